#!/usr/bin/env bash
# The fence gate's runs on one NVIDIA H200 (docs/gate.md): starts CUDA MPS so that two ranks can
# share the GPU, then runs the parts named, each bounded, writing JSON and Markdown into OUT.
#
#   bash bench/h200.sh OUT build tests ranks profile kill decode pyspy
#
# On the lent GPU machine, after `bash .device/b/install.sh` (see docs/gate.md) and with
# PYTHONPATH=/tmp/site:$PWD. Without a GPU (no nvidia-smi) the same parts run on the CPU, where
# the gate is off and every run takes the host path: a check of the scripts, not of the gate.
#   build    the native engine, in place          tests    the GPU, kernel and gate tests
#   ranks    gate_bench.py ranks: 64-gate chains, host path / direct / host mode (RANKS_ROWS
#            its rows, RANKS_EXACT=N checks N host-mode gates one by one)
#   profile  gate_bench.py profile: the gate's per-gate timings (FASTCOLL_GATE_PROFILE=1)
#   kill     gate_bench.py kill: a peer SIGKILLed mid-token, both modes
#   decode   decode_bench.py: DECODE_RUNS, DECODE_TOKENS, DECODE_SHAPE (8b); with the host's
#            times and costs per token and each thread's scheduling
#   pyspy    decode sampled by py-spy --native (PYSPY names its binary)
#   before ROOT   ROOT's own h200.sh ranks (another checkout), into OUT/before
set -u
out=$(realpath -m "$1")
shift
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export FASTCOLL_LOG=${FASTCOLL_LOG:-warning}  # a gate that falls back to the host path says why
mkdir -p "$out" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
gpu=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader)
echo "${gpu:-no NVIDIA GPU: the parts run on the CPU}"
mps() {  # mps on|off: two ranks share the GPU through CUDA MPS; one process runs without it
  [ -n "$gpu" ] || return 0
  if [ "$1" = on ]; then pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d
  else echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 1; fi
}
run() {  # run SECONDS COMMAND...: the command, killed past SECONDS, its output teed into OUT/log
  local limit=$1
  shift
  echo "== $(date -u +%H:%M:%S) $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$out/log.txt"
  echo "== exit ${PIPESTATUS[0]} after $SECONDS s"
}
decode=(python3 bench/decode_bench.py --shape "${DECODE_SHAPE:-8b}")
while [ $# -gt 0 ]; do
  case $1 in
    build) run 200 env FASTCOLL_BUILD_STRICT=1 python3 setup.py -q build_ext --inplace --force
      run 60 fastcoll-launch -n 2 python3 -c "import fastcoll; print(fastcoll.init().transport_info())" ;;
    tests) mps off; run 200 python3 -m pytest -q -x tests/test_gate_gpu.py tests/test_gate_host.py \
      tests/test_gate_kernels.py tests/test_gate_direct.py tests/test_gate_ranks.py ;;
    ranks) mps on; run 400 python3 bench/gate_bench.py ranks --world 2 --gpus 0,0 --tokens 20 --out "$out" \
      ${RANKS_ROWS:+--rows "$RANKS_ROWS"} ${RANKS_EXACT:+--exact "$RANKS_EXACT"} ;;
    profile) mps on; run 300 python3 bench/gate_bench.py profile --world 2 --gpus 0,0 --tokens 10 --out "$out" ;;
    kill) mps on; run 200 python3 bench/gate_bench.py kill --out "$out" ;;
    decode) mps on; run 500 env DECODE_HOST_TIMES=1 DECODE_HOST_COSTS=1 DECODE_THREADS=1 "${decode[@]}" --out "$out" \
      --runs "${DECODE_RUNS:-single,host,gate,gate_host_mode}" --tokens "${DECODE_TOKENS:-48}" ;;
    pyspy) mps on; run 300 env DECODE_PYSPY="${PYSPY:-py-spy}" DECODE_PYSPY_NATIVE=1 "${decode[@]}" \
      --out "$out/pyspy" --runs single,gate --tokens 1000 ;;
    before) shift; (cd "$1" && PYTHONPATH="/tmp/site:$PWD" bash bench/h200.sh "$out/before" ranks) ;;
    *) echo "unknown part $1" ;;
  esac
  shift
done
