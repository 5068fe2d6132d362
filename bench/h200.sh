#!/usr/bin/env bash
# The fence gate's runs on one NVIDIA H200 (docs/gate.md): starts CUDA MPS so that two ranks can
# share the GPU, then runs the parts named, each bounded, writing JSON into OUT.
#
#   bash bench/h200.sh OUT build tests where profile ranks decode kill pyspy
#
# On the lent GPU machine, after `bash .device/b/install.sh` (see docs/gate.md) and with
# PYTHONPATH=/tmp/site:$PWD. `before ROOT` runs the previous version's benchmark from ROOT; `pyspy`
# samples decode with py-spy --native (PYSPY names its binary). DECODE_RUNS and DECODE_TOKENS choose
# decode_bench's runs and tokens, DECODE_FAST_CPUS its --fast-cpus, DECODE_FAST_MAIN=1 its --fast-main; RANKS_ROWS the ranks part's rows. `cpumap` maps how fast each CPU
# runs Python now (bench/micro/cpu_map.py). `build` builds the native engine in place;
# RANKS_EXACT=N makes the ranks part check N host-mode gates one by one.
set -u
out=$1
shift
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export FASTCOLL_LOG=${FASTCOLL_LOG:-warning}  # a gate that falls back to the host path says why
mkdir -p "$out" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
mps() {  # mps on|off: two ranks share the GPU through CUDA MPS; one process runs without it
  if [ "$1" = on ]; then pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d
  else echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 1; fi
}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
run() {  # run SECONDS COMMAND...: the command, killed past SECONDS, its output teed into OUT/log
  local limit=$1
  shift
  echo "== $(date -u +%H:%M:%S) $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$out/log.txt"
  echo "== exit ${PIPESTATUS[0]} after $SECONDS s"
}
while [ $# -gt 0 ]; do
  case $1 in
    build) run 200 env FASTCOLL_BUILD_STRICT=1 python3 setup.py -q build_ext --inplace --force
      run 30 python3 -c "import fastcoll.engine._native as n; print('native engine built:', n.__file__)" ;;
    tests) mps off; run 200 python3 -m pytest -q -x tests/test_gate_gpu.py tests/test_gate_host.py \
      tests/test_gate_kernels.py tests/test_gate_direct.py tests/test_gate_ranks.py ;;
    profile) mps off; run 300 python3 bench/gate_bench.py profile --out "$out" ;;
    kill) mps on; run 200 python3 bench/gate_bench.py kill --out "$out" ;;
    ranks) mps on; run 400 python3 bench/gate_bench.py ranks --world 2 --gpus 0,0 --tokens 20 --out "$out" \
      ${RANKS_ROWS:+--rows "$RANKS_ROWS"} ${RANKS_EXACT:+--exact "$RANKS_EXACT"} ;;
    where) mps off; run 200 python3 bench/gate_where.py gate --out "$out" ;;
    cpumap) python3 bench/micro/cpu_map.py 2>&1 | tee -a "$out/log.txt" ;;
    decode) mps on; run 500 env DECODE_HOST_TIMES=1 DECODE_HOST_COSTS=1 DECODE_THREADS=1 python3 bench/decode_bench.py \
      --shape 8b --runs "${DECODE_RUNS:-single,host,gate,gate_bound}" --tokens "${DECODE_TOKENS:-48}" --out "$out" \
      ${DECODE_FAST_CPUS:+--fast-cpus "$DECODE_FAST_CPUS"} ${DECODE_FAST_MAIN:+--fast-main} ;;
    pyspy) mps on; run 300 env DECODE_PYSPY="${PYSPY:-py-spy}" DECODE_PYSPY_NATIVE=1 python3 bench/decode_bench.py \
      --shape 8b --runs single,gate --tokens 1000 --out "$out/pyspy" ;;
    before)
      shift
      mps on
      (cd "$1" && export PYTHONPATH="/tmp/site:$PWD" &&
        run 150 python3 bench/gate_bench.py breakdown --tokens 10 --out "$out/before" &&
        run 150 python3 bench/gate_bench.py ranks --world 2 --gpus 0,0 --ops 300 --tokens 10 \
          --tag-prefix gate_ranks1gpu_ --out "$out/before") ;;
    *) echo "unknown part $1" ;;
  esac
  shift
done
