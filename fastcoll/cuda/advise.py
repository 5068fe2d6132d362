"""cudaMemAdvise for the control page, and cudaHostRegister for the direct mode's gather segment,
through cuda-python where it is installed.

MLX's CUDA arrays that the host has viewed live in managed memory, which migrates a page to
whichever side touched it last. The control page is touched by both on every gate (the GPU spins
on RELEASE while the host polls ARRIVAL), so left alone it would bounce between them. Preferring
host memory for it and marking it accessed by the GPU maps it into the GPU's page tables where it
stays: the host's stores land in its own memory and the GPU reads them over the bus (the design
expected a median release of ~8 us, p90 ~10 us, on an H200 with this advice; what the H200
measured, 5.9 us median: bench/records/2026-11-30-h200-gate/).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

log = logging.getLogger("fastcoll.gate")


def _runtime() -> Any | None:
    try:
        from cuda.bindings import runtime as rt  # cuda-python >= 12.6
        return rt
    except ImportError:
        pass
    try:
        from cuda import cudart as rt  # older cuda-python
        return rt
    except ImportError:
        return None


def _location(rt: Any, host: bool, device: int) -> Any:
    loc = rt.cudaMemLocation()
    if host:
        loc.type = rt.cudaMemLocationType.cudaMemLocationTypeHost
        loc.id = 0
    else:
        loc.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
        loc.id = device
    return loc


def _advise(rt: Any, ptr: int, nbytes: int, advice: Any, host: bool, device: int) -> None:
    """One cudaMemAdvise call, in whichever form this cuda-python has (CUDA 13 takes a location)."""
    attempts = []
    if hasattr(rt, "cudaMemLocation"):
        loc = _location(rt, host, device)
        attempts.append(lambda: rt.cudaMemAdvise(ptr, nbytes, advice, loc))
        if hasattr(rt, "cudaMemAdvise_v2"):
            attempts.append(lambda: rt.cudaMemAdvise_v2(ptr, nbytes, advice, loc))
    ordinal = getattr(rt, "cudaCpuDeviceId", -1) if host else device
    attempts.append(lambda: rt.cudaMemAdvise(ptr, nbytes, advice, int(ordinal)))
    last: Exception | None = None
    for attempt in attempts:
        try:
            result = attempt()
        except (TypeError, AttributeError) as e:  # not this form of the call
            last = e
            continue
        err = result[0] if isinstance(result, tuple) else result
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaMemAdvise({advice}) failed: {err}")
        return
    raise RuntimeError(f"no usable form of cudaMemAdvise: {last}")


def advise_towards_host(page: np.ndarray, device: int = 0) -> Callable[[], None] | None:
    """Prefer host memory for `page` and map it for `device`; returns an undo, or None if not done."""
    rt = _runtime()
    if rt is None:
        log.info("cuda-python is not installed: the gate's control page is left unadvised "
                 "(it works, but pages migrate; install it, or fastcoll's extra cuda, for the fast path)")
        return None
    ptr, nbytes = page.ctypes.data, page.nbytes
    A = rt.cudaMemoryAdvise
    try:
        _advise(rt, ptr, nbytes, A.cudaMemAdviseSetPreferredLocation, True, device)
        _advise(rt, ptr, nbytes, A.cudaMemAdviseSetAccessedBy, False, device)
    except Exception as e:
        log.warning("could not advise the gate's control page towards host memory: %s", e)
        return None
    log.debug("control page %#x (%d bytes) advised: preferred host, accessed by GPU %d", ptr, nbytes, device)

    def undo() -> None:
        try:
            _advise(rt, ptr, nbytes, A.cudaMemAdviseUnsetAccessedBy, False, device)
            _advise(rt, ptr, nbytes, A.cudaMemAdviseUnsetPreferredLocation, True, device)
        except Exception as e:  # the buffer goes back to MLX's cache either way
            log.debug("could not undo the control page's memory advice: %s", e)

    return undo


def advise_page(page: np.ndarray) -> Callable[[], None] | None:
    """Prefer host memory for the gate's control page and map it for MLX's GPU; an undo, or None."""
    import mlx.core as mx

    # MLX runs on CUDA device 0 of those visible (CUDA_VISIBLE_DEVICES picks which GPU that is).
    ordinal = getattr(mx.default_device(), "index", 0) or 0
    return advise_towards_host(page, ordinal)


def register_host_memory(ptr: int, nbytes: int) -> tuple[int, Callable[[], None]] | None:
    """Page-lock host memory (another process's shared mapping too) and map it for the GPU
    (cudaHostRegister, mapped and portable): its GPU-visible address and an undo, or None (logged)
    where cuda-python or the registration is unavailable. The direct mode's gather segment."""
    rt = _runtime()
    if rt is None:
        log.info("cuda-python is not installed: the gate's direct mode is off")
        return None
    flags = int(getattr(rt, "cudaHostRegisterMapped", 2)) | int(getattr(rt, "cudaHostRegisterPortable", 1))

    def failed(result: Any) -> bool:
        err = result[0] if isinstance(result, tuple) else result
        return err != rt.cudaError_t.cudaSuccess

    try:
        result = rt.cudaHostRegister(ptr, nbytes, flags)
        if failed(result):
            log.info("cudaHostRegister failed (%s): the gate's direct mode is off", result)
            return None
        result = rt.cudaHostGetDevicePointer(ptr, 0)
        if failed(result):
            rt.cudaHostUnregister(ptr)
            log.info("cudaHostGetDevicePointer failed (%s): the gate's direct mode is off", result)
            return None
    except Exception as e:  # an unexpected binding: no direct mode, never a broken job
        log.info("could not register the gather segment with CUDA (%s): the gate's direct mode is off", e)
        return None
    device_ptr = int(result[1])

    def undo() -> None:
        try:
            rt.cudaHostUnregister(ptr)
        except Exception as e:
            log.debug("cudaHostUnregister failed: %s", e)

    return device_ptr, undo
