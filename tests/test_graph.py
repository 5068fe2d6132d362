"""Graph mode (FASTCOLL_MLX_GRAPH=1): MLX's graph runs fastcoll's collectives through fastcoll's
MPI library (fastcoll/mlx_compat/csrc/mpi_abi.c over fastcoll/engine/csrc/binding/py_graph.c).

- every size (both algorithms), dtype and collective the table serves, on 2, 3 and 4 ranks
  (direct, and recursive doubling at 4), gives what the ranks' own arithmetic gives;
- the same mx.distributed calls give MLX's ring backend's results (tests/test_compat.py);
- a rank killed mid-loop ends every other rank with an error naming it, and the launcher exits
  non-zero at once; ranks that call different collectives end with a MismatchError;
- order: collectives made on two MLX streams, their inputs slow on different ranks, each get their
  own sum (every collective of a thread goes on its one stream); an eager call made while a graph
  collective is still waiting for its input comes after it on every rank; two threads inside
  calls at once end the rank with a message that names both calls;
- splits: MLX's Group.split is fastcoll's, and its groups' collectives stay in MLX's graph (every
  collective, dtype, nested splits, inside mx.compile) on 3 and 4 ranks; ranks that call
  different collectives on a split, or send what the other does not take, end with a
  MismatchError naming both calls in the user's terms;
- the library alone: what it says to MLX's probe, and what it refuses;
- on the pure-Python engine (which has no table) graph mode says so and the eager path serves;
- FASTCOLL_TRACE: every graph call in the rank's trace, once and in order, after init's calls,
  with its phases inside it and its bytes and peers; a rank that traces alone beside an untraced
  one; the table's bounds (set small by a test hook) keep the first calls and count the rest;
- the default (FASTCOLL_MLX_GRAPH unset) is graph mode where it can run, and where it cannot (an
  MLX older than 0.29.4, one whose MPI backend loads nothing, the fence gate asked for) the eager
  path with a log line and no warning; =0 is the eager path; =1 where it cannot run warns.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import PROGS, assert_ok, jobless_env, run_session

mx = pytest.importorskip("mlx.core")

from fastcoll.mlx_compat import graph  # noqa: E402

NATIVE = os.environ.get("FASTCOLL_NATIVE", "1") not in ("0", "")
LIBRARY = graph.library()


def _mode() -> str:
    """What the worker runs: the graph where the native engine and the library are built."""
    from fastcoll.engine import native_available

    return "graph" if NATIVE and LIBRARY and native_available() is None else "eager"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_graph_mode_collectives(launch, world):
    results = launch(world, "graph_worker.py", "check", FASTCOLL_MLX_GRAPH="1").wait(timeout=120)
    assert_ok(results)
    mode = _mode()
    for r in results:
        assert f"rank {r.rank}: {mode} checks passed" in r.out, r.out
        if mode == "eager":  # the reason is said, once a rank
            assert "FASTCOLL_MLX_GRAPH=1:" in r.err and "collectives run eagerly instead" in r.err, r.err


GRAPH_ONLY = pytest.mark.skipif(_mode() != "graph", reason="graph mode cannot run here (FASTCOLL_NATIVE=0, or "
                                "fastcoll's MPI library for MLX was not built): the eager path serves instead")


def _launch(*args: str, timeout: int = 10, prog: str = "graph_worker.py") -> list[str]:
    return [sys.executable, "-m", "fastcoll.launch", "-n", "2", "--timeout", "60", "--env", "FASTCOLL_MLX_GRAPH=1",
            "--env", f"FASTCOLL_TIMEOUT={timeout}", sys.executable, os.path.join(PROGS, prog), *args]


def _env() -> dict:
    return jobless_env("FASTCOLL_NATIVE")  # the engine under test stays the one this run asks for


def test_graph_mode_peer_killed_mid_loop_ends_the_job():
    """Rank 1 SIGKILLs itself between two all_sums: rank 0, waiting inside MLX's graph, writes a
    PeerLostError naming rank 1 and exits 1; the launcher exits non-zero well within the timeout."""
    started = time.monotonic()
    code, out, err = run_session(_launch("die", "1"), _env(), 60, merge_stderr=True)
    took = time.monotonic() - started
    assert code != 0, out
    assert "PeerLostError" in out and "rank 1" in out, out
    assert "the loop ended" not in out, out
    assert took < 10 + 15, (took, out)  # the timeout plus the launcher's start and grace


def test_graph_mode_mismatched_calls_end_with_a_mismatch_error_in_the_users_terms():
    """Rank r sums r + 4 float32s on the job's group: a rank ends naming its own call and the
    other rank's as eager mode names them (op, dtype, shape), not by the engine's codes."""
    code, out, err = run_session(_launch("mismatch"), _env(), 60, merge_stderr=True)
    assert code != 0, out
    assert "a mismatched call returned" not in out, out
    call = r"all_reduce\(sum,float32,\((\d),\)\)"
    if _mode() == "graph":
        pattern = (rf"rank (\d) \(host [^)]*\): s\d+c\d+/{call} in MLX's graph: MismatchError: "
                   rf"rank (\d) \(host [^)]*\) called another collective \(s\d+c\d+/{call}\)")
    else:  # the eager path's own words, the same names
        pattern = rf"rank (\d) called {call} as collective #\d+ but rank (\d) called {call}"
    found = re.findall(pattern, out)
    assert found, out
    for me, mine, peer, theirs in found:
        assert (int(mine), int(peer), int(theirs)) == (int(me) + 4, 1 - int(me), 5 - int(me)), out


@pytest.mark.skipif(not NATIVE, reason="the graph table is the native engine's (FASTCOLL_NATIVE=0 asks for none)")
def test_graph_table_takes_the_names_of_fastcoll_dtypes_and_refuses_others():
    """graph_open takes fastcoll.dtypes' names (one per engine dtype code, one per op), which its
    signatures use; a table of another length, or a name that is not one, is a ValueError."""
    import threading

    from fastcoll import dtypes
    from fastcoll.engine import _native

    e = _native.Engine(0, 2, 1, 0, 0, threading.main_thread().ident, 0)
    try:
        ring = _native.ALGORITHMS.index("ring")
        head = dict(prefix="s0c0/", ranks=(0, 1), rank=0, limit=10.0, piece_bytes=1 << 16, all_reduce=(0, ring, ring),
                    all_gather=(0, ring, ring), labels=("rank 0", "rank 1"))
        for names, ops, says in [(dtypes.names()[:-1], dtypes.OPS, "14 dtype names"),
                                 (dtypes.names(), dtypes.OPS + ("xor",), "5 op names"),
                                 (dtypes.names(), ("sum", "", "min", "max", "mean"), "a bad op name"),
                                 (dtypes.names()[:-1] + ("c" * 40,), dtypes.OPS, "a bad dtype name"),
                                 (dtypes.names()[:-1] + (7,), dtypes.OPS, "a bad dtype name")]:
            with pytest.raises(ValueError, match=says):
                e.runner.graph_open(**head, dtype_names=names, op_names=ops)
        assert e.runner.graph_open(**head, dtype_names=dtypes.names(), op_names=dtypes.OPS) is not None
    finally:
        e.close(0.0, 0.0)


def _library_script(body: str) -> subprocess.CompletedProcess:
    code = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({LIBRARY!r})\n"
        "buf = ctypes.create_string_buffer(256); n = ctypes.c_int()\n" + body
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(LIBRARY is None, reason="fastcoll's MPI library for MLX was not built (no compiler)")
def test_library_alone_answers_mlx_probe_and_refuses_what_it_cannot_serve():
    p = _library_script(
        "assert lib.MPI_Get_library_version(buf, ctypes.byref(n)) == 0\n"
        "print('version', buf.value[:n.value].decode())\n"
        "print('init', lib.MPI_Init(None, None))\n"  # nothing attached: MLX then has no MPI group
        "print('attach', lib.fastcoll_mpi_attach(ctypes.byref(ctypes.c_int(99)), b'rank 0\\n', None))\n"  # another version
        "P = ctypes.c_void_p\n"
        "lib.MPI_Comm_split.argtypes = [P, ctypes.c_int, ctypes.c_int, P]\n"
        "lib.MPI_Allreduce.argtypes = [P, P, ctypes.c_int, P, P, P]\n"
        "world = ctypes.c_void_p.in_dll(lib, 'ompi_mpi_comm_world')\n"
        "out = ctypes.c_void_p()\n"
        "print('split', lib.MPI_Comm_split(ctypes.addressof(world), 0, 0, ctypes.byref(out)))\n"
        "sys.stdout.flush()\n"
        "f = ctypes.c_void_p.in_dll(lib, 'ompi_mpi_float'); op = ctypes.c_void_p.in_dll(lib, 'ompi_mpi_op_sum')\n"
        "x = (ctypes.c_float * 4)()\n"
        "lib.MPI_Allreduce(x, x, 4, ctypes.addressof(f), ctypes.addressof(op), ctypes.addressof(world))\n"
        "print('returned')\n")
    assert "version " in p.stdout and "Open MPI" in p.stdout, p.stdout  # MLX accepts only Open MPI's ABI
    assert "init 0" not in p.stdout and "init " in p.stdout, p.stdout
    assert "did not attach a job" in p.stderr, p.stderr
    assert "attach -1" in p.stdout, p.stdout
    assert "split 0" not in p.stdout and "MPI_Comm_split: fastcoll.mlx_compat did not attach" in p.stderr, p.stderr
    # A collective with nothing attached ends the process: MLX ignores the result's code.
    assert p.returncode == 1 and "returned" not in p.stdout, (p.returncode, p.stdout)
    assert "MPI_Allreduce: called after fastcoll.finalize() or before init()" in p.stderr, p.stderr


@pytest.mark.parametrize("action,said", [("streams", "streams kept apart"), ("eager", "eager after graph in order"),
                                         ("finalize", "finalized after the graph's call")])
def test_graph_mode_keeps_the_programs_order(launch, action, said):
    """streams: two all_sums of one shape on two MLX streams, one's input slow on rank 0 and the
    other's on rank 1, traded their data before each thread's collectives went on one stream.
    eager: an eager call made while rank 0's graph collective waited for its input ran before it
    there and after it on rank 1 (a MismatchError) before eager calls waited for the graph's.
    finalize: fastcoll.finalize() closed the engine under that waiting call, which then ended the
    process, before finalize() waited for the graph's calls too."""
    results = launch(2, "graph_worker.py", action, FASTCOLL_MLX_GRAPH="1", FASTCOLL_TIMEOUT="30").wait(timeout=120)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}: {said}" in r.out, (r.out, r.err)


@GRAPH_ONLY
def test_graph_mode_two_threads_inside_calls_at_once_end_the_rank_naming_both():
    code, out, err = run_session(_launch("threads"), _env(), 60, merge_stderr=True)
    assert code != 0, out
    assert ("fastcoll: rank 0 (host " in out and "): all_gather(float32,(3,)) in MLX's graph: FastcollError: another "
            "MLX stream was inside all_reduce(sum,float32,(8,)) at the same time" in out), out
    assert "one stream of its own" in out and "from one thread at a time" in out, out
    assert "were not caught" not in out, out


@GRAPH_ONLY
@pytest.mark.parametrize("world", [3, 4])
def test_graph_mode_splits_are_fastcolls_and_stay_in_the_graph(launch, world):
    results = launch(world, "graph_split_worker.py", "split", FASTCOLL_MLX_GRAPH="1").wait(timeout=180)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}: split checks passed" in r.out, r.out


@GRAPH_ONLY
def test_graph_mode_mismatch_on_a_split_names_both_calls_as_the_user_made_them():
    code, out, err = run_session(_launch("mismatch", prog="graph_split_worker.py"), _env(), 60, merge_stderr=True)
    assert code != 0, out
    assert ("): s1c0/all_reduce(sum,float32,(4,)) in MLX's graph: MismatchError: rank 1 (host " in out
            and ") called s1c0/all_gather(float32,(4,)) (its call 0 of the group, this rank's 0)" in out), out
    assert "a mismatched call returned" not in out, out


@GRAPH_ONLY
def test_graph_mode_message_on_a_split_that_the_receiver_does_not_expect_is_not_taken():
    code, out, err = run_session(_launch("p2p", prog="graph_split_worker.py"), _env(), 60, merge_stderr=True)
    assert code != 0, out
    assert ("): s1c0/recv(0,1,float32,(5,)) in MLX's graph: MismatchError: rank 0 (host " in out
            and ") called s1c0/send(0,1,float32,(4,))" in out), out
    assert "rank 1: its p2p call returned" not in out, out


@GRAPH_ONLY
def test_graph_mode_failed_split_raises_fastcolls_error():
    """MLX turns a failed MPI_Comm_split into `RuntimeError: MPI could not split this group`; the
    split that install() gives MLX's class raises the error fastcoll's split raised instead."""
    code, out, err = run_session(_launch("failed", prog="graph_split_worker.py"), _env(), 60, merge_stderr=True)
    assert code == 0, out
    assert "rank 0: raised MismatchError: rank 0 called split(int64,2) as collective #2 but rank 1 called barrier()" in out, out
    assert "could not split" not in out, out


def test_install_gives_mlxs_group_class_fastcoll_group_and_split_and_uninstall_takes_them_off():
    """Graph mode hands out MLX's own groups: install() gives their class `fastcoll_group` (as
    mlx_compat.Group has; tp_inference reads it) and a split that notes each split's fastcoll
    group; a group fastcoll did not make says so; uninstall() leaves MLX's class as it was."""
    code = (
        "import mlx.core as mx\nfrom fastcoll import mlx_compat\n"
        "G = mx.distributed.Group; split = G.split; own = mx.distributed.init()\n"
        "mlx_compat.install()\n"
        "print('split wrapped', G.split is not split, 'property', isinstance(G.__dict__['fastcoll_group'], property))\n"
        "try:\n    own.fastcoll_group\nexcept AttributeError as e:\n    print('refused:', e)\n"
        "print('ours', mx.distributed.init().fastcoll_group.size())\n"
        "mlx_compat.uninstall()\n"
        "print('restored', G.split is split, hasattr(G, 'fastcoll_group'))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert p.returncode == 0, p.stderr
    assert "split wrapped True property True" in p.stdout, p.stdout
    assert "is not a group fastcoll made (make it with mx.distributed.init() after fastcoll.mlx_compat.install()" in p.stdout
    assert "ours 1" in p.stdout and "restored True False" in p.stdout, p.stdout


OLD = "this MLX (0.29.3) is older than 0.29.4, whose MPI backend does not read MLX_MPI_LIBNAME"
NO_MPI = "MLX's MPI backend did not load "
GATE = "FASTCOLL_FAST_SYNC=1 asks for the fence gate, which the eager path runs"


@pytest.mark.parametrize("env, said, warned", [
    ({}, None, False),  # the default: graph mode where MLX allows it, without a word
    ({"FASTCOLL_MLX_GRAPH": "0"}, None, False),  # the eager path, asked for
    ({"FASTCOLL_TEST_GRAPH_UNAVAILABLE": "old-mlx"}, OLD, False),  # the default where graph mode cannot run
    ({"FASTCOLL_TEST_GRAPH_UNAVAILABLE": "no-mpi"}, NO_MPI, False),
    ({"FASTCOLL_FAST_SYNC": "1"}, GATE, False),  # the fence gate is the eager path's
    ({"FASTCOLL_MLX_GRAPH": "1", "FASTCOLL_TEST_GRAPH_UNAVAILABLE": "old-mlx"}, OLD, True),  # asked for: warned
])
def test_graph_mode_is_the_default_where_it_can_run_else_the_eager_path_quietly(launch, env, said, warned):
    """Which path an mx.distributed program gets: the worker says "graph" only where its group is
    MLX's own of the MPI backend over fastcoll's library. The default's fallback is an info line
    (FASTCOLL_LOG=info shows it) and nothing at warning level; an explicit =1's is a warning."""
    env = {"FASTCOLL_MLX_GRAPH": "", "FASTCOLL_LOG": "" if warned else "info", **env}
    results = launch(2, "graph_worker.py", "check", **env).wait(timeout=120)
    assert_ok(results)
    graph_here = _mode() == "graph"
    mode = "graph" if graph_here and said is None and env["FASTCOLL_MLX_GRAPH"] != "0" else "eager"
    for r in results:
        assert f"rank {r.rank}: {mode} checks passed" in r.out, (r.out, r.err)
        assert ("RuntimeWarning" in r.err) == (warned and mode == "eager"), r.err
        assert "WARNING" not in r.err, r.err
        default_fallback = "collectives run eagerly, not in MLX's graph (graph mode, the default): "
        if not warned and mode == "eager" and env["FASTCOLL_MLX_GRAPH"] != "0":
            assert default_fallback + (said if graph_here else "") in r.err, r.err
        else:
            assert default_fallback not in r.err, r.err
        if warned and graph_here:
            assert f"FASTCOLL_MLX_GRAPH=1: {said}; collectives run eagerly instead" in r.err, r.err


@pytest.mark.parametrize("version, old", [("0.29.3", True), ("0.28.9", True), ("0.29.4", False), ("0.32.4", False),
                                          ("1.0.0", False), ("0.30.0.dev20251201+abc", False), ("", True),
                                          ("unknown", True)])
def test_mlx_older_than_0_29_4_cannot_run_graph_mode(version, old):
    assert graph.mlx_too_old(version) is old


# graph_worker.py traced's calls on two ranks, in order: rank r's name for each, and the bytes it
# sends and receives in it (a send's bytes go one way only)
def _traced_calls(r: int) -> list[tuple[str, int, int]]:
    p2p = "send" if r == 0 else "recv"
    return [("s0c0/all_reduce(sum,float32,(16,))", 64, 64), ("s0c0/all_gather(int16,(3,))", 6, 6),
            ("s0c0/all_reduce(max,int32,(4,))", 16, 16), (f"s0c0/{p2p}(0,1,uint8,(20,))", 20 * (r == 0), 20 * (r == 1)),
            ("s0c0/all_reduce(sum,float32,(1,))", 4, 4)]


PHASES = ("send", "wait", "receive", "reduce", "flush")


def _rows(path) -> tuple[list[dict], list[dict], list[dict]]:
    """A rank's trace: (its eager spans, its graph row's spans, the graph row's instants)."""
    events = json.loads(path.read_text())["traceEvents"]
    rows = [e["tid"] for e in events if e["ph"] == "M" and e["args"]["name"] == "MLX's graph"]
    assert len(rows) == 1, events
    eager = [e for e in events if e["ph"] == "X" and e["tid"] != rows[0]]
    graph_row = [e for e in events if e["ph"] == "X" and e["tid"] == rows[0]]
    return eager, graph_row, [e for e in events if e["ph"] == "i" and e["tid"] == rows[0]]


def _inside(e: dict, call: dict) -> bool:
    return call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1


@GRAPH_ONLY
def test_graph_mode_trace_has_every_graph_call_with_its_phases(launch, tmp_path):
    """FASTCOLL_TRACE in graph mode: each call MLX's graph made (all_sum, all_gather, all_max,
    send/recv) is in the rank's trace once, in order, numbered, with a queue span and its phases
    inside it; the sends and receives name the peer and add up to what the calls move; every
    graph span comes after init's eager calls and lies within the job's time."""
    path = tmp_path / "t.json"
    began = time.time() * 1e6
    assert_ok(launch(2, "graph_worker.py", "traced", FASTCOLL_MLX_GRAPH="1", FASTCOLL_TRACE=str(path)).wait(120))
    ended = time.time() * 1e6
    for r in range(2):
        eager, row, instants = _rows(tmp_path / f"t.rank{r}.json")
        calls = [e for e in row if e["name"] not in PHASES + ("queue",)]
        want = _traced_calls(r)
        assert [c["name"] for c in calls] == [name for name, _, _ in want], calls
        assert [c["args"]["seq"] for c in calls] == [0, 1, 2, 0, 3], calls  # p2p messages: their own count
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(calls, calls[1:])), "calls out of order"
        assert len([e for e in row if e["name"] == "queue"]) == len(calls) and not instants, row
        for call, (name, sent, received) in zip(calls, want):
            inner = [e for e in row if e["name"] in PHASES and _inside(e, call)]
            assert {e["name"] for e in inner} >= ({"send", "flush"} if sent else set()) | (
                {"wait", "receive"} if received else set()), (name, inner)
            assert all(e["args"]["peer"] == 1 - r for e in inner if e["name"] in ("send", "wait", "receive"))
            assert sum(e["args"]["bytes"] for e in inner if e["name"] == "send") == sent, (name, inner)
            assert sum(e["args"]["bytes"] for e in inner if e["name"] == "receive") == received, (name, inner)
        assert sum(e["name"] in PHASES for e in row) == sum(
            e["name"] in PHASES and any(_inside(e, c) for c in calls) for e in row), "a phase outside every call"
        assert calls[3]["args"] == {"seq": 0, "peer": 1 - r, "bytes": 20}, calls[3]
        init = [e for e in eager if e["name"].startswith(("split(", "all_reduce(min"))]
        assert len(init) == 2, eager  # init's split and its all-ranks check
        assert max(e["ts"] + e["dur"] for e in init) <= min(e["ts"] for e in row), "a graph span before init's"
        assert began <= min(e["ts"] for e in eager) and max(e["ts"] + e["dur"] for e in row) <= ended


@GRAPH_ONLY
def test_graph_mode_rank_may_trace_alone_and_an_untraced_rank_writes_nothing(launch, tmp_path):
    path = tmp_path / "t.json"
    job = launch(2, "graph_worker.py", "traced", FASTCOLL_MLX_GRAPH="1",
                 per_rank_env=lambda r: {"FASTCOLL_TRACE": str(path)} if r == 1 else {})
    assert_ok(job.wait(120))
    assert sorted(f.name for f in tmp_path.iterdir()) == ["t.rank1.json"]
    _, row, _ = _rows(tmp_path / "t.rank1.json")
    assert [e["name"] for e in row if e["name"].startswith("s0c0/")] == [n for n, _, _ in _traced_calls(1)]


@GRAPH_ONLY
def test_graph_mode_trace_keeps_the_first_calls_and_phases_and_counts_the_rest(launch, tmp_path):
    """A table that keeps 3 calls and 8 phases (the test hook's bounds): the first all_sum's 5
    phases, the all_gather's first 3 (its 4th counted as its `dropped`), none of the all_max's
    (all 5 counted); its 22 later calls counted in an instant at the first of them."""
    path = tmp_path / "t.json"
    assert_ok(launch(2, "graph_worker.py", "traced", "3", "8", FASTCOLL_MLX_GRAPH="1",
                     FASTCOLL_TRACE=str(path)).wait(120))
    for r in range(2):
        _, row, instants = _rows(tmp_path / f"t.rank{r}.json")
        calls = [e for e in row if e["name"].startswith("s0c0/")]
        assert [c["name"] for c in calls] == [n for n, _, _ in _traced_calls(r)[:3]], calls
        assert [c["args"].get("dropped", 0) for c in calls] == [0, 1, 5], calls
        assert sum(e["name"] in PHASES for e in row) == 8
        assert [(e["name"], e["args"]) for e in instants] == [("graph calls not kept", {"dropped": 22})], instants
        assert instants[0]["ts"] >= calls[-1]["ts"] + calls[-1]["dur"]


@GRAPH_ONLY
def test_graph_mode_trace_shows_a_graph_call_waiting_behind_an_eager_one(launch, tmp_path):
    """Rank 0's graph all_sum, made while its eager all_reduce (async_op=True) waits 1 s for rank
    1, waits behind it on the engine: its queue span covers the wait, and the call itself starts
    after the eager call ended."""
    path = tmp_path / "t.json"
    assert_ok(launch(2, "graph_worker.py", "queued", FASTCOLL_MLX_GRAPH="1", FASTCOLL_TRACE=str(path)).wait(120))
    eager, row, _ = _rows(tmp_path / "t.rank0.json")
    before = [e for e in eager if e["name"] == "all_reduce(sum,float32,(4,))"]
    call = [e for e in row if e["name"] == "s0c0/all_reduce(sum,float32,(8,))"]
    queue = [e for e in row if e["name"] == "queue"]
    assert len(before) == len(call) == len(queue) == 1, (eager, row)
    assert queue[0]["dur"] >= 200_000, queue  # (us) most of rank 1's second
    assert abs(queue[0]["ts"] + queue[0]["dur"] - call[0]["ts"]) <= 1, (queue, call)
    assert call[0]["ts"] >= before[0]["ts"] + before[0]["dur"], (before, call)
