"""`python -m fastcoll.mlx_compat [-m MODULE | SCRIPT] ARGS`: install(), then run the program."""

from __future__ import annotations

import os
import runpy
import sys

from fastcoll.mlx_compat.patch import install

PROG = "python -m fastcoll.mlx_compat"


def run_main(argv: list[str]) -> None:
    """`python -m fastcoll.mlx_compat [-m MODULE | SCRIPT] ARGS`: install(), then run it."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(f"usage: {PROG} (-m MODULE | SCRIPT) [ARGS...]\n"
              "Runs the program with mx.distributed routed to fastcoll.", file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    if argv[0] != "-m" and not os.path.exists(argv[0]):
        print(f"{PROG}: can't open file {argv[0]!r}: no such file or directory", file=sys.stderr)
        raise SystemExit(2)  # as `python SCRIPT` exits
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        if os.path.isfile(argv[0]):
            # As `python DIR/script.py` does, so that the script imports the modules beside it
            # (runpy puts a directory or zip that it runs first itself).
            sys.path.insert(0, os.path.dirname(os.path.realpath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
