"""Real clients of mx.distributed, unchanged, on fastcoll, each against its single-process result:

- mlx-lm's own HTTP server (`python -m fastcoll.mlx_compat -m mlx_lm server`, started by
  fastcoll-launch on two ranks with docs/mlx.md's command), tensor-parallel and with --pipeline,
  eagerly and in graph mode, answering several concurrent requests as one process does, on a
  qwen2 made here (tests/progs/lm_model.py: random weights, a tokenizer trained with the
  tokenizers package, no download); the same command under tests/progs/lm_probe.py, which says
  what each rank loaded: every rank holds fewer of the model's parameters than one process;
- mlx.nn.fully_shard training and a quantized model sharded with shard_linear
  (tests/progs/nn_clients.py).

Bounded: a 4-layer model of 64 hidden units, three requests of 8 tokens, a timeout on every wait;
each server runs in a session of its own that is killed whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest

from conftest import PROGS, ROOT, assert_ok, free_port, jobless_env, run_session

pytest.importorskip("mlx_lm")
pytest.importorskip("tokenizers")

PROMPTS = ["the red cat is", "one two three four", "the old house by the river"]


def _env() -> dict:
    return jobless_env() | {"FASTCOLL_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    made = {}
    for name, extra in (("plain", []), ("quantized", ["--quantize"])):
        code, out, err = run_session([sys.executable, os.path.join(PROGS, "lm_model.py"), str(root / name), *extra],
                                     _env(), timeout=120)
        assert code == 0, err
        made[name] = str(root / name)
    return made


@contextmanager
def server(argv: list[str], port: int, log_path):
    """Run a server in its own session until /health answers; kill the session afterwards."""
    log = open(log_path, "w+")
    p = subprocess.Popen(argv, env=_env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            if p.poll() is not None:
                log.seek(0)
                pytest.fail(f"the server exited with {p.returncode}:\n{log.read()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"the server did not answer /health in 90 s:\n{log.read()[-4000:]}")
            time.sleep(0.2)
        yield p
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever the launcher left in its session
        except (ProcessLookupError, PermissionError):
            pass
        log.close()


def ask_concurrently(port: int) -> list[str]:
    """The PROMPTS as concurrent greedy completions; the texts in PROMPTS' order."""
    texts: list = [None] * len(PROMPTS)
    errors: list = []

    def one(i: int) -> None:
        body = json.dumps({"prompt": PROMPTS[i], "max_tokens": 8, "temperature": 0.0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                texts[i] = json.loads(r.read())["choices"][0]["text"]
        except Exception as e:  # reported below
            errors.append((i, e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert all(isinstance(t, str) for t in texts), texts
    return texts


@pytest.fixture(scope="module")
def single_process_answers(models, tmp_path_factory):
    port = free_port()
    argv = [sys.executable, "-m", "mlx_lm", "server", "--model", models["plain"], "--port", str(port)]
    with server(argv, port, tmp_path_factory.mktemp("single") / "server.log"):
        return ask_concurrently(port)


def documented_server(model: str, port: int) -> list[str]:
    """docs/mlx.md's command that serves a model on two ranks, with its DIR and P filled in."""
    with open(os.path.join(ROOT, "docs", "mlx.md")) as f:
        m = re.search(r"`(fastcoll-launch -n 2 python -m fastcoll\.mlx_compat -m mlx_lm[^`]*)`", f.read())
    assert m, "docs/mlx.md no longer shows how to start mlx-lm's server on two ranks"
    words = {"fastcoll-launch": [sys.executable, "-m", "fastcoll.launch"], "DIR": [model], "P": [str(port)]}
    return [w for word in m.group(1).split() for w in words.get(word, [word])]


def graph_env(argv: list[str], graph: str) -> list[str]:
    """argv (a fastcoll-launch command) with FASTCOLL_MLX_GRAPH=1 for its ranks in graph mode, =0
    eagerly (the eager path is no longer what an unset FASTCOLL_MLX_GRAPH gives)."""
    at = argv.index("fastcoll.launch") + 1
    return argv[:at] + ["--env", f"FASTCOLL_MLX_GRAPH={int(graph == 'graph')}"] + argv[at:]


@pytest.mark.parametrize("graph", ["eager", "graph"])
@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_mlx_lm_server_on_two_ranks(models, single_process_answers, mode, graph, tmp_path):
    port = free_port()
    argv = graph_env(documented_server(models["plain"], port), graph)
    if mode == "pipeline":
        argv.append("--pipeline")
    with server(argv, port, tmp_path / "server.log"):
        answers = ask_concurrently(port)
        again = ask_concurrently(port)  # the server keeps serving
    assert answers == single_process_answers, (answers, single_process_answers)
    assert again == single_process_answers
    log = (tmp_path / "server.log").read_text()
    assert "deprecated" not in log.lower(), log[-4000:]  # the documented command is the current one
    assert "collectives run eagerly instead" not in log, log[-4000:]


@pytest.mark.parametrize("graph", ["eager", "graph"])
@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_mlx_lm_server_really_shards_the_model(models, single_process_answers, mode, graph, tmp_path):
    """The documented command with `-m mlx_lm` replaced by tests/progs/lm_probe.py, which runs
    mlx-lm's command as it is and says what each rank loaded."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load

    whole = sum(v.size for _, v in tree_flatten(load(models["plain"])[0].parameters()))
    port = free_port()
    argv = graph_env(documented_server(models["plain"], port), graph)
    at = argv.index("mlx_lm")
    argv[at - 1:at + 1] = [os.path.join(PROGS, "lm_probe.py")]
    if mode == "pipeline":
        argv.append("--pipeline")
    with server(argv, port, tmp_path / "server.log"):
        answers = ask_concurrently(port)
    assert answers == single_process_answers, (answers, single_process_answers)
    log = (tmp_path / "server.log").read_text()
    held = dict(re.findall(r"^\[\d\] probe: rank (\d): sharded_load gave a model of (\d+) parameters$", log, re.M))
    assert sorted(held) == ["0", "1"], log[-4000:]
    assert all(int(n) < whole for n in held.values()), (held, whole)


def test_fully_shard_training_and_a_quantized_sharded_model(launch, models):
    results = launch(2, "nn_clients.py", models["quantized"]).wait(timeout=120)
    assert_ok(results)
    assert all("checks passed" in r.out for r in results)
