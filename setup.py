"""Builds the native engine, fastcoll.engine._native, from its C sources (fastcoll/engine/csrc/)
with the platform's compiler, and beside it the MPI library that MLX's graph calls it through
(fastcoll.mlx_compat._mpi_abi, from fastcoll/mlx_compat/csrc/: a plain shared library that
fastcoll.mlx_compat hands MLX, never imported as a module). It is optional: where it cannot be built (no compiler), the
install still succeeds and fastcoll runs its pure-Python engine, saying so at init().

CC, CFLAGS and LDFLAGS are honoured as usual (CI builds with clang, with -Werror, and with
AddressSanitizer and UndefinedBehaviorSanitizer this way); FASTCOLL_PORTABLE=1 builds only the
portable POSIX paths (no Linux-only call), as a macOS build has them; FASTCOLL_BUILD_STRICT=1
makes a failed build fail the install (CI), where by default it only warns. The RDMA (verbs) link
is compiled where the compiler finds <infiniband/verbs.h>, and left out elsewhere.
"""

import glob
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup

CSRC = os.path.join("fastcoll", "engine", "csrc")
MACROS = [("_DEFAULT_SOURCE", "1"), ("_DARWIN_C_SOURCE", "1")]
if os.environ.get("FASTCOLL_PORTABLE", "") not in ("", "0"):
    MACROS.append(("FC_PORTABLE", "1"))

FLAGS = ["-std=c11", "-ffp-contract=off", "-fvisibility=hidden"]
OPTIONAL = os.environ.get("FASTCOLL_BUILD_STRICT", "") in ("", "0")

# The RDMA (verbs) link's files: built only where the platform has <infiniband/verbs.h> (Debian's
# libibverbs-dev; the macOS SDK from 26.2). The engine loads the verbs library when a job asks for
# an RDMA link, never links against it: a machine without RDMA imports and runs everything else.
VERBS_SOURCES = set(glob.glob(os.path.join(CSRC, "links", "verbs", "*.c")))


def have_verbs_header() -> bool:
    """Whether the compiler (CC, as the build will use it) finds <infiniband/verbs.h>."""
    cc = shlex.split(os.environ.get("CC", "") or "cc")
    try:
        probe = subprocess.run(cc + ["-fsyntax-only", "-x", "c", "-"], input=b"#include <infiniband/verbs.h>\n",
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


# The engine's rooms (csrc/README.md): every C file under csrc/, by folder.
SOURCES = sorted(glob.glob(os.path.join(CSRC, "**", "*.c"), recursive=True))
LIBRARIES = ["m"] if sys.platform.startswith("linux") else []  # fmaf (complex64 products, fc_reduce.c)
if have_verbs_header():
    MACROS.append(("FC_HAVE_VERBS", "1"))
    if sys.platform.startswith("linux"):
        LIBRARIES.append("dl")  # dlopen, in libc itself only from glibc 2.34
else:
    SOURCES = [s for s in SOURCES if s not in VERBS_SOURCES]

native = Extension(
    "fastcoll.engine._native",
    sources=SOURCES,
    depends=sorted(glob.glob(os.path.join(CSRC, "**", "*.h"), recursive=True)),
    include_dirs=[CSRC],
    libraries=LIBRARIES,
    define_macros=MACROS,
    # -ffp-contract=off: no fused multiply-adds, so reductions give numpy's bits.
    extra_compile_args=FLAGS,
    optional=OPTIONAL,
)

MPI_CSRC = os.path.join("fastcoll", "mlx_compat", "csrc")
mpi_abi = Extension(
    "fastcoll.mlx_compat._mpi_abi",
    # fc_reduce.c: the engine's reductions, for the collectives of split groups (mpi_sub.c).
    sources=sorted(glob.glob(os.path.join(MPI_CSRC, "*.c"))) + [os.path.join(CSRC, "reduce", "fc_reduce.c")],
    depends=sorted(glob.glob(os.path.join(MPI_CSRC, "*.h"))) + [os.path.join(CSRC, "binding", "fc_graph.h"),
                                                                 os.path.join(CSRC, "reduce", "fc_reduce.h")],
    include_dirs=[CSRC, MPI_CSRC],
    libraries=["m"] if sys.platform.startswith("linux") else [],  # fmaf (fc_reduce.c)
    define_macros=MACROS,
    extra_compile_args=FLAGS,
    optional=OPTIONAL,
)

setup(ext_modules=[native, mpi_abi])
