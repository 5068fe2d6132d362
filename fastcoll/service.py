"""The per-rank service thread: it owns the sockets and runs queued collectives in call order."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger("fastcoll.service")


class Work:
    """A queued collective, like torch.distributed's Work: `wait()` returns its result."""

    __slots__ = ("_done", "_result", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the collective ends; return its result or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the collective did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has ended, successfully or not."""
        return self._done.is_set()

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()


class Done(Work):
    """A Work that ended before it was returned: what a call that needed no communication, or
    one that the GPU finishes (the fence gate), gives with async_op."""

    __slots__ = ()

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._finish(result)


class Service:
    """One thread that runs submitted functions one at a time, in submission order.

    `claim_if_idle` lets a synchronous caller run its function on its own thread when nothing is
    queued or running, because handing a small collective to another thread and back costs
    several times the exchange itself. Whoever runs a function holds `_running`,
    so the sockets still have one user at a time and calls still run in call order.
    """

    def __init__(self, name: str = "fastcoll-service"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._running = threading.Lock()
        self._count = threading.Lock()
        self._queued = 0  # submitted and not yet finished
        self._inline = False  # a caller's thread holds the run lock (claim_if_idle)
        self._refused: BaseException | None = None  # what calls get once the service is shut
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Work:
        """Queue fn; its result or exception reaches the returned Work (the service's refusal once
        it is shut: nothing would run it)."""
        work = Work()
        with self._count:
            if self._refused is not None:
                work._finish(error=self._refused)
                return work
            self._queued += 1
        self._queue.put((fn, work))
        return work

    def claim_if_idle(self) -> bool:
        """Take the run lock for the calling thread if nothing is queued or running.

        Call it under the lock that orders submissions; `release()` when done."""
        with self._count:
            if self._queued or self._refused is not None:
                return False
            self._running.acquire()
            self._inline = True
            return True

    def release(self) -> None:
        """Give back the run lock that claim_if_idle() took."""
        self._inline = False
        self._running.release()

    def end_inline(self, refusal: BaseException, interrupt: Callable[[], None], timeout: float) -> bool:
        """Refuse every later call (`refusal`); if a caller's thread runs one now, interrupt() it
        and wait up to `timeout` seconds for it to let go of the run lock. False if it kept it.
        What is queued still runs (close())."""
        with self._count:
            self._refused = refusal
            inline = self._inline
        if not inline:
            return True
        interrupt()
        if not self._running.acquire(timeout=timeout):
            return False
        self._running.release()
        return True

    def stop_running(self, timeout: float) -> bool:
        """Take the run lock for good, once the function running (if any) ends within `timeout`
        seconds: nothing runs after. False if it did not end in time."""
        return self._running.acquire(timeout=timeout)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, work = item
            try:
                with self._running:
                    result = fn()
                work._finish(result)
            except BaseException as e:  # the caller gets it through Work.wait()
                work._finish(error=e)
            finally:
                with self._count:
                    self._queued -= 1

    def close(self, timeout: float = 5.0) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the service thread did not stop within %.1fs", timeout)
