"""Every example, and every command the README, docs/mlx.md and docs/macs.md show, eagerly
(FASTCOLL_MLX_GRAPH=0) and in graph mode (FASTCOLL_MLX_GRAPH=1, where MLX's graph runs the
collectives of mx.distributed code).

Each example runs on two ranks under fastcoll-launch (`python -m fastcoll.launch -n 2 ...`) and
as a world of one, and must print the equalities it checks: examples/allreduce.py's sum,
tp_inference's sharded logits == single-process logits (and the same greedy tokens),
dp_training's data-parallel weights == single-process weights, sharded_generate's text == one
process's text, with every rank holding fewer of the model's parameters than one process does
(mlx-lm really sharded it). These run at small sizes. The documented commands run verbatim
(the slow set, for CI: `fastcoll-launch --hostfile hosts` becomes `-n 2` on this one machine,
DIR the small model tests/progs/lm_model.py makes); the HTTP server's command runs in
tests/test_real_clients.py.
"""

from __future__ import annotations

import os
import re
import shlex
import sys

import pytest

from conftest import PROGS, ROOT, jobless_env, run_session

pytest.importorskip("mlx.core")

EXAMPLES = os.path.join(ROOT, "examples")
TP_SMALL = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
            "--vocab", "256", "--prompt-len", "6", "--tokens", "6", "--repeat", "1"]
DP_SMALL = ["--steps", "30", "--batch", "32", "--inputs", "8", "--hidden", "16", "--outputs", "2"]
EAGERLY = "collectives run eagerly instead"  # graph mode's warning where it cannot run


def graph_runs() -> bool:
    """Whether graph mode can run here (else it says so and the eager path serves)."""
    from fastcoll.engine import native_available
    from fastcoll.mlx_compat import graph

    return os.environ.get("FASTCOLL_NATIVE", "1") not in ("0", "") and graph.library() is not None \
        and native_available() is None


def run(argv: list[str], timeout: float = 120, **env: str) -> tuple[str, str]:
    """Run argv in its own session; kill the whole session if it overstays. (stdout, stderr)."""
    code, out, err = run_session(argv, jobless_env("FASTCOLL_NATIVE") | env, timeout, cwd=ROOT)
    assert code == 0, f"{argv} exited {code}:\n{out}\n{err[-3000:]}"
    return out, err


def launched(script: str, *args: str, mode: str = "eager", runner: bool = False) -> tuple[str, str]:
    """`fastcoll-launch -n 2 --env FASTCOLL_MLX_GRAPH=0|1 python [-m fastcoll.mlx_compat] script args`."""
    try:
        import fastcoll.launch.cli  # noqa: F401
    except ImportError as e:
        pytest.skip(f"fastcoll-launch is not importable: {e}")
    # Each mode asked for by name: the eager path is no longer what an unset FASTCOLL_MLX_GRAPH gives.
    graph = ["--env", f"FASTCOLL_MLX_GRAPH={int(mode == 'graph')}"]
    prefix = ["-m", "fastcoll.mlx_compat"] if runner else []
    out, err = run([sys.executable, "-m", "fastcoll.launch", "-n", "2", "--timeout", "100", *graph,
                    sys.executable, *prefix, os.path.join(EXAMPLES, script), *args])
    if mode == "graph" and graph_runs():
        assert EAGERLY not in err, err[-3000:]  # graph mode ran, not the eager path in its place
    return out, err


def result(out: str) -> dict[str, str]:
    lines = [line for line in out.splitlines() if "RESULT " in line]
    assert lines, f"no RESULT line in:\n{out}"
    return dict(kv.split("=", 1) for kv in lines[-1].split("RESULT ", 1)[1].split())


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_allreduce_example(mode):
    out, _ = launched("allreduce.py", mode=mode)
    for r in (0, 1):
        assert f"[{r}] rank {r}/2: all_reduce(sum) of 4 KiB float32 gave 3 everywhere, as expected" in out, out
        assert re.search(rf"\[{r}\] rank {r}/2: transport .*: 4 KiB all_reduce median \d+ us", out), out


@pytest.mark.parametrize("world,mode,extra", [(2, "eager", []), (2, "graph", []), (2, "graph", ["--no-single"]),
                                              (1, "eager", [])])
def test_tp_inference(world, mode, extra):
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[lm]' in the clone)")
    if world == 1:
        out, _ = run([sys.executable, os.path.join(EXAMPLES, "tp_inference.py"), *TP_SMALL])
    else:
        out, _ = launched("tp_inference.py", *TP_SMALL, *extra, mode=mode)
    res = result(out)
    assert res["world"] == str(world)
    assert res["logits_ok"] == "1" and res["tokens_equal"] == "1", out
    assert re.search(r"logits max \|sharded - single\| = \S+ \(tolerance \S+\): OK", out), out
    assert ("tokens equal: True" in out) is (not extra), out  # --no-single: no single-process tokens
    # What carries the messages, worded as examples/allreduce.py words it (Group.transport_info).
    carrier = "tcp, shared memory on 1 of 1 connections" if world == 2 else "none (world of one)"
    assert re.search(rf"\(float32\), transport {re.escape(carrier)}", out), out
    assert re.search(r"tokens/s \(median of \d+\): sharded over \d rank\(s\) [\d.]+, single process [\d.n]+", out), out


@pytest.mark.parametrize("world,mode,extra", [(2, "eager", []), (2, "eager", ["--mlx-average"]),
                                              (2, "graph", []), (2, "graph", ["--mlx-average"]), (1, "eager", [])])
def test_dp_training(world, mode, extra):
    if world == 1:
        out, _ = run([sys.executable, os.path.join(EXAMPLES, "dp_training.py"), *DP_SMALL, *extra])
    else:
        out, _ = launched("dp_training.py", *DP_SMALL, *extra, mode=mode)
    res = result(out)
    assert res["world"] == str(world)
    assert res["weights_match"] == "1", out
    assert float(res["max_diff"]) <= 1e-4
    assert re.search(r"max \|w - w_single\| = \S+ \(tolerance \S+\): OK", out), out
    assert "step 30/30" in out  # rank 0's progress reached the end


@pytest.fixture(scope="module")
def lm_model(tmp_path_factory):
    """The small qwen2 docs/mlx.md tells users to make (tests/progs/lm_model.py: no download)."""
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[lm]' in the clone)")
    pytest.importorskip("tokenizers", reason="the tokenizers package is not installed (mlx-lm's transformers has it)")
    path = str(tmp_path_factory.mktemp("lm") / "model")
    run([sys.executable, os.path.join(PROGS, "lm_model.py"), path])
    return path


def held(out: str) -> dict[int, int]:
    """Each rank's count of the model's parameters, as sharded_generate.py says it."""
    return {int(r): int(n) for r, n in re.findall(r"rank (\d+): holds (\d+) of the model's parameters", out)}


@pytest.mark.parametrize("split", ["tensor", "pipeline"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_sharded_generate_shards_and_gives_one_process_text(lm_model, split, mode):
    args = ["--model", lm_model, "--max-tokens", "8"] + (["--pipeline"] if split == "pipeline" else [])
    single, _ = run([sys.executable, os.path.join(EXAMPLES, "sharded_generate.py"), *args])
    sharded, _ = launched("sharded_generate.py", *args, mode=mode, runner=True)
    said = lambda out: re.search(r"-> ('.*')$", out, re.M)
    assert said(single) and said(sharded), (single, sharded)
    assert said(sharded).group(1) == said(single).group(1), (single, sharded)
    assert f"2 rank(s), {'pipeline' if split == 'pipeline' else 'tensor parallel'}" in sharded, sharded
    whole, parts = held(single), held(sharded)
    assert list(whole) == [0] and sorted(parts) == [0, 1], (single, sharded)
    assert all(n < whole[0] for n in parts.values()), (whole, parts)  # mlx-lm sharded the model


# ----- the documented commands, verbatim -----

SKIPPED_COMMANDS = ("my_mlx_script.py", "some.module", "--check", "mlx_lm server")  # see the module docstring


def documented_commands() -> list[str]:
    """Every command line of the README's quick start, docs/mlx.md and docs/macs.md that runs an
    example or mlx-lm (placeholders, --check and the server apart)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    texts = [readme[readme.index("## Quick start"):readme.index("## API")]]
    for page in ("mlx.md", "macs.md"):
        with open(os.path.join(ROOT, "docs", page)) as f:
            texts.append(f.read())
    found = []
    for block in re.findall(r"```sh\n(.*?)```", "\n".join(texts), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split("&&")[-1].strip()
            if (re.match(r"(fastcoll-launch|python) ", line) and re.search(r"examples/|mlx_lm", line)
                    and not any(s in line for s in SKIPPED_COMMANDS)):
                found.append(" ".join(line.split()))
    return found


COMMANDS = documented_commands()


def test_the_documents_show_the_commands_these_tests_run():
    assert "fastcoll-launch -n 2 python examples/allreduce.py" in COMMANDS
    assert sum("examples/tp_inference.py" in c for c in COMMANDS) == 3, COMMANDS
    assert sum("examples/dp_training.py" in c for c in COMMANDS) == 5, COMMANDS
    assert sum("examples/sharded_generate.py" in c for c in COMMANDS) >= 3, COMMANDS
    assert not any("mlx_lm generate" in c for c in COMMANDS), "mlx-lm's generate does not shard"


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("command", COMMANDS)
def test_documented_command(lm_model, command, mode):
    words = {"fastcoll-launch": [sys.executable, "-m", "fastcoll.launch"], "python": [sys.executable],
             "DIR": [lm_model], "--hostfile": ["-n"], "hosts": ["2"]}
    argv = [w for word in shlex.split(command) for w in words.get(word, [word])]
    # The mode through the environment, which the launcher passes on to its ranks; a command's own
    # --env FASTCOLL_MLX_GRAPH (the launcher's, which wins) is made this mode's.
    flag = f"FASTCOLL_MLX_GRAPH={int(mode == 'graph')}"
    argv = [flag if a.startswith("FASTCOLL_MLX_GRAPH=") else a for a in argv]
    out, err = run(argv, timeout=600, FASTCOLL_MLX_GRAPH=flag.split("=")[1])
    if mode == "graph" and graph_runs():
        assert EAGERLY not in err, err[-3000:]
    if "tp_inference.py" in command or "dp_training.py" in command:
        assert re.search(r"RESULT \S+=1 ", out), out  # (each example also exits 1 unless its checks hold)
    if "sharded_generate.py" in command:
        assert re.search(r"-> '.*'$", out, re.M), out
