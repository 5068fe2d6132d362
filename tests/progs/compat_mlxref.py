"""The same mx.distributed calls under MLX's own ring backend and under fastcoll.mlx_compat.

    mlx.launch -n 2 --backend ring -- python compat_mlxref.py mlx OUTDIR
    (FASTCOLL_* environment) python compat_mlxref.py fastcoll OUTDIR

Each rank writes one JSON line per case to OUTDIR/<which>-<rank>.jsonl:
{"rank", "case", "dtype", "shape", "values"} or {"rank", "case", "error"}. A file per rank,
because mlx.launch forwards the ranks' stdout without keeping their lines apart. The test
compares the two runs case by case.
"""

from __future__ import annotations

import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def encode(y: mx.array) -> dict:
    dt = str(y.dtype).rsplit(".", 1)[-1]
    if y.dtype == mx.bfloat16:
        y = y.astype(mx.float32)
    a = np.array(y)
    if np.iscomplexobj(a):
        vals = [[float(v.real), float(v.imag)] for v in a.reshape(-1)]
    else:
        vals = a.reshape(-1).tolist()
    return {"dtype": dt, "shape": list(a.shape), "values": vals}


def main() -> None:
    which, outdir = sys.argv[1], sys.argv[2]
    if which == "fastcoll":
        from fastcoll import mlx_compat

        mlx_compat.install()
        group = mx.distributed.init()
    else:
        group = mx.distributed.init(backend="ring", strict=True)
    d = mx.distributed
    r, n = group.rank(), group.size()
    sink = open(os.path.join(outdir, f"{which}-{r}.jsonl"), "w")

    def case(name, fn):
        try:
            y = fn()
            mx.eval(y)
            out = {"rank": r, "case": name, **encode(y)}
        except Exception as e:  # noqa: BLE001 - the error itself is the result
            out = {"rank": r, "case": name, "error": f"{type(e).__name__}"}
        sink.write(json.dumps(out) + "\n")

    base = np.array([[1, 2, 3], [4, 0, 6]]) * (r + 1) - 2 * r
    for dt in (mx.float32, mx.float16, mx.bfloat16, mx.float64, mx.int32, mx.int8, mx.uint8, mx.int64, mx.uint64, mx.complex64):
        x = mx.array(base).astype(dt)
        if dt == mx.int8:
            x = x * 20  # sums overflow and wrap
        if dt == mx.complex64:
            x = x + mx.array(1j) * mx.array(base[::-1].copy()).astype(dt)
        for op in ("all_sum", "all_max", "all_min"):
            case(f"{op}/{dt}", lambda: getattr(d, op)(x, group=group))
        case(f"all_gather/{dt}", lambda: d.all_gather(x))
    b = mx.array([True, r == 0, False, r == 1])
    for op in ("all_sum", "all_max", "all_min", "all_gather"):
        case(f"{op}/bool", lambda: getattr(d, op)(b))
    for v in (1, 2.5, True):
        case(f"all_sum/scalar {v!r}", lambda: d.all_sum(v))
    case("all_gather/scalar", lambda: d.all_gather(mx.array(r * 3)))
    case("all_sum/empty", lambda: d.all_sum(mx.zeros((0, 3))))
    case("all_sum/stream", lambda: d.all_sum(mx.arange(3), stream=mx.cpu))
    if r == 0:
        case("send", lambda: d.send(mx.arange(4, dtype=mx.float16) * 3, 1))
    else:
        case("recv", lambda: d.recv((4,), mx.float16, 0))
    if r == 1:
        case("send_like", lambda: d.send(mx.arange(3) + 7, 0))
    else:
        case("recv_like", lambda: d.recv_like(mx.arange(3), 1))

    x = mx.array([1.0, 2.0]) * (r + 1)
    case("grad/all_sum", lambda: mx.grad(lambda x: (d.all_sum(x) * mx.array([1.0, 10.0])).sum())(x))
    case("grad/all_gather", lambda: mx.grad(lambda x: (d.all_gather(x) * mx.arange(2.0 * n)).sum())(x))
    case("grad/all_max", lambda: mx.grad(lambda x: (d.all_max(x) * 3).sum())(x))
    mx.random.seed(3)
    lin = nn.Linear(8, 6)
    inp = mx.random.normal((2, 8))
    mx.eval(lin.parameters(), inp)
    from mlx.nn.layers.distributed import shard_linear

    case("sharded-to-all", lambda: shard_linear(lin, "sharded-to-all", group=group)(inp))
    case("all-to-sharded", lambda: shard_linear(lin, "all-to-sharded", group=group)(inp))
    grads = {"w": mx.ones((3, 2)) * (r + 1), "b": [mx.array([r * 2.0])]}
    case("average_gradients", lambda: mx.concatenate([v.reshape(-1) for v in nn.average_gradients(grads).values() if isinstance(v, mx.array)]))
    case("split", lambda: mx.array(group.split(0).size()))
    case("sum_scatter", lambda: d.sum_scatter(mx.arange(4.0) + r))
    sink.close()


if __name__ == "__main__":
    main()
