"""Which engines a multi-process test runs on: the native one (FASTCOLL_NATIVE=1) where it is
built, and the pure-Python reference (FASTCOLL_NATIVE=0), as parameters of FASTCOLL_NATIVE."""

from __future__ import annotations

import pytest


def native_missing() -> str | None:
    """Why the native engine cannot run here, or None."""
    from fastcoll.engine import native_available

    return native_available()


def engines() -> list:
    """pytest parameters: "1" (native; skipped, saying why, where it is not built) and "0"."""
    why = native_missing()
    native = pytest.param("1", id="native", marks=pytest.mark.skipif(why is not None, reason=f"no native engine: {why}"))
    return [native, pytest.param("0", id="python")]
