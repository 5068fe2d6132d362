"""The examples at small size: tensor-parallel inference and data-parallel training.

Each runs on two ranks under fastcoll-launch (`python -m fastcoll.launch -n 2 ...`) and as a
world of one, and must print the equalities it checks: sharded logits == single-process logits
(and the same greedy tokens); data-parallel weights == single-process weights.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import ROOT, jobless_env, run_session

pytest.importorskip("mlx.core")

EXAMPLES = os.path.join(ROOT, "examples")
TP_SMALL = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
            "--vocab", "256", "--prompt-len", "6", "--tokens", "6", "--repeat", "1"]
DP_SMALL = ["--steps", "30", "--batch", "32", "--inputs", "8", "--hidden", "16", "--outputs", "2"]


def run(argv: list[str], timeout: float = 90) -> str:
    """Run argv in its own session; kill the whole session if it overstays. Returns stdout."""
    code, out, err = run_session(argv, jobless_env(), timeout, cwd=ROOT)
    assert code == 0, f"{argv} exited {code}:\n{out}\n{err[-3000:]}"
    return out


def launched(script: str, *args: str, n: int = 2) -> str:
    try:
        import fastcoll.launch.cli  # noqa: F401
    except ImportError as e:
        pytest.skip(f"fastcoll-launch is not importable: {e}")
    return run([sys.executable, "-m", "fastcoll.launch", "-n", str(n), "--timeout", "80",
                sys.executable, os.path.join(EXAMPLES, script), *args])


def result(out: str) -> dict[str, str]:
    lines = [line for line in out.splitlines() if "RESULT " in line]
    assert lines, f"no RESULT line in:\n{out}"
    return dict(kv.split("=", 1) for kv in lines[-1].split("RESULT ", 1)[1].split())


@pytest.mark.parametrize("world", [2, 1])
def test_tp_inference(world):
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[lm]' in the clone)")
    if world == 1:
        out = run([sys.executable, os.path.join(EXAMPLES, "tp_inference.py"), *TP_SMALL])
    else:
        out = launched("tp_inference.py", *TP_SMALL)
    res = result(out)
    assert res["world"] == str(world)
    assert res["logits_ok"] == "1" and res["tokens_equal"] == "1", out
    assert re.search(r"logits max \|sharded - single\| = \S+ \(tolerance \S+\): OK", out), out
    assert "tokens equal: True" in out
    # What carries the messages, worded as examples/allreduce.py words it (Group.transport_info).
    carrier = "tcp, shared memory on 1 of 1 connections" if world == 2 else "none (world of one)"
    assert re.search(rf"\(float32\), transport {re.escape(carrier)}", out), out
    assert re.search(r"tokens/s \(median of \d+\): sharded over \d rank\(s\) [\d.]+, single process [\d.]+", out), out


@pytest.mark.parametrize("world,extra", [(2, []), (2, ["--mlx-average"]), (1, [])])
def test_dp_training(world, extra):
    if world == 1:
        out = run([sys.executable, os.path.join(EXAMPLES, "dp_training.py"), *DP_SMALL, *extra])
    else:
        out = launched("dp_training.py", *DP_SMALL, *extra)
    res = result(out)
    assert res["world"] == str(world)
    assert res["weights_match"] == "1", out
    assert float(res["max_diff"]) <= 1e-4
    assert re.search(r"max \|w - w_single\| = \S+ \(tolerance \S+\): OK", out), out
    assert "step 30/30" in out  # rank 0's progress reached the end
