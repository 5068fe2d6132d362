"""The native engine's door (fastcoll/engine/door.py): the extension has exactly the public names
PUBLIC_API declares, a name missing or added is an ImportError naming it, and an OpSpec takes its
fields by name, each checked with an error that names the field."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from fastcoll.engine import door, native_available

NATIVE = native_available() is None
pytestmark = pytest.mark.skipif(not NATIVE, reason=f"the door is the native engine's: {native_available()}")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _native():
    from fastcoll.engine import _native

    return _native


def _fields(**changes):
    """A valid all_reduce of 4 float32 on a group of ranks (0, 1), as this rank 0, with changes."""
    n = _native()
    fields = dict(kind=n.KINDS.index("all_reduce"), algorithm=n.ALGORITHMS.index("direct"), sig="all_reduce(x)",
                  limit=10.0, rank=0, size=2, ranks=np.array([0, 1], np.int32).tobytes(), piece_bytes=1 << 16,
                  dtype=n.DTYPES.index("float32"), itemsize=4)
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


@pytest.fixture
def engine():
    e = _native().Engine(rank=0, size=2, channels=1, spin_us=0, yield_us=0, main_thread=threading.main_thread().ident)
    yield e
    e.close(0.0, 0.0)


def test_the_extension_has_exactly_the_declared_surface():
    n = _native()
    door.check(n)  # (what importing fastcoll.engine.native does)
    e = n.Engine(rank=0, size=2, channels=1, spin_us=0, yield_us=0, main_thread=threading.main_thread().ident)
    try:  # an Engine's three objects are the declared types, each of a few methods
        for attr, kind in (("runner", n.Runner), ("links", n.Links), ("gate", n.GateHost)):
            assert type(getattr(e, attr)) is kind
            assert len(door.PUBLIC_API[kind.__name__]) <= 8
    finally:
        e.close(0.0, 0.0)


def test_a_missing_or_an_extra_name_is_an_import_error_naming_it():
    n = _native()
    fake = types.ModuleType("fake")
    fake.__dict__.update({k: v for k, v in vars(n).items() if k != "Links"})
    fake.shortcut = lambda: None
    with pytest.raises(door.SurfaceError, match=r"lacks Links.*has undeclared shortcut"):
        door.check(fake)
    assert issubclass(door.SurfaceError, ImportError)

    class Runner:  # one method gone, one come
        def __getattr__(self, name):
            raise AttributeError(name)

    for name in door.PUBLIC_API["Runner"]:
        if name != "run":
            setattr(Runner, name, lambda self: None)
    Runner.run_everything = lambda self: None
    fake = types.ModuleType("fake")
    fake.__dict__.update(vars(n))
    fake.Runner = Runner
    with pytest.raises(door.SurfaceError, match=r"_native.Runner lacks run; _native.Runner has undeclared "
                                                r"run_everything"):
        door.check(fake)


def test_importing_the_engine_over_another_surface_fails_and_says_why():
    """In a process of its own: the extension loaded, one of its names taken away, then the
    native engine's module imported (fastcoll.engine.native_available says the same)."""
    code = ("from fastcoll.engine import _native, native_available\n"
            "del _native.Links\n"
            "print(native_available())\n"
            "import fastcoll.engine.native\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode != 0
    assert "fastcoll.engine._native lacks Links" in p.stdout, p.stdout
    assert "SurfaceError" in p.stderr and "lacks Links" in p.stderr, p.stderr


def test_an_op_spec_takes_its_fields_by_name_and_reads_them_back(engine):
    spec = engine.runner.spec(**_fields(root=1, reduce=_native().OPS.index("max")))
    assert (spec.sig, spec.rank, spec.size, spec.root, spec.itemsize, spec.limit) == ("all_reduce(x)", 0, 2, 1, 4, 10.0)
    assert spec.reduce == _native().OPS.index("max") and spec.bounds is None and spec.agree_counts == 0
    with pytest.raises(TypeError, match="by name"):
        engine.runner.spec(0, 1)
    with pytest.raises(TypeError):
        _native().OpSpec()  # made by a Runner only


@pytest.mark.parametrize("change, error, says", [
    (dict(sig=None), TypeError, "needs field 'sig'"),
    (dict(colour=3), TypeError, "no field 'colour'"),
    (dict(root="0"), TypeError, "field 'root' must be an int"),
    (dict(limit="soon"), TypeError, "field 'limit'"),
    (dict(sig=b"bytes"), TypeError, "field 'sig' must be a str"),
    (dict(kind=99), ValueError, "field 'kind'"),
    (dict(dtype=-1), ValueError, "field 'dtype'"),
    (dict(root=2), ValueError, "field 'root'"),
    (dict(rank=2), ValueError, "field 'size' or 'rank'"),
    (dict(size=3, ranks=np.array([0, 1, 0], np.int32).tobytes()), ValueError, "field 'size' is larger"),
    (dict(itemsize=2), ValueError, "field 'itemsize'"),
    (dict(ranks=np.array([0], np.int32).tobytes()), ValueError, "field 'ranks' must hold an int32"),
    (dict(ranks=np.array([1, 0], np.int32).tobytes()), ValueError, "field 'ranks'"),
    (dict(bounds=[0, 1]), TypeError, "field 'bounds'"),
    (dict(algorithm=3), ValueError, "field 'algorithm' names no native schedule"),  # pairwise: all_to_all's
])
def test_a_bad_field_is_an_error_that_names_it(engine, change, error, says):
    with pytest.raises(error, match=says):
        engine.runner.spec(**_fields(**change))


def test_a_run_takes_an_op_spec_of_this_job_only(engine):
    other = _native().Engine(rank=1, size=3, channels=1, spin_us=0, yield_us=0,
                             main_thread=threading.main_thread().ident)
    try:
        foreign = other.runner.spec(**_fields(rank=1, size=2, ranks=np.array([0, 1], np.int32).tobytes()))
    finally:
        other.close(0.0, 0.0)
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="another job's engine"):
        engine.runner.run(foreign, 0, x, x)
    with pytest.raises(TypeError, match="expected an OpSpec"):
        engine.runner.run((0, 1, 2), 0, x, x)
    spec = engine.runner.spec(**_fields())
    with pytest.raises(ValueError, match="not as long as the contribution"):  # the buffers: each call's
        engine.runner.run(spec, 0, x, np.ones(3, np.float32))


def test_a_traced_op_spec_returns_its_phases_from_run_and_is_never_queued():
    """trace=True: run() returns the phases the call noted, ((phase, peer, bytes, start_ns,
    end_ns) ..., dropped), by _native.PHASES' codes (a group of one rank only flushes); an
    untraced run returns None; submit() refuses a traced spec (its phases would have no way
    back)."""
    n = _native()
    e = n.Engine(rank=0, size=1, channels=1, spin_us=0, yield_us=0, main_thread=threading.main_thread().ident)
    try:
        fields = _fields(size=1, ranks=np.array([0], np.int32).tobytes())
        traced = e.runner.spec(**fields, trace=True)
        assert traced.trace == 1 and e.runner.spec(**fields).trace == 0
        x = np.arange(4, dtype=np.float32)
        out = np.empty_like(x)
        spans, dropped = e.runner.run(traced, 0, x, out)
        assert np.array_equal(out, x) and dropped == 0
        assert [(n.PHASES[s[0]], s[1], s[2]) for s in spans] == [("flush", -1, 0)]
        assert all(0 <= s[3] <= s[4] for s in spans)
        assert e.runner.run(e.runner.spec(**fields), 1, x, out) is None
        with pytest.raises(ValueError, match="runs through Runner.run"):
            e.runner.submit(traced, 2, x, out, None, None)
    finally:
        e.close(0.0, 0.0)


def test_a_collective_on_an_engine_without_its_links_is_an_error_naming_the_link(engine):
    """An Engine whose links were never added (the door used directly) fails the call with the
    peer and channel it lacks: it must not divide by a queue of no capacity (SIGFPE)."""
    x = np.ones(4, np.float32)
    with pytest.raises(Exception, match="no link to rank 1 on channel 0 was added"):
        engine.runner.run(engine.runner.spec(**_fields()), 0, x, np.empty_like(x))
    with pytest.raises(ValueError, match="no link to rank 1"):  # the message level too
        engine.links.send_raw(1, b"\0" * 8)
