"""The fence gate on a GPU: where a gate's time goes, whether it is right, and chains of dependent
all-reduces beside the host path.

    python bench/gate_bench.py profile [--gates 10000] [--tokens 30] [--out DIR]   one rank, one GPU
    python bench/gate_bench.py ranks [--world 2] [--gpus 0,0] [--out DIR]          ranks on localhost
    python bench/gate_bench.py kill [--timeout 20] [--out DIR]                      a peer killed mid-token
    python bench/gate_bench.py poll [--out DIR]                                     CPU only: the arrival poll
    python bench/gate_bench.py report DIR                                           markdown tables of DIR/*.json

A token is LAYERS dependent small all-reduces, y = all_reduce(y + 1, "mean"), checked to give
LAYERS. "serial" builds the whole token's graph, then evaluates it (what the host path always
does per all-reduce); "pipelined" builds token t + 1 while token t runs (mx.async_eval, as
mlx-lm's generation loop does). Two ranks sharing one GPU need CUDA MPS started first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # gate_sim: the test double of a GPU, which the package does not ship

LAYERS = 64  # all-reduces per token
ROW = 4096  # elements of a row: bf16 hidden size 4096 = 8 KiB
MAX_ITERS = 50_000_000
OUT = ROOT / "bench" / "out"


def stats(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"n": 0}
    return {"n": int(v.size), "median": float(np.median(v)), "p10": float(np.percentile(v, 10)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99)),
            "mean": float(v.mean()), "max": float(v.max())}


def dump(out: Path, name: str, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    print(f"wrote {out / (name + '.json')}", flush=True)


def per_call_us(fn, n: int = 2000) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def machine() -> dict:
    import mlx.core as mx

    res = {"host": socket.gethostname(), "mlx": mx.__version__, "python": platform.python_version(),
           "device": str(mx.default_device()), "cores": os.cpu_count(),
           "switch_interval_s": sys.getswitchinterval()}
    try:
        res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    return res


# ------------------------------------------------------------------------------------------------
# one rank: by hand on the control page, and the Gate with a local service thread


def same(send: np.ndarray, gathered: np.ndarray) -> None:
    """One rank's exchange: its own bytes are the whole gather."""
    gathered[:] = send


def release_latency(backend, n: int, count: int, dtype, warmup: int = 50) -> dict:
    """Gates driven by hand: the host stores RELEASE as soon as ARRIVAL shows, and times until the
    spin acknowledged it (ACK) and until a kernel placed after the result ran (fc_mark). Every
    gate's result is checked against the bytes the host put in the receive mailbox."""
    import mlx.core as mx

    from fastcoll.gate import layout as L
    from fastcoll.gate.page import ControlPage
    from gate_sim import raw_bytes

    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    x = mx.zeros((count,), dtype=dtype)
    mx.eval(x)
    nbytes = x.nbytes
    token = backend.initial_token(0)
    ack_us, mark_us, iters = [], [], []
    missed = wrong = 0

    def wait_word(word: int, seq: int, limit_s: float) -> float | None:
        deadline = time.perf_counter() + limit_s
        while page.load(word) != seq:
            if time.perf_counter() > deadline:
                return None
        return time.perf_counter()

    for i in range(n + warmup):
        seq = i + 1
        out, token = backend.launch(x, "sum", 5_000_000, token)
        marked = backend.mark(seq, out)
        mx.async_eval(marked)
        if wait_word(L.ARRIVAL, seq, 10.0) is None:
            missed += 1
            break
        pattern = (seq * 7 + 1) % 251  # finite, normal values in every float dtype
        page.recv[:nbytes] = pattern
        t_store = time.perf_counter()
        page.store(L.STATUS, L.OK)
        page.store(L.RELEASE, seq)
        t_ack = wait_word(L.ACK, seq, 1.0)
        t_mark = wait_word(L.MARK, seq, 1.0)
        mx.eval(marked)
        if t_ack is None or t_mark is None or page.load(L.SPIN_FAILED):
            missed += 1
            continue
        if not np.all(raw_bytes(out) == pattern):
            wrong += 1
        if i >= warmup:
            ack_us.append((t_ack - t_store) * 1e6)
            mark_us.append((t_mark - t_store) * 1e6)
            iters.append(page.load(L.SPIN_ITERS))
    return {"gates": n, "nbytes": nbytes, "missed": missed, "wrong": wrong,
            "ack_us": stats(ack_us), "continue_us": stats(mark_us), "spin_iters": stats(iters)}


def fresh_submission(backend, n: int, warmup: int = 50) -> dict:
    """What the host path pays instead of a release: the host builds and submits a one-thread
    kernel itself (submit -> running, submit -> eval returned)."""
    import mlx.core as mx

    from fastcoll.gate import layout as L
    from fastcoll.gate.page import ControlPage

    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    ready = mx.zeros((8,), dtype=mx.uint32)
    mx.eval(ready)
    running_us, eval_us = [], []
    for i in range(n + warmup):
        seq = i + 1
        t0 = time.perf_counter()
        marked = backend.mark(seq, ready)
        mx.async_eval(marked)
        while page.load(L.MARK) != seq:
            pass
        t1 = time.perf_counter()
        mx.eval(marked)
        t2 = time.perf_counter()
        mx.eval(backend.mark(seq, ready))
        t3 = time.perf_counter()
        if i >= warmup:
            running_us.append((t1 - t0) * 1e6)
            eval_us.append((t3 - t2) * 1e6)
    return {"submit_to_running_us": stats(running_us), "submit_to_eval_returned_us": stats(eval_us)}


def tokens(build, n: int, dtype, row: int, pipelined: bool = False) -> dict:
    """ms per token of `build(y)` (LAYERS all-reduces of y + 1, mean), checked every token."""
    import mlx.core as mx

    def fresh():
        x = mx.zeros((row,), dtype=dtype)
        mx.eval(x)
        return x

    times, build_ms = [], []
    if pipelined:
        prev = build(fresh())
        mx.async_eval(prev)
        t_last = time.perf_counter()
        for t in range(n + 3):
            nxt = build(fresh())
            mx.async_eval(nxt)
            mx.eval(prev)
            now = time.perf_counter()
            if float(prev[0].item()) != LAYERS:
                raise AssertionError(f"token gave {prev[0].item()}, expected {LAYERS}")
            if t >= 3:
                times.append((now - t_last) * 1e3)
            t_last, prev = now, nxt
        mx.eval(prev)
        return {"ms_per_token": stats(times)}
    for t in range(n + 3):
        x = fresh()
        t0 = time.perf_counter()
        y = build(x)
        t1 = time.perf_counter()
        mx.eval(y)
        t2 = time.perf_counter()
        if float(y[0].item()) != LAYERS:
            raise AssertionError(f"token gave {y[0].item()}, expected {LAYERS}")
        if t >= 3:
            times.append((t2 - t0) * 1e3)
            build_ms.append((t1 - t0) * 1e3)
    return {"ms_per_token": stats(times), "build_ms": stats(build_ms)}


def host_path_1rank(y):
    """One rank's host path per layer: evaluate, exchange on the host (a copy), a new array."""
    import mlx.core as mx

    bf16 = y.dtype == mx.bfloat16
    for _ in range(LAYERS):
        y = y + 1
        mx.eval(y)
        h = np.array(y.view(mx.uint16) if bf16 else y, copy=False)
        y = mx.array(np.array(h, copy=True))
        if bf16:
            y = y.view(mx.bfloat16)
    return y


def one_rank_direct_gate(config):
    """A CUDA gate in the direct mode over a gather segment of this process alone: each gate's
    spin waits for this GPU's own arrival only. None where no segment can be set up."""
    from fastcoll.cuda import LANGUAGE as cuda
    from fastcoll.gate import Gate, direct_mode
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gpu.mlx_backend import MlxBackend

    gather = direct_mode.setup(lambda what, values: np.array([values], dtype=np.int64), 0, 1,
                               config.gate_max_bytes, cuda.share_host_memory)
    if gather is None:
        return None
    gate = Gate(MlxBackend(cuda, ControlLayout(config.gate_max_bytes, 1), advise=cuda.advise_page), config)
    gate.use_direct(gather)
    return gate


def cmd_profile(args) -> None:
    """One rank, one GPU: where a gate's time goes, release latency and correctness, tokens."""
    import mlx.core as mx

    from fastcoll import dtypes
    from fastcoll.config import Config
    from fastcoll.cuda import LANGUAGE as cuda
    from fastcoll.gate import Gate
    from fastcoll.gate import layout as L
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gate.page import ControlPage
    from fastcoll.gate.probe import probe
    from fastcoll.gpu.mlx_backend import MlxBackend
    from gate_sim import SerialService

    if cuda.unavailable():
        sys.exit(f"gate_bench profile: {cuda.unavailable()}")
    res: dict = machine()
    t0 = time.perf_counter()
    gate = probe(Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS))
    res["probe_s"] = time.perf_counter() - t0
    if gate is None:
        sys.exit("gate_bench profile: probe() returned None (see the log above)")
    print(f"probe ok in {res['probe_s']:.2f}s", flush=True)
    layout = ControlLayout(64 * 1024, 1)
    advised = MlxBackend(cuda, layout, advise=cuda.advise_page)
    plain = MlxBackend(cuda, layout)
    res["advice_applied"] = advised._undo_advice is not None

    def step(name, fn, *a, **k):
        t = time.perf_counter()
        r = fn(*a, **k)
        print(f"{name}: {json.dumps(r)[:600]} ({time.perf_counter() - t:.1f}s)", flush=True)
        res[name] = r

    # 1. Building a gate into the graph: Python's share, piece by piece.
    y8 = mx.zeros((ROW,), dtype=mx.bfloat16)
    y64 = mx.zeros((16,), dtype=mx.float32)
    mx.eval(y8, y64)
    tok = advised.initial_token(0)
    advised.launch(y8, "mean", MAX_ITERS, tok)
    kernel, kwargs = advised._calls[(y8.dtype, y8.shape, "mean", MAX_ITERS)]
    side = Gate(plain, Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS))
    host = dtypes.host_dtype("bfloat16")
    a, b = np.ones(ROW, host), np.ones(ROW, host)
    combine = dtypes.reducer("bfloat16", "sum")
    step("python_us", lambda: {
        "y_plus_1": per_call_us(lambda: y8 + 1),
        "one_kernel_call": per_call_us(lambda: kernel(inputs=[y8, advised._ctrl, tok], **kwargs)),
        "launch_8k": per_call_us(lambda: advised.launch(y8, "mean", MAX_ITERS, tok)),
        "launch_64b": per_call_us(lambda: advised.launch(y64, "mean", MAX_ITERS, tok)),
        "gate_all_reduce_8k": per_call_us(lambda: side.all_reduce(y8, "mean", same, lambda fn: None), 1000),
        "params_array_as_before": per_call_us(lambda: mx.array([1, 8192, 1000, 4096], dtype=mx.uint32)),
        "host_bf16_reduce_8k_as_before": per_call_us(lambda: (combine(a, b, a), dtypes.finish_mean("bfloat16", a, 2))),
        "numpy_copy_8k": per_call_us(lambda: np.copyto(a, b)),
    })
    side.close()

    # 2. The kernels alone: a token with every gate released before its evaluation, beside the
    # same 64 layers without gates.
    page = ControlPage(advised.page, advised.layout)
    page.reset(1)
    seq = 0
    tok = advised.initial_token(0)

    def prereleased(x):
        nonlocal seq, tok
        for _ in range(LAYERS):
            x, tok = advised.launch(x + 1, "sum", MAX_ITERS, tok)
            seq += 1
        page.recv[: ROW * 2] = 0
        page.store(L.STATUS, L.OK)
        page.store(L.RELEASE, seq)
        return x

    def timed_eval(build, n):
        out = []
        for t in range(n + 3):
            x = mx.zeros((ROW,), dtype=mx.bfloat16)
            mx.eval(x)
            y = build(x)
            t0 = time.perf_counter()
            mx.eval(y)
            if t >= 3:
                out.append((time.perf_counter() - t0) * 1e3)
        return {"eval_ms": stats(out)}

    def no_gate(x):
        for _ in range(LAYERS):
            x = x + 1
        return x

    step("token_no_gate", timed_eval, no_gate, args.tokens)
    step("token_prereleased", timed_eval, prereleased, args.tokens)

    # 3. Release latency and correctness, by hand (no service thread).
    step("release_8k_advised", release_latency, advised, args.gates, ROW, mx.bfloat16)
    step("release_8k_unadvised", release_latency, plain, min(args.gates, 1000), ROW, mx.bfloat16)
    step("release_64b", release_latency, advised, 1000, 16, mx.float32)
    step("release_16k", release_latency, advised, 1000, 4096, mx.float32)
    step("fresh_submission", fresh_submission, advised, 1000)

    # 4. Tokens through the Gate and a local service thread (one rank: the exchange is a copy).
    service = SerialService()
    gated = lambda g: (lambda y: _chain(y, lambda v: g.all_reduce(v, "mean", same, service.submit)))
    step("token_gate_8k", tokens, gated(gate), args.tokens, mx.bfloat16, ROW)
    step("token_gate_8k_pipelined", tokens, gated(gate), args.tokens, mx.bfloat16, ROW, True)
    step("token_host_8k", tokens, host_path_1rank, args.tokens, mx.bfloat16, ROW)
    step("token_gate_64b", tokens, gated(gate), args.tokens, mx.float32, 16)
    step("token_host_64b", tokens, host_path_1rank, args.tokens, mx.float32, 16)
    gate.check()
    # The direct mode with one rank: the GPU's own FLAG is all its spin waits for, so this is the
    # gate's kernels with no host turn at all (fastcoll/gate/direct_mode.py).
    solo = one_rank_direct_gate(Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024,
                                       fence_max_iters=MAX_ITERS))
    res["direct_1rank_available"] = solo is not None
    if solo is not None:
        step("token_direct_8k", tokens, gated(solo), args.tokens, mx.bfloat16, ROW)
        step("token_direct_8k_pipelined", tokens, gated(solo), args.tokens, mx.bfloat16, ROW, True)
        step("token_direct_64b", tokens, gated(solo), args.tokens, mx.float32, 16)
        solo.check()
        solo.close()
    prof = Gate(plain, Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS, gate_profile=True))
    step("token_gate_8k_profiled", tokens, gated(prof), 10, mx.bfloat16, ROW)
    service.submit(lambda: None).result(10)
    res["profile"] = prof.profile().summary()
    prof.close()
    gate.close()
    service.close()
    dump(Path(args.out), "gate_profile", res)


def _chain(y, allreduce):
    for _ in range(LAYERS):
        y = allreduce(y + 1)
    return y


# ------------------------------------------------------------------------------------------------
# ranks on localhost, through the core (fastcoll.init / fastcoll.all_reduce)


def cmd_worker(args) -> None:
    import mlx.core as mx

    import fastcoll

    g = fastcoll.init()
    rank = g.rank()
    gated = g._job.gate is not None
    res = {"rank": rank, "size": g.size(), "gated": gated, "fast_sync": os.environ.get("FASTCOLL_FAST_SYNC"),
           "direct": gated and g._job.gate.direct,
           "transport": g.transport_info(), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), **machine()}
    allreduce = lambda y: fastcoll.all_reduce(y + 1, op="mean")
    for row, dtype_name in ((int(r), d) for r, d in (part.split(":") for part in args.rows.split(","))):
        dtype = getattr(mx, dtype_name)
        key = f"{dtype_name}_{row}"
        y = mx.zeros((row,), dtype=dtype)
        for _ in range(3):
            y = allreduce(y)
        mx.eval(y)
        times = []  # per dependent all-reduce, evaluated each time (what the host path always does)
        for i in range(args.ops + 20):
            t0 = time.perf_counter()
            y = allreduce(y)
            mx.eval(y)
            if i >= 20:
                times.append((time.perf_counter() - t0) * 1e6)
        res[f"{key}_us_per_allreduce_evaluated"] = stats(times)
        res[f"{key}_serial"] = tokens(lambda v: _chain(v, lambda w: fastcoll.all_reduce(w, op="mean")),
                                      args.tokens, dtype, row)
        if gated:
            res[f"{key}_pipelined"] = tokens(lambda v: _chain(v, lambda w: fastcoll.all_reduce(w, op="mean")),
                                             args.tokens, dtype, row, True)
        print(f"rank {rank} {key}: {res[f'{key}_serial']['ms_per_token']['median']:.2f} ms per token", flush=True)
    if args.exact:
        res["exact"] = exact_gates(args.exact, rank, g.size())
        print(f"rank {rank} exact: {res['exact']}", flush=True)
    fastcoll.check()
    if gated and g._job.gate.profile() is not None:
        res["profile"] = g._job.gate.profile().summary()
    fastcoll.finalize()
    if rank == 0:
        dump(Path(args.out), args.tag, res)


def exact_gates(count: int, rank: int, size: int) -> dict:
    """`count` gated all-reduces (sum of 1024 float32), 64 to a token, each result compared with
    the exact sum: how many came out wrong, and the error a missed release would raise."""
    import mlx.core as mx
    import numpy as np

    import fastcoll

    wrong, error = 0, None
    try:
        for t in range(count // 64):
            ys = [fastcoll.all_reduce(mx.full((1024,), float(rank + 1 + (t * 64 + j) % 7), dtype=mx.float32))
                  for j in range(64)]
            mx.eval(*ys)
            for j, y in enumerate(ys):
                want = sum(p + 1 + (t * 64 + j) % 7 for p in range(size))
                wrong += not bool(np.all(np.array(y) == want))
        fastcoll.check()
    except fastcoll.FastcollError as e:
        error = f"{type(e).__name__}: {e}"
    return {"gates": count // 64 * 64, "wrong": wrong, "error": error}


def cmd_ranks(args) -> None:
    gpus = args.gpus.split(",") if args.gpus else [None] * args.world
    host_mode = {"FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1"}  # the gate's host mode where the direct one would apply
    runs = [("host", {"FASTCOLL_FAST_SYNC": "0"}), ("gate", {"FASTCOLL_FAST_SYNC": "1"}),
            ("gatehost", {"FASTCOLL_FAST_SYNC": "1", **host_mode}),
            ("gate_profile", {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_GATE_PROFILE": "1", **host_mode})]
    for i, (tag, extra) in enumerate(runs):
        port = 29700 + (os.getpid() % 200) + i
        procs = []
        for r in range(args.world):
            env = dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE=str(args.world),
                       FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN="gate-bench",
                       FASTCOLL_TIMEOUT="60", PYTHONUNBUFFERED="1", **extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            if gpus[r % len(gpus)] is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus[r % len(gpus)]
            name = f"{args.tag_prefix}{tag}"
            profile = tag == "gate_profile"
            exact = ["--exact", str(args.exact)] if tag == "gatehost" and args.exact else []
            cmd = [sys.executable, __file__, "worker", "--out", args.out, "--tag", name, *exact,
                   "--ops", str(100 if profile else args.ops), "--tokens", str(10 if profile else args.tokens),
                   "--rows", f"{ROW}:bfloat16" if profile else args.rows]
            log = open(f"/tmp/gate_bench_{name}_{r}.log", "w")
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        codes = []
        for p, log in procs:
            try:
                codes.append(p.wait(timeout=args.timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
            log.close()
        print(f"ranks {tag}: exit codes {codes}", flush=True)
        for r in range(args.world):
            text = Path(f"/tmp/gate_bench_{args.tag_prefix}{tag}_{r}.log").read_text()
            print(f"--- rank {r} log tail ---\n{text[-1500 if any(codes) else -400:]}", flush=True)


def cmd_killworker(args) -> None:
    """One rank of the kill test: rank 1 dies (SIGKILL) in the middle of a token; rank 0 must get
    PeerLostError well within FASTCOLL_TIMEOUT, and its GPU must still run."""
    import signal

    import mlx.core as mx

    import fastcoll

    g = fastcoll.init()
    gate = g._job.gate
    y = mx.zeros((ROW,), dtype=mx.bfloat16)
    y = _chain(y, lambda v: fastcoll.all_reduce(v, op="mean"))
    mx.eval(y)  # one whole token first: both ranks are up and gating
    half = LAYERS // 2
    for _ in range(half):  # the first half of a token, evaluated by both ranks
        y = fastcoll.all_reduce(y + 1, op="mean")
    if g.rank() == 1:
        mx.eval(y)
        os.kill(os.getpid(), signal.SIGKILL)  # gone before the second half: rank 0 waits on it there
    for _ in range(half):
        y = fastcoll.all_reduce(y + 1, op="mean")
    res = {"mode": "direct" if gate is not None and gate.direct else "host" if gate is not None else "no gate",
           "timeout_s": g.config.timeout}
    t0 = time.perf_counter()
    try:
        mx.eval(y)
        fastcoll.check()
        res["error"] = None
    except fastcoll.FastcollError as e:
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds_to_error"] = time.perf_counter() - t0
    z = mx.arange(1024, dtype=mx.float32) * 2  # the GPU still runs
    mx.eval(z)
    res["gpu_runs_after"] = bool(float(z[3].item()) == 6.0)
    fastcoll.finalize()
    dump(Path(args.out), args.tag, res)


def cmd_kill(args) -> None:
    """A peer killed mid-token, in the gate's direct mode and in its host mode."""
    for i, (tag, extra) in enumerate((("kill_direct", {}), ("kill_hostmode", {"FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1"}))):
        port = 29900 + (os.getpid() % 50) + i
        procs = []
        for r in range(2):
            env = dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE="2", FASTCOLL_FAST_SYNC="1",
                       FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN="gate-kill",
                       FASTCOLL_TIMEOUT=str(args.timeout), PYTHONUNBUFFERED="1", **extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            procs.append(subprocess.Popen([sys.executable, __file__, "killworker", "--out", args.out, "--tag", tag],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for r, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=3 * args.timeout + 60)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            print(f"--- {tag} rank {r}: exit {p.returncode}\n{text[-800:]}", flush=True)
        f = Path(args.out) / f"{tag}.json"
        print(f"{tag}: {f.read_text() if f.exists() else 'no result'}", flush=True)


# ------------------------------------------------------------------------------------------------
# the arrival poll against the caller's Python thread (CPU only)


def cmd_poll(args) -> None:
    """The caller's Python loop rate alone and beside a pending arrival poll, interleaved (so that
    other load on the machine hits every case alike); a GIL-holding poll and a process burning a
    core are the contrasts: the first is what the poll avoids, the second is plain CPU contention."""
    import mlx.core as mx

    from fastcoll.config import Config
    from fastcoll.gate import Gate
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gate.poll import DEFAULT_SPIN_S, Poller
    from gate_sim import SerialService, SimDevice, loop_rate

    def with_poll(spin_s: float) -> float:
        device = SimDevice(ControlLayout(4096))
        gate = Gate(device, Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=4096), poller=Poller(spin_s=spin_s))
        service = SerialService()
        device.hold()  # the arrival does not come: the service thread polls throughout
        r = gate.all_reduce(mx.arange(8, dtype=mx.float32), "sum", same, service.submit)
        time.sleep(0.01)
        rate = loop_rate(0.2)
        device.resume()
        r.wait(10)
        gate.close()
        service.close()
        return rate

    def with_naive_poll() -> float:
        stop = threading.Event()
        word = np.zeros(1, np.uint32)

        def naive() -> None:
            while not stop.is_set() and word[0] == 0:
                pass

        t = threading.Thread(target=naive)
        t.start()
        rate = loop_rate(0.2)
        stop.set()
        t.join()
        return rate

    def with_hog() -> float:
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.05)
        rate = loop_rate(0.2)
        p.kill()
        p.wait()
        return rate

    cases = {
        "alone": lambda: loop_rate(0.2),
        "yielding_poll": lambda: with_poll(3600.0),  # every read gives the GIL up (the first spin_s)
        "napping_poll": lambda: with_poll(0.0),  # past spin_s: naps between reads
        "gil_holding_poll": with_naive_poll,
        "process_burning_a_core": with_hog,
    }
    rates: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.reps):
        for k, fn in cases.items():
            rates[k].append(fn())
    alone = float(np.median(rates["alone"]))
    res = {"cpu": platform.machine(), "cores": os.cpu_count(), "host": socket.gethostname(),
           "python": platform.python_version(), "switch_interval_s": sys.getswitchinterval(),
           "spin_s": DEFAULT_SPIN_S, "reps": args.reps, "window_s": 0.2}
    for k, v in rates.items():
        res[k] = {"loops_per_s": float(np.median(v)), "ratio_to_alone": float(np.median(v)) / alone}
    print(json.dumps(res, indent=1), flush=True)
    dump(Path(args.out), args.name, res)


# ------------------------------------------------------------------------------------------------


def _f(st: dict, key: str = "median", digits: int = 1) -> str:
    return "n/a" if not st or st.get("n", 1) == 0 or key not in st else f"{st[key]:.{digits}f}"


def cmd_report(args) -> None:
    """Markdown tables from the JSON files that profile, ranks and poll wrote into DIR."""
    d = Path(args.dir)
    load = lambda name: json.loads((d / f"{name}.json").read_text()) if (d / f"{name}.json").exists() else None
    lines: list[str] = []
    s = load("gate_profile")
    if s:
        py = s["python_us"]
        lines += [f"One rank, {s.get('gpu', '?').splitlines()[0]}, MLX {s['mlx']}, Python {s['python']}; probe "
                  f"{s['probe_s']:.1f} s; control page advised towards host: {s['advice_applied']}.", "",
                  "Python per call, us: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in py.items()) + ".",
                  "", f"A token of {LAYERS} layers, evaluation only, ms: without gates "
                  f"{_f(s['token_no_gate']['eval_ms'], digits=2)}; with every gate released before the evaluation "
                  f"{_f(s['token_prereleased']['eval_ms'], digits=2)}.", "",
                  "Release latency, us (host store of RELEASE -> the spin's ACK / the next kernel running):", "",
                  "| payload | gates | missed | wrong | ACK median | p90 | p99 | next kernel median | p90 | p99 |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for k, v in s.items():
            if isinstance(v, dict) and "continue_us" in v:
                a, c = v["ack_us"], v["continue_us"]
                lines.append(f"| {k.replace('release_', '').replace('_', ' ')} | {v['gates']} | "
                             f"{v['missed']} | {v['wrong']} | {_f(a)} | {_f(a, 'p90')} | {_f(a, 'p99')} | "
                             f"{_f(c)} | {_f(c, 'p90')} | {_f(c, 'p99')} |")
        f = s["fresh_submission"]
        lines += ["", f"A fresh one-thread kernel instead (what the host path pays), us: submit -> running "
                      f"{_f(f['submit_to_running_us'])}, submit -> eval returned {_f(f['submit_to_eval_returned_us'])}.",
                  "", "Tokens on one rank, ms per token (median / p90):", "", "| token | gate | host path | host / gate |",
                  "| --- | --- | --- | --- |"]
        for gk, hk, label in (("token_gate_8k", "token_host_8k", "4096 x bf16 (8 KiB), serial"),
                              ("token_gate_8k_pipelined", "token_host_8k", "4096 x bf16 (8 KiB), gate pipelined"),
                              ("token_gate_64b", "token_host_64b", "16 x f32 (64 B), serial"),
                              ("token_direct_8k", "token_host_8k", "8 KiB, direct mode, serial"),
                              ("token_direct_8k_pipelined", "token_host_8k", "8 KiB, direct mode, pipelined"),
                              ("token_direct_64b", "token_host_64b", "64 B, direct mode, serial")):
            if gk not in s:
                continue
            g, h = s[gk]["ms_per_token"], s[hk]["ms_per_token"]
            lines.append(f"| {label} | {g['median']:.2f} / {g['p90']:.2f} | {h['median']:.2f} / {h['p90']:.2f} | "
                         f"{h['median'] / g['median']:.1f} |")
        p = s.get("profile")
        if p:
            lines += ["", "Per gate on the service thread (one rank, 8 KiB bf16, median / p90, us): " + ", ".join(
                f"{k.replace('_us', '').replace('_', ' ')} {_f(p[k])} / {_f(p[k], 'p90')}"
                for k in ("arrival_us", "exchange_us", "host_us", "release_us", "spin_iters")) + "."]
    for prefix in sorted({p.stem.rsplit("_", 1)[0] for p in d.glob("gate_*_host.json")}):  # not decode_bench's
        host, gate, prof = load(f"{prefix}_host"), load(f"{prefix}_gate"), load(f"{prefix}_gate_profile")
        gh = load(f"{prefix}_gatehost") or {}
        if not (host and gate):
            continue
        lines += ["", f"{prefix}: {gate['size']} ranks, {gate['transport']}, {gate.get('gpu', '?').splitlines()[0]}, "
                      f"rank 0, ms per token of {LAYERS} dependent all-reduces (median / p90); gate: "
                      f"{'direct' if gate.get('direct') else 'host'} mode:", "",
                  "| row | host path, us per all-reduce | host path, token | gate, token (serial) | gate, token (pipelined) "
                  "| host / gate (serial) | gate's host mode, serial | its pipelined |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for key in [k[: -len("_serial")] for k in gate if k.endswith("_serial")]:
            hs, gs = host[f"{key}_serial"]["ms_per_token"], gate[f"{key}_serial"]["ms_per_token"]
            gp = gate.get(f"{key}_pipelined", {}).get("ms_per_token", {})
            hu = host[f"{key}_us_per_allreduce_evaluated"]
            ghs = gh.get(f"{key}_serial", {}).get("ms_per_token", {})
            ghp = gh.get(f"{key}_pipelined", {}).get("ms_per_token", {})
            lines.append(f"| {key} | {_f(hu)} | {_f(hs, digits=2)} / {_f(hs, 'p90', 2)} | {_f(gs, digits=2)} / "
                         f"{_f(gs, 'p90', 2)} | {_f(gp, digits=2)} / {_f(gp, 'p90', 2)} | {hs['median'] / gs['median']:.1f} "
                         f"| {_f(ghs, digits=2)} | {_f(ghp, digits=2)} |")
        if prof and prof.get("profile"):
            p = prof["profile"]
            lines += ["", "Per gate on rank 0's service thread (median / p90, us): " + ", ".join(
                f"{k.replace('_us', '').replace('_', ' ')} {_f(p[k])} / {_f(p[k], 'p90')}"
                for k in ("arrival_us", "exchange_us", "host_us", "release_us", "spin_iters")) + "."]
    for name in sorted(x.stem for x in d.glob("gate_poll*.json")):
        pl = load(name)
        lines += ["", f"Arrival polling vs the caller's Python loop ({name}: {pl['cores']} cores, Python "
                      f"{pl['python']}), loop rate as a fraction of the loop alone (median of {pl['reps']}):", "",
                  "| beside the loop | ratio |", "| --- | --- |"]
        for k in ("alone", "yielding_poll", "napping_poll", "gil_holding_poll", "process_burning_a_core"):
            lines.append(f"| {k.replace('_', ' ')} | {pl[k]['ratio_to_alone']:.2f} |")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("--gates", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--out", default=str(OUT))
    p = sub.add_parser("ranks")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--gpus", default="")
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--rows", default=f"16:float32,{ROW}:bfloat16,8192:bfloat16",
                   help="elements:dtype of each row to measure, comma-separated")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--tag-prefix", default="gate_ranks_")
    p.add_argument("--exact", type=int, default=0, help="gates whose results the host-mode run checks")
    p.add_argument("--out", default=str(OUT))
    p = sub.add_parser("worker")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--rows", default=f"{ROW}:bfloat16")
    p.add_argument("--exact", type=int, default=0)
    p = sub.add_parser("kill")
    p.add_argument("--timeout", type=float, default=20)
    p.add_argument("--out", default=str(OUT))
    p = sub.add_parser("killworker")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p = sub.add_parser("poll")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--name", default="gate_poll")
    p.add_argument("--out", default=str(OUT))
    p = sub.add_parser("report")
    p.add_argument("dir")
    args = ap.parse_args()
    {"profile": cmd_profile, "ranks": cmd_ranks, "worker": cmd_worker, "kill": cmd_kill, "killworker": cmd_killworker,
     "poll": cmd_poll, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
