"""Run by Python at the start of every local rank of fastcoll-launch (its directory is first on
the rank's PYTHONPATH): a hint for mx.distributed programs run without fastcoll's compat layer.

Such a program's `mx.distributed.init()` finds none of MLX's own backends set up and gives every
rank a world of one, without a word. Once the program imports `mlx.core`, `mx.distributed.init`
is wrapped so that a world of one in a fastcoll-launch job of several ranks logs one warning
that says how to run the program. This module then takes its directory off `sys.path` and runs
the sitecustomize it hides, if there is one. Standard library only, written for any Python 3 a
rank may run, and never an error of its own: a failure here only loses the hint.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_warned = []  # one warning per process


def _world():
    """FASTCOLL_WORLD_SIZE, the job's number of ranks (1 if unset or unreadable)."""
    try:
        return int(os.environ.get("FASTCOLL_WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _hint(group):
    """Warn once if `group` is a world of one in a fastcoll-launch job of several ranks."""
    size = _world()
    if _warned or size < 2 or group.size() != 1:
        return
    _warned.append(True)
    import logging

    logging.getLogger("fastcoll.launch").warning(
        "mx.distributed.init() gave rank %s a world of one, though fastcoll-launch started %d "
        "ranks: MLX's own backends do not read fastcoll's settings. Run the program under "
        "fastcoll's compat layer: fastcoll-launch ... python -m fastcoll.mlx_compat %s",
        os.environ.get("FASTCOLL_RANK", "?"), size, _program())


def _program():
    """This program as `python -m fastcoll.mlx_compat` takes it: `-m MODULE`, `-c CODE` or the
    script, then its arguments, quoted for a shell, so that the hint is a command that runs."""
    args = [str(a) for a in sys.argv[1:]]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or ""
    if name.endswith(".__main__"):
        name = name[: -len(".__main__")]
    first = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if name:
        program = ["-m", name]
    elif first == "-c":
        # The code itself is only in the interpreter's own argv (Python 3.10 on): CODE, ARGS.
        orig = getattr(sys, "orig_argv", None) or []
        code = orig[-len(sys.argv)] if len(orig) > len(sys.argv) else None
        program = ["-c", code] if code is not None else ["-c", "CODE"]
    else:
        program = [first or "SCRIPT"]
    return " ".join(_quoted(p) for p in program + args)


def _quoted(word):
    """`word` for a shell command on one line (the launcher tags each line of output): as
    shlex quotes it, or, holding a newline or another control character, in $'...' (bash, zsh)."""
    import shlex

    if not any(ord(c) < 32 or ord(c) == 127 for c in word):
        return shlex.quote(word)
    escapes = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "$'" + "".join(escapes.get(c) or (c if 32 <= ord(c) != 127 else "\\x%02x" % ord(c))
                          for c in word) + "'"


def _wrap(core):
    """Replace core.distributed.init by one that hints after MLX's own has run."""
    real = core.distributed.init

    def init(*args, **kwargs):
        group = real(*args, **kwargs)
        try:
            _hint(group)
        except Exception:  # noqa: BLE001 - the hint must never break the program
            pass
        return group

    init.__name__, init.__qualname__, init.__doc__ = "init", "init", real.__doc__
    init.__wrapped__ = real
    core.distributed.init = init


class _Loader:
    """mlx.core's own loader, which wraps init once the module has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # as if never wrapped
        try:
            _wrap(module)
        except Exception:  # noqa: BLE001 - an MLX without distributed.init: no hint
            pass

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Watch:
    """A meta path finder that only sees `mlx.core` go by, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "mlx.core":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001 - let the import itself report it
            return None
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def _chain():
    """Take this directory off sys.path and import the sitecustomize it hid, if any."""
    mine = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        import sitecustomize  # noqa: F401
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            raise
        if mine is not None:
            sys.modules["sitecustomize"] = mine


if _world() > 1 and "mlx.core" not in sys.modules:
    sys.meta_path.insert(0, _Watch())
_chain()
