"""Where a gated token's time goes, read from the GPU's own clock (issue 12; CUDA only).

    python bench/gate_where.py kinds [--out DIR]    a chain of 64 (y + 1, K) for kernels K that
                                                    touch one kind of memory each
    python bench/gate_where.py gate [--out DIR]     the gate's own kernels, stamped: one rank,
                                                    direct, host mode, prereleased
    python bench/gate_where.py ranks [--out DIR]    the same, two ranks through fastcoll.init
                                                    (two ranks on one GPU: start CUDA MPS first)

Every stamped kernel's thread 0 reads %globaltimer (nanoseconds, one clock for every process on
the GPU) when it starts and, after a barrier, when it ends, into a trace buffer in device memory
whose address is compiled into the kernel. The stamps give each kernel's duration and the gap
between one kernel's end and the next one's start, which no host clock can see. The gate's
kernels are stamped by wrapping their bodies (fastcoll/gpu/kernels.py) in this process only;
nothing in the library changes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gate_bench import LAYERS, MAX_ITERS, OUT, ROW, _chain, dump, machine, same, stats, tokens  # noqa: E402

KINDS_MAX = 16  # kernel kinds a trace tells apart
SLOTS = 4096  # stamps kept per kind (a ring)
TRACE_WORDS = 64 + KINDS_MAX * SLOTS * 2  # 64 counters, then (start, end) pairs


def rt():
    from fastcoll.cuda.advise import _runtime

    r = _runtime()
    if r is None:
        sys.exit("gate_where: cuda-python is needed")
    return r


def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


class Trace:
    """A trace buffer in device memory: per kernel kind a counter and a ring of (start, end)."""

    def __init__(self):
        self.r = rt()
        self.nbytes = TRACE_WORDS * 8
        self.ptr = int(ok(self.r.cudaMalloc(self.nbytes)))
        self.reset()

    def reset(self) -> None:
        ok(self.r.cudaDeviceSynchronize())
        ok(self.r.cudaMemset(self.ptr, 0, self.nbytes))
        ok(self.r.cudaDeviceSynchronize())

    def read(self) -> np.ndarray:
        ok(self.r.cudaDeviceSynchronize())
        host = np.zeros(TRACE_WORDS, dtype=np.uint64)
        ok(self.r.cudaMemcpy(host.ctypes.data, self.ptr, self.nbytes,
                             self.r.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return host

    def stamps(self, kind: int) -> np.ndarray:
        """(n, 2) start and end, ns, of kind's kernels in the order they ran."""
        host = self.read()
        n = int(host[kind]) & 0xFFFFFFFF
        pairs = host[64 + kind * SLOTS * 2: 64 + (kind + 1) * SLOTS * 2].reshape(SLOTS, 2)
        return pairs[: min(n, SLOTS)].astype(np.int64)

    def prelude(self) -> str:
        return STAMP_PRELUDE.replace("@TRACE@", f"{self.ptr:#x}ull")


STAMP_PRELUDE = r"""
__device__ inline unsigned long long fcw_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define FCW_TRACE ((unsigned long long*)(@TRACE@))
__device__ inline void fcw_stamp(unsigned int kind, unsigned long long t0) {
  unsigned int i = atomicAdd((unsigned int*)(FCW_TRACE + kind), 1u) % 4096u;
  FCW_TRACE[64 + (kind * 4096u + i) * 2] = t0;
  FCW_TRACE[64 + (kind * 4096u + i) * 2 + 1] = fcw_now();
}
"""


def stamped(body: str, kind: int) -> str:
    """body with thread 0's start and end times recorded as kind `kind`."""
    return ("  const unsigned long long fcw_t0 = fcw_now();\n" + body +
            f"\n  __syncthreads();\n  if (threadIdx.x == 0) {{ fcw_stamp({kind}u, fcw_t0); }}\n")


# ------------------------------------------------------------------------------------------------
# kinds: one kernel K per layer, touching one kind of memory


KIND_BODIES = {
    # y -> out by every thread, in 16-byte units: what each variant adds is on top of this.
    "copy": "",
    # thread 0: one system-scope acquire load of BASE (the spin's one iteration)
    "ld1": """
  if (threadIdx.x == 0) {
    unsigned int v = cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*(unsigned int*)BASE).load(cuda::memory_order_acquire);
    if (v == 0x5a5a5a5au) { out[0] = y[1]; }
  }""",
    # thread 0: one system-scope release store to BASE (the arrival's publish)
    "st1": """
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*(unsigned int*)BASE).store(1u, cuda::memory_order_release);
  }""",
    # every thread: y (8 KiB) -> BASE in 16-byte units, then a system fence (the arrival's copy)
    "wr8k": """
  for (unsigned int j = threadIdx.x; j < NBYTES / 16; j += blockDim.x) {
    ((uint4*)BASE)[j] = ((const uint4*)y)[j];
  }
  __threadfence_system();""",
    # every thread: BASE (8 KiB) -> out in element loads that no cache answers (fc_reduce's loads)
    "rd8k": """
  __syncthreads();
  for (unsigned int first = threadIdx.x; first < COUNT; first += 8 * blockDim.x) {
    T w[8];
    for (unsigned int k = 0; k < 8; ++k) {
      const unsigned int i = first + k * blockDim.x;
      if (i < COUNT) { w[k] = __ldcv((const T*)BASE + i); }
    }
    for (unsigned int k = 0; k < 8; ++k) {
      const unsigned int i = first + k * blockDim.x;
      if (i < COUNT) { out[i] = w[k]; }
    }
  }""",
    # the same in 16-byte loads
    "rd8k16": """
  __syncthreads();
  for (unsigned int j = threadIdx.x; j < NBYTES / 16; j += blockDim.x) {
    ((uint4*)out)[j] = __ldcv((const uint4*)BASE + j);
  }""",
}
COPY = """
  for (unsigned int j = threadIdx.x; j < NBYTES / 16; j += blockDim.x) {
    ((uint4*)out)[j] = ((const uint4*)y)[j];
  }"""


class Memory:
    """One kind of memory the variants touch: its GPU address and a host view (None: none)."""

    def __init__(self, kind: str):
        import mlx.core as mx

        r = rt()
        self.kind, self.keep, self.view = kind, None, None
        n = 64 * 1024
        if kind == "device":
            self.address = int(ok(r.cudaMalloc(n)))
            ok(r.cudaMemset(self.address, 0, n))
        elif kind == "pinned":
            flags = int(getattr(r, "cudaHostAllocMapped", 2)) | int(getattr(r, "cudaHostAllocPortable", 1))
            host = int(ok(r.cudaHostAlloc(n, flags)))
            self.view = np.frombuffer((ctypes.c_uint8 * n).from_address(host), dtype=np.uint8)
            self.view[:] = 0
            self.address = int(ok(r.cudaHostGetDevicePointer(host, 0)))
        elif kind in ("managed", "managed_advised"):
            from fastcoll.cuda import LANGUAGE as cuda

            self.keep = mx.array(np.zeros(n // 4, dtype=np.uint32))
            mx.eval(self.keep)
            self.view = np.array(self.keep, copy=False).view(np.uint8).reshape(-1)
            self.address = self.view.ctypes.data
            self.undo = cuda.advise_page(self.view) if kind == "managed_advised" else None
        else:
            raise ValueError(kind)


def kind_kernel(trace: Trace, variant: str, mem: Memory | None, index: int):
    import mlx.core as mx

    header = "#include <cuda/atomic>\n" + trace.prelude()
    header += f"#define BASE ((unsigned char*)({mem.address:#x}ull))\n" if mem is not None else ""
    body = COPY + KIND_BODIES[variant]
    name = f"where_{variant}_{mem.kind if mem else 'none'}_{index}"
    return mx.fast.cuda_kernel(name=name, input_names=["y"], output_names=["out"],
                               source=stamped(body, index), header=header, ensure_row_contiguous=True)


def cmd_kinds(args) -> None:
    import mlx.core as mx

    trace = Trace()
    res: dict = machine()
    mems = {k: Memory(k) for k in ("device", "pinned", "managed", "managed_advised")}
    y0 = mx.zeros((ROW,), dtype=mx.bfloat16)
    mx.eval(y0)
    tmpl = [("T", mx.bfloat16), ("NBYTES", ROW * 2), ("COUNT", ROW)]

    def chain(kernels, per_layer: int = 1):
        def build(y):
            for _ in range(LAYERS):
                y = y + 1
                for _ in range(per_layer):
                    for k in kernels:
                        (y,) = k(inputs=[y], template=tmpl, grid=(256, 1, 1), threadgroup=(256, 1, 1),
                                 output_shapes=[y.shape], output_dtypes=[y.dtype])
            return y
        return build

    def run(name: str, kernels, index: int, per_layer: int = 1, poll: np.ndarray | None = None):
        build = chain(kernels, per_layer)
        stop = threading.Event()
        if poll is not None:  # a host thread reading the memory all the while, as the watcher does
            def poller():
                while not stop.is_set():
                    int(poll[0])
            t = threading.Thread(target=poller, daemon=True)
            t.start()
        evals, builds, spans = [], [], []
        for i in range(args.tokens + 3):
            trace.reset()
            t0 = time.perf_counter()
            y = build(y0)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            if i >= 3:
                evals.append((t2 - t1) * 1e3)
                builds.append((t1 - t0) * 1e3)
                st = trace.stamps(index)
                spans.append(st)
        stop.set()
        durs = np.concatenate([(s[:, 1] - s[:, 0]) / 1e3 for s in spans])
        gaps = np.concatenate([(s[1:, 0] - s[:-1, 1]) / 1e3 for s in spans])
        span = [(s[-1, 1] - s[0, 0]) / 1e6 for s in spans]
        r = {"eval_ms": stats(evals), "build_ms": stats(builds), "gpu_span_ms": stats(span),
             "kernel_us": stats(durs), "gap_us": stats(gaps), "kernels_per_token": int(spans[0].shape[0])}
        print(f"{name}: eval {r['eval_ms']['median']:.2f} ms, gpu span {r['gpu_span_ms']['median']:.2f} ms, "
              f"kernel {r['kernel_us']['median']:.1f} us, gap {r['gap_us']['median']:.1f} us "
              f"(p90 {r['gap_us']['p90']:.1f})", flush=True)
        res[name] = r

    i = 0
    run("copy", [kind_kernel(trace, "copy", None, i)], i)
    run("copy_x3", [kind_kernel(trace, "copy", None, i)], i, per_layer=3)
    for variant in ("ld1", "st1", "wr8k", "rd8k", "rd8k16"):
        for kind, mem in mems.items():
            i = (i + 1) % KINDS_MAX
            run(f"{variant}_{kind}", [kind_kernel(trace, variant, mem, i)], i)
    for kind in ("pinned", "managed_advised", "managed"):
        i = (i + 1) % KINDS_MAX
        run(f"ld1_{kind}_hostpoll", [kind_kernel(trace, "ld1", mems[kind], i)], i, poll=mems[kind].view)
    dump(Path(args.out), f"where_kinds{args.tag}", res)


# ------------------------------------------------------------------------------------------------
# the gate's kernels, stamped

GATE_KINDS = {"gate": 5}  # fc_gate, a gate's one kernel (before NOTES 33: arrival 1, release 2-3, deliver 4)


def stamp_gate_kernels(trace: Trace) -> None:
    """Wrap the gate's kernel bodies and append the stamp helpers to the CUDA prelude, in this
    process (before any gate kernel is built)."""
    from fastcoll.cuda import LANGUAGE as cuda
    from fastcoll.gpu import kernels

    source = kernels.source
    kernels.source = lambda name: stamped(source(name), GATE_KINDS[name]) if name in GATE_KINDS else source(name)
    text = cuda.prelude() + trace.prelude()
    cuda.prelude = lambda: text


def gate_timeline(trace: Trace) -> dict:
    """Per gate, from the stamps of the last token: each kernel's duration and the gaps."""
    whole = trace.stamps(GATE_KINDS["gate"])
    if whole.shape[0]:
        us = lambda v: stats(np.asarray(v) / 1e3)
        return {"gates": int(whole.shape[0]), "gate_us": us(whole[:, 1] - whole[:, 0]),
                "gate_to_next_gate_us": us(whole[1:, 0] - whole[:-1, 1]),
                "span_ms": float((whole[-1, 1] - whole[0, 0]) / 1e6), "first_ns": int(whole[0, 0]),
                "raw_first_8": {"gate": whole[:8].tolist()}}
    return {"gates": 0}


def traced_tokens(trace: Trace, build, n: int, dtype, row: int, pipelined: bool = False) -> dict:
    trace.reset()
    r = tokens(build, n, dtype, row, pipelined)
    if not pipelined:  # the last token's stamps alone (the ring holds 4096 per kind)
        trace.reset()
        r["one_token"] = tokens(build, 1, dtype, row)["ms_per_token"]
    r["timeline"] = gate_timeline(trace)
    return r


def cmd_gate(args) -> None:
    import mlx.core as mx

    from fastcoll.config import Config
    from fastcoll.cuda import LANGUAGE as cuda
    from fastcoll.gate import Gate, direct_mode
    from fastcoll.gate import layout as L
    from fastcoll.gate.layout import ControlLayout
    from fastcoll.gate.page import ControlPage
    from fastcoll.gpu.mlx_backend import MlxBackend
    from gate_sim import SerialService

    trace = Trace()
    stamp_gate_kernels(trace)
    res: dict = machine()
    cfg = Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024, fence_max_iters=MAX_ITERS)
    layout = ControlLayout(64 * 1024, 1)

    def step(name, fn, *a):
        r = fn(*a)
        tl = r.get("timeline", {})
        brief = {k: round(v["median"], 1) for k, v in tl.items() if isinstance(v, dict) and "median" in v}
        print(f"{name}: {r['ms_per_token']['median']:.2f} ms/token; {brief}", flush=True)
        res[name] = r

    # The gate's kernels with every gate released before the evaluation: no waiting at all.
    pre = MlxBackend(cuda, layout, advise=cuda.advise_page)
    page = ControlPage(pre.page, pre.layout)
    page.reset(1)
    state = {"seq": 0, "tok": pre.initial_token(0)}

    def prereleased(x):
        for _ in range(LAYERS):
            x, state["tok"] = pre.launch(x + 1, "sum", MAX_ITERS, state["tok"])
            state["seq"] += 1
        page.recv[: ROW * 2] = 0
        page.store(L.STATUS, L.OK)
        page.store(L.RELEASE, state["seq"])
        return x

    def timed_eval(build):
        trace.reset()
        x = mx.zeros((ROW,), dtype=mx.bfloat16)
        mx.eval(x)
        out = []
        for t in range(args.tokens + 3):
            trace.reset()
            y = build(x)
            t0 = time.perf_counter()
            mx.eval(y)
            if t >= 3:
                out.append((time.perf_counter() - t0) * 1e3)
        return {"ms_per_token": stats(out), "timeline": gate_timeline(trace)}

    step("prereleased_8k", timed_eval, prereleased)

    service = SerialService()
    gated = lambda g: (lambda y: _chain(y, lambda v: g.all_reduce(v, "mean", same, service.submit)))
    host = Gate(MlxBackend(cuda, layout, advise=cuda.advise_page), cfg)
    step("host_mode_8k", traced_tokens, trace, gated(host), args.tokens, mx.bfloat16, ROW)
    step("host_mode_64b", traced_tokens, trace, gated(host), args.tokens, mx.float32, 16)
    gather = direct_mode.setup(lambda what, values: np.array([values], dtype=np.int64), 0, 1, 64 * 1024,
                               cuda.share_host_memory)
    if gather is not None:
        solo = Gate(MlxBackend(cuda, ControlLayout(64 * 1024, 1), advise=cuda.advise_page), cfg)
        solo.use_direct(gather)
        step("direct_8k", traced_tokens, trace, gated(solo), args.tokens, mx.bfloat16, ROW)
        step("direct_8k_pipelined", traced_tokens, trace, gated(solo), args.tokens, mx.bfloat16, ROW, True)
        step("direct_64b", traced_tokens, trace, gated(solo), args.tokens, mx.float32, 16)
        solo.check()
        solo.close()
    host.check()
    host.close()
    service.close()
    dump(Path(args.out), f"where_gate{args.tag}", res)


def cmd_rank(args) -> None:
    """One rank of `ranks`: its gate's kernels stamped, then tokens through fastcoll.all_reduce."""
    import mlx.core as mx

    import fastcoll

    trace = Trace()
    stamp_gate_kernels(trace)
    g = fastcoll.init()
    rank = g.rank()
    gate = g._job.gate
    res = {"rank": rank, "gated": gate is not None, "direct": gate is not None and gate.direct, **machine()}
    chain = lambda v: _chain(v, lambda w: fastcoll.all_reduce(w, op="mean"))
    for row, dtype in ((ROW, mx.bfloat16), (16, mx.float32)):
        key = f"{dtype}_{row}".replace("mlx.core.", "")
        res[f"{key}_serial"] = traced_tokens(trace, chain, args.tokens, dtype, row)
        res[f"{key}_pipelined"] = traced_tokens(trace, chain, args.tokens, dtype, row, True)
        tl = res[f"{key}_serial"]["timeline"]
        print(f"rank {rank} {key}: {res[f'{key}_serial']['ms_per_token']['median']:.2f} ms/token serial, "
              f"{res[f'{key}_pipelined']['ms_per_token']['median']:.2f} pipelined; "
              f"{ {k: round(v['median'], 1) for k, v in tl.items() if isinstance(v, dict) and 'median' in v} }",
              flush=True)
    fastcoll.check()
    fastcoll.finalize()
    dump(Path(args.out), f"where_rank{rank}{args.tag}", res)


def cmd_ranks(args) -> None:
    runs = {"direct": {}, "hostmode": {"FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1"}}
    for i, tag in enumerate(args.modes.split(",")):
        extra = runs[tag]
        port = 29500 + (os.getpid() % 200) + i
        procs = []
        for r in range(2):
            env = dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE="2", FASTCOLL_FAST_SYNC="1",
                       FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN="gate-where",
                       FASTCOLL_TIMEOUT="60", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="0", **extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            cmd = [sys.executable, __file__, "rank", "--out", args.out, "--tag", f"_{tag}{args.tag}",
                   "--tokens", str(args.tokens)]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=args.timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
        print(f"ranks {tag}: exit codes {codes}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["kinds", "gate", "ranks", "rank"])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--tag", default="")
    p.add_argument("--tokens", type=int, default=10)
    p.add_argument("--timeout", type=float, default=200)
    p.add_argument("--modes", default="direct,hostmode", help="ranks: the gate's modes to run")
    args = p.parse_args()
    {"kinds": cmd_kinds, "gate": cmd_gate, "ranks": cmd_ranks, "rank": cmd_rank}[args.what](args)


if __name__ == "__main__":
    main()
