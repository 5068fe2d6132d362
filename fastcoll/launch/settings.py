"""Check the FASTCOLL_* settings a job's ranks will get before any rank starts.

Their names first: a name that is no setting (`config.SETTINGS`) is refused where it was given
(the launcher's environment, --env, the hostfile's envs), with the nearest setting named. Then
their values: each rank's `init()` reads its environment with `Config.from_env`, and checks
FASTCOLL_TRACE's directory (`fastcoll.trace.check_path`); the launcher runs the same rules on the
environment it is about to give each rank, so a mistyped name or value ends the launch with one
line instead of a traceback from every rank. The trace path is checked here only for ranks on this machine: a
remote rank's path is on its own host, where the agent checks it before starting the rank
(`fastcoll/launch/agent.py`), and `init()` checks it again.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from fastcoll.config import Config, check_setting_names
from fastcoll.launch.job import JobPlan, PlanError
from fastcoll.trace import check_path


def check_names(host_envs: Iterable[str], env_items: Iterable[str], environ: Mapping[str, str]) -> None:
    """PlanError naming a FASTCOLL_* name that is no setting (a misspelling), where it was given:
    the launcher's environment, --env or the hostfile's envs (each KEY=VALUE or KEY); checked
    before a host is asked anything."""
    for where, names in (("the launcher's environment", list(environ)),
                         ("--env", [item.partition("=")[0] for item in env_items]),
                         ("the hostfile's envs", [item.partition("=")[0] for item in host_envs])):
        try:
            check_setting_names(names, where)
        except ValueError as e:
            raise PlanError(str(e)) from None


def check_settings(plan: JobPlan, environ: Mapping[str, str]) -> None:
    """Raise PlanError with init()'s own one-line message if a rank of `plan` would refuse its
    settings; `environ` is what local ranks inherit (the launcher's environment)."""
    for r in plan.ranks:
        env = {**environ, **r.env} if r.local else dict(r.env)
        try:
            config = Config.from_env(env)
            if r.local and config.trace:
                check_path(config.trace, r.rank, plan.cwd)
        except ValueError as e:
            raise PlanError(" ".join(str(e).split())) from None
