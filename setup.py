"""Builds the native engine, fastcoll.engine._native, from its C sources (fastcoll/engine/csrc/)
with the platform's compiler, and beside it the MPI library that MLX's graph calls it through
(fastcoll.mlx_compat._mpi_abi, from fastcoll/mlx_compat/csrc/: a plain shared library that
fastcoll.mlx_compat hands MLX, never imported as a module). It is optional: where it cannot be built (no compiler), the
install still succeeds and fastcoll runs its pure-Python engine, saying so at init().

CC, CFLAGS and LDFLAGS are honoured as usual (CI builds with clang, with -Werror, and with
AddressSanitizer and UndefinedBehaviorSanitizer this way); FASTCOLL_PORTABLE=1 builds only the
portable POSIX paths (no Linux-only call), as a macOS build has them; FASTCOLL_BUILD_STRICT=1
makes a failed build fail the install (CI), where by default it only warns.
"""

import glob
import os
import sys

from setuptools import Extension, setup

CSRC = os.path.join("fastcoll", "engine", "csrc")
MACROS = [("_DEFAULT_SOURCE", "1"), ("_DARWIN_C_SOURCE", "1")]
if os.environ.get("FASTCOLL_PORTABLE", "") not in ("", "0"):
    MACROS.append(("FC_PORTABLE", "1"))

FLAGS = ["-std=c11", "-ffp-contract=off", "-fvisibility=hidden"]
OPTIONAL = os.environ.get("FASTCOLL_BUILD_STRICT", "") in ("", "0")

native = Extension(
    "fastcoll.engine._native",
    sources=sorted(glob.glob(os.path.join(CSRC, "*.c"))),
    depends=sorted(glob.glob(os.path.join(CSRC, "*.h"))),
    include_dirs=[CSRC],
    libraries=["m"] if sys.platform.startswith("linux") else [],  # fmaf (complex64 products, fc_reduce.c)
    define_macros=MACROS,
    # -ffp-contract=off: no fused multiply-adds, so reductions give numpy's bits.
    extra_compile_args=FLAGS,
    optional=OPTIONAL,
)

MPI_CSRC = os.path.join("fastcoll", "mlx_compat", "csrc")
mpi_abi = Extension(
    "fastcoll.mlx_compat._mpi_abi",
    # fc_reduce.c: the engine's reductions, for the collectives of split groups (mpi_sub.c).
    sources=sorted(glob.glob(os.path.join(MPI_CSRC, "*.c"))) + [os.path.join(CSRC, "fc_reduce.c")],
    depends=sorted(glob.glob(os.path.join(MPI_CSRC, "*.h"))) + [os.path.join(CSRC, "fc_graph.h"),
                                                                 os.path.join(CSRC, "fc_reduce.h")],
    include_dirs=[CSRC, MPI_CSRC],
    libraries=["m"] if sys.platform.startswith("linux") else [],  # fmaf (fc_reduce.c)
    define_macros=MACROS,
    extra_compile_args=FLAGS,
    optional=OPTIONAL,
)

setup(ext_modules=[native, mpi_abi])
