"""The launch API: run a job to its end, restarting every rank after a failure when asked.

    from fastcoll.launch.api import LaunchConfig, launch
    code = launch(LaunchConfig(["python", "train.py"], nprocs=4, max_restarts=2))

`fastcoll-launch` (fastcoll/launch/cli.py) is a parser over this, as torch's `run.py` is over
`elastic_launch`. Each attempt is a new job: a fresh plan, token and coordinator port, every rank
told its attempt in FASTCOLL_RESTART_COUNT.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from fastcoll.launch.hostfile import HostList
from fastcoll.launch.job import JobPlan, PlanError, RankPlan, plan_job
from fastcoll.launch.output import OutputMux
from fastcoll.launch.procs import LOST_AFTER, LocalRank, RankProcess, RemoteRank
from fastcoll.launch.remote import RemoteError, remote_free_port
from fastcoll.launch.settings import check_names, check_settings
from fastcoll.launch.supervise import Supervisor

log = logging.getLogger("fastcoll.launch")

USAGE_ERROR = 2  # the exit code of a job that its options cannot describe
REMOTE_ERROR = 255  # as ssh's: a remote host could not be asked
RESTART_VARIABLE = "FASTCOLL_RESTART_COUNT"


class LaunchError(RuntimeError):
    """The job cannot start (the message says why); `code` is the launcher's exit code for it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LaunchConfig:
    """What `launch` runs, and how: the options of `fastcoll-launch` (its --help says each)."""

    program: Sequence[str]
    hosts: HostList | None = None  # None: every rank on this machine
    nprocs: int | None = None
    env: Sequence[str] = ()  # KEY=VALUE, or KEY to pass the launcher's value on
    interface: str | None = None
    coordinator: str | None = None
    cwd: str | None = None
    python: str = sys.executable
    ssh: Sequence[str] = ("ssh",)
    bind: str = "none"
    tag_output: bool = True
    log_dir: str | None = None
    grace: float = 5.0
    timeout: float | None = None
    lost_after: float = LOST_AFTER
    max_restarts: int = 0


def launch(config: LaunchConfig) -> int:
    """Run the job until it succeeds, a signal stops it, or `max_restarts` restarts are spent;
    the last attempt's exit code. LaunchError if an attempt cannot be planned."""
    attempt = 0
    while True:
        plan = plan_attempt(config, attempt)
        log.debug("job of %d rank(s), coordinator %s, attempt %d", plan.size, plan.coordinator, attempt)
        outcome: dict = {}
        code = run_job(plan, ssh=list(config.ssh), tag=config.tag_output, log_dir=config.log_dir,
                       grace=config.grace, timeout=config.timeout, outcome=outcome,
                       lost_after=config.lost_after)
        interrupted = outcome.get("interrupted")
        if code == 0 or interrupted or attempt >= config.max_restarts:
            if code != 0 and attempt and not interrupted:
                _say(f"attempt {attempt + 1} of {config.max_restarts + 1} failed too (exit code {code}); "
                     "no restarts left")
            return code
        attempt += 1
        _say(f"the job failed (exit code {code}); restarting every rank (restart {attempt} of "
             f"{config.max_restarts}, {RESTART_VARIABLE}={attempt})")


def plan_attempt(config: LaunchConfig, attempt: int) -> JobPlan:
    """The plan of attempt `attempt` (0 first), its settings checked as init() will check them;
    LaunchError naming the problem otherwise."""
    ssh, python = list(config.ssh), config.python
    try:
        check_names(config.hosts.envs if config.hosts else (), config.env, os.environ)
        plan = plan_job(
            config.hosts,
            config.program,
            nprocs=config.nprocs,
            env_items=[*config.env, f"{RESTART_VARIABLE}={attempt}"],
            interface=config.interface,
            coordinator=config.coordinator,
            cwd=config.cwd,
            python=python,
            remote_port=lambda h: remote_free_port(ssh, h.name, python),
            bind=config.bind,
        )
        check_settings(plan, os.environ)
    except (PlanError, RemoteError, ValueError) as e:
        raise LaunchError(str(e), USAGE_ERROR if isinstance(e, PlanError) else REMOTE_ERROR) from None
    return plan


def run_job(
    plan: JobPlan,
    *,
    ssh: list[str] | None = None,
    tag: bool = True,
    log_dir: str | None = None,
    grace: float = 5.0,
    timeout: float | None = None,
    outcome: dict | None = None,
    lost_after: float = LOST_AFTER,
) -> int:
    """Start every rank of `plan`, supervise the job, and return its exit code. `outcome`, if
    given, gets "interrupted": whether a signal to the launcher stopped the job."""
    mux = OutputMux(sys.stdout.buffer, sys.stderr.buffer, tag=tag, log_dir=log_dir)
    job_id = secrets.token_hex(4)
    environ = dict(os.environ)

    def starter(r: RankPlan) -> Callable[[], RankProcess]:
        if r.local:
            return lambda: LocalRank(r, plan.cwd, mux, environ)
        return lambda: RemoteRank(r, plan.cwd, mux, ssh=ssh, python=plan.python,
                                  grace=grace, job_id=job_id, lost_after=lost_after)

    supervisor = Supervisor(mux, grace=grace, timeout=timeout)
    try:
        with supervisor.forwarding_signals():
            return supervisor.run([starter(r) for r in plan.ranks])
    finally:
        if outcome is not None:
            outcome["interrupted"] = supervisor.interrupted
        mux.close()


def _say(text: str) -> None:
    """One line to the launcher's stderr, between the ranks' lines."""
    sys.stderr.write(f"fastcoll-launch: {text}\n")
    sys.stderr.flush()
