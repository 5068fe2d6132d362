"""MLX's own test of its MPI backend (tests/mlx_upstream/: python/tests/mpi_test_distributed.py of
MLX's main branch, unchanged) on fastcoll, eagerly and in graph mode (FASTCOLL_MLX_GRAPH=1, where
MLX's MPI backend runs over fastcoll's MPI library):

    fastcoll-launch -n 4 python -m fastcoll.mlx_compat tests/mlx_upstream/mpi_test_distributed.py

Its 13 tests run on 4 ranks but two, which assume 8 ranks and run on 8 apart: test_groups
(it asserts a world of 8, and sub-groups of 4 and 2) and test_mixed (its expected result is
shaped for 8 ranks: 4 pairs). Eagerly, test_donation is left out: it checks that an all_sum's
result reuses its input's memory (MLX's donation, which graph mode has), and an eager collective
returns a fresh array, so the peak memory it measures is higher; nothing is wrong with the values.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import ROOT, jobless_env, run_session

pytest.importorskip("mlx.core")

from fastcoll.mlx_compat import graph  # noqa: E402

SCRIPT = os.path.join(ROOT, "tests", "mlx_upstream", "mpi_test_distributed.py")
ALL = ["test_all_gather", "test_all_gather_extra", "test_all_reduce", "test_all_reduce_extra", "test_average_gradients",
       "test_clip_grad_norm_sharded", "test_donation", "test_groups", "test_jaccl_all_gather_factory_validation",
       "test_mixed", "test_send_recv", "test_shard_linear", "test_shard_predicate"]
EIGHT_RANKS = ["test_groups", "test_mixed"]
GRAPH_ONLY = ["test_donation"]


def graph_runs() -> bool:
    from fastcoll.engine import native_available

    return os.environ.get("FASTCOLL_NATIVE", "1") not in ("0", "") and graph.library() is not None \
        and native_available() is None


def run_tests(world: int, mode: str, names: list[str]) -> None:
    if mode == "graph" and not graph_runs():
        pytest.skip("graph mode cannot run here (FASTCOLL_NATIVE=0, or fastcoll's MPI library was not built)")
    argv = [sys.executable, "-m", "fastcoll.launch", "-n", str(world), "--timeout", "240",
            "--env", f"FASTCOLL_MLX_GRAPH={int(mode == 'graph')}", sys.executable, "-m", "fastcoll.mlx_compat",
            SCRIPT, "-v", *(f"TestMPIDistributed.{n}" for n in names)]
    code, out, _ = run_session(argv, jobless_env("FASTCOLL_NATIVE"), 300, cwd=ROOT, merge_stderr=True)
    assert code == 0, out[-6000:]
    for r in range(world):
        assert re.search(rf"^\[{r}\] Ran {len(names)} tests? in ", out, re.M), out[-6000:]
        assert re.search(rf"^\[{r}\] OK$", out, re.M), out[-6000:]
        for n in names:
            assert re.search(rf"^\[{r}\] {n} \(__main__\.TestMPIDistributed\.{n}\) \.\.\. ok$", out, re.M), n
    assert "collectives run eagerly instead" not in out, out[-6000:]


def test_the_copy_is_mlxs_whole_test():
    with open(SCRIPT) as f:
        found = re.findall(r"^    def (test_\w+)", f.read(), re.M)
    with open(os.path.join(ROOT, "tests", "mlx_upstream", "mlx_distributed_tests.py")) as f:
        found += re.findall(r"^    def (test_\w+)", f.read(), re.M)
    assert sorted(set(found)) == ALL


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mlx_mpi_tests_on_four_ranks(mode):
    leave_out = EIGHT_RANKS + (GRAPH_ONLY if mode == "eager" else [])
    run_tests(4, mode, [n for n in ALL if n not in leave_out])


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mlx_mpi_tests_that_assume_eight_ranks(mode):
    run_tests(8, mode, EIGHT_RANKS)
