"""Tensor-parallel decode through mlx-lm's own generation loop, on a llama of random weights made
here (no download): one process unsharded, two ranks on fastcoll's host path, two ranks through
the fence gate, in one run.

    python bench/decode_bench.py [--shape 8b] [--tokens 64] [--runs single,host,gate] [--out DIR]
                                 [--fast-cpus N] [--fast-main]

The loop is `mlx_lm.generate.generate_step` (greedy), which builds the next token's graph while
this one runs (mx.async_eval). Ranks start through `fastcoll-launch` and run
`model.shard(group)` under `fastcoll.mlx_compat`, as a user would. Two ranks on one GPU need CUDA
MPS running. Prints ms per token, tokens/s and the ratio to the single process for each run, and
checks that the gate and the host path generated the same tokens. The `floor_*` runs are sharded
ranks whose all_sum exchanges nothing (floor_all_sum): what any collective must at least cost;
`floor_gate` is the gate's whole path over a gather of each rank alone (solo_gate), so its ranks
never wait for each other. `--fast-main` puts each process's main thread (the one that builds and
submits every token) on a CPU of its own among those fastest just before the run, the single
process's too, so that runs compare on CPUs of equal speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    # Llama 3 8B's shape
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    "2b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=16,
               num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000),  # a smoke test, on any machine
}
PROMPT = 16  # prompt tokens
WARMUP = 8  # tokens left out of the timing (the prompt's step, compilation, first gates)


def make_model(shape: str, seed: int = 0):
    """The same random bf16 llama in every process (one seed, one construction order)."""
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=False, **SHAPES[shape])
    mx.random.seed(seed)
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    return model


def decode(model, n: int, after_warmup=None) -> dict:
    """Greedy decode of n tokens from a fixed random prompt; the tokens and ms between them.
    `after_warmup()` is called once the warm-up tokens are out."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = mx.array(np.random.default_rng(1).integers(0, model.args.vocab_size, PROMPT), dtype=mx.uint32)
    stamps, tokens = [], []
    host = HostTimes(model) if os.environ.get("DECODE_HOST_TIMES") == "1" else None
    threads = None
    for token, _ in generate_step(prompt, host or model, max_tokens=n):
        stamps.append(time.perf_counter())
        tokens.append(int(token))
        if len(tokens) == WARMUP:
            if after_warmup is not None:
                after_warmup()
            if os.environ.get("DECODE_THREADS") == "1" and Path("/proc/self/task").is_dir():
                threads = Threads()
    gaps = np.diff(stamps[WARMUP:]) * 1e3
    res = {"tokens": tokens, "ms_per_token": {"median": float(np.median(gaps)), "p10": float(np.percentile(gaps, 10)),
                                              "p90": float(np.percentile(gaps, 90)), "n": int(gaps.size)}}
    if host is not None:
        res["host_ms"] = host.summary()
    if threads is not None:
        res["threads"] = threads.summary(stamps[-1] - stamps[WARMUP - 1])
    return res


def host_costs(gated: bool, n: int = 64, reps: int = 12) -> dict:
    """In this process, with the model loaded: the host's cost of one call (building the graph)
    and of evaluating n dependent calls, for y + 1, fastcoll.all_reduce and mx.distributed.all_sum
    of a (1, 1, 4096) bf16 row (a decode step's all-reduce). Every rank runs the same calls."""
    import mlx.core as mx

    x = mx.zeros((1, 1, 4096), dtype=mx.bfloat16)
    mx.eval(x)

    def per(fn, evaluate: bool = True) -> dict:
        """n chained calls of fn: the build's time per call and, with `evaluate`, the evaluation's
        (without, the graph is dropped unevaluated); medians over `reps`."""
        builds, evals = [], []
        for r in range(reps + 2):
            t0 = time.perf_counter()
            y = x
            for _ in range(n):
                y = fn(y)
            t1 = time.perf_counter()
            if evaluate:
                mx.eval(y)
            t2 = time.perf_counter()
            del y
            if r >= 2:
                builds.append((t1 - t0) / n * 1e6)
                evals.append((t2 - t1) * 1e3)
        res = {"build_us_per_call": round(float(np.median(builds)), 2)}
        if evaluate:
            res[f"eval_ms_per_{n}"] = round(float(np.median(evals)), 3)
        return res

    def row(kernel, y, **more):  # a (1, 1, 4096) row through a one-input kernel of 256 threads
        return kernel(inputs=[y], grid=(256, 1, 1), threadgroup=(256, 1, 1), output_shapes=[y.shape],
                      output_dtypes=[y.dtype], **more)[0]

    copy_source = "const unsigned i = threadIdx.x;\nfor (unsigned j = i; j < 4096; j += 256) out[j] = y[j];\n"
    out = {"plus_one": per(lambda y: y + 1)}
    if hasattr(mx.fast, "cuda_kernel") and mx.cuda.is_available():
        # the floor of any custom kernel: a copy through mx.fast.cuda_kernel, 256 threads
        copy = mx.fast.cuda_kernel(name="decode_bench_copy", input_names=["y"], output_names=["out"],
                                   source=copy_source)
        out["custom_kernel_copy"] = per(lambda y: row(copy, y))
    if gated:
        import fastcoll
        from mlx.nn.layers.distributed import sum_gradients

        gate = fastcoll.lifecycle.resolve(None)._job.gate
        if gate is not None and "custom_kernel_copy" in out:
            # Where a gated call's build goes: the gate's own kernel call alone, and the copy
            # kernel with each thing the gate's call has more (built only, never evaluated: a
            # gate kernel the host half did not issue must not run)
            out["gate_kernel_call_built_only"] = per(
                lambda y: gate._backend.launch(y, "sum", gate._max_iters, gate._token)[0], evaluate=False)
            out["copy_templated_built_only"] = per(lambda y: row(copy, y, template=[
                ("T", y.dtype), ("COUNT", 4096), ("OP", 0), ("MAX_ITERS", 1000), ("SIG", 12345)]), evaluate=False)
            big = mx.fast.cuda_kernel(name="decode_bench_copy_big", input_names=["y"], output_names=["out"],
                                      source="// padding as long as the gate's source\n" * 160 + copy_source)
            out["copy_6kb_source_built_only"] = per(lambda y: row(big, y), evaluate=False)
            ctrl, tok = gate._backend._ctrl, gate._token
            three = mx.fast.cuda_kernel(name="decode_bench_copy_three", input_names=["y", "c", "t"],
                                        output_names=["out", "tok"], source=copy_source)
            out["copy_three_inputs_built_only"] = per(lambda y: three(
                inputs=[y, ctrl, tok], grid=(256, 1, 1), threadgroup=(256, 1, 1), output_shapes=[y.shape, (4,)],
                output_dtypes=[y.dtype, mx.uint32])[0], evaluate=False)
            out["copy_built_only"] = per(lambda y: row(copy, y), evaluate=False)

        out["fastcoll_all_reduce"] = per(lambda y: fastcoll.all_reduce(y, op="sum"))
        out["mx_distributed_all_sum"] = per(lambda y: mx.distributed.all_sum(y))
        # what mlx.nn's sharded layers add besides the all-reduces: every "all-to-sharded" linear
        # (q, k, v, gate, up: 5 a layer) wraps its input in this identity mx.custom_function
        out["sum_gradients"] = per(sum_gradients(mx.distributed.init()))
    return out


def floor_all_sum(kind: str):
    """An all_sum that exchanges nothing (wrong values: a floor, never a result), to put in
    mx.distributed.all_sum's place in a sharded rank: what tensor parallelism costs the host when
    the all-reduce costs (identity) nothing, (kernel) one bare mx.fast.cuda_kernel call, a copy
    with a thread per element in threadgroups of 256, (custom) that call inside an mx.custom_function with a vjp, as any differentiable
    collective made through MLX's Python API has; the gate's all_sum is the last plus its own."""
    import mlx.core as mx

    if kind not in ("identity", "kernel", "custom"):
        raise ValueError(f"DECODE_FLOOR={kind!r}: identity, kernel or custom")
    if kind == "identity":
        return lambda x, *, group=None, stream=None: x
    copy = mx.fast.cuda_kernel(
        name="decode_bench_floor_copy", input_names=["y"], output_names=["out"],
        source="const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\nout[i] = y[i];\n")

    def kernel(x):
        if x.size % 256:
            raise ValueError(f"the floor's copy kernel needs a multiple of 256 elements, not {x.size}")
        return copy(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                    output_dtypes=[x.dtype])[0]

    if kind == "kernel":
        return lambda x, *, group=None, stream=None: kernel(x)

    @mx.custom_function
    def differentiable(x):
        return kernel(x)

    @differentiable.vjp
    def differentiable(primals, cotangent, output):
        return cotangent

    return lambda x, *, group=None, stream=None: differentiable(x)


def solo_gate(group) -> None:
    """Make the job's fence gate one over a gather of this rank alone (the direct mode with one
    rank: each gate's spin waits for this GPU's own arrival only). Every gated all_sum then takes
    the gate's whole path, mlx_compat, fastcoll.all_reduce, the kernel and the watcher, but no rank
    waits for another: the floor_gate run, what the gate costs a rank apart from the coupling."""
    from bench.gate_bench import one_rank_direct_gate
    from fastcoll.config import Config

    job = group.fastcoll_group._job  # (a benchmark's floor: the job runs without a gate of its own)
    if job.gate is not None:
        raise RuntimeError("floor_gate runs with FASTCOLL_FAST_SYNC=0")
    job.gate = one_rank_direct_gate(Config(fast_sync=True))
    if job.gate is None:
        raise RuntimeError("floor_gate: no gather segment for a gate of one rank here")


def watch_check(gate, how: str) -> list[float]:
    """DECODE_GATE_CHECK, a diagnosis of the check every gated call makes (Group.check ->
    Gate.check: one load of the control page, which the GPU's spin reads and writes): `skip` makes
    it do nothing, `time` times each one. Returns the times (s), filled as calls are made."""
    times: list[float] = []
    plain = gate.check
    if how == "skip":
        gate.check = lambda: None
    elif how == "time":
        def timed() -> None:
            t = time.perf_counter()
            plain()
            times.append(time.perf_counter() - t)

        gate.check = timed
    else:
        raise ValueError(f"DECODE_GATE_CHECK={how!r}: skip or time")
    return times


def pin_main_thread(rank: int) -> list[int] | None:
    """DECODE_MAIN_CPUS (decode_bench's --fast-main): this process's main thread alone onto the
    CPU of its rank in that list, and every other thread of the process back onto all the CPUs
    the process had (a thread inherits the mask of the thread that starts it, and MLX starts
    some lazily). Called from the thread that decodes, once the warm-up has started every
    thread. Returns the main thread's CPUs, or None without DECODE_MAIN_CPUS."""
    cpus = os.environ.get("DECODE_MAIN_CPUS")
    if not cpus:
        return None
    listed = [int(c) for c in cpus.split(",")]
    everywhere = os.sched_getaffinity(os.getpid())  # the process's (its first thread's) mask
    me = threading.get_native_id()
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        try:
            os.sched_setaffinity(tid, {listed[rank % len(listed)]} if tid == me else everywhere)
        except OSError:  # a thread that has just ended
            pass
    return sorted(os.sched_getaffinity(0))


class HostTimes:
    """The model, with the host's time per token measured: building its graph (the model call)
    and handing it to the GPU (mx.async_eval). What is left of a token's time is the wait for it."""

    def __init__(self, model):
        import mlx.core as mx

        self._model, self.build, self.submit = model, [], []
        plain = mx.async_eval

        def timed(*a, **k):
            t = time.perf_counter()
            plain(*a, **k)
            self.submit.append((time.perf_counter() - t) * 1e3)

        mx.async_eval = timed  # mlx_lm.generate calls mx.async_eval by name

    def __call__(self, *a, **k):
        t = time.perf_counter()
        out = self._model(*a, **k)
        self.build.append((time.perf_counter() - t) * 1e3)
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)

    def summary(self) -> dict:
        med = lambda v: float(np.median(v[WARMUP:])) if len(v) > WARMUP else None
        return {"build_median": med(self.build), "async_eval_median": med(self.submit)}


class Threads:
    """Each thread's scheduling over the timed tokens (Linux /proc): CPU time, the switches it
    asked for (waits) and those forced on it (preemption), and its moves between CPUs. Shows
    whether a rank's Python thread was preempted or migrated while it built tokens."""

    def __init__(self):
        self._start = self._read()

    @staticmethod
    def _read() -> dict:
        import threading

        named = {t.native_id: t.name for t in threading.enumerate()}
        out = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                name = named.get(int(task.name)) or (task / "comm").read_text().strip()
                stat = (task / "stat").read_text().rpartition(")")[2].split()
                status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
                sched = (task / "sched").read_text() if (task / "sched").exists() else ""
            except OSError:
                continue
            moves = next((int(float(l.split(":")[1])) for l in sched.splitlines() if l.startswith("se.nr_migrations")), -1)
            tick = os.sysconf("SC_CLK_TCK")
            out[task.name] = {"name": name, "cpu_s": (int(stat[11]) + int(stat[12])) / tick,
                              "cpus_allowed": status.get("Cpus_allowed_list", "").strip(),
                              "minflt": int(stat[7]), "majflt": int(stat[9]),
                              "waits": int(status.get("voluntary_ctxt_switches", 0)),
                              "preempted": int(status.get("nonvoluntary_ctxt_switches", 0)), "moves": moves,
                              "last_cpu": int(stat[36])}
        return out

    def summary(self, seconds: float) -> list:
        end, rows = self._read(), []
        for tid, e in end.items():
            b = self._start.get(tid, {"cpu_s": 0, "waits": 0, "preempted": 0, "moves": 0, "minflt": 0, "majflt": 0})
            rows.append({"tid": int(tid), "name": e["name"], "cpu_share": round((e["cpu_s"] - b["cpu_s"]) / seconds, 3),
                         "waits": e["waits"] - b["waits"], "preempted": e["preempted"] - b["preempted"],
                         "moves": e["moves"] - b["moves"] if e["moves"] >= 0 else None, "last_cpu": e["last_cpu"],
                         "cpus_allowed": e["cpus_allowed"], "faults": e["minflt"] - b["minflt"] + e["majflt"] - b["majflt"]})
        return sorted(rows, key=lambda r: -r["cpu_share"])


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """CPU -> (all ticks, ticks stolen by the hypervisor), from /proc/stat (Linux; {} elsewhere)."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name != "cpu":
                    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
                    out[int(name[3:])] = (sum(ticks), ticks[7])
    except OSError:
        pass
    return out


def steal_share(before: dict, after: dict, cpus: list[int]) -> dict[int, float]:
    """The share of each CPU's time that the hypervisor gave to someone else between two reads."""
    out = {}
    for c in cpus:
        if c in before and c in after and after[c][0] > before[c][0]:
            out[c] = round((after[c][1] - before[c][1]) / (after[c][0] - before[c][0]), 3)
    return out


def rank_main(args) -> None:
    """One rank (or the single process): build, shard, evaluate the weights, decode."""
    import mlx.core as mx

    if os.environ.get("DECODE_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["DECODE_SWITCH_INTERVAL"]))
    model = make_model(args.shape)
    rank, info = int(os.environ.get("FASTCOLL_RANK", "0")), "single process"  # (a rank of single_pair)
    trace = None
    if os.environ.get("DECODE_GATE_STAMPS") == "1" and args.run.startswith("gate"):
        from bench.gate_where import Trace, stamp_gate_kernels  # the GPU's clock at each gate kernel

        trace = Trace()
        stamp_gate_kernels(trace)
    if args.run != "single":
        from fastcoll import mlx_compat

        mlx_compat.install()
        group = mx.distributed.init()
        model.shard(group)
        if os.environ.get("DECODE_FLOOR") == "gate":
            solo_gate(group)
        elif os.environ.get("DECODE_FLOOR"):  # after install(): mlx.nn's layers call it by name
            mx.distributed.all_sum = floor_all_sum(os.environ["DECODE_FLOOR"])
        rank, info = group.rank(), group.fastcoll_group.transport_info()
    check_times = None
    if os.environ.get("DECODE_GATE_CHECK") and args.run != "single":
        check_times = watch_check(group.fastcoll_group._job.gate, os.environ["DECODE_GATE_CHECK"])
    t0 = time.perf_counter()
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    if os.environ.get("DECODE_HOST_COSTS") == "1":
        res_costs = host_costs(args.run != "single")
        print(f"rank {rank} host costs: {res_costs}", flush=True)
    if trace is not None:
        trace.reset()
    spy = os.environ.get("DECODE_PYSPY")  # a py-spy binary: sample this rank while it decodes

    def sample() -> None:  # from the end of the warm-up (not the prompt's step, not compiling)
        # DECODE_PYSPY_NATIVE=1: C++ frames too (MLX's), sampling with the process stopped
        how = ["--native"] if os.environ.get("DECODE_PYSPY_NATIVE") == "1" else ["--nonblocking"]
        subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--duration", "3", "--rate", "400",
                          "--idle", "--threads", *how, "--format", "raw",
                          "-o", str(Path(args.result).with_suffix(".pyspy.txt"))])

    main_cpus = []

    def warmed_up() -> None:  # every thread exists now: pin the main thread, then start py-spy
        main_cpus.append(pin_main_thread(rank))
        if spy and rank == 0:
            sample()

    res = decode(model, args.tokens, warmed_up)
    res["main_thread_cpus"] = main_cpus[0] if main_cpus else None
    if check_times:
        res["gate_check_us"] = {"median": float(np.median(check_times)) * 1e6,
                                "p99": float(np.percentile(check_times, 99)) * 1e6, "n": len(check_times)}
        print(f"rank {rank} gate check: {res['gate_check_us']}", flush=True)
    if trace is not None:
        from bench.gate_where import gate_timeline

        res["gate_timeline"] = gate_timeline(trace)
    res.update(run=args.run, shape=args.shape, rank=rank, transport=info, load_s=load_s,
               gated=os.environ.get("FASTCOLL_FAST_SYNC") == "1", mlx=mx.__version__,
               device=str(mx.default_device()), switch_interval_s=sys.getswitchinterval())
    if args.run != "single":
        import fastcoll

        fastcoll.check()
        gate = fastcoll.lifecycle.resolve(None)._job.gate
        res["gate_used"] = gate is not None
        if gate is not None and gate.profile() is not None:
            res["profile"] = gate.profile().summary()
        fastcoll.finalize()
    result = Path(args.result)
    (result if rank == 0 else result.with_suffix(f".rank{rank}.json")).write_text(json.dumps(res))
    print(f"rank {rank} {args.run}: {res['ms_per_token']['median']:.2f} ms per token"
          + (f"; host ms per token: {res['host_ms']}" if "host_ms" in res else ""), flush=True)
    if "threads" in res:
        busy = [t for t in res["threads"] if t["cpu_share"] >= 0.02]
        print(f"rank {rank} threads (CPU share, waits, preempted, moves, last CPU, page faults): "
              + "; ".join(f"{t['name']} {t['cpu_share']:.2f} {t['waits']} {t['preempted']} {t['moves']} {t['last_cpu']} "
                          f"{t['faults']}"
                          for t in busy), flush=True)
    if trace is not None:
        tl = res["gate_timeline"]
        print(f"rank {rank} gate kernels (us, medians over {tl['gates']} gates): "
              f"{ {k: round(v['median'], 1) for k, v in tl.items() if isinstance(v, dict) and 'median' in v} }",
              flush=True)


RUNS = {
    "single": {},
    # a control: two unsharded processes at once, each alone with its model (no collective): how
    # much two processes on this machine slow each other's host work
    "single_pair": {},
    "host": {"FASTCOLL_FAST_SYNC": "0"},
    "gate": {"FASTCOLL_FAST_SYNC": "1"},
    "gate_profile": {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_GATE_PROFILE": "1"},
    # the direct mode's watcher looking every 1 ms, as before 2026-12-01's third session (5 ms now)
    "gate_watch1": {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_TUNING": "gate_watch_ms=1"},
    # the host mode of the gate where the direct mode would apply (ranks of one host)
    "gate_host_mode": {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_TUNING": "gate_direct=0"},
    # floors: sharded ranks whose all_sum exchanges nothing (floor_all_sum; their tokens are wrong)
    "floor_identity": {"FASTCOLL_FAST_SYNC": "0", "DECODE_FLOOR": "identity"},
    "floor_kernel": {"FASTCOLL_FAST_SYNC": "0", "DECODE_FLOOR": "kernel"},
    "floor_custom": {"FASTCOLL_FAST_SYNC": "0", "DECODE_FLOOR": "custom"},
    # diagnoses of the per-call check (watch_check): skipped, or timed
    "gate_nocheck": {"FASTCOLL_FAST_SYNC": "1", "DECODE_GATE_CHECK": "skip"},
    "gate_checktimed": {"FASTCOLL_FAST_SYNC": "1", "DECODE_GATE_CHECK": "time"},
    # the gate's whole path in each rank, over a gather of that rank alone: no rank waits for another
    "floor_gate": {"FASTCOLL_FAST_SYNC": "0", "DECODE_FLOOR": "gate"},
}
# A run named NAME_bound is NAME under `fastcoll-launch --bind-to cores`: each rank on cores of its
# own, as each has a machine of its own in a real job.
BOUND = "_bound"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", default="single,host,gate")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    ap.add_argument("--fast-cpus", type=int, default=0, metavar="N",
                    help="start each run on the N CPUs that run Python fastest just before it "
                         "(bench/micro/cpu_map.py; a lent machine's CPUs differ by up to 1.8x)")
    ap.add_argument("--fast-main", action="store_true",
                    help="put each process's main thread alone on one of the CPUs that run Python "
                         "fastest just before the run (one CPU a process; its other threads keep every CPU)")
    ap.add_argument("--rank-main", dest="run", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        rank_main(args)
        return
    from fastcoll.launch.agent import on_cpus

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for run in args.runs.split(","):
        # gate@0.0002: the gate with sys.setswitchinterval(0.0002); gate#2: gate again
        name = run.split("@")[0].split("#")[0]
        bound = name.endswith(BOUND)
        name = name.removesuffix(BOUND)
        result = out / f"decode_{args.shape}_{run.replace('@', '_si').replace('#', '_')}.json"
        env = dict(os.environ, PYTHONUNBUFFERED="1", **RUNS[name])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        if "@" in run:
            env["DECODE_SWITCH_INTERVAL"] = run.split("@")[1]
        cmd = [sys.executable, __file__, "--rank-main", "single" if name == "single_pair" else name, "--result", str(result),
               "--shape", args.shape, "--tokens", str(args.tokens)]
        if name != "single":  # the ranks, started as a user would
            env["FASTCOLL_TIMEOUT"] = "120"
            cmd = [sys.executable, "-m", "fastcoll.launch", "-n", str(args.world), "--timeout", str(args.timeout),
                   "--bind-to", "cores" if bound else "none", *cmd]
        cpus = None
        if args.fast_cpus or args.fast_main:
            from bench.micro.cpu_map import cpu_map

            speeds = cpu_map(passes=1)
            best = min(speeds.values())
            ranked = sorted(speeds, key=speeds.get)
            if args.fast_cpus:
                cpus = ranked[: args.fast_cpus]
            mains = ranked[: 1 if name == "single" else args.world]
            if args.fast_main:
                env["DECODE_MAIN_CPUS"] = ",".join(map(str, mains))
            chosen = cpus if args.fast_cpus else mains
            print(f"--- {run}: {'on CPUs' if args.fast_cpus else 'main threads on CPUs'} {chosen}, each "
                  f"{[round(speeds[c] / best, 2) for c in chosen]}x the fastest's time "
                  f"(all: {sorted(round(v / best, 2) for v in speeds.values())})", flush=True)
        ticks = cpu_ticks() if args.fast_main else {}
        with on_cpus(cpus):  # a child starts with the CPU mask of the thread that starts it
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            text, _ = p.communicate(timeout=args.timeout + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        print(f"--- {run} (exit {p.returncode}) ---\n{text[-3000:]}", flush=True)
        if args.fast_main:
            stolen = steal_share(ticks, cpu_ticks(), sorted(ticks))
            after = cpu_map(passes=1)
            print(f"--- {run}: afterwards the main threads' CPUs {mains} take "
                  f"{[round(after[c] / min(after.values()), 2) for c in mains]}x the fastest's time; "
                  f"stolen by the hypervisor during the run: { {c: stolen.get(c) for c in mains} } "
                  f"(the most on any CPU: {max(stolen.values(), default=0)})", flush=True)
        if result.exists() and p.returncode == 0:
            results[run] = json.loads(result.read_text())
            results[run]["cpus"] = cpus
    print(f"\nDecode, llama {args.shape} shape, bf16, random weights, {args.tokens} tokens (median of the last "
          f"{args.tokens - WARMUP - 1} gaps), mlx_lm.generate.generate_step, greedy:\n")
    single = results.get("single", {}).get("ms_per_token", {}).get("median")
    print("| run | ranks | ms per token (median) | p90 | tokens/s | against single |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run, r in results.items():
        m = r["ms_per_token"]
        ratio = f"{m['median'] / single:.2f}x" if single else "-"
        ranks = 1 if run.split("@")[0].split("#")[0] == "single" else args.world
        print(f"| {run} | {ranks} | {m['median']:.2f} | {m['p90']:.2f} | "
              f"{1000 / m['median']:.1f} | {ratio} |")
    host = results.get("host", {}).get("tokens")
    for run, r in results.items():
        if r["run"].startswith("gate") and host is not None:
            same = r["tokens"] == host
            print(f"\n{run} generated the same {len(host)} tokens as the host path: {same}")
            r["same_tokens_as_host"] = same
    (out / f"decode_{args.shape}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
