"""What a gated all_sum costs the thread that builds and encodes the graph (NOTES 82): under
    fastcoll-launch -n 2 python3 -m fastcoll.mlx_compat encode_cost.py
each rank builds chains of 64 dependent calls on a (1, 1, 4096) bfloat16 row and times the
building, MLX's async_eval (encoding the chain for the GPU) and the wait for the GPU apart, for:
adds; mx.distributed.all_sum (the gate); fastcoll.all_reduce (the gate without mlx_compat's
mx.custom_function around it); a trivial CUDA kernel of the gate's inputs and outputs
(a copy, with the previous call's token as input), with a short source and one of the gate's size (about 9 KB)."""
import statistics
import time

import mlx.core as mx

N, REPS = 64, 30
group = mx.distributed.init(strict=True)
x = (mx.random.normal((1, 1, 4096)) * 0.01).astype(mx.bfloat16)
ctrl = mx.zeros((4096,), dtype=mx.uint32)
token0 = mx.zeros((4,), dtype=mx.uint32)
mx.eval(x, ctrl, token0)
half = mx.array(0.5, dtype=mx.bfloat16)
BODY = """
for (int k = threadIdx.x; k < 4096; k += blockDim.x) out[k] = inp[k];
if (threadIdx.x < 4) token[threadIdx.x] = after[threadIdx.x] + (ctrl[0] & 0u);
"""


def copy_kernel(name, header):
    k = mx.fast.cuda_kernel(name=name, input_names=["inp", "ctrl", "after"], output_names=["out", "token"],
                            source=BODY, header=header)
    box = [token0]
    kw = {"output_shapes": [(1, 1, 4096), (4,)], "output_dtypes": [mx.bfloat16, mx.uint32],
          "grid": (256, 1, 1), "threadgroup": (256, 1, 1)}

    def step(y):
        out, box[0] = k(inputs=[y, ctrl, box[0]], **kw)
        return out
    return step


def chain(step):
    y = x
    t0 = time.perf_counter()
    for _ in range(N):
        y = step(y) * half
    t1 = time.perf_counter()
    mx.async_eval(y)
    t2 = time.perf_counter()
    mx.eval(y)
    t3 = time.perf_counter()
    return (t1 - t0) * 1e6 / N, (t2 - t1) * 1e6 / N, (t3 - t2) * 1e3


def run(name, step):
    for _ in range(3):
        chain(step)
    res = [chain(step) for _ in range(REPS)]
    b, e, w = (statistics.median(r[i] for r in res) for i in range(3))
    print(f"ENCODE rank={group.rank()} {name}: build {b:.1f} us a call, encode {e:.1f} us a call, "
          f"wait {w:.3f} ms a chain of {N}", flush=True)


import fastcoll  # noqa: E402

steps = {"add": lambda y: y + 1,
         "all_sum": lambda y: mx.distributed.all_sum(y, group=group),
         "fastcoll.all_reduce": lambda y: fastcoll.all_reduce(y, "sum", group=group.fastcoll_group)}
if mx.cuda.is_available():
    steps["copy kernel"] = copy_kernel("fc_probe_copy", "")
    steps["copy kernel, 9 KB header"] = copy_kernel("fc_probe_copy9", "".join(
        f"#define FC_PROBE_PAD_{i} {i}\n" for i in range(270)))
for _ in range(2):
    for name, step in steps.items():
        run(name, step)
mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
