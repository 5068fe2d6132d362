"""fastcoll's side-by-side benchmark harness: `python bench/run.py --help`.

Modules: `metrics` (statistics and nccl-tests bandwidths), `systems` (the systems and how each
is launched), `harness` (the interleaved run), `report` (JSON, Markdown and plots), `run` (CLI).
The per-rank workers live in `bench/workers/` and run as scripts.
"""
