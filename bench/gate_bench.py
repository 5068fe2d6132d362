"""The fence gate on a GPU: release latency, the host path, and a token of 64 dependent all-reduces.

    python bench/gate_bench.py single [--gates 10000] [--out DIR]     one rank, one GPU
    python bench/gate_bench.py ranks [--world 2] [--gpus 0,1] [--out DIR]   ranks on localhost
    python bench/gate_bench.py poll [--out DIR]                       CPU only: the arrival poll
    python bench/gate_bench.py report DIR                             markdown tables of DIR/*.json

(a) release latency: the host stores RELEASE, and times until the GPU has continued, i.e. until a
    one-thread kernel placed after the gate's result (fc_mark) has stored into the control page;
    ACK (the spin observed the store) is timed too. Against it: a fresh submission, the host
    submitting that kernel itself (submit -> running, and submit -> eval returned).
(b) the host path: evaluate, exchange on the host, make the next array: per dependent all-reduce.
(c) a token: 64 dependent small all-reduces (y = all_reduce(y + 1, "mean")), evaluated once per
    token with the gate and at every all-reduce on the host path; time per token.
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

LAYERS = 64  # all-reduces per token (c)
ROW = 4096  # elements of a row: bf16 hidden size 4096 = 8 KiB
MAX_ITERS = 50_000_000
# The hand-driven release test bounds its spin lower: a missed release shows up in ~seconds.
BENCH_MAX_ITERS = 5_000_000


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


# ------------------------------------------------------------------------------------------------
# (a) release latency, by hand on the control page (the gate's own kernels, no service thread)


def release_latency(backend, n: int, nbytes: int, dtype, warmup: int = 50) -> dict:
    import mlx.core as mx

    from fastcoll.gate import layout as L
    from fastcoll.gate.page import ControlPage
    from fastcoll.gate.sim import raw_bytes

    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    itemsize = np.dtype(np.float16).itemsize if dtype in (mx.bfloat16, mx.float16) else 4
    x = mx.zeros((nbytes // itemsize,), dtype=dtype)
    mx.eval(x)
    token = backend.initial_token()
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
        out, token = backend.launch(x, seq, nbytes, BENCH_MAX_ITERS, token)
        marked = backend.mark(seq, out)
        mx.async_eval(marked)
        if wait_word(L.ARRIVAL, seq, 10.0) is None:
            missed += 1
            break
        pattern = (seq * 7 + 1) % 251
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
            "spin_copy": nbytes <= backend.spin_copy_max_bytes,
            "ack_us": stats(ack_us), "continue_us": stats(mark_us), "spin_iters": stats(iters)}


def fresh_submission(backend, n: int, warmup: int = 50) -> dict:
    """The host submits the one-thread kernel itself: submit -> running, submit -> eval returned."""
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
        if i >= warmup:
            running_us.append((t1 - t0) * 1e6)
        # the full round trip of a fresh kernel, as the host path pays it per all-reduce
        t0 = time.perf_counter()
        mx.eval(backend.mark(seq, ready))
        t3 = time.perf_counter()
        if i >= warmup:
            eval_us.append((t3 - t0) * 1e6)
    return {"submit_to_running_us": stats(running_us), "submit_to_eval_returned_us": stats(eval_us)}


# ------------------------------------------------------------------------------------------------
# (b), (c) on one rank: the Gate with a local service thread vs the host path


def token_loop_single(gate, tokens: int, dtype, row: int) -> dict:
    import mlx.core as mx

    from fastcoll.gate.sim import SerialService

    service = SerialService()
    exchange = lambda send: np.array(send, copy=True)  # one rank: the all-reduce is a copy

    def gated(y):
        for _ in range(LAYERS):
            y = gate.all_reduce(y + 1, "mean", exchange, service.submit)
        return y

    def host(y):
        for _ in range(LAYERS):
            y = y + 1
            mx.eval(y)
            h = np.array(y.view(mx.uint16) if y.dtype == mx.bfloat16 else y, copy=False)
            r = exchange(h.reshape(-1))
            y = mx.array(r.reshape(y.shape))
            if dtype == mx.bfloat16:
                y = y.view(mx.bfloat16)
        return y

    out = {}
    for name, fn in (("gate", gated), ("host", host)):
        times = []
        for t in range(tokens + 3):
            x = mx.zeros((row,), dtype=dtype)
            mx.eval(x)
            t0 = time.perf_counter()
            y = fn(x)
            mx.eval(y)
            dt = time.perf_counter() - t0
            if float(y[0].item()) != LAYERS:
                raise AssertionError(f"{name} path: token gave {y[0].item()}, expected {LAYERS}")
            if t >= 3:
                times.append(dt * 1e3)
        out[name] = {"ms_per_token": stats(times)}
    gate.check()
    service.close()
    return out


def host_path_single(n: int, dtype, row: int) -> dict:
    """(b) evaluate, exchange on the host (a copy for one rank), make the next array."""
    import mlx.core as mx

    y = mx.zeros((row,), dtype=dtype)
    mx.eval(y)
    times = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        y = y + 1
        mx.eval(y)
        h = np.array(y.view(mx.uint16) if dtype == mx.bfloat16 else y, copy=False)
        r = np.array(h, copy=True)
        y = mx.array(r)
        if dtype == mx.bfloat16:
            y = y.view(mx.bfloat16)
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e6)
    return {"us_per_allreduce": stats(times)}


def cmd_single(args) -> None:
    import mlx.core as mx

    from fastcoll.config import Config
    from fastcoll import cuda as cuda_kernels
    from fastcoll.cuda.advise import advise_towards_host
    from fastcoll.gate import probe
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gate.mlx_backend import MlxBackend

    if cuda_kernels.unavailable():
        sys.exit(f"gate_bench single: {cuda_kernels.unavailable()}")
    res: dict = {"host": socket.gethostname(), "mlx": mx.__version__, "python": platform.python_version(),
                 "device": str(mx.default_device()), "gates": args.gates}
    try:
        res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    t0 = time.perf_counter()
    gate = probe(Config(fast_sync=True, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS))
    res["probe_s"] = time.perf_counter() - t0
    if gate is None:
        sys.exit("gate_bench single: probe() returned None (see the log above)")
    print(f"probe ok in {res['probe_s']:.2f}s", flush=True)
    layout = ControlLayout(64 * 1024)
    advised = MlxBackend(cuda_kernels, layout, advise=lambda p: advise_towards_host(p, 0))
    plain = MlxBackend(cuda_kernels, layout)
    res["advice_applied"] = advised._undo_advice is not None
    row_bytes = ROW * 2

    def step(name, fn, *a, **k):
        t = time.perf_counter()
        r = fn(*a, **k)
        print(f"{name}: {json.dumps(r)[:400]} ({time.perf_counter() - t:.1f}s)", flush=True)
        res[name] = r

    step("release_8k_advised", release_latency, advised, args.gates, row_bytes, mx.bfloat16)
    step("release_8k_unadvised", release_latency, plain, min(args.gates, 1000), row_bytes, mx.bfloat16)
    for nbytes in (64, 1024, 65536):
        step(f"release_{nbytes}_advised", release_latency, advised, 1000, nbytes, mx.float32)
    for nbytes in (1024, row_bytes, 65536):  # the other copy-out path, for the cut-off
        advised.spin_copy_max_bytes = 1 << 30
        step(f"release_{nbytes}_spin_copy", release_latency, advised, 300, nbytes, mx.float32)
        advised.spin_copy_max_bytes = 0
        step(f"release_{nbytes}_deliver", release_latency, advised, 300, nbytes, mx.float32)
    advised.spin_copy_max_bytes = gate._backend.spin_copy_max_bytes
    step("fresh_submission", fresh_submission, advised, 2000)
    step("host_path_8k", host_path_single, 2000, mx.bfloat16, ROW)
    step("token_8k", token_loop_single, gate, args.tokens, mx.bfloat16, ROW)
    step("token_64b", token_loop_single, gate, args.tokens, mx.float32, 16)
    gate.close()
    dump(Path(args.out), "gate_single", res)


def cmd_breakdown(args) -> None:
    """Where a gated token's time goes: building the graph, evaluating it, the host half's turn."""
    import mlx.core as mx

    from fastcoll.config import Config
    from fastcoll import cuda as cuda_kernels
    from fastcoll.gate import probe
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gate.mlx_backend import MlxBackend
    from fastcoll.gate.sim import SerialService

    res: dict = {}
    backend = MlxBackend(cuda_kernels, ControlLayout(64 * 1024))
    y = mx.zeros((ROW,), dtype=mx.bfloat16)
    mx.eval(y)
    tok = backend.initial_token()

    def per_call(fn, n=640):
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6

    res["build_us"] = {
        "y_plus_1": per_call(lambda: y + 1),
        "params_array": per_call(lambda: mx.array([1, 8192, 1000, 4096], dtype=mx.uint32)),
        "launch_deliver_path": per_call(lambda: backend.launch(y, 1, 8192, 1000, tok)),
        "launch_spin_copy_path": per_call(lambda: backend.launch(y[:16], 1, 32, 1000, tok)),
    }
    # Baselines for the token's evaluation: the same 64 layers without gates, and with every gate
    # released by the host before the evaluation starts (the kernels alone, no host turn).
    from fastcoll.gate import layout as L
    from fastcoll.gate.page import ControlPage

    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    no_gate, prereleased = [], []
    seq = 0
    for t in range(args.tokens + 3):
        x = mx.zeros((ROW,), dtype=mx.bfloat16)
        mx.eval(x)
        t0 = time.perf_counter()
        for _ in range(LAYERS):
            x = x + 1
        mx.eval(x)
        t1 = time.perf_counter()
        for _ in range(LAYERS):
            seq += 1
            x, tok = backend.launch(x + 1, seq, 8192, MAX_ITERS, tok)
        page.store(L.STATUS, L.OK)
        page.store(L.RELEASE, seq)
        t2 = time.perf_counter()
        mx.eval(x)
        t3 = time.perf_counter()
        if t >= 3:
            no_gate.append((t1 - t0) * 1e3)
            prereleased.append((t3 - t2) * 1e3)
    res["no_gate_token_ms"] = stats(no_gate)
    res["prereleased_token_eval_ms"] = stats(prereleased)
    gate = probe(Config(fast_sync=True, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS, gate_profile=True))
    service = SerialService()
    exchange = lambda send: np.array(send, copy=True)
    build, run = [], []
    for t in range(args.tokens + 3):
        x = mx.zeros((ROW,), dtype=mx.bfloat16)
        mx.eval(x)
        t0 = time.perf_counter()
        for _ in range(LAYERS):
            x = gate.all_reduce(x + 1, "mean", exchange, service.submit)
        t1 = time.perf_counter()
        mx.eval(x)
        t2 = time.perf_counter()
        if t >= 3:
            build.append((t1 - t0) * 1e3)
            run.append((t2 - t1) * 1e3)
    service.submit(lambda: None).result(10)
    res["token_build_ms"] = stats(build)
    res["token_eval_ms"] = stats(run)
    res["profile"] = gate.profile().summary()
    gate.close()
    service.close()
    print(json.dumps(res, indent=1), flush=True)
    dump(Path(args.out), "gate_breakdown", res)


# ------------------------------------------------------------------------------------------------
# ranks on localhost, through the core (fastcoll.init / fastcoll.all_reduce)


def cmd_worker(args) -> None:
    import mlx.core as mx

    import fastcoll

    g = fastcoll.init()
    rank = g.rank()
    gated = g.gate is not None
    dtype = mx.bfloat16
    res = {"rank": rank, "size": g.size(), "gated": gated, "fast_sync": os.environ.get("FASTCOLL_FAST_SYNC"),
           "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    y = mx.zeros((ROW,), dtype=dtype)
    for _ in range(3):
        y = fastcoll.all_reduce(y + 1, op="mean")
    mx.eval(y)
    # (b) per dependent all-reduce, evaluated each time (what the host path always does)
    times = []
    for i in range(args.ops + 20):
        t0 = time.perf_counter()
        y = fastcoll.all_reduce(y + 1, op="mean")
        mx.eval(y)
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e6)
    res["us_per_allreduce_evaluated"] = stats(times)
    # (c) tokens of 64 dependent all-reduces, evaluated once per token
    times = []
    for t in range(args.tokens + 3):
        y = mx.zeros((ROW,), dtype=dtype)
        mx.eval(y)
        t0 = time.perf_counter()
        for _ in range(LAYERS):
            y = fastcoll.all_reduce(y + 1, op="mean")
        mx.eval(y)
        dt = time.perf_counter() - t0
        if float(y[0].item()) != LAYERS:
            raise AssertionError(f"rank {rank}: token gave {y[0].item()}, expected {LAYERS}")
        if t >= 3:
            times.append(dt * 1e3)
    res["ms_per_token"] = stats(times)
    fastcoll.check()
    if gated and g.gate.profile() is not None:
        res["profile"] = g.gate.profile().summary()
    fastcoll.finalize()
    if rank == 0:
        dump(Path(args.out), args.tag, res)


def cmd_ranks(args) -> None:
    gpus = args.gpus.split(",") if args.gpus else [None] * args.world
    runs = [("host", {"FASTCOLL_FAST_SYNC": "0"}), ("gate", {"FASTCOLL_FAST_SYNC": "1"}),
            ("gate_profile", {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_GATE_PROFILE": "1"})]
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
            cmd = [sys.executable, __file__, "worker", "--out", args.out, "--tag", name,
                   "--ops", str(args.ops if tag != "gate_profile" else 200),
                   "--tokens", str(args.tokens if tag != "gate_profile" else 10)]
            log = open(f"/tmp/gate_bench_{name}_{r}.log", "w")
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        codes = [p.wait(timeout=args.timeout) for p, _ in procs]
        for p, log in procs:
            log.close()
        print(f"ranks {tag}: exit codes {codes}", flush=True)
        if any(codes):
            for r in range(args.world):
                text = Path(f"/tmp/gate_bench_{args.tag_prefix}{tag}_{r}.log").read_text()
                print(f"--- rank {r} log tail ---\n{text[-2500:]}", flush=True)


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
    from fastcoll.gate.sim import SerialService, SimDevice, loop_rate

    def with_poll(spin_s: float) -> float:
        device = SimDevice(ControlLayout(4096))
        gate = Gate(device, Config(fast_sync=True, gate_max_bytes=4096), poller=Poller(spin_s=spin_s))
        service = SerialService()
        device.hold()  # the arrival does not come: the service thread polls throughout
        r = gate.all_reduce(mx.arange(8, dtype=mx.float32), "sum", lambda s: np.array(s), service.submit)
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


def _f(st: dict, key: str = "median") -> str:
    return "n/a" if not st or st.get("n", 1) == 0 or key not in st else f"{st[key]:.1f}"


def cmd_report(args) -> None:
    """Markdown tables from the JSON files that single/breakdown/ranks/poll wrote into DIR."""
    d = Path(args.dir)
    load = lambda name: json.loads((d / f"{name}.json").read_text()) if (d / f"{name}.json").exists() else None
    lines = []
    s = load("gate_single")
    if s:
        lines += [f"One rank, {s.get('gpu', '?').splitlines()[0]}, MLX {s['mlx']}; probe {s['probe_s']:.1f} s "
                  f"(kernel compilation and self-test); control page advised towards host: {s['advice_applied']}.", "",
                  "(a) Release latency, microseconds (host store of RELEASE -> ...):", "",
                  "| payload | copy-out | gates | missed | wrong | spin acknowledged: median | p90 | p99 "
                  "| next kernel running: median | p90 | p99 |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for k, v in s.items():
            if isinstance(v, dict) and "continue_us" in v:
                label = k.replace("release_", "").replace("_", " ")
                path = "spinning thread" if v["spin_copy"] else "fc_deliver"
                a, c = v["ack_us"], v["continue_us"]
                lines.append(f"| {label} | {path} | {v['gates']} | {v['missed']} | {v['wrong']} | {_f(a)} | "
                             f"{_f(a, 'p90')} | {_f(a, 'p99')} | {_f(c)} | {_f(c, 'p90')} | {_f(c, 'p99')} |")
        f = s["fresh_submission"]
        lines += ["", "Fresh submission instead of a gate, microseconds (2000 each):", "",
                  "| measure | median | p90 | p99 |", "| --- | --- | --- | --- |"]
        for k, v in f.items():
            lines.append(f"| {k.replace('_us', '').replace('_', ' ')} | {_f(v)} | {_f(v, 'p90')} | {_f(v, 'p99')} |")
        h = s["host_path_8k"]["us_per_allreduce"]
        lines += ["", f"(b) Host path, one rank, 8 KiB bf16: evaluate, copy on the host, new array: median "
                      f"{_f(h)} us, p90 {_f(h, 'p90')} us per all-reduce.", "",
                  "(c) Token of 64 dependent all-reduces, one rank, ms per token:", "",
                  "| row | gate: median | p90 | host path: median | p90 | host / gate |", "| --- | --- | --- | --- | --- | --- |"]
        for k, label in (("token_8k", "4096 x bf16 (8 KiB)"), ("token_64b", "16 x f32 (64 B)")):
            g, hp = s[k]["gate"]["ms_per_token"], s[k]["host"]["ms_per_token"]
            lines.append(f"| {label} | {g['median']:.2f} | {g['p90']:.2f} | {hp['median']:.2f} | {hp['p90']:.2f} "
                         f"| {hp['median'] / g['median']:.2f} |")
    b = load("gate_breakdown")
    if b:
        p = b["profile"]
        lines += ["", "Where a one-rank gated token goes (8 KiB bf16, FASTCOLL_GATE_PROFILE=1), ms per token "
                      "(median): build the graph "
                      f"{b['token_build_ms']['median']:.2f}, evaluate it {b['token_eval_ms']['median']:.2f}; "
                      f"the same 64 layers without gates {b['no_gate_token_ms']['median']:.2f}; with every gate "
                      f"released before the evaluation {b['prereleased_token_eval_ms']['median']:.2f}. Building one "
                      f"gate into the graph: {b['build_us']['launch_deliver_path']:.1f} us. Per gate on the service "
                      f"thread (median / p90, us): arrival wait {_f(p['arrival_us'])} / {_f(p['arrival_us'], 'p90')}, "
                      f"exchange {_f(p['exchange_us'])} / {_f(p['exchange_us'], 'p90')}, host turn "
                      f"{_f(p['host_us'])} / {_f(p['host_us'], 'p90')}, release {_f(p['release_us'])} / "
                      f"{_f(p['release_us'], 'p90')}, spin iterations {_f(p['spin_iters'])}."]
    rows = []
    for prefix, label in (("gate_ranks", "2 ranks, one H200 each"), ("gate_ranks1gpu", "2 ranks sharing one H200")):
        host, gate, prof = load(f"{prefix}_host"), load(f"{prefix}_gate"), load(f"{prefix}_gate_profile")
        if host and gate:
            hu, gu = host["us_per_allreduce_evaluated"], gate["us_per_allreduce_evaluated"]
            ht, gt = host["ms_per_token"], gate["ms_per_token"]
            rel = prof["profile"]["release_us"] if prof and prof.get("profile") else {}
            ex = prof["profile"]["exchange_us"] if prof and prof.get("profile") else {}
            rows.append(f"| {label} | {_f(hu)} | {_f(gu)} | {ht['median']:.2f} | {gt['median']:.2f} | "
                        f"{ht['median'] / gt['median']:.2f} | {_f(rel)} / {_f(rel, 'p90')} | {_f(ex)} |")
    if rows:
        lines += ["", "Through the core (fastcoll.init / fastcoll.all_reduce, op=mean, 4096 x bf16), rank 0:", "",
                  "| ranks | (b) host path, us per all-reduce evaluated | gate, us per all-reduce evaluated "
                  "| (c) host path, ms per token | gate, ms per token | host / gate | gate release us "
                  "(median / p90) | exchange us (median) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"] + rows
    for name in ("gate_poll_h200host", "gate_poll_cpu2core", "gate_poll"):
        pl = load(name)
        if pl:
            lines += ["", f"Arrival polling vs the caller's Python loop ({name}: {pl['cores']} cores, Python "
                          f"{pl['python']}), loop rate as a fraction of the loop alone (median of {pl['reps']}):", "",
                      "| beside the loop | ratio |", "| --- | --- |"]
            for k in ("alone", "yielding_poll", "napping_poll", "gil_holding_poll", "process_burning_a_core"):
                lines.append(f"| {k.replace('_', ' ')} | {pl[k]['ratio_to_alone']:.2f} |")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("single")
    p.add_argument("--gates", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p = sub.add_parser("breakdown")
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p = sub.add_parser("ranks")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--gpus", default="")
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--tag-prefix", default="gate_ranks_")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p = sub.add_parser("worker")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=30)
    p = sub.add_parser("poll")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--name", default="gate_poll")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p = sub.add_parser("report")
    p.add_argument("dir")
    args = ap.parse_args()
    {"single": cmd_single, "breakdown": cmd_breakdown, "ranks": cmd_ranks, "worker": cmd_worker, "poll": cmd_poll,
     "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
