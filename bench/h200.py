"""The fence gate's runs on one NVIDIA H200 (docs/gate.md): starts CUDA MPS so that two ranks can
share the GPU, then runs the parts named, each bounded, writing JSON and Markdown into OUT.

    python3 bench/h200.py OUT build tests ranks profile kill decode

On the lent GPU machine, after `bash .device/b/install.sh` (see docs/gate.md) and with
PYTHONPATH=/tmp/site:$PWD. Without a GPU (no nvidia-smi) the same parts run on the CPU, where the
gate is off and every run takes the host path: a check of the scripts, not of the gate.

  build    the native engine, in place          tests    the GPU, kernel and gate tests
  ranks    gate_bench.py ranks: 64-gate chains, host path / direct / host mode (RANKS_ROWS its
           rows, RANKS_EXACT=N checks N host-mode gates one by one)
  profile  gate_bench.py profile: the gate's per-gate timings (FASTCOLL_GATE_PROFILE=1)
  kill     gate_bench.py kill: a peer SIGKILLed mid-token, both modes
  decode   decode_bench.py: DECODE_RUNS, DECODE_TOKENS, DECODE_SHAPE (8b)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness  # noqa: E402

PY = sys.executable
GATE_TESTS = ["tests/test_gate_gpu.py", "tests/test_gate_host.py", "tests/test_gate_kernels.py",
              "tests/test_gate_direct.py", "tests/test_gate_ranks.py"]
MPS = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/mpslog"}


def gpu_name() -> str:
    """The GPU's name, driver and memory in use, or '' where there is no NVIDIA GPU."""
    if shutil.which("nvidia-smi") is None:
        return ""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.used", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True).stdout.strip()


def mps(on: bool, gpu: str) -> None:
    """Two ranks share the GPU through CUDA MPS (on); one process runs without it (off). Either way
    MPS's folders are made and named in this environment, which the ranks (and hostbed's) inherit."""
    os.environ.update(MPS)
    for d in MPS.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    if not gpu:
        return
    if on:
        if subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-control"], capture_output=True).returncode:
            subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    else:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True)
        time.sleep(1)


def run(limit: float, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run cmd, killed past `limit` seconds, its output shown and appended to `log`; 1 if it failed."""
    print(f"== {time.strftime('%H:%M:%S', time.gmtime())} {' '.join(cmd)}", flush=True)
    res = harness.run_job([(cmd, env or {})], limit, key=None)  # no document: the exit code says it
    failed = res.error is not None
    sys.stdout.write(res.output)
    with log.open("a") as f:
        f.write(res.output)
    print(f"== {res.error if failed else 'exit 0'} after {res.wall_s:.0f} s", flush=True)
    return int(failed)


def parts(out: Path) -> dict[str, tuple[bool | None, float, list[str], dict[str, str]]]:
    """Each part: (MPS on, off or untouched (None), its limit in seconds, command, environment)."""
    env = os.environ.get
    rows = ["--rows", env("RANKS_ROWS")] if env("RANKS_ROWS") else []
    exact = ["--exact", env("RANKS_EXACT")] if env("RANKS_EXACT") else []
    decode = [PY, "bench/decode_bench.py", "--shape", env("DECODE_SHAPE", "8b")]
    gate, two = [PY, "bench/gate_bench.py"], ["--world", "2", "--gpus", "0,0", "--out", str(out)]  # under MPS
    return {
        "build": (None, 200, [PY, "setup.py", "-q", "build_ext", "--inplace", "--force"],
                  {"FASTCOLL_BUILD_STRICT": "1"}),
        "tests": (False, 200, [PY, "-m", "pytest", "-q", "-x", *GATE_TESTS], {}),
        "ranks": (True, 400, [*gate, "ranks", *two, "--tokens", "20", *rows, *exact], {}),
        "profile": (True, 300, [*gate, "profile", *two, "--tokens", "10"], {}),
        "kill": (True, 200, [*gate, "kill", "--out", str(out)], {}),
        "decode": (True, 500, [*decode, "--out", str(out), "--runs",
                               env("DECODE_RUNS", "single,host,gate,gate_host_mode"), "--tokens",
                               env("DECODE_TOKENS", "48")], {}),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    out = Path(argv[0]).resolve()
    table = parts(out)
    unknown = [p for p in argv[1:] if p not in table]
    if unknown:
        print(f"unknown part(s) {', '.join(unknown)}: the parts are {', '.join(table)}", file=sys.stderr)
        return 2
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"})
    os.environ.setdefault("FASTCOLL_LOG", "warning")  # a gate that falls back to the host path says why
    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name()
    print(gpu or "no NVIDIA GPU: the parts run on the CPU", flush=True)
    failed = 0
    for name in argv[1:]:
        on, limit, cmd, env = table[name]
        if on is not None:
            mps(on, gpu)
        failed += run(limit, cmd, out / "log.txt", env)
        if name == "build":
            check = "import fastcoll; print(fastcoll.init().transport_info())"
            failed += run(60, [PY, "-m", "fastcoll.launch", "-n", "2", PY, "-c", check], out / "log.txt")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
