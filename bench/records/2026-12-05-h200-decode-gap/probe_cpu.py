"""The main thread's CPU time a decoded token, around tp_worker's decode (NOTES 81's next step):
    python3 probe_cpu.py bench/workers/tp_worker.py --mode tp ... (under fastcoll-launch and -m fastcoll.mlx_compat)."""
import importlib.util
import os
import sys
import time

sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
spec = importlib.util.spec_from_file_location("tp_worker", sys.argv[0])
tw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tw)
orig = tw.decode


def decode(model, prompt, n):
    c0, w0 = time.thread_time(), time.perf_counter()
    r = orig(model, prompt, n)
    c1, w1 = time.thread_time(), time.perf_counter()
    print(f"MAINCPU n={n} cpu_ms_per_token={(c1 - c0) * 1e3 / n:.2f} wall_ms_per_token={(w1 - w0) * 1e3 / n:.2f}",
          flush=True)
    return r


tw.decode = decode
tw.main()
