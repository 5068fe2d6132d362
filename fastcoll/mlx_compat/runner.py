"""`python -m fastcoll.mlx_compat (-m MODULE | -c CODE | SCRIPT) ARGS`: install(), then run the
program as `python` would run it."""

from __future__ import annotations

import os
import runpy
import sys
import types

from fastcoll.mlx_compat.patch import install

PROG = "python -m fastcoll.mlx_compat"
USAGE = (f"usage: {PROG} (-m MODULE | -c CODE | SCRIPT) [ARGS...]\n"
         "Runs the program with mx.distributed routed to fastcoll.")


def run_main(argv: list[str]) -> None:
    """`python -m fastcoll.mlx_compat (-m MODULE | -c CODE | SCRIPT) ARGS`: install(), then run it."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] in ("-m", "-c") and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    if argv[0] not in ("-m", "-c") and not os.path.exists(argv[0]):
        print(f"{PROG}: can't open file {argv[0]!r}: no such file or directory", file=sys.stderr)
        raise SystemExit(2)  # as `python SCRIPT` exits
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        run_code(argv[1], argv[2:])
    else:
        sys.argv = list(argv)
        if os.path.isfile(argv[0]):
            # As `python DIR/script.py` does, so that the script imports the modules beside it
            # (runpy puts a directory or zip that it runs first itself).
            sys.path.insert(0, os.path.dirname(os.path.realpath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


def run_code(code: str, args: list[str]) -> None:
    """Run `code` as `python -c CODE ARGS` does: in a fresh `__main__` module, with sys.argv
    ['-c', *ARGS] and the working directory first on sys.path."""
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv = ["-c", *args]
    # sys.path needs nothing: `python -m` put the working directory first, as `python -c` does.
    exec(compile(code, "<string>", "exec"), main.__dict__)
