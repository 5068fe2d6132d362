"""The job's configuration, read once from the environment at `fastcoll.init()`.

The FASTCOLL_* variables are a contract (the README's environment table lists every one this
reads; docs/design.md, Rendezvous). Where they are absent, the ranks that
other launchers set are understood too, so that jobs started by mpirun, srun or mlx.launch work.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from fastcoll.wire import TRANSPORTS, parse_address

DEFAULT_PORT = 29517
DEFAULT_TIMEOUT = 60.0
# The longest timeout accepted (FASTCOLL_TIMEOUT, timeout=): every wait fastcoll makes, and
# every setting derived from it (ZeroMQ's heartbeat, in int32 milliseconds, is clamped), holds
# it; far beyond it, time_t and the thread waits overflow.
MAX_TIMEOUT = 1e9
DEFAULT_FENCE_MAX_ITERS = 50_000_000
# 16 KiB: a 64 KiB gate's copy-out alone took ~190 us on an H200 (bench/records/2026-11-30-h200-gate/).
DEFAULT_GATE_MAX_BYTES = 16 * 1024
# The gate's host mode (ranks on several hosts, or no direct mode) moves every gate's bytes on the
# service thread, which for 64-byte rows cost more than the host path (two ranks on one H200:
# 8.48 against 7.26 ms per token of 64); from 256 bytes on it cost half or less (bench/NOTES.md 34).
DEFAULT_GATE_HOST_MIN_BYTES = 256

# Algorithm thresholds, measured with bench/compare.py, each algorithm forced (docs/performance.md;
# 2-core Linux box, TCP on localhost, median us per all-reduce, direct / ring). Two ranks: 4 KiB
# 51/93, 256 KiB 219/445, 1 MiB 1051/1967, 4 MiB 4542/4836 -- direct wins up to megabytes, since
# with two ranks both move the same bytes and the ring adds a step. Four ranks: 64 KiB 686/1361,
# 256 KiB 1691/1724, 512 KiB 2816/3081, 1 MiB 5494/4263 -- direct sends (n-1)x the data and loses
# past ~512 KiB. Ring pieces, 64 MiB: 256 KiB 56.6 ms, 1 MiB 47.4 ms, 4 MiB 53.6 ms
# (bench/NOTES.md).
DEFAULT_DIRECT_MAX_BYTES = 256 * 1024  # any world size (average_gradients' buckets rely on it)
DEFAULT_DIRECT_MAX_BYTES_TWO_RANKS = 1 << 20
DEFAULT_PIECE_BYTES = 1 << 20
# Non-blocking reads tried (~1.5 us each) before sleeping in poll(): a small exchange's reply is
# usually a few microseconds away, and a sleep costs a wake-up. Two ranks, 4 B all-reduce,
# median: 115 us with 1 try, 56 us with 10, 63-69 us with 25-100; with 4 ranks on 2 cores
# 10 tries changed nothing and 100 doubled the time (bench/NOTES.md, entry 5).
DEFAULT_SPIN_READS = 10
# Then as many more, each after sched_yield(): when ranks outnumber cores the peer that owes
# the reply may be waiting for this very core, and yielding hands it over without the sleep
# and wake-up of poll(). Four ranks on 2 cores, 4 B all-reduce: 592 us without, 395 us with 20
# (bench/NOTES.md, entry 11). Only while a small message is awaited.
DEFAULT_YIELD_READS = 20
# The native engine's wait (fastcoll/engine/csrc/core/fc_wait.c): it spins spin_us on what it waits
# for, then yields the CPU between looks for yield_us, then sleeps in poll() until woken. spin_us
# -1 (the default) spins AUTO_SPIN_US, or not at all where this host's ranks outnumber its CPUs
# (a spinning rank then holds the core its peer needs). Two ranks, 4 B all_reduce, median on the
# 2-core VM: with a third process busy, spin 200 us 1.9 us, spin 0 10.0 us; four ranks, spin 0
# 10.4 us, spin 200 us 164 us; yield 1 ms instead of 5 ms doubled the four ranks' time
# (bench/NOTES.md, entry 48). A call that moves 16 MiB or more never spins (fc_wait.c; NOTES 65).
DEFAULT_SPIN_US = -1
AUTO_SPIN_US = 200
DEFAULT_YIELD_US = 5000
# A call of the native engine whose wait once idled long_wait_us leaves the yields out of the next
# call of its kind (that wait is a peer's work, not a reply on its way); 0 never does. Graph mode
# sets it where ranks share CPUs (MLX_GRAPH_WAITS, for_host).
DEFAULT_LONG_WAIT_US = 0
# The native engine keeps the memory of large numpy results that the program has let go, up to
# this many MiB, for the next results: fresh pages for every call cost a quarter of a 64 MiB
# all_reduce's CPU time on 4 ranks (bench/NOTES.md, entry 70). 0 keeps none.
DEFAULT_RESULT_CACHE_MB = 512
# FASTCOLL_MLX_GRAPH unset or empty: under fastcoll.mlx_compat MLX's graph runs the collectives
# (graph mode, fastcoll/mlx_compat/graph.py) wherever it can, else they run eagerly, quietly. On
# the pinned bed (two hosts, links unshaped, 1 Gbit/s + 50 us and + 200 us, mlx-lm decode) graph
# mode was faster than the eager path in every configuration: tensor-parallel 1.18-1.34x,
# pipelined 1.06-1.17x, median of 10 rounds (bench/records/2026-12-07-pinned-bed-decode/).
DEFAULT_MLX_GRAPH = True

LOG_LEVELS = ("warning", "info", "debug")

# Every FASTCOLL_* name fastcoll reads or sets, and who reads it: init() and fastcoll-launch
# refuse any other, naming the nearest of these, since a misspelled setting would otherwise run
# with its default in silence. The README's environment table says what each means.
SETTINGS = {
    **dict.fromkeys(("FASTCOLL_RANK", "FASTCOLL_WORLD_SIZE", "FASTCOLL_LOCAL_RANK", "FASTCOLL_COORDINATOR",
                     "FASTCOLL_PORT", "FASTCOLL_TOKEN", "FASTCOLL_TRANSPORT", "FASTCOLL_TIMEOUT",
                     "FASTCOLL_INTERFACE", "FASTCOLL_CONNECTIONS", "FASTCOLL_SHM", "FASTCOLL_NATIVE",
                     "FASTCOLL_FAST_SYNC", "FASTCOLL_MLX_GRAPH", "FASTCOLL_FENCE_MAX_ITERS",
                     "FASTCOLL_GATE_MAX_BYTES", "FASTCOLL_GATE_PROFILE", "FASTCOLL_TRACE", "FASTCOLL_LOG",
                     "FASTCOLL_TUNING"), "init()"),
    # The rdma transport's (the README's table and docs/design.md say what they mean).
    **dict.fromkeys(("FASTCOLL_VERBS_LIB", "FASTCOLL_RDMA_DEVICES", "FASTCOLL_RDMA_RELIABLE"), "init()"),
    # Set by fastcoll-launch for its ranks (the ones above it sets too: RANK, WORLD_SIZE, ...).
    "FASTCOLL_RESTART_COUNT": "fastcoll-launch, for the program",
    "FASTCOLL_HOST": "fastcoll-launch, for init()",
    # Read by setup.py when the native engine is built.
    **dict.fromkeys(("FASTCOLL_BUILD_STRICT", "FASTCOLL_PORTABLE"), "setup.py"),
}
PREFIX = "FASTCOLL_"
# The test suite's own settings (tests/): names under this prefix are never refused.
TEST_PREFIX = "FASTCOLL_TEST_"


def check_setting_names(names: Iterable[str], where: str = "") -> None:
    """ValueError naming the first FASTCOLL_* name among `names` that is not a setting (SETTINGS)
    and the setting nearest to it; `where` says where it was given ("--env", ...)."""
    for name in names:
        if not name.startswith(PREFIX) or name in SETTINGS or name.startswith(TEST_PREFIX):
            continue
        # Nearest by what follows the prefix, which every name shares.
        cut = len(PREFIX)
        near = difflib.get_close_matches(name[cut:], [known[cut:] for known in SETTINGS], n=1, cutoff=0.6)
        hint = f"did you mean {PREFIX}{near[0]}?" if near else "the README's environment table lists them"
        raise ValueError(f"{where + ': ' if where else ''}{name} is not a fastcoll setting: {hint}")

# (rank variable, size variable, local rank variable, launcher name), in order of preference.
_LAUNCHER_RANKS = (
    ("FASTCOLL_RANK", "FASTCOLL_WORLD_SIZE", "FASTCOLL_LOCAL_RANK", "fastcoll"),
    ("MLX_RANK", "MLX_WORLD_SIZE", None, "mlx.launch"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPICH/PMI"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"),
)


@dataclass(frozen=True)
class Config:
    """Everything `init()` needs to know about the job; immutable once read."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    coordinator: tuple[str, int] | None = None
    token: bytes = b""
    transport: str = "tcp"
    timeout: float = DEFAULT_TIMEOUT
    interface: str | None = None
    connections: int = 1
    shm: bool = True
    fast_sync: bool = False
    fence_max_iters: int = DEFAULT_FENCE_MAX_ITERS
    gate_max_bytes: int = DEFAULT_GATE_MAX_BYTES
    gate_profile: bool = False
    trace: str | None = None
    mlx_graph: bool = DEFAULT_MLX_GRAPH  # FASTCOLL_MLX_GRAPH: MLX's graph runs the collectives (mlx_compat/graph.py)
    # FASTCOLL_MLX_GRAPH was given (not left to the default): where graph mode cannot run, a
    # program that asked for it is warned; the default takes the eager path with a log line.
    mlx_graph_set: bool = False
    native: bool = True  # FASTCOLL_NATIVE: the native engine where every rank has it (fastcoll/engine/)
    launcher: str = "none"
    # The job this rank belongs to, as its launcher names it ("Slurm job 12 step 0"; "" where
    # the launcher names none): the rendezvous refuses ranks of another job (job_identity).
    job: str = ""
    log: str | None = None  # FASTCOLL_LOG: the `fastcoll` logger's level, if set
    host: str = ""  # FASTCOLL_HOST: this rank's host as fastcoll-launch names it ("": the host's own name)
    # FASTCOLL_TRANSPORT=rdma (fastcoll/transport/rdma.py): the verbs library to load (None: the
    # platform's), this rank's devices toward each rank (FASTCOLL_RDMA_DEVICES: per rank None, or
    # the device names, one per cable; None for the whole: every peer over the library's first
    # device), and reliable-connected queue pairs instead of unreliable ones.
    verbs_lib: str | None = None
    rdma_devices: tuple[tuple[str, ...] | None, ...] | None = None
    rdma_reliable: bool = False
    # Tuning (FASTCOLL_TUNING="name=value,..."): the algorithm choice and the transports' waits.
    direct_max_bytes: int = DEFAULT_DIRECT_MAX_BYTES
    direct_max_bytes_two_ranks: int = DEFAULT_DIRECT_MAX_BYTES_TWO_RANKS
    piece_bytes: int = DEFAULT_PIECE_BYTES
    # Recursive doubling for small calls; a group whose hosts it would cross twice or more runs
    # direct sends instead, unless init() timed doubling faster on the job's links or
    # FASTCOLL_TUNING set this (algorithms/select.py's for_hosts, doubling_probe.py).
    doubling: bool = True
    gate_direct: bool = True  # the gate's direct mode where every rank shares a host (docs/gate.md)
    # How often the direct mode's watcher looks at its peers, in ms: each look takes the GIL from
    # the thread that builds the next token, so not more often than a failure needs noticing.
    gate_watch_ms: int = 5
    # The smallest all-reduce the gate takes in its host mode (the direct mode takes every size).
    gate_host_min_bytes: int = DEFAULT_GATE_HOST_MIN_BYTES
    spin_reads: int = DEFAULT_SPIN_READS
    yield_reads: int = DEFAULT_YIELD_READS
    spin_us: int = DEFAULT_SPIN_US
    yield_us: int = DEFAULT_YIELD_US
    long_wait_us: int = DEFAULT_LONG_WAIT_US
    result_cache_mb: int = DEFAULT_RESULT_CACHE_MB
    tuned: frozenset = frozenset()  # the knobs FASTCOLL_TUNING set (for_mlx and for_host keep those)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"FASTCOLL_TRANSPORT must be one of {', '.join(map(repr, TRANSPORTS))}, "
                f"not {self.transport!r}")
        check_timeout(self.timeout, "FASTCOLL_TIMEOUT", text=True)

    @property
    def interfaces(self) -> tuple[str, ...]:
        """FASTCOLL_INTERFACE's addresses in order (it may list several, comma-separated)."""
        return split_interfaces(self.interface)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Config":
        """Read the configuration from `env` (default: os.environ); bad values raise ValueError."""
        env = os.environ if env is None else env
        check_setting_names(env)
        rank, size, local_rank, launcher = _ranks(env)
        coordinator = None
        if size > 1:
            coordinator = _coordinator(env, launcher)
        kind = env.get("FASTCOLL_TRANSPORT", "tcp").strip().lower() or "tcp"
        log = env.get("FASTCOLL_LOG", "").strip().lower() or None
        if log is not None and log not in LOG_LEVELS:
            raise ValueError(f"FASTCOLL_LOG must be one of {', '.join(LOG_LEVELS)}, not {log!r}")
        interface = env.get("FASTCOLL_INTERFACE", "").strip() or None
        addresses = split_interfaces(interface)
        tuning = _tuning(env.get("FASTCOLL_TUNING", ""))
        rdma = _rdma(env, rank, size) if kind == "rdma" else {}
        return cls(
            rank=rank,
            world_size=size,
            local_rank=local_rank,
            coordinator=coordinator,
            token=env.get("FASTCOLL_TOKEN", "").encode(),
            transport=kind,
            timeout=_seconds(env, "FASTCOLL_TIMEOUT", DEFAULT_TIMEOUT),
            interface=interface,
            connections=_number(env, "FASTCOLL_CONNECTIONS", max(1, len(addresses)), int, minimum=1),
            shm=_flag(env, "FASTCOLL_SHM", default=True),
            fast_sync=_flag(env, "FASTCOLL_FAST_SYNC"),
            fence_max_iters=_number(
                env, "FASTCOLL_FENCE_MAX_ITERS", DEFAULT_FENCE_MAX_ITERS, int, minimum=1
            ),
            gate_max_bytes=_number(
                env, "FASTCOLL_GATE_MAX_BYTES", DEFAULT_GATE_MAX_BYTES, int, minimum=1
            ),
            gate_profile=_flag(env, "FASTCOLL_GATE_PROFILE"),
            trace=env.get("FASTCOLL_TRACE") or None,
            mlx_graph=_flag(env, "FASTCOLL_MLX_GRAPH", default=DEFAULT_MLX_GRAPH),
            mlx_graph_set=bool(env.get("FASTCOLL_MLX_GRAPH", "").strip()),
            native=_flag(env, "FASTCOLL_NATIVE", default=True),
            launcher=launcher,
            job=job_identity(env, launcher),
            log=log,
            host=_host_name(env),
            **rdma,
            **tuning,
            tuned=frozenset(tuning),
        )


TUNING = ("direct_max_bytes", "direct_max_bytes_two_ranks", "piece_bytes", "doubling", "gate_direct",
          "gate_watch_ms", "gate_host_min_bytes", "spin_reads", "yield_reads", "spin_us", "yield_us", "long_wait_us",
          "result_cache_mb")


# An MLX program evaluates on threads of its own (mlx-lm's loop builds the next step while the last
# one runs), so where ranks share cores a rank that spins or yields while it waits takes a core
# from them; its waits sleep at once instead (bench/NOTES.md 62).
MLX_WAITS = {"spin_us": 0, "yield_us": 0}
# In graph mode MLX's evaluation thread waits, while the thread that would build the next step
# mostly waits for it: yielding the CPU for up to 2 ms, then sleeping, answers a peer sooner than
# a wake-up does and still lets the threads that share the core run (bench/NOTES.md 63). But a
# kind of call that last waited 1 ms or more (a pipeline's stage) sleeps at once (NOTES 80).
MLX_GRAPH_WAITS = {"spin_us": 0, "yield_us": 2000, "long_wait_us": 1000}
# Those sleeps are for ranks that share CPUs. Where a rank can count on MLX_GRAPH_CPUS_PER_RANK
# CPUs (reasoned, not measured: the two threads an MLX rank keeps busy, and one for a wait), a
# wait yields through a pipeline's stage instead, so that the peer's reply finds it awake:
# pipelined decode, two ranks on a 16-core machine, took 0.90x the time it took with the sleeps
# (bench/NOTES.md 92).
MLX_GRAPH_SPARE_WAITS = {"yield_us": 20000, "long_wait_us": 0}
MLX_GRAPH_CPUS_PER_RANK = 3


def for_mlx(config: Config) -> Config:
    """`config` for a program under fastcoll.mlx_compat: its waits sleep at once (MLX_WAITS), or
    in graph mode yield first (MLX_GRAPH_WAITS), but for a knob FASTCOLL_TUNING set, and not
    where the fence gate is asked for (its host half waits microseconds for a GPU, not for a
    peer's evaluation)."""
    if config.fast_sync:
        return config
    return _with_waits(config, MLX_GRAPH_WAITS if config.mlx_graph else MLX_WAITS)


def for_host(config: Config, cpus_per_rank: float) -> Config:
    """`config` for a rank that can count on `cpus_per_rank` CPUs: graph mode's waits
    (MLX_GRAPH_WAITS, from for_mlx) yield through a peer's work where that is
    MLX_GRAPH_CPUS_PER_RANK or more (MLX_GRAPH_SPARE_WAITS), but for a knob FASTCOLL_TUNING set.
    The native engine applies it; the group's config keeps the waits as configured."""
    graph_waits = config.mlx_graph and not config.fast_sync and all(
        getattr(config, k) == v or k in config.tuned for k, v in MLX_GRAPH_WAITS.items())
    if not graph_waits or cpus_per_rank < MLX_GRAPH_CPUS_PER_RANK:
        return config
    return _with_waits(config, MLX_GRAPH_SPARE_WAITS)


def _with_waits(config: Config, waits: dict) -> Config:
    """`config` with `waits`, but for the knobs FASTCOLL_TUNING set."""
    return dataclasses.replace(config, **{k: v for k, v in waits.items() if k not in config.tuned})


# An RDMA device's name as the verbs library lists it (rdma_en3, mlx5_0, rxe0): at most
# IBV_SYSFS_NAME_MAX (64) bytes, with none of the characters that would make a line unreadable.
_DEVICE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _rdma(env: Mapping[str, str], rank: int, size: int) -> dict:
    """The FASTCOLL_TRANSPORT=rdma settings: FASTCOLL_VERBS_LIB, FASTCOLL_RDMA_DEVICES and
    FASTCOLL_RDMA_RELIABLE, as Config fields (read only under rdma: elsewhere they mean nothing)."""
    lib = env.get("FASTCOLL_VERBS_LIB", "")
    if lib and (lib != lib.strip() or "\0" in lib):
        raise ValueError(f"FASTCOLL_VERBS_LIB must be a library's path or name, not {lib!r}")
    text = env.get("FASTCOLL_RDMA_DEVICES", "").strip()
    return {"verbs_lib": lib or None,
            "rdma_devices": parse_rdma_devices(text, rank, size) if text else None,
            "rdma_reliable": _flag(env, "FASTCOLL_RDMA_RELIABLE")}


def parse_rdma_devices(text: str, rank: int, size: int, what: str = "FASTCOLL_RDMA_DEVICES",
                       unit: str = "rank") -> tuple[tuple[str, ...] | None, ...]:
    """'[null, "rdma_en3", ["rdma_en4", "rdma_en5"]]' for rank 0 of 3 -> (None, ("rdma_en3",),
    ("rdma_en4", "rdma_en5")): one entry per rank, as MLX's hostfile `rdma` lists them: null
    (this rank itself, or a peer reached over TCP or shared memory), a device name, or a list of
    names (one per cable: connection k to that peer uses name k modulo their number)."""
    try:
        entries = json.loads(text)
    except ValueError:
        raise ValueError(f"{what} must be a JSON list such as [null, \"rdma_en3\"], not {text!r}") from None
    if not isinstance(entries, list) or len(entries) != size:
        raise ValueError(f"{what} must be a JSON list with one entry per {unit} ({size}), not {text!r}")
    out = []
    for i, entry in enumerate(entries):
        names = [entry] if isinstance(entry, str) else entry
        if entry is None:
            out.append(None)
        elif not isinstance(names, list) or not names or not all(
                isinstance(n, str) and _DEVICE_NAME.fullmatch(n) for n in names):
            raise ValueError(f"{what}: entry {i} must be null, a device name or a list of device names "
                             f"(letters, digits, _ . : -), not {json.dumps(entry)}")
        elif i == rank:
            raise ValueError(f"{what}: entry {i} is this {unit} itself and must be null, not {json.dumps(entry)}")
        else:
            out.append(tuple(names))
    return tuple(out)


def _tuning(text: str) -> dict:
    """FASTCOLL_TUNING='spin_reads=0,doubling=0' -> {'spin_reads': 0, 'doubling': False}: the
    knobs benchmarks turn, each a Config field (see the defaults above for what they do)."""
    out: dict = {}
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in TUNING:
            raise ValueError(f"FASTCOLL_TUNING: {item!r} is not name=value with a name among {', '.join(TUNING)}")
        what = f"FASTCOLL_TUNING's {name}"
        if fields[name].type in (bool, "bool"):
            out[name] = _flag({what: value}, what)
        else:
            out[name] = _number({what: value}, what, 0, int, minimum=-1 if name == "spin_us" else 0)
    return out


def check_timeout(value: object, what: str, text: bool = False) -> float:
    """`value` as seconds to wait: a finite, positive number of at most MAX_TIMEOUT; a
    ValueError that names `what` and the value otherwise (inf would overflow the sockets'
    timeouts, NaN would expire at once, 1e300 overflows the platform's time_t). Only with `text`
    (an environment variable's) may it be a string; else a value that is no number (a string,
    a bool) is a TypeError, as `timeout="5"` is a mistake, not a number of seconds."""
    if not text and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{what} must be a number of seconds (an int or a float), not "
                        f"{type(value).__name__} {value!r}")
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a finite number of seconds above 0, not {value!r}")
    if seconds > MAX_TIMEOUT:
        raise ValueError(f"{what} must be at most {MAX_TIMEOUT:g} seconds (about 31 years), not {value!r}")
    return seconds


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if text is None or text.strip() == "":
        return default
    return check_timeout(text.strip(), name, text=True)


def _host_name(env: Mapping[str, str]) -> str:
    """FASTCOLL_HOST, the launcher's name for this rank's host, which error messages use."""
    name = env.get("FASTCOLL_HOST", "").strip()
    if len(name) > 255 or not name.isprintable():
        raise ValueError(f"FASTCOLL_HOST must be a host name of at most 255 printable characters, not {name[:300]!r}")
    return name


def split_interfaces(text: str | None) -> tuple[str, ...]:
    """'10.0.0.1,10.0.1.1' -> ('10.0.0.1', '10.0.1.1'); a ValueError names an empty entry."""
    if not text:
        return ()
    parts = tuple(p.strip() for p in text.split(","))
    if not all(parts):
        raise ValueError(f"FASTCOLL_INTERFACE must be addresses separated by commas, not {text!r}")
    return parts


def _mlx_hosts(env: Mapping[str, str]) -> list | None:
    """mlx.launch's MLX_HOSTFILE: a JSON list with one entry per rank (ring backend: a list of
    "ip:port" strings; mlx.distributed_config: {"ssh": name, "ips": [...]})."""
    path = env.get("MLX_HOSTFILE")
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        hosts = json.load(f)
    if not isinstance(hosts, list) or not hosts:
        raise ValueError(f"MLX_HOSTFILE {path} is not a non-empty JSON list")
    return hosts


def _ranks(env: Mapping[str, str]) -> tuple[int, int, int, str]:
    if "MLX_RANK" in env and "MLX_WORLD_SIZE" not in env and "FASTCOLL_RANK" not in env:
        # mlx.launch sets MLX_RANK and MLX_HOSTFILE only: the world is the hostfile's length.
        hosts = _mlx_hosts(env)
        if hosts is None:
            raise ValueError("MLX_RANK is set but neither MLX_WORLD_SIZE nor MLX_HOSTFILE is")
        env = {**env, "MLX_WORLD_SIZE": str(len(hosts))}
    for rank_var, size_var, local_var, launcher in _LAUNCHER_RANKS:
        if rank_var in env or size_var in env:
            if rank_var not in env or size_var not in env:
                raise ValueError(f"{rank_var} and {size_var} must be set together")
            rank = _number(env, rank_var, 0, int, minimum=0)
            size = _number(env, size_var, 1, int, minimum=1)
            if rank >= size:
                raise ValueError(f"{rank_var}={rank} is not below {size_var}={size}")
            local = _number(env, local_var, 0, int, minimum=0) if local_var else 0
            return rank, size, local, launcher
    return 0, 1, 0, "none"


def job_identity(env: Mapping[str, str], launcher: str) -> str:
    """The job as the launcher that gave this rank its number names it, the same on every rank
    of one job and different for two jobs: Slurm's job and step ids, Open MPI's (or PMIx's)
    job id, MPICH's PMI job name, mlx.launch's hostfile; "" where there is none (MPICH's hydra
    sets no job id; fastcoll-launch gives each job a token of its own instead).

    Only the launcher's own variables count: a variable inherited from elsewhere (a Slurm
    allocation around mpirun, say) need not reach every rank alike."""
    def first(*names: str) -> str:
        return next((env[n].strip() for n in names if env.get(n, "").strip()), "")

    if launcher == "Slurm":
        job = first("SLURM_JOB_ID", "SLURM_JOBID")
        return f"Slurm job {job} step {first('SLURM_STEP_ID', 'SLURM_STEPID') or '?'}" if job else ""
    if launcher == "Open MPI":
        job = first("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid")
        return f"Open MPI job {job}" if job else ""
    if launcher == "MPICH/PMI":
        job = first("PMIX_NAMESPACE", "PMI_KVSNAME")
        return f"MPI job {job}" if job else ""
    if launcher == "mlx.launch":
        hosts = _mlx_hosts(env)
        if hosts is not None:
            digest = hashlib.sha256(json.dumps(hosts, sort_keys=True).encode()).hexdigest()[:12]
            return f"mlx.launch job of hostfile {digest}"
        where = first("MLX_JACCL_COORDINATOR") or (
            f"{env['NCCL_HOST_IP']}:{env.get('NCCL_PORT', '')}" if env.get("NCCL_HOST_IP") else "")
        return f"mlx.launch job at {where}" if where else ""
    return ""


def _coordinator(env: Mapping[str, str], launcher: str) -> tuple[str, int]:
    text = env.get("FASTCOLL_COORDINATOR")
    if text:
        return parse_address(text, "FASTCOLL_COORDINATOR")
    port = _number(env, "FASTCOLL_PORT", DEFAULT_PORT, int, minimum=1)
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"], _number(env, "MASTER_PORT", port, int, minimum=1)
    host = _first_host(env)
    if host is None:
        raise ValueError(
            f"a {launcher} job of several ranks needs FASTCOLL_COORDINATOR=host:port "
            "(the address where rank 0 listens); none could be derived from the environment"
        )
    return host, port


def _first_host(env: Mapping[str, str]) -> str | None:
    """The first host of the job, as mlx.launch, Slurm or a local mpirun describe it."""
    hosts = _mlx_hosts(env)
    if hosts:
        first = hosts[0]
        if isinstance(first, dict):
            ips = first.get("ips") or []
            return ips[0] if ips else first.get("ssh")
        if isinstance(first, list) and first and isinstance(first[0], str):
            return first[0].rsplit(":", 1)[0].strip("[]")  # "ip:port" of MLX's own ring
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodes:
        return first_slurm_node(nodes)
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
    size = env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE")
    if local and size and local == size:
        return "127.0.0.1"
    return None


def first_slurm_node(nodelist: str) -> str:
    """'node[03-05,7],gpu1' -> 'node03': the first host of a Slurm node list."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _number(env: Mapping[str, str], name: str, default, kind, minimum=None):
    text = env.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a{'n' if kind is int else ''} {kind.__name__}, not {text!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {text!r}")
    return value


# What an on/off setting (FASTCOLL_SHM, ...) accepts, in any case; the README lists the same.
FLAG_OFF = ("0", "off", "false", "no")
FLAG_ON = ("1", "on", "true", "yes")


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """An on/off setting: FLAG_ON or FLAG_OFF; unset or empty gives the default."""
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text in FLAG_OFF:
        return False
    if text in FLAG_ON:
        return True
    words = ", ".join(f"{on}/{off}" for on, off in zip(FLAG_ON[1:], FLAG_OFF[1:]))
    raise ValueError(f"{name} must be 0 or 1 (or {words}), not {env[name]!r}")
