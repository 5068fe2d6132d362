"""One rank of a multi-host job (tests/test_multihost.py), started by fastcoll-launch.

    multihost_worker.py OUTDIR collectives      every collective against numpy references
    multihost_worker.py OUTDIR big MB           one MB-sized all_reduce, checked
    multihost_worker.py OUTDIR loop [FLOATS]    prints "ready", then all-reduces FLOATS float32
                                                (default 4096; one more says whether a rank's
                                                MULTIHOST_LOOP_SECONDS are up, so that all stop
                                                together) every 10 ms until then or an error
    multihost_worker.py OUTDIR decode           mlx-lm's generate_step over a small llama split
                                                with its shard() through fastcoll.mlx_compat;
                                                prints "ready" after the first token, then
                                                decodes until MULTIHOST_LOOP_SECONDS are up
                                                (in graph mode unless FASTCOLL_MLX_GRAPH=0)

Each rank writes OUTDIR/rank<N>.json (what it saw: hostname, transport_info(), checks passed,
the error class and message, times) as soon as it knows, and prints it as one line. OUTDIR is
unique per test, so it also marks the processes of that test. Exit codes: 0 fine, 3 a
FastcollError, 1 anything else (a wrong result), 143 stopped by SIGTERM (the launcher).
Public API only.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import time
import traceback

import mlx.core as mx
import numpy as np

import fastcoll

OUTDIR, MODE, *ARGS = sys.argv[1:]
report: dict = {"pid": os.getpid(), "hostname": socket.gethostname(),
                "interface": os.environ.get("FASTCOLL_INTERFACE"),
                "local_rank": os.environ.get("FASTCOLL_LOCAL_RANK"),
                "rank": int(os.environ.get("FASTCOLL_RANK", "-1")), "checks": 0}


def write() -> None:
    path = os.path.join(OUTDIR, f"rank{report['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def on_term(signum, frame) -> None:
    if "outcome" not in report:  # the launcher stopped this rank before it saw anything
        report.update(outcome="terminated", signal=signum, t_end=time.time())
    write()
    os._exit(128 + signum)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    report["checks"] += 1


def equal(got, want, what: str) -> None:
    got = np.array(got) if isinstance(got, mx.array) else got
    check(got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want),
          f"{what}: got {got.dtype}{got.shape} {got.ravel()[:6]}, want {want.dtype}{want.shape} "
          f"{want.ravel()[:6]}")


def inputs(rank: int, case: int, shape, dtype) -> np.ndarray:
    """Small integers, different per rank and case: every rank can compute everyone's, and
    sums and products are exact whatever the order."""
    rng = np.random.default_rng(1000 * case + rank)
    return rng.integers(1, 4, size=shape).astype(dtype)


def collectives(g) -> None:
    r, n = g.rank(), g.size()
    case = 0
    for count in (1, 1000, 300_001):  # 300k float32 crosses over to the ring
        for dtype in (np.float32, np.int32, np.float64):
            case += 1
            every = [inputs(q, case, (count,), dtype) for q in range(n)]
            stack = np.stack(every)
            for op in ("sum", "prod", "min", "max"):
                want = {"sum": stack.sum(0, dtype=dtype), "prod": stack.prod(0, dtype=dtype),
                        "min": stack.min(0), "max": stack.max(0)}[op]
                equal(fastcoll.all_reduce(every[r], op=op), want,
                      f"all_reduce {op} {dtype} {count}")
            if dtype is np.float32:
                equal(fastcoll.all_reduce(every[r], op="mean"),
                      stack.sum(0, dtype=dtype) / np.float32(n), f"all_reduce mean {count}")
            equal(fastcoll.all_gather(every[r].reshape(1, -1)), stack,
                  f"all_gather {dtype} {count}")
            rows = inputs(r, case + 500, (n * 3, count), dtype)
            allrows = np.stack([inputs(q, case + 500, (n * 3, count), dtype) for q in range(n)])
            equal(fastcoll.reduce_scatter(rows), allrows.sum(0, dtype=dtype)[3 * r:3 * r + 3],
                  f"reduce_scatter {dtype} {count}")
            for root in range(n):
                equal(fastcoll.broadcast(every[r], root=root), every[root],
                      f"broadcast root {root} {dtype} {count}")
    # mx.array in, mx.array out
    x = mx.array(inputs(r, 77, (4, 256), np.float32))
    y = fastcoll.all_reduce(x)
    check(isinstance(y, mx.array), "all_reduce of an mx.array gives an mx.array")
    equal(y, np.stack([inputs(q, 77, (4, 256), np.float32) for q in range(n)]).sum(0),
          "all_reduce mx.array")
    equal(fastcoll.all_gather(x), np.concatenate([inputs(q, 77, (4, 256), np.float32)
                                                  for q in range(n)]), "all_gather mx.array")
    work = fastcoll.all_reduce(np.full(64, r + 1, np.int64), async_op=True)
    equal(work.wait(), np.full(64, n * (n + 1) // 2, np.int64), "async all_reduce")
    fastcoll.barrier()
    check(True, "barrier")
    # send/recv: pairs (0,1), (2,3), then every rank to the next one around the ring
    for count in (10, 400_000):
        if n % 2 == 0:
            peer = r ^ 1
            mine = inputs(r, 900 + count, (count,), np.float32)
            if r % 2 == 0:
                fastcoll.send(mine, dst=peer)
                got = fastcoll.recv((count,), np.float32, src=peer)
            else:
                got = fastcoll.recv((count,), np.float32, src=peer)
                fastcoll.send(mine, dst=peer)
            equal(got, inputs(peer, 900 + count, (count,), np.float32), f"send/recv pair {count}")
        nxt, prv = (r + 1) % n, (r - 1) % n
        mine = inputs(r, 950 + count, (count,), np.float32)
        if r == 0:
            fastcoll.send(mine, dst=nxt)
            got = fastcoll.recv((count,), np.float32, src=prv)
        else:
            got = fastcoll.recv((count,), np.float32, src=prv)
            fastcoll.send(mine, dst=nxt)
        equal(got, inputs(prv, 950 + count, (count,), np.float32), f"send/recv ring {count}")
    fastcoll.barrier()


def big(g, mb: int) -> None:
    n = g.size()
    count = mb * (1 << 20) // 4
    x = np.arange(count, dtype=np.float32) % 1024 + g.rank()
    t = time.perf_counter()
    y = fastcoll.all_reduce(x)
    report["seconds"] = time.perf_counter() - t
    equal(y, (np.arange(count, dtype=np.float32) % 1024) * n + n * (n - 1) / 2,
          f"all_reduce of {mb} MB")
    fastcoll.barrier()


def loop(g, floats: int) -> None:
    # The last element says whether this rank's time is up: every rank stops after the same
    # call. (Each stopping at its own clock's deadline, one rank once finalized while the other,
    # its deadline a moment later, had begun one more all_reduce: PeerLostError.)
    x = np.ones(floats + 1, np.float32)
    fastcoll.barrier()
    report["t_ready"] = time.time()
    print("ready", flush=True)
    deadline = time.monotonic() + float(os.environ.get("MULTIHOST_LOOP_SECONDS", "60"))
    while True:
        x[-1] = 1.0 if time.monotonic() < deadline else 0.0
        y = fastcoll.all_reduce(x)
        check(y[0] == g.size(), "loop all_reduce")
        if y[-1] < g.size():
            return
        time.sleep(0.01)
        report["t_last_ok"] = time.time()


def decode(g) -> None:
    # The ranks agree after every token whether the time is up, so that all stop together.
    from mlx_lm.generate import generate_step, generation_stream
    from mlx_lm.models import llama

    from fastcoll import mlx_compat

    mlx_compat.install()
    group = mx.distributed.init()
    args = llama.ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=4, intermediate_size=688,
                           num_attention_heads=8, num_key_value_heads=8, rms_norm_eps=1e-5, vocab_size=1024,
                           tie_word_embeddings=False)
    mx.random.seed(0)
    model = llama.Model(args)
    model.shard(group)
    mx.eval(model.parameters())
    deadline = time.monotonic() + float(os.environ.get("MULTIHOST_LOOP_SECONDS", "60"))
    report["tokens"] = 0
    while True:
        for token, _ in generate_step(mx.array([1, 2, 3, 4], dtype=mx.uint32), model, max_tokens=256):
            report["tokens"] += 1
            if report["tokens"] == 1:
                report["t_ready"] = time.time()
                print("ready", flush=True)
            if not isinstance(group, mlx_compat.Group):  # graph mode: MLX's graph runs the all_sums,
                mx.synchronize(generation_stream)  # the step queued ahead goes first on every rank
            up = fastcoll.all_reduce(np.array([time.monotonic() >= deadline], np.int32), op="max")
            if up[0]:
                check(report["tokens"] > 1, "decoded tokens")
                return


def main() -> int:
    faulthandler.enable()  # a crash (SIGSEGV, SIGBUS, ...) still says where, on stderr
    signal.signal(signal.SIGTERM, on_term)
    report["t_start"] = time.time()
    code = 0
    try:
        g = fastcoll.init()
        report.update(rank=g.rank(), size=g.size(), transport=g.transport_info(),
                      small=g.choose("all_reduce", 4), t_init=time.time())
        write()  # a rank that dies without a word still leaves this
        {"collectives": lambda: collectives(g), "big": lambda: big(g, int(ARGS[0])),
         "loop": lambda: loop(g, int(ARGS[0]) if ARGS else 4096), "decode": lambda: decode(g)}[MODE]()
        report["outcome"] = "ok"
    except fastcoll.FastcollError as e:
        report.update(outcome="error", error=type(e).__name__, message=str(e))
        code = 3
    except Exception as e:
        report.update(outcome="failed", error=type(e).__name__, message=str(e),
                      traceback=traceback.format_exc())
        code = 1
    report["t_end"] = time.time()
    write()
    print(json.dumps({k: report.get(k) for k in
                      ("rank", "hostname", "transport", "outcome", "error", "message", "checks")}),
          flush=True)
    t = time.time()
    try:
        fastcoll.finalize()
    except Exception as e:  # finalize is meant to be safe after an error; say so if it is not
        print(f"finalize raised {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    report["finalize_seconds"] = time.time() - t
    write()
    return code


if __name__ == "__main__":
    sys.exit(main())
