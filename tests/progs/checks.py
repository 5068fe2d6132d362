"""What the test programs share: counted checks, and running main() so that any failure
prints its traceback and exits 1 (the test reads the exit code and stderr)."""

from __future__ import annotations

import sys
import traceback
from typing import Callable

passed = 0  # checks passed so far; programs print it at the end


def check(cond: bool, what: str) -> None:
    """Fail with `what` unless `cond`; count it otherwise."""
    global passed
    if not cond:
        raise AssertionError(what)
    passed += 1


def raises(exc: type[BaseException], fn: Callable[[], object], what: str, match: str | None = None) -> None:
    """Check that fn() raises `exc`, whose message contains `match` if given."""
    try:
        fn()
    except exc as e:
        check(match is None or match in str(e), f"{what}: message {e!r} lacks {match!r}")
        return
    raise AssertionError(f"{what}: no {exc.__name__} raised")


def run(main: Callable[[], None], cleanup: Callable[[], None] | None = None) -> None:
    """main(); on an exception print it and exit 1. cleanup() runs either way (its own errors
    are ignored: main's failure is the one to report)."""
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    finally:
        if cleanup is not None:
            try:
                cleanup()
            except Exception:
                pass
