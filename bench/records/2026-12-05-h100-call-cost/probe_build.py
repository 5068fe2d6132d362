"""Where the thread that builds the tokens spends a token (NOTES 82), around tp_worker's decode:
    python3 probe_build.py bench/workers/tp_worker.py --mode tp ... (under fastcoll-launch and
    -m fastcoll.mlx_compat). Per token: the model's call (building the graph in Python), MLX's
    async_eval (encoding it for the GPU), the rest (mostly y.item(), waiting for the GPU); within
    the model's call, mx.distributed.all_sum, fastcoll's Gate.launch within it, and the MLX
    kernel call within that (MlxBackend.launch)."""
import importlib.util
import os
import statistics
import sys
import time

import mlx.core as mx

sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
spec = importlib.util.spec_from_file_location("tp_worker", sys.argv[0])
tw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tw)
orig_decode, orig_build, orig_async = tw.decode, tw.build, mx.async_eval
spent = {"model": 0.0, "async_eval": 0.0, "all_sum": 0.0, "gate_launch": 0.0, "kernel": 0.0}


def timed(key, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0
    return wrapper


def build(a, kind):
    model = orig_build(a, kind)
    cls = type(model)
    cls.__call__ = timed("model", cls.__call__)
    return model


def decode(model, prompt, n):
    for k in spent:
        spent[k] = 0.0
    w0 = time.perf_counter()
    r = orig_decode(model, prompt, n)
    wall = time.perf_counter() - w0
    m, e = spent["model"], spent["async_eval"]
    parts = " ".join(f"{k}_ms={spent[k] * 1e3 / n:.2f}" for k in ("all_sum", "gate_launch", "kernel"))
    print(f"BUILD n={n} wall_ms={wall * 1e3 / n:.2f} model_ms={m * 1e3 / n:.2f} async_eval_ms={e * 1e3 / n:.2f} "
          f"rest_ms={(wall - m - e) * 1e3 / n:.2f} {parts}", flush=True)
    return r


mx.async_eval = timed("async_eval", orig_async)
mx.distributed.all_sum = timed("all_sum", mx.distributed.all_sum)  # mlx.nn's layers look it up per call
try:
    from fastcoll.gate.gate import Gate
    from fastcoll.gpu.mlx_backend import MlxBackend

    Gate.launch = timed("gate_launch", Gate.launch)
    MlxBackend.launch = timed("kernel", MlxBackend.launch)
except ImportError:
    pass
tw.decode, tw.build = decode, build
tw.main()
