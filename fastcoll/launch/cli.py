"""The `fastcoll-launch` command: a parser over the launch API (fastcoll/launch/api.py).

    fastcoll-launch -n 4 python train.py --lr 3e-4
    fastcoll-launch --hosts mac1,mac2:2 python train.py
    fastcoll-launch --hostfile hosts.json --log-dir logs python -m mypkg.train
    fastcoll-launch --check --hostfile hosts.json

Everything from the program name on is the program's, untouched.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from typing import Sequence

import fastcoll
from fastcoll.launch.api import USAGE_ERROR, LaunchConfig, LaunchError, launch
from fastcoll.launch.check import run_check
from fastcoll.launch.hostfile import HostfileError, HostList, parse_hosts_arg, read_hostfile
from fastcoll.launch.job import BIND_CHOICES, PlanError, launcher_settings, parse_env_items
from fastcoll.launch.procs import HEARTBEAT, LOST_AFTER
from fastcoll.launch.routes import data_warnings, ssh_address
from fastcoll.launch.settings import check_names


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (also what `--help` prints)."""
    p = argparse.ArgumentParser(
        prog="fastcoll-launch",
        usage="fastcoll-launch [options] PROGRAM [ARGS...]\n"
        "       fastcoll-launch --check (--hostfile FILE | --hosts LIST)",
        description="Start a fastcoll job on this machine or on several hosts over ssh, "
        "the way mpirun does. Every rank gets FASTCOLL_RANK, FASTCOLL_WORLD_SIZE, "
        "FASTCOLL_LOCAL_RANK, FASTCOLL_COORDINATOR, FASTCOLL_TOKEN and FASTCOLL_INTERFACE.",
        epilog="A bare `python`/`python3` or a `script.py` runs with the launcher's Python (or "
        "--python) on every host. Stopping: the first rank to fail (or SIGINT/SIGTERM to the "
        "launcher, or --timeout) stops every rank: the signal (after a failure, 1 s later, so that "
        "the others' own errors are written whole), then SIGKILL after --grace.",
    )
    _where_options(p)
    _environment_options(p)
    _output_options(p)
    _stopping_options(p)
    p.add_argument("--check", action="store_true",
                   help="check the hosts (ssh, Python and fastcoll versions, reachability) "
                   "and exit; runs no program")
    p.add_argument("--version", action="version", version=f"fastcoll {fastcoll.__version__}")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]",
                   help=argparse.SUPPRESS)
    return p


def _where_options(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("where the ranks run")
    where.add_argument("-n", "-np", "--np", dest="nprocs", type=int, metavar="N",
                       help="number of ranks (default: 1 here, or every slot of the hosts)")
    where.add_argument("--hosts", metavar="LIST",
                       help="comma-separated hosts, host:N for N ranks: mac1,mac2:2")
    where.add_argument("--hostfile", metavar="FILE",
                       help="mpirun-style (host slots=N) or MLX JSON hostfile")
    where.add_argument("--ssh", metavar="CMD", default="ssh",
                       help="ssh command and its options, e.g. 'ssh -F cluster.conf' "
                       "(default: ssh)")
    where.add_argument("--python", metavar="PATH",
                       help="Python interpreter on every host (default: the launcher's, "
                       f"{sys.executable})")
    where.add_argument("--cwd", metavar="DIR",
                       help="working directory of every rank (default: the launcher's)")
    where.add_argument("--bind-to", choices=BIND_CHOICES, default="none",
                       help="cores: split each host's physical cores among its ranks in "
                       "consecutive blocks and keep each rank, and every thread it starts, on "
                       "its own block, so that ranks sharing a host do not compete for cores "
                       "(Linux; mpirun's --bind-to). none: let the system place them "
                       "(default: none)")


def _environment_options(p: argparse.ArgumentParser) -> None:
    env = p.add_argument_group("environment")
    env.add_argument("--env", "-x", action="append", default=[], metavar="KEY[=VALUE]",
                     help="set KEY=VALUE for every rank, or pass the launcher's KEY (repeatable)")
    env.add_argument("--interface", metavar="ADDR",
                     help="FASTCOLL_INTERFACE for every rank (default: each host's address in "
                     "the job: its listed ips, else its name, or 127.0.0.1 for a local job; "
                     "a host listing several ips gets a connection per ip)")
    env.add_argument("--coordinator", metavar="HOST[:PORT]",
                     help="where rank 0 listens (default: the first host, a free port)")


def _output_options(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=True,
                     help="prefix every line with [rank] (default: on)")
    out.add_argument("--log-dir", metavar="DIR",
                     help="also write each rank's output to DIR/rank.N.log")
    out.add_argument("-v", "--verbose", action="store_true",
                     help="print the launcher's diagnostics")


def _stopping_options(p: argparse.ArgumentParser) -> None:
    ctl = p.add_argument_group("stopping")
    ctl.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                     help="seconds between SIGTERM and SIGKILL when stopping ranks (default: 5)")
    ctl.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="stop the job after this many seconds (exit code 124)")
    ctl.add_argument("--lost-after", type=float, default=LOST_AFTER, metavar="SECONDS",
                     help="take a remote host as lost when its ssh session has sent nothing "
                     "(its agent beats every second) for this long, and stop the job "
                     f"(default: {LOST_AFTER:g}); raise it where the ssh network has longer "
                     "outages that the job should ride out")
    ctl.add_argument("--max-restarts", type=int, default=0, metavar="N",
                     help="when a rank fails (or --timeout ends an attempt), stop the job, then "
                     "start every rank again with a fresh token and port, up to N times; each "
                     "rank sees FASTCOLL_RESTART_COUNT (0, 1, ...); the exit code is the last "
                     "attempt's. A signal to the launcher never restarts (default: 0)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fastcoll-launch`; returns (and, as a script, exits with) the job's code."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before any rank started (e.g. while asking a host)
        sys.stderr.write("fastcoll-launch: interrupted\n")
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="fastcoll-launch: %(message)s")
    config = config_from_args(parser, args)
    if args.check:
        return _check(parser, args, config)
    if not config.program:
        parser.error("no program to run: fastcoll-launch [options] PROGRAM [ARGS...]")
    if config.hosts is not None:
        for warning in data_warnings(config.hosts, from_hostfile=bool(args.hostfile), nprocs=config.nprocs,
                                     interface=config.interface,
                                     resolve=lambda name: ssh_address(config.ssh, name)):
            sys.stderr.write(f"fastcoll-launch: warning: {warning}\n")
    try:
        return launch(config)
    except LaunchError as e:
        parser.exit(e.code, f"fastcoll-launch: {e}\n")


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> LaunchConfig:
    """The launch the options describe; a usage error (exit code 2) for options that cannot be."""
    if args.grace < 0 or (args.timeout is not None and args.timeout <= 0):
        parser.error("--grace must be >= 0 and --timeout > 0")
    if args.lost_after < 2 * HEARTBEAT:
        parser.error(f"--lost-after must be at least {2 * HEARTBEAT:g} s (two beats)")
    if args.max_restarts < 0:
        parser.error("--max-restarts must be >= 0")
    if args.hosts and args.hostfile:
        parser.error("give --hosts or --hostfile, not both")
    try:
        hosts = _hosts(args)
    except HostfileError as e:
        parser.exit(USAGE_ERROR, f"fastcoll-launch: {e}\n")
    program = list(args.program)
    return LaunchConfig(
        program[1:] if program[:1] == ["--"] else program, hosts=hosts, nprocs=args.nprocs, env=tuple(args.env),
        interface=args.interface, coordinator=args.coordinator,
        cwd=os.path.abspath(args.cwd) if args.cwd else os.getcwd(), python=args.python or sys.executable,
        ssh=tuple(shlex.split(args.ssh)), bind=args.bind_to, tag_output=args.tag_output, log_dir=args.log_dir,
        grace=args.grace, timeout=args.timeout, lost_after=args.lost_after, max_restarts=args.max_restarts)


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace, config: LaunchConfig) -> int:
    """`--check`: the hosts' table (fastcoll/launch/check.py) instead of a job."""
    if config.hosts is None:
        parser.error("--check needs --hostfile or --hosts")
    try:
        check_names(config.hosts.envs, config.env, os.environ)
        # What a job's ranks would get: the launcher's FASTCOLL_* settings, then --env and the hostfile's.
        env = {**launcher_settings(os.environ), **parse_env_items(list(config.hosts.envs) + list(config.env), os.environ)}
    except PlanError as e:
        parser.exit(USAGE_ERROR, f"fastcoll-launch: {e}\n")
    return run_check(config.hosts, ssh=list(config.ssh), python=config.python, cwd=config.cwd or os.getcwd(),
                     env=env, from_hostfile=bool(args.hostfile))


def _hosts(args: argparse.Namespace) -> HostList | None:
    if args.hostfile:
        return read_hostfile(args.hostfile)
    if args.hosts:
        return parse_hosts_arg(args.hosts)
    return None


if __name__ == "__main__":
    sys.exit(main())
