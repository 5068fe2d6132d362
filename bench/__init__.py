"""fastcoll's benchmarks, users of its public API only (bench/README.md): `compare.py` beside its
peers on localhost, `multihost.py` across simulated hosts, `gate_bench.py` and `decode_bench.py`
for the fence gate, all through one runner (`harness`) and one per-rank timing loop
(`workers/timing.py`)."""
