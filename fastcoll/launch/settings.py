"""Check the FASTCOLL_* settings a job's ranks will get before any rank starts.

Each rank's `init()` reads its environment with `Config.from_env`, and checks FASTCOLL_TRACE's
directory (`fastcoll.trace.check_path`); the launcher runs the same rules on the environment it
is about to give each rank, so a mistyped value ends the launch with one line instead of a
traceback from every rank. The trace path is checked here only for ranks on this machine: a
remote rank's path is on its own host, where the agent checks it before starting the rank
(`fastcoll/launch/agent.py`), and `init()` checks it again.
"""

from __future__ import annotations

from typing import Mapping

from fastcoll.config import Config
from fastcoll.launch.job import JobPlan, PlanError
from fastcoll.trace import check_path


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
