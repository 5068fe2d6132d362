"""Shared test machinery: start real rank processes on localhost and always clean them up."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import pytest

from fastcoll.launch import agent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGS = os.path.join(ROOT, "tests", "progs")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses now and the kernel will not hand out meanwhile
    (the launcher's choice: fastcoll.launch.agent.free_port)."""
    return agent.free_port("127.0.0.1")


# FASTCOLL_TEST_TRANSPORT=rdma runs the suites' default jobs ("shm" below) over verbs links on the
# test fabric (tests/fabric/) instead, wherever they ask for the native engine: CI's "over the
# fabric" step (.ci/run). The pure-Python engine's jobs stay on shared memory (rdma refuses it).
TEST_TRANSPORT = os.environ.get("FASTCOLL_TEST_TRANSPORT", "shm").strip() or "shm"
if TEST_TRANSPORT not in ("shm", "rdma"):
    raise ValueError(f"FASTCOLL_TEST_TRANSPORT must be shm or rdma, not {TEST_TRANSPORT!r}")


@functools.cache
def fabric_build():
    """tests/fabric/build.py as a module (loaded by path: tests/fabric is not a package)."""
    spec = importlib.util.spec_from_file_location("fcfab_build", os.path.join(ROOT, "tests", "fabric", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fabric_missing() -> str | None:
    """Why the test fabric cannot be built here (no C compiler, no <infiniband/verbs.h>), or None."""
    build = fabric_build()
    cc = build.compiler()
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}) to build the test fabric"
    if not build.have_verbs_h(cc, build.env_flags("CFLAGS")):
        return build.NO_VERBS
    return None


@functools.cache
def fabric_library() -> str:
    """The test fabric's verbs library, built once a session (tests/fabric/build.py)."""
    return fabric_build().build()


@pytest.fixture(scope="session")
def fabric_jobs() -> str:
    """The test fabric's library for jobs that run `FASTCOLL_TRANSPORT=rdma` on it, built once; the
    tests that need it skip, saying why, where it cannot be built or the engine has no verbs link."""
    from engines import native_missing
    from fastcoll.engine import link_kinds

    why = fabric_missing() or native_missing()
    if why is None and "verbs" not in link_kinds():
        why = "the native engine was built without the verbs link (no <infiniband/verbs.h> where it was compiled)"
    if why is not None:
        pytest.skip(why)
    return fabric_library()


def rank_env(rank: int, size: int, port: int, transport: str = "shm", token: str = "test-token", **extra: str) -> dict:
    """The environment of one rank of a local job. `transport`: "shm" (TCP connections, which
    ranks on one host replace by shared memory: the default; under FASTCOLL_TEST_TRANSPORT=rdma,
    "rdma" where the native engine runs), "tcp" (TCP only, FASTCOLL_SHM=0), "zmq", or "rdma"
    (FASTCOLL_TRANSPORT=rdma over the test fabric: every peer over a verbs link)."""
    env = dict(os.environ)
    if transport == "shm" and TEST_TRANSPORT == "rdma" and extra.get("FASTCOLL_NATIVE", env.get("FASTCOLL_NATIVE")) != "0":
        transport = "rdma"
    if transport == "rdma":  # (only the native engine has verbs links, whatever the environment asks)
        env.update(FASTCOLL_VERBS_LIB=fabric_library(), FASTCOLL_NATIVE="1")
    env.update(
        FASTCOLL_RANK=str(rank),
        FASTCOLL_WORLD_SIZE=str(size),
        FASTCOLL_COORDINATOR=f"127.0.0.1:{port}",
        FASTCOLL_TOKEN=token,
        FASTCOLL_TRANSPORT="tcp" if transport == "shm" else transport,
        FASTCOLL_SHM="1" if transport == "shm" else "0",
        FASTCOLL_TIMEOUT=extra.pop("timeout", "30"),
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def jobless_env(*keep: str) -> dict:
    """This process's environment without any launcher's or job's variables (but those in
    `keep`), with the repository importable: a program started from it is a world of one, or
    the job its argv describes."""
    drop = ("FASTCOLL_", "MLX_", "OMPI_", "PMI_", "SLURM_", "MPI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) or k in keep}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_session(argv: list[str], env: dict, timeout: float, cwd: str | None = None,
                merge_stderr: bool = False) -> tuple[int, str, str]:
    """Run argv in its own session: (exit code, stdout, stderr). If it overstays `timeout`, kill
    the whole session (whatever it started too) and fail the test with its output."""
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{argv} did not finish in {timeout}s:\n{out}\n{(err or '')[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out, err or ""


@dataclass
class Result:
    """How one rank process ended."""

    rank: int
    code: int
    out: str
    err: str


class Job:
    """Rank processes of one local job; kill() ends whatever is still running."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs

    def wait(self, timeout: float) -> list[Result]:
        deadline = time.monotonic() + timeout
        results = []
        for rank, p in enumerate(self.procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                out, err = p.communicate()
                raise AssertionError(f"rank {rank} did not finish within {timeout}s:\n{out}\n{err}")
            results.append(Result(rank, p.returncode, out, err))
        return results

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def launch():
    """launch(size, prog, *args, transport=..., env=...) -> Job; every process is killed at teardown."""
    jobs: list[Job] = []

    def start(size: int, prog: str, *args: str, transport: str = "shm", per_rank_env=None, **env: str) -> Job:
        port = free_port()
        script = prog if os.path.isabs(prog) else os.path.join(PROGS, prog)
        procs = []
        for r in range(size):
            e = rank_env(r, size, port, transport, **env)
            if per_rank_env:
                e.update(per_rank_env(r))
            procs.append(
                subprocess.Popen(
                    [sys.executable, script, *args],
                    env=e,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        job = Job(procs)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def assert_ok(results: list[Result]) -> None:
    """Every rank exited 0; otherwise show what each printed."""
    bad = [r for r in results if r.code != 0]
    if bad:
        detail = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.out}\n{r.err[-4000:]}" for r in bad)
        raise AssertionError(f"{len(bad)} rank(s) failed:\n{detail}")


# What the README's test command leaves to CI: these tests are marked `slow`, which pyproject's
# addopts deselect (`-m "not slow"`), and .ci/run runs them (`python -m pytest -q -m slow`) after
# the README's command. file -> (what they are, which of them: None for all, else a test on the
# test's parameters and, under "test", its name). docs/testing.md lists the same.
SLOW: dict[str, tuple[str, Callable[[dict], bool] | None]] = {
    "test_multihost.py": ("the multi-host bed (network namespaces, an sshd per host; root)", None),
    "test_netbed_built.py": ("the bed of pinned hosts built (network namespaces, taps; root)", None),
    "test_netbed.py": ("bench/hostbed.py's gate part across the bed's hosts (root)",
                       lambda params: params["test"] == "test_the_gate_part_runs_across_two_hosts_exactly_and_over_tcp"),
    "test_soak.py": ("the soak (600 random collectives per transport)", None),
    "test_memory.py": ("the 20,000-call memory soak", lambda params: params.get("calls") == 20000),
    "test_real_clients.py": ("real mlx-lm clients (its HTTP server, mlx.nn)", None),
    "test_examples.py": ("the documented commands of the examples, verbatim, eagerly and in graph mode, and"
                         " sharded_generate's other two pairings of split and mode",
                         lambda params: "command" in params
                         or (params.get("split"), params.get("mode")) in (("pipeline", "eager"), ("tensor", "graph"))),
    "test_mlx_upstream.py": ("MLX's own test of its MPI backend, eagerly (graph mode's runs by default)",
                             lambda params: params.get("mode") == "eager"),
    # Every fault still runs in the default run, on shm (the default transport).
    "test_faults.py": ("the fault matrix on tcp and zmq", lambda params: params.get("transport") in ("tcp", "zmq")),
    # The short soak (300 collectives) and every collective at 2 ranks still run in the default run;
    # CI's step "over the RDMA test fabric" runs the core suites over it too.
    "test_rdma.py": ("the 10,000-collective soak over the RDMA test fabric, and its collectives at 3 and 4 ranks",
                     lambda params: params.get("ops") == 10_000 or params.get("world") in (3, 4)),
    # Each case still runs in the default run on both engines; the busy one's eight repeats are CI's.
    "test_finalize_thread.py": ("finalize() beside a busy collective, eight times over, and on tcp on the pure-Python engine",
                                lambda p: p.get("scenario") == "busy" or (p.get("transport") == "tcp" and p.get("native") == "0")),
    # Every bad counter still runs in the default run on the native engine, where it crashed.
    "test_shm_peer.py": ("a bad shared-memory counter on the pure-Python engine",
                         lambda params: "scenario" in params and params.get("native") == "0"),
    # Each case still runs on shm in the default run.
    "test_diagnosis.py": ("who stopped answering, on tcp and zmq", lambda params: params.get("transport") in ("tcp", "zmq")),
    # Every collective still runs on zmq at 1-3 ranks and at 4 on shm and tcp in the default run.
    "test_collectives.py": ("every collective on zmq at 3 and 4 ranks, and a job of eight ranks",
                            lambda p: (p.get("transport") == "zmq" and p.get("world") in (3, 4)) or p["test"] == "test_eight_ranks"),
    "test_exchange.py": ("the newer collectives on zmq at 4 ranks", lambda p: p.get("transport") == "zmq" and p.get("world") == 4),
    # Every hardening case still runs on shm (and tcp) at 2 ranks in the default run.
    "test_hardening.py": ("the hardening matrix on zmq, and at 3 ranks",
                          lambda p: p.get("transport") == "zmq" or p.get("world") == 3),
    # Every disagreement still runs at 2 ranks on shared memory, on both engines.
    "test_agreement.py": ("the agreement matrix at 3 ranks and on tcp", lambda p: p.get("world") == 3 or p.get("transport") == "tcp"),
    "test_strangers.py": ("strangers on zmq", lambda p: p.get("transport") == "zmq"),
    "test_launch_local.py": ("the first failure reported, twenty times over",
                             lambda p: p["test"] == "test_the_first_rank_to_fail_is_reported_not_the_first_noticed"),
    # The ssh path's remote ranks, their environment and output still run in the default run.
    "test_launch_ssh.py": ("the ssh launcher's failures, signals, restarts, binding and --check against a real sshd",
                           lambda p: p["test"] not in ("test_remote_ranks_env_output_and_no_token_on_command_lines",
                                                       "test_the_ssh_config_advice_for_user_at_host_is_valid_ssh_config")),
}
# A test that runs on both engines keeps its native run in the default run where the extension is
# built; its pure-Python twin is `slow` (CI's slow step and its pure-Python step run it).
PYTHON_TWINS = "the pure-Python engine's twin of a test that runs on both engines"


def python_twin(params: dict) -> bool:
    return params.get("engine") in ("0", "python") or params.get("native") == "0"


# Fixtures that start an OpenSSH server: their tests are also marked `sshd`.
SSHD_FIXTURES = ("sshd", "bed")
_deselected_slow = 0


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the SLOW tests and the pure-Python twins `slow`, and the tests that start sshd `sshd`."""
    from engines import native_missing

    twins = native_missing() is None  # without the extension, the pure-Python runs are all there is
    for item in items:
        what = SLOW.get(item.path.name)
        spec = getattr(item, "callspec", None)
        params = spec.params if spec else {}
        # A rule reads the test's parameters and, under "test", its name.
        if (what is not None and (what[1] is None or what[1]({**params, "test": item.originalname}))) or \
                (twins and python_twin(params)):
            item.add_marker(pytest.mark.slow)
        if any(f in SSHD_FIXTURES for f in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sshd)


def pytest_deselected(items: list[pytest.Item]) -> None:
    global _deselected_slow
    _deselected_slow += sum(1 for item in items if item.get_closest_marker("slow"))


def pytest_terminal_summary(terminalreporter) -> None:
    """Say what the deselected slow tests are and how to run them."""
    if _deselected_slow:
        terminalreporter.write_line(
            f"{_deselected_slow} slow test(s) deselected ({'; '.join([w for w, _ in SLOW.values()] + [PYTHON_TWINS])}): CI runs "
            "them after this command (.ci/run); `python -m pytest -q -m slow` runs them here")
