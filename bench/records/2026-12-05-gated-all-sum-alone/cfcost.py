"""A chain of 64 `x * 1` calls, as they are and inside an mx.custom_function with a vjp: build and evaluation, us a call.
    python cfcost.py"""
import mlx.core as mx
f0 = lambda x: x * 1
cf = mx.custom_function(lambda x: x * 1)
cf = cf.vjp(lambda p, c, o: c)
x = mx.ones((1, 1, 1024), dtype=mx.bfloat16); mx.eval(x)
for name, f in (("plain", f0), ("cf+vjp", cf)) * 1:
    b, e = [], []
    for r in range(200):
        y = x
        t0 = time.perf_counter()
        for _ in range(64):
            y = f(y)
        t1 = time.perf_counter()
        mx.eval(y)
        t2 = time.perf_counter()
        b.append((t1 - t0) * 1e6 / 64); e.append((t2 - t1) * 1e6 / 64)
    print(f"{name}: build {statistics.median(b):.2f} us eval {statistics.median(e):.2f} us a call")
