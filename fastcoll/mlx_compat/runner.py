"""`python -m fastcoll.mlx_compat [-m MODULE | SCRIPT] ARGS`: install(), then run the program."""

from __future__ import annotations

import runpy
import sys

from fastcoll.mlx_compat.patch import install


def run_main(argv: list[str]) -> None:
    """`python -m fastcoll.mlx_compat [-m MODULE | SCRIPT] ARGS`: install(), then run it."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print("usage: python -m fastcoll.mlx_compat (-m MODULE | SCRIPT) [ARGS...]\n"
              "Runs the program with mx.distributed routed to fastcoll.", file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
