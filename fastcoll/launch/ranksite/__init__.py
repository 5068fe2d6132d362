"""The directory fastcoll-launch puts first on a local rank's PYTHONPATH: its `sitecustomize`
warns a program that calls `mx.distributed.init()` without fastcoll's compat layer (which
gives each rank a world of one, silently), and then runs the sitecustomize it hides, if any."""

from __future__ import annotations

import os

HOOK_DIR = os.path.dirname(os.path.abspath(__file__))


def python_path(existing: str) -> str:
    """PYTHONPATH for a rank: HOOK_DIR, then `existing` (the rank's own, possibly empty)."""
    return os.pathsep.join([HOOK_DIR, *(p for p in existing.split(os.pathsep) if p)])
