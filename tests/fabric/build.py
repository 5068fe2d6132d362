"""Builds the test fabric, libfcfabric.so: a verbs provider over shared memory for tests (README.md).

`python tests/fabric/build.py [BUILD_DIR]` compiles it (again only when its sources, compiler or
flags changed) and prints the library's absolute path as its last line; `build()` does the same
for a test's fixture. CC, CFLAGS and LDFLAGS are honoured as for the native engine (a sanitized
build: CFLAGS="-fsanitize=address,undefined" LDFLAGS="-fsanitize=address,undefined"), and
FASTCOLL_BUILD_STRICT=1 makes warnings errors. Only the C library and pthread are needed, and
<infiniband/verbs.h> (Debian's libibverbs-dev), so that structures and constants are the real ones.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "build")
LIBRARY = "libfcfabric.so"
FLAGS = ["-std=c11", "-D_DEFAULT_SOURCE", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]
NO_VERBS = "infiniband/verbs.h not found: install libibverbs-dev (rdma-core) to build the test fabric"


class BuildError(Exception):
    """The fabric could not be built; the message is one line that says why."""


def sources() -> list[str]:
    """The library's own sources (the test programs beside them are not part of it)."""
    return sorted(glob.glob(os.path.join(HERE, "fcfab*.c")) + glob.glob(os.path.join(HERE, "fcfab*.h")))


def compiler() -> str:
    return os.environ.get("CC") or "cc"


def env_flags(name: str) -> list[str]:
    return shlex.split(os.environ.get(name, ""))


def strict() -> bool:
    return os.environ.get("FASTCOLL_BUILD_STRICT", "") not in ("", "0")


def have_verbs_h(cc: str, cflags: list[str]) -> bool:
    """Whether `cc` finds <infiniband/verbs.h> (with the caller's include flags)."""
    try:
        p = subprocess.run([cc, *cflags, "-E", "-x", "c", "-"], input="#include <infiniband/verbs.h>\n",
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"cannot run the C compiler {cc!r}: {e}") from None
    return p.returncode == 0


def stamp(argv: list[str]) -> str:
    """What the library was built from: the command and every source's bytes."""
    h = hashlib.sha256("\0".join(argv).encode())
    for path in sources():
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.hexdigest()


def build(out_dir: str | None = None, cc: str | None = None, cflags: list[str] | None = None,
          ldflags: list[str] | None = None, werror: bool | None = None) -> str:
    """Build the fabric into `out_dir` (tests/fabric/build by default) unless it is up to date;
    return the library's absolute path. Raises BuildError saying why it could not."""
    out_dir = os.path.abspath(out_dir or DEFAULT_OUT)
    cc = cc or compiler()
    cflags = env_flags("CFLAGS") if cflags is None else cflags
    ldflags = env_flags("LDFLAGS") if ldflags is None else ldflags
    werror = strict() if werror is None else werror
    lib = os.path.join(out_dir, LIBRARY)
    c_files = [s for s in sources() if s.endswith(".c")]
    argv = [cc, *FLAGS, *(["-Werror"] if werror else []), *cflags, "-shared", "-o", "OUT", *c_files,
            *ldflags, "-pthread"]
    want = stamp(argv)
    stamp_file = lib + ".stamp"
    if os.path.exists(lib) and os.path.exists(stamp_file):
        with open(stamp_file) as f:
            if f.read().strip() == want:
                return lib
    if not have_verbs_h(cc, cflags):
        raise BuildError(NO_VERBS)
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{lib}.{os.getpid()}.tmp"  # renamed into place whole: concurrent builds never see half
    argv[argv.index("OUT")] = tmp
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise BuildError(f"{shlex.join(argv)} failed:\n{p.stdout}{p.stderr}".rstrip())
    os.replace(tmp, lib)
    with open(stamp_file + f".{os.getpid()}", "w") as f:
        f.write(want + "\n")
    os.replace(stamp_file + f".{os.getpid()}", stamp_file)
    return lib


def program(name: str, out_dir: str, cc: str | None = None, cflags: list[str] | None = None) -> str:
    """Compile the test program tests/fabric/<name>.c into `out_dir`; return its path."""
    cc = cc or compiler()
    exe = os.path.join(out_dir, name)
    argv = [cc, *FLAGS, "-Werror", "-I", HERE, *(cflags or []), "-o", exe, os.path.join(HERE, name + ".c"),
            "-ldl"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise BuildError(f"{shlex.join(argv)} failed:\n{p.stdout}{p.stderr}".rstrip())
    return exe


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python tests/fabric/build.py [BUILD_DIR]", file=sys.stderr)
        return 2
    try:
        print(build(argv[0] if argv else None))
    except BuildError as e:
        print(f"build.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
