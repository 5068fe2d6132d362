"""python -m fastcoll.mlx_compat (-m MODULE | -c CODE | SCRIPT) [ARGS...]"""

import sys

from fastcoll.mlx_compat.runner import run_main

run_main(sys.argv[1:])
