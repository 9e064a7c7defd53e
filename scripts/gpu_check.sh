#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine, in one command (target: under 8 minutes on
# one H200): the `gpu` tests (each CUDA kernel vs its CPU reference; the fixtures vs
# transformers at tp = 1 and tp = 2 with two ranks on one GPU; CUDA-graph replay vs the
# eager path), then `linnet-tp bench` on the Llama-3.1-8B shape with random bf16 weights
# at batch 1 and 16, each eager and with --cuda-graphs, and a short table last.
#
# The device machine has nvcc, CMake and Python but none of our Debian packages and no
# network, so everything travels in the working tree:
#   here:   scripts/gpu_check.sh prepare     # .debs/ (scripts/gpu_fetch_debs.sh) and
#                                            # .gpu-bin/ (binaries built here, CUDA on)
#   device: run(command="scripts/gpu_check.sh", carry=[".debs", ".gpu-bin"], timeout_s=540)
# There the .debs are unpacked with `dpkg -x` into a private prefix (never into /).
# The binaries built here are used when they start; otherwise (or with --build) the
# needed targets are built there against the prefix.
#
# Time: the device call has 540 s. The script keeps a budget of GPU_CHECK_BUDGET seconds
# (default 420) for its steps: no step starts once the budget is spent, each step's
# timeout is cut to what is left, the benches stop at the first failure, and the summary
# table prints whatever happened (from an EXIT trap).
#
# Options: --build (ignore .gpu-bin), --no-gpu (test this script's logic on a machine
# without a GPU: unpack, configure/build or pick binaries, bench on the CPU backend with
# a small model), --out DIR (logs; default $OUT or /tmp/linnet-gpu-check). GPU_CHECK_BUILD_DIR
# overrides the build folder (default build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

MODE=check
FORCE_BUILD=0
NO_GPU=0
LOGS=${OUT:-/tmp/linnet-gpu-check}
while [ $# -gt 0 ]; do
  case "$1" in
    prepare) MODE=prepare ;;
    --build) FORCE_BUILD=1 ;;
    --no-gpu) NO_GPU=1 ;;
    --out) LOGS=$2; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-420}
say() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }
die() { TESTS_OK=0; say "FAILED: $*"; exit 1; }
# Seconds of the budget left; a step's timeout: its own limit cut to what is left.
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
step_timeout() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }

GPU_TARGETS="linnet-tp test_cuda_kernels test_cuda_engine test_nccl"
GPU_BINS="linnet-tp test_cuda_kernels test_cuda_engine test_nccl"

if [ "$MODE" = prepare ]; then
  set -e
  scripts/gpu_fetch_debs.sh
  cmake -S . -B build-cuda -DLINNET_CUDA=ON >/dev/null
  # shellcheck disable=SC2086  # the targets are separate words
  cmake --build build-cuda -j2 --target $GPU_TARGETS
  grep -qxF '/.gpu-bin/' .git/info/exclude || echo '/.gpu-bin/' >> .git/info/exclude
  rm -rf .gpu-bin && mkdir -p .gpu-bin
  for t in launch/linnet-tp tests/test_cuda_kernels tests/test_cuda_engine tests/test_nccl; do
    cp "build-cuda/$t" .gpu-bin/ && strip .gpu-bin/"$(basename "$t")"
  done
  say "prepared: .debs ($(du -sh .debs | cut -f1)), .gpu-bin ($(du -sh .gpu-bin | cut -f1)); carry both"
  exit 0
fi

mkdir -p "$LOGS"
if [ "$NO_GPU" = 0 ]; then
  CONFIG=$ROOT/scripts/configs/llama-3.1-8b.json BACKEND=cuda RUNS="1 16" BENCH_P=128 BENCH_N=64
else
  CONFIG=$ROOT/tests/data/fixtures/llama31/f32/config.json BACKEND=cpu RUNS="1 4" BENCH_P=16 BENCH_N=8
fi
TESTS_OK=1
GPU_LOG=$LOGS/gpu_tests.log
ROWS=()
# The table, printed whatever happened (also when a step above died or ran out of time).
table() {
  echo
  echo "linnet-tp bench, $(basename "$CONFIG") random weights, $BACKEND, prompt $BENCH_P, $BENCH_N new tokens ($(( $(date +%s) - T0 )) s in all)"
  echo "| batch | decode path (graphs on?) | prefill tok/s | decode tok/s | ms/step | GB/s |"
  echo "|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo "gpu tests: $([ $TESTS_OK = 1 ] && echo passed || echo FAILED) (log: $GPU_LOG)"
}
trap table EXIT

# --- 1. Dependencies: the .debs unpacked into a prefix, and the CUDA libraries --------
PREFIX=/tmp/linnet-deps
if ! ls .debs/*.deb >/dev/null 2>&1; then die ".debs/ is missing: run scripts/gpu_check.sh prepare here and carry .debs"; fi
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
for f in .debs/*.deb; do dpkg -x "$f" "$PREFIX" || die "dpkg -x $f"; done
P=$PREFIX/usr
ARCHLIB=$P/lib/x86_64-linux-gnu
export OPAL_PREFIX=$P                      # relocates Open MPI (wrappers, orted, help files)
export PATH=$P/bin:$PATH
export LD_LIBRARY_PATH=$ARCHLIB:$ARCHLIB/openmpi/lib:$ARCHLIB/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG=$P/bin/pkgconf
export PKG_CONFIG_LIBDIR=$ARCHLIB/pkgconfig:$P/share/pkgconfig:$ARCHLIB/openblas-pthread/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$PREFIX      # the .pc files say /usr
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_hwloc_base_binding_policy=none  # linnet-tp pins its own threads (kernels/cpu/threads.h)
MPIRUN=$P/bin/mpirun.openmpi  # Debian names it so (update-alternatives makes mpirun)
[ -x "$MPIRUN" ] || die "no mpirun in the unpacked prefix"

# cuBLASLt and NCCL: the CUDA toolkit's folders, else the wheels PyTorch brought.
PYLIBS=$(python3 - <<'PY' 2>/dev/null
import importlib, os
for m in ("nvidia.nccl", "nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        mod = importlib.import_module(m)
        for p in mod.__path__:
            print(p)
    except Exception:
        pass
PY
)
NCCL_ROOT=""
for d in /usr/local/cuda /usr/local/cuda/targets/x86_64-linux $PYLIBS; do
  for sub in lib64 lib; do
    ls "$d/$sub"/libcublasLt.so* >/dev/null 2>&1 && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d/$sub
    if ls "$d/$sub"/libnccl.so* >/dev/null 2>&1; then
      LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d/$sub
      [ -z "$NCCL_ROOT" ] && [ -f "$d/include/nccl.h" ] && NCCL_ROOT=$d
    fi
  done
done
export LD_LIBRARY_PATH
say "prefix $PREFIX ready"

if [ "$NO_GPU" = 0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || die "nvidia-smi"
fi

# --- 2. Binaries: the ones built here if they start, else build the targets here ------
BIN=""
TESTBIN=""
BUILD=""
if [ "$FORCE_BUILD" = 0 ] && [ -x .gpu-bin/linnet-tp ]; then
  # shellcheck disable=SC2086  # the binaries are separate words
  if ! (cd .gpu-bin && ldd $GPU_BINS) | grep -q "not found" &&
     .gpu-bin/linnet-tp --version >/dev/null 2>"$LOGS/prebuilt.err"; then
    BIN=$ROOT/.gpu-bin/linnet-tp
    TESTBIN=$ROOT/.gpu-bin
    say "using the binaries built elsewhere (.gpu-bin)"
  else
    say "the carried binaries do not start here (see prebuilt.err / ldd); building"
    # shellcheck disable=SC2086
    (cd .gpu-bin && ldd $GPU_BINS) | grep "not found" >>"$LOGS/prebuilt.err"
  fi
fi
if [ -z "$BIN" ]; then
  # Building here: find cuBLASLt / NCCL wherever this machine keeps them (a toolkit
  # without cuBLAS, another wheel layout); only then is the slow search worth it.
  if ! ls /usr/local/cuda/lib64/libcublasLt.so* >/dev/null 2>&1 || [ -z "$NCCL_ROOT" ]; then
    while read -r lib; do
      d=$(dirname "$lib")
      case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *) LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d ;; esac
      if [ -z "$NCCL_ROOT" ] && [ -f "$d/../include/nccl.h" ] && [[ $lib == *nccl* ]]; then NCCL_ROOT=$(cd "$d/.." && pwd); fi
    done < <(find /usr /opt -name 'libcublasLt.so.1[0-9]' -o -name 'libnccl.so.2' 2>/dev/null)
    export LD_LIBRARY_PATH
    say "NCCL_ROOT=${NCCL_ROOT:-none} (searched)"
  fi
fi
if [ -z "$BIN" ]; then
  BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
  ARCHS=90
  [ "$NO_GPU" = 1 ] && ARCHS=80
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLINNET_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS \
    -DCMAKE_PREFIX_PATH="$P" -DMPI_C_COMPILER="$P/bin/mpicc.openmpi" -DMPIEXEC_EXECUTABLE="$MPIRUN" \
    -DCXXOPTS_INCLUDE_DIR="$P/include" -DICU_ROOT="$P" -DGTest_DIR="$ARCHLIB/cmake/GTest" \
    -Dnlohmann_json_DIR="$P/share/cmake/nlohmann_json" ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} \
    -DLINNET_SHARED_DIR="$ROOT/../shared" >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; die "configure"; }
  grep -E "CUDA backend|NCCL" "$LOGS/configure.log"
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"$(nproc)" --target $GPU_TARGETS >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; die "build"; }
  BIN=$BUILD/launch/linnet-tp
  TESTBIN=$BUILD/tests
  say "built $GPU_TARGETS"
fi
ldd "$BIN" | grep -iE "cublas|nccl|cudart|libcuda" || true

# --- 3. The gpu tests ------------------------------------------------------------------
# The test binaries run directly (built here or there alike), each to the end whatever
# the others did, into one log; a suite that skips for "no CUDA device" on a machine
# whose nvidia-smi sees a GPU is a failure (a driver / runtime mismatch), not a pass.
export LINNET_TEST_DATA=$ROOT/tests/data LINNET_BIN=$BIN LINNET_MPIEXEC=$MPIRUN
: >"$GPU_LOG"
gpu_test() {  # timeout (s), then the command
  local t
  t=$(step_timeout "$1")
  shift
  echo "=== $*" >>"$GPU_LOG"
  if [ "$t" -lt 20 ]; then
    TESTS_OK=0
    say "NOT RUN (budget spent): $*"
    echo "not run: the budget of ${BUDGET}s was spent" >>"$GPU_LOG"
    return
  fi
  if ! timeout "$t" "$@" >>"$GPU_LOG" 2>&1; then
    TESTS_OK=0
    say "FAILED: $*"
  fi
}
gpu_test 120 "$TESTBIN/test_cuda_kernels"
gpu_test 60 "$MPIRUN" -np 1 "$TESTBIN/test_nccl"
gpu_test 150 "$MPIRUN" -np 1 "$TESTBIN/test_cuda_engine"
# Two ranks on one GPU: only the suite that uses the job's tp group (the others make
# their own one-rank groups on MPI_COMM_SELF and ran above).
gpu_test 150 "$MPIRUN" -np 2 "$TESTBIN/test_cuda_engine" --gtest_filter='Seeds/CudaEngineTest.*'
grep -aE "^===|tests? from .* ran|  (PASSED|FAILED)  \]|\[rank [0-9]+\]|: Failure" "$GPU_LOG" | head -60
if [ "$NO_GPU" = 0 ] && grep -aq "no CUDA device" "$GPU_LOG"; then
  TESTS_OK=0
  say "FAILED: the gpu tests skipped with \"no CUDA device\" on a machine with a GPU"
fi
say "gpu tests: $([ $TESTS_OK = 1 ] && echo passed || echo FAILED) (log: $GPU_LOG)"

# --- 4. bench ---------------------------------------------------------------------------
BENCH_FAILED=0
for B in $RUNS; do
  for GRAPHS in eager graphs; do
    log=$LOGS/bench_b${B}_$GRAPHS.log
    t=$(step_timeout 90)
    if [ "$BENCH_FAILED" = 1 ] || [ "$t" -lt 20 ]; then
      ROWS+=("| $B | $GRAPHS | not run ($([ "$BENCH_FAILED" = 1 ] && echo "an earlier bench failed" || echo "budget spent")) | | | |")
      continue
    fi
    FLAG=""
    [ "$GRAPHS" = graphs ] && FLAG=--cuda-graphs
    # shellcheck disable=SC2086  # FLAG is one word or none
    if ! timeout "$t" "$MPIRUN" -np 1 "$BIN" bench --config "$CONFIG" --random-weights --backend $BACKEND \
      --batch "$B" --prompt-len $BENCH_P --new-tokens $BENCH_N $FLAG >"$log" 2>&1; then
      tail -20 "$log"
      say "bench batch $B $GRAPHS FAILED (log: $log)"
      ROWS+=("| $B | $GRAPHS | FAILED (see $(basename "$log")) | | | |")
      TESTS_OK=0
      BENCH_FAILED=1
      continue
    fi
    cat "$log"
    v() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" "$log"; }
    ON=$(sed -n 's/^cuda graphs: \([a-z]*\).*/\1/p' "$log")
    ROWS+=("| $B | $GRAPHS (${ON:-?}) | $(v 'prefill tokens\/s') | $(v 'decode tokens\/s') | $(v 'decode ms\/step') | $(v 'achieved GB\/s') |")
  done
done
[ $TESTS_OK = 1 ] || exit 1
