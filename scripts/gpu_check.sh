#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine, in one command (one H200, 540 s for the call;
# the steps keep to a budget of GPU_CHECK_BUDGET seconds, default 420). Steps, most
# informative first, each against an outside reference:
#   kernels         test_cuda_kernels: each CUDA kernel against its CPU reference
#   engine_tp1      test_cuda_engine: the fixtures against transformers, CUDA graphs vs eager
#   shape_llama8b   compare_backends: the Llama-3.1-8B shape, random bf16 weights from one
#                   seed on both backends, a 64-token prefill and 8 decode steps on CUDA
#                   against the CPU backend (bf16 weights, f32 activations) on the
#                   machine's cores: max |logit diff| within the bf16 bound the tool
#                   states, greedy tokens equal (near ties named)
#   cli_generate    `generate --input` (continuous batching, a shared prefix), CUDA vs CPU
#   cli_serve       `serve`: one completion and one streamed chat request through curl
#   cli_loss        `loss`: per-document mean NLL, CUDA vs CPU within 1%
#   qwen3_4b_hf     a full-size random Qwen3-4B checkpoint (bf16, seeded) written by the
#                   machine's transformers, its logits over 64 tokens from transformers
#                   (f32 math on the GPU) against linnet-tp's on CUDA
#   shape_qwen3_4b  compare_backends on the Qwen3-4B shape
#   nccl            test_nccl: a real NCCL communicator, eager and inside a graph
#   engine_tp2      test_cuda_engine with two ranks on one GPU
#   bench           the 8B shape at batch 1 and 16, eager and with --cuda-graphs
# Two tables print at the end whatever happened (an EXIT trap): the steps, and the bench.
#
# The device machine has nvcc, CMake and Python (torch, transformers) but none of our
# Debian packages, no ssh and no network, so everything travels in one folder:
#   here:   scripts/gpu_check.sh prepare
#           # .gpu-check/ (ignored by git): debs/ (runtime libraries, gpu_fetch_debs.sh), bin/
#           # (the binaries, CUDA on, stripped), models/stories260k (the CLI steps' model)
#   device: run(command="scripts/gpu_check.sh", carry=[".gpu-check"], timeout_s=540)
# `prepare` checks every carried binary (and the prefix's mpirun and orted) with ldd against
# the unpacked prefix alone and fails naming any library it would not find there; it prints
# what travels (tracked files + the carried folder) and refuses above 56 MiB (the call
# takes 64). There the .debs are unpacked with `dpkg -x` into a private prefix (never
# into /). Every MPI start uses Open MPI's isolated launcher (OMPI_MCA_plm=isolated): one
# node, no ssh / rsh needed.
#
# Options:
#   prepare [--build-dir DIR] [--build-deps] [--dest DIR]
#       --build-dir: take the binaries from a finished build (default: configure build/
#       with -DLINNET_CUDA=ON and build the targets); --build-deps: also carry what
#       building there needs (for --build); --dest: the folder (default .gpu-check).
#   [--no-gpu] [--build] [--carried DIR] [--out DIR]
#       --no-gpu: prove this script's logic on a machine without a GPU (the CUDA tests
#       skip, the shape steps compare the CPU backend with itself on the small fixture
#       configs, the CLI steps too; the transformers step runs where python3 has torch and
#       transformers, with a small config); --build: build there (needs prepare
#       --build-deps); --carried: the prepared folder; --out: the logs (default
#       /tmp/linnet-gpu-check). Where $OUT is set (the device call), summary.md and
#       gpu_check_logs.tar.gz are copied there at the end (what comes back).
#   GPU_CHECK_BUDGET (s), GPU_CHECK_PYTHON (default python3), GPU_CHECK_PREFIX (where the
#   .debs are unpacked; default /tmp/linnet-deps), GPU_CHECK_BUILD_DIR (for --build).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

MODE=check
FORCE_BUILD=0
NO_GPU=0
BUILD_DEPS=0
FROM_BUILD=""
CARRIED=$ROOT/.gpu-check
LOGS=/tmp/linnet-gpu-check
while [ $# -gt 0 ]; do
  case "$1" in
    prepare) MODE=prepare ;;
    --build) FORCE_BUILD=1 ;;
    --no-gpu) NO_GPU=1 ;;
    --build-deps) BUILD_DEPS=1 ;;
    --build-dir) FROM_BUILD=${2:?--build-dir needs a folder}; shift ;;
    --dest|--carried) CARRIED=${2:?$1 needs a folder}; shift ;;
    --out) LOGS=${2:?--out needs a folder}; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$CARRIED" in /*) ;; *) CARRIED=$ROOT/$CARRIED ;; esac
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-420}
PY=${GPU_CHECK_PYTHON:-python3}
say() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

# The binaries that travel (built targets; where each lives in a build folder).
BIN_TARGETS="linnet-tp test_cuda_kernels test_cuda_engine test_nccl compare_backends"
bin_path() { case "$1" in linnet-tp) echo launch/linnet-tp ;; *) echo "tests/$1" ;; esac; }

# Libraries every Linux has (the C and C++ runtime), and CUDA's own, which the device's
# toolkit provides: neither is carried.
is_base_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|\
    libstdc++.so.*|libgcc_s.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
  esac
  return 1
}
is_cuda_lib() { case "$1" in libcublasLt.so.*|libcublas.so.*|libnccl.so.*|libcudart.so.*|libcuda.so.*) return 0 ;; esac; return 1; }

# unpack_prefix DEBS_DIR PREFIX: every .deb of the folder unpacked into PREFIX (fresh).
unpack_prefix() {
  rm -rf "$2" && mkdir -p "$2" || return 1
  local f
  for f in "$1"/*.deb; do dpkg -x "$f" "$2" || { echo "dpkg -x $f failed" >&2; return 1; }; done
}
# prefix_libpath PREFIX: the prefix's library folders, as LD_LIBRARY_PATH.
prefix_libpath() { echo "$1/usr/lib/x86_64-linux-gnu:$1/usr/lib/x86_64-linux-gnu/openmpi/lib:$1/lib/x86_64-linux-gnu"; }
# check_libs BIN PREFIX [EXTRA_LIBPATH]: ldd of BIN in an empty environment whose library
# path is the prefix's (and EXTRA, the CUDA folders on the device). Prints one line per
# library that is not found or resolves outside the prefix (the base and CUDA libraries
# aside; CUDA's may be missing here, they come from the device's toolkit). Non-zero when
# any is printed.
check_libs() {
  local bin=$1 prefix=$2 extra=${3:-} out line name path bad=0
  out=$(env -i LD_LIBRARY_PATH="$(prefix_libpath "$prefix")${extra:+:$extra}" ldd "$bin" 2>&1) || {
    echo "$(basename "$bin"): ldd failed: $out"
    return 1
  }
  while IFS= read -r line; do
    # A library too old for the binary (GLIBC_2.34 / GLIBCXX_3.4.30 from a Debian 12 build).
    case "$line" in *"version"*"not found"*) echo "$(basename "$bin"): $line"; bad=1; continue ;; esac
    case "$line" in *"=>"*) ;; *) continue ;; esac
    name=$(echo "$line" | awk '{print $1}')
    path=$(echo "$line" | awk '{print $3}')
    if is_base_lib "$name"; then continue; fi
    if is_cuda_lib "$name"; then
      if [ "$path" = not ] && [ -n "$extra" ]; then echo "$(basename "$bin"): $name not found (CUDA's)"; bad=1; fi
      continue
    fi
    if [ "$path" = not ]; then
      echo "$(basename "$bin"): $name not found"
      bad=1
    else
      case "$(readlink -f "$path")" in
        "$prefix"/*) ;;
        *) echo "$(basename "$bin"): $name resolves outside the carried prefix ($path)"; bad=1 ;;
      esac
    fi
  done <<<"$out"
  return $bad
}

# --- prepare (here) ---------------------------------------------------------------------
if [ "$MODE" = prepare ]; then
  set -e
  rm -rf "$CARRIED" && mkdir -p "$CARRIED/bin" "$CARRIED/models"
  if [ "$BUILD_DEPS" = 1 ]; then
    scripts/gpu_fetch_debs.sh "$CARRIED/debs" --build-deps
  else
    scripts/gpu_fetch_debs.sh "$CARRIED/debs"
  fi
  if [ -z "$FROM_BUILD" ]; then
    scripts/setup.sh
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLINNET_CUDA=ON >/dev/null
    # shellcheck disable=SC2086  # the targets are separate words
    cmake --build build -j "$(nproc)" --target $BIN_TARGETS
    FROM_BUILD=$ROOT/build
  fi
  for t in $BIN_TARGETS; do
    [ -x "$FROM_BUILD/$(bin_path "$t")" ] || { say "FAILED: $FROM_BUILD has no $t (a build with the CUDA backend on?)"; exit 1; }
    cp "$FROM_BUILD/$(bin_path "$t")" "$CARRIED/bin/" && strip "$CARRIED/bin/$t"
  done
  SHARED=${LINNET_SHARED_DIR:-$ROOT/../shared}
  [ -f "$SHARED/models/stories260k/config.json" ] || { say "FAILED: no $SHARED/models/stories260k (set LINNET_SHARED_DIR)"; exit 1; }
  cp -r "$SHARED/models/stories260k" "$CARRIED/models/"
  chmod -R u+w "$CARRIED/models"
  # A chat template for the serve step's chat request (the model has none of its own).
  printf '%s' "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}" >"$CARRIED/models/stories260k/chat_template.jinja"
  # Each binary on its own, against the prefix alone.
  CHECK_PREFIX=$(mktemp -d /tmp/linnet-gpu-prefix.XXXXXX)
  unpack_prefix "$CARRIED/debs" "$CHECK_PREFIX"
  bad=0
  for b in "$CARRIED"/bin/* "$CHECK_PREFIX/usr/bin/mpirun.openmpi" "$CHECK_PREFIX/usr/bin/orted"; do
    if msg=$(check_libs "$b" "$CHECK_PREFIX"); then
      say "ldd $(basename "$b"): every library from the prefix (or the C/C++ runtime, or CUDA's)"
    else
      echo "$msg" | sed 's/^/  /'
      bad=1
    fi
  done
  rm -rf "$CHECK_PREFIX"
  [ "$bad" = 0 ] || { say "FAILED: a carried binary needs a library the debs do not hold (add its package to scripts/gpu_fetch_debs.sh)"; exit 1; }
  # The binaries travel gzipped (their CUDA fat binaries shrink to a third); the device
  # side unpacks them into its log folder.
  gzip -9 "$CARRIED"/bin/*
  # What travels: the files git would send (tracked, and untracked but not ignored) and
  # the carried folder.
  tracked=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  carried=$(du -sb "$CARRIED" | cut -f1)
  total=$((tracked + carried))
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
  say "travels: $(mib "$total") MiB (tracked $(mib "$tracked"), $(basename "$CARRIED") $(mib "$carried"): debs $(mib "$(du -sb "$CARRIED/debs" | cut -f1)"), bin $(mib "$(du -sb "$CARRIED/bin" | cut -f1)"), models $(mib "$(du -sb "$CARRIED/models" | cut -f1)"))"
  if [ "$total" -gt $((56 * 1048576)) ]; then
    say "FAILED: more than 56 MiB would travel (the device call takes 64 MiB in all)"
    exit 1
  fi
  say "prepared $CARRIED; on the device: scripts/gpu_check.sh with carry=[\"$(basename "$CARRIED")\"]"
  exit 0
fi

# --- the check (there) ------------------------------------------------------------------
mkdir -p "$LOGS" && rm -rf "$LOGS/cli" "$LOGS"/*.log "$LOGS/summary.md"
STEPS=()   # rows of the steps table
ROWS=()    # rows of the bench table
SUMMARY=$LOGS/summary.md
FAILED=0
if [ "$NO_GPU" = 0 ]; then
  TEST_BACKEND=cuda
  BENCH_CONFIG=$ROOT/scripts/configs/llama-3.1-8b.json RUNS="1 16" BENCH_P=128 BENCH_N=64
  LOSS_B=8 LOSS_P=${GPU_CHECK_LOSS_LEN:-4096}  # the issue's 8 x 8192 once attention is known to fit the budget
  SHAPES="llama8b:$ROOT/scripts/configs/llama-3.1-8b.json qwen3_4b:$ROOT/scripts/configs/qwen3-4b.json"
  HF_CONFIG=$ROOT/scripts/configs/qwen3-4b.json
else
  TEST_BACKEND=cpu
  BENCH_CONFIG=$ROOT/tests/data/fixtures/llama31/f32/config.json RUNS="1 4" BENCH_P=16 BENCH_N=8
  LOSS_B=3 LOSS_P=16
  SHAPES="llama8b:$ROOT/tests/data/fixtures/llama31/f32/config.json qwen3_4b:$ROOT/tests/data/fixtures/qwen3/f32/config.json"
  HF_CONFIG=$ROOT/tests/data/fixtures/qwen3/f32/config.json
fi
table() {
  {
    echo
    echo "gpu_check ($([ "$NO_GPU" = 1 ] && echo "--no-gpu: the CPU backend stands in for CUDA" || echo "CUDA against the CPU backend and transformers")), $(( $(date +%s) - T0 )) s in all, budget ${BUDGET} s"
    echo "| step | result | s | detail |"
    echo "|---|---|---|---|"
    for r in "${STEPS[@]}"; do echo "$r"; done
    echo
    echo "linnet-tp bench, $(basename "$BENCH_CONFIG") random weights, $TEST_BACKEND, prompt $BENCH_P, $BENCH_N new tokens"
    echo "| batch | decode path (graphs on?) | prefill tok/s | decode tok/s | ms/step | GB/s | ms/step waiting on the device / on the host, waits per step |"
    echo "|---|---|---|---|---|---|---|"
    for r in "${ROWS[@]}"; do echo "$r"; done
    echo "loss: ${LOSS_ROW:-not run}"
    echo "gpu check: $([ "$FAILED" = 0 ] && echo passed || echo FAILED) (logs: $LOGS)"
  } | tee "$SUMMARY"
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$OUT" != "$LOGS" ]; then
    cp "$SUMMARY" "$OUT/summary.md"
    tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
  fi
}
trap table EXIT
die() { FAILED=1; STEPS+=("| setup | FAILED | $(( $(date +%s) - T0 )) | $* |"); say "FAILED: $*"; exit 1; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# --- 1. The prefix: the .debs unpacked, Open MPI relocated, the CUDA libraries -----------
[ -d "$CARRIED/debs" ] && ls "$CARRIED"/debs/*.deb >/dev/null 2>&1 ||
  die "$CARRIED/debs is missing: run scripts/gpu_check.sh prepare here and carry .gpu-check"
PREFIX=${GPU_CHECK_PREFIX:-/tmp/linnet-deps}
unpack_prefix "$CARRIED/debs" "$PREFIX" || die "unpacking $CARRIED/debs"
P=$PREFIX/usr
ARCHLIB=$P/lib/x86_64-linux-gnu
SYS_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  # python3 and curl keep the machine's own libraries
export OPAL_PREFIX=$P                      # relocates Open MPI (wrappers, orted, help files)
export PATH=$P/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_hwloc_base_binding_policy=none  # linnet-tp pins its own threads (kernels/cpu/threads.h)
export OMPI_MCA_plm=isolated                    # one node: no ssh / rsh, singletons included
MPIRUN=$P/bin/mpirun.openmpi  # Debian names it so (update-alternatives makes mpirun)
[ -x "$MPIRUN" ] || die "no mpirun in the unpacked prefix"

# cuBLASLt and NCCL: the CUDA toolkit's folders, else the wheels PyTorch brought.
PYLIBS=$(LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH "$PY" - <<'PY' 2>/dev/null
import importlib
for m in ("nvidia.nccl", "nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        for p in importlib.import_module(m).__path__:
            print(p)
    except Exception:
        pass
PY
)
CUDA_LIBPATH=""
NCCL_ROOT=""
for d in /usr/local/cuda /usr/local/cuda/targets/x86_64-linux $PYLIBS; do
  for sub in lib64 lib; do
    if ls "$d/$sub"/libcublasLt.so* >/dev/null 2>&1 || ls "$d/$sub"/libnccl.so* >/dev/null 2>&1; then
      CUDA_LIBPATH=${CUDA_LIBPATH:+$CUDA_LIBPATH:}$d/$sub
    fi
    if [ -z "$NCCL_ROOT" ] && ls "$d/$sub"/libnccl.so* >/dev/null 2>&1 && [ -f "$d/include/nccl.h" ]; then NCCL_ROOT=$d; fi
  done
done
LD_LIBRARY_PATH=$(prefix_libpath "$PREFIX")${CUDA_LIBPATH:+:$CUDA_LIBPATH}
export LD_LIBRARY_PATH
say "prefix $PREFIX ready (CUDA libraries: ${CUDA_LIBPATH:-none found})"
sys() { LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH "$@"; }

if [ "$NO_GPU" = 0 ]; then
  GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) || die "nvidia-smi: $GPU"
  say "GPU: $GPU"
fi

# --- 2. Binaries: each carried one that starts, or built here with --build ---------------
declare -A MISSING  # binary -> why it cannot run
BINDIR=$CARRIED/bin
if ls "$CARRIED"/bin/*.gz >/dev/null 2>&1; then  # prepare gzips them for the trip
  BINDIR=$LOGS/carried-bin && rm -rf "$BINDIR" && mkdir -p "$BINDIR"
  for z in "$CARRIED"/bin/*.gz; do
    out=$BINDIR/$(basename "$z" .gz)
    if command -v gzip >/dev/null; then gzip -dc "$z" >"$out"; else
      python3 -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$z" "$out"
    fi
    chmod +x "$out"
  done
fi
if [ "$FORCE_BUILD" = 1 ]; then
  ls "$CARRIED"/debs/libopenmpi-dev_*.deb >/dev/null 2>&1 || die "--build needs the build packages: scripts/gpu_check.sh prepare --build-deps"
  BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
  ARCHS=90
  [ "$NO_GPU" = 1 ] && ARCHS=80
  export PKG_CONFIG=$P/bin/pkgconf PKG_CONFIG_LIBDIR=$ARCHLIB/pkgconfig:$P/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$PREFIX
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLINNET_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS \
    -DCMAKE_PREFIX_PATH="$P" -DMPI_C_COMPILER="$P/bin/mpicc.openmpi" -DMPIEXEC_EXECUTABLE="$MPIRUN" \
    -DCXXOPTS_INCLUDE_DIR="$P/include" -DICU_ROOT="$P" -DGTest_DIR="$ARCHLIB/cmake/GTest" \
    -Dnlohmann_json_DIR="$P/share/cmake/nlohmann_json" ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} \
    -DLINNET_SHARED_DIR="$CARRIED" >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; die "configure (configure.log)"; }
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"$(nproc)" --target $BIN_TARGETS >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; die "build (build.log)"; }
  BINDIR=$LOGS/bin && rm -rf "$BINDIR" && mkdir -p "$BINDIR"
  for t in $BIN_TARGETS; do cp "$BUILD/$(bin_path "$t")" "$BINDIR/"; done
  say "built $BIN_TARGETS"
fi
for t in $BIN_TARGETS; do
  if [ ! -x "$BINDIR/$t" ]; then
    MISSING[$t]="not carried"
  elif ! why=$(check_libs "$BINDIR/$t" "$PREFIX" "${CUDA_LIBPATH:-}"); then
    MISSING[$t]=$(echo "$why" | tr '\n' ';' | sed 's/;$//')
  fi
  [ -n "${MISSING[$t]:-}" ] && say "cannot run $t: ${MISSING[$t]}"
done
BIN=$BINDIR/linnet-tp
ldd "$BIN" 2>/dev/null | grep -iE "cublas|nccl" || true

# --- 3. The steps ----------------------------------------------------------------------
# run_limited T CMD...: CMD (a program or one of this script's functions) in a process
# group of its own, which is ended (TERM, then KILL 5 s later) after T seconds: exit 124
# then, else CMD's own.
run_limited() {
  local t=$1 pid dog rc mark
  shift
  mark=$(mktemp -u "$LOGS/.timeout.XXXXXX")
  set -m
  ( "$@" ) &
  pid=$!
  ( sleep "$t"; touch "$mark"; kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null ) \
    </dev/null >/dev/null 2>&1 &
  dog=$!
  set +m
  wait "$pid"
  rc=$?
  kill -- "-$dog" 2>/dev/null
  wait "$dog" 2>/dev/null
  if [ -e "$mark" ]; then rm -f "$mark"; return 124; fi
  return $rc
}

# step NAME LIMIT NEEDS DETAIL_FN CMD...: runs CMD with a timeout cut to the budget left,
# its output in $LOGS/NAME.log; NEEDS: the binaries it runs (space-separated). DETAIL_FN
# prints the table's detail from the log (after the run).
step() {
  local name=$1 limit=$2 needs=$3 detail_fn=$4 t b t1 rc result detail
  shift 4
  local log=$LOGS/$name.log
  for b in $needs; do
    if [ -n "${MISSING[$b]:-}" ]; then
      STEPS+=("| $name | not run | 0 | $b cannot run: ${MISSING[$b]} |")
      FAILED=1
      return
    fi
  done
  t=$(left)
  [ "$limit" -lt "$t" ] && t=$limit
  if [ "$t" -lt 15 ]; then
    STEPS+=("| $name | not run | 0 | the budget of ${BUDGET} s was spent |")
    FAILED=1
    return
  fi
  say "step $name (at most $t s)"
  t1=$(date +%s)
  run_limited "$t" "$@" >"$log" 2>&1
  rc=$?
  detail=$("$detail_fn" "$log" 2>/dev/null | sed 's/|/\\|/g' | paste -sd';' | sed 's/;/; /g')
  case $rc in
    0) result=passed ;;
    77) result=skipped ;;
    124|137) result="FAILED (timeout ${t} s)"; FAILED=1 ;;
    *) result="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || tail -15 "$log" | sed "s/^/  [$name] /"
  STEPS+=("| $name | $result | $(( $(date +%s) - t1 )) | ${detail:-see $name.log} |")
  say "step $name: $result"
}

# gtest suites: the counts, and a skip because no device was visible on a machine whose
# nvidia-smi sees one is a failure (a driver / runtime mismatch), not a pass.
gtest_detail() {
  awk '/^\[==========\] [0-9]+ tests? from .* ran/ { ran += $2 }
       /^\[  PASSED  \] [0-9]+ test/ { passed += $4 }
       /^\[  SKIPPED \] [0-9]+ test/ { skipped += $4 }
       /^\[  FAILED  \] [0-9]+ test/ { failed += $4 }
       /no CUDA device/ && !why { why = $0; sub(/.*no CUDA device/, "no CUDA device", why) }
       END { printf "%d ran: %d passed, %d skipped, %d failed%s\n", ran, passed, skipped, failed,
                    skipped && why ? " (" why ")" : "" }' "$1"
  grep -a "^\[  FAILED  \] [A-Za-z]" "$1" | sort -u | head -3
  grep -a "a suite skipped\|no GoogleTest summary" "$1"
}
gtest_step() {  # the gtest command; 77 (skipped) when it passed by skipping every test
  "$@"
  local rc=$?
  if [ "$NO_GPU" = 0 ] && grep -aq "no CUDA device" "$LOG_NOW"; then
    echo "a suite skipped with \"no CUDA device\" on a machine with a GPU"
    return 1
  fi
  if [ $rc = 0 ] && ! grep -aqE "^\[==========\] [0-9]+ tests? from .* ran" "$LOG_NOW"; then
    echo "no GoogleTest summary in the output"
    return 1
  fi
  if [ $rc = 0 ] && grep -aq "^\[  PASSED  \] 0 tests" "$LOG_NOW" && grep -aq "^\[  SKIPPED \] [1-9]" "$LOG_NOW"; then
    return 77
  fi
  return $rc
}
run_gtest() {  # NAME LIMIT BIN ARGS...: a gtest binary, under mpirun when ARGS start with -np
  local name=$1 limit=$2 bin=$3
  shift 3
  LOG_NOW=$LOGS/$name.log
  if [ "${1:-}" = -np ]; then
    step "$name" "$limit" "$bin" gtest_detail gtest_step "$MPIRUN" "$@" "$BINDIR/$bin" "${GTEST_ARGS[@]}"
  else
    step "$name" "$limit" "$bin" gtest_detail gtest_step "$BINDIR/$bin" "$@"
  fi
}
export GTEST_COLOR=no  # mpirun hands the ranks a terminal: no colour codes in the logs
export LINNET_TEST_DATA=$ROOT/tests/data LINNET_BIN=$BIN LINNET_MPIEXEC=$MPIRUN LINNET_SHARED_DIR=$CARRIED

GTEST_ARGS=()
run_gtest kernels 120 test_cuda_kernels
run_gtest engine_tp1 150 test_cuda_engine -np 1

# Real shapes: compare_backends prints its numbers and PASS / FAIL.
shape_detail() { grep -aE "^(prefill|decode) max|^greedy|^result" "$1" | sed 's/ (row [0-9]*)//'; }
shape_step() {  # NAME CONFIG
  step "shape_$1" 150 compare_backends shape_detail "$BINDIR/compare_backends" --config "$2" --backend "$TEST_BACKEND" \
    --reference cpu --seed 1 --prompt-len 64 --decode-steps 8
}
SHAPE1=${SHAPES%% *}
shape_step "${SHAPE1%%:*}" "${SHAPE1#*:}"

# --- The CLI on the model carried in models/stories260k: the tested backend against the
# CPU backend holding the same bf16 weights and a bf16 KV cache (CUDA's default).
MODEL=$CARRIED/models/stories260k
CLI=$LOGS/cli && mkdir -p "$CLI"
REF_FLAGS=(--backend cpu --weight-dtype bf16 --kv-cache-dtype bf16)
TEST_FLAGS=(--backend "$TEST_BACKEND")
[ "$TEST_BACKEND" = cpu ] && TEST_FLAGS+=(--weight-dtype bf16 --kv-cache-dtype bf16)
# Each line's completion_ids (our own JSONL, as nlohmann dumps it), one per line.
ids_of() { sed -n 's/.*"completion_ids":\(\[[^]]*\]\).*/\1/p' "$1"; }
cli_generate() {
  local prefix="Once upon a time, there was a little girl named Lily. She loved to play outside. One day,"
  : >"$CLI/prompts.jsonl"
  for tail in " she saw a big" " her mom said" " the sun was" " a little bird" " Lily went to the park and" " they"; do
    echo "{\"prompt\": \"$prefix$tail\"}" >>"$CLI/prompts.jsonl"
  done
  local which
  for which in ref test; do
    local flags="REF_FLAGS[@]"
    [ $which = test ] && flags="TEST_FLAGS[@]"
    "$MPIRUN" -np 1 "$BIN" --model "$MODEL" "${!flags}" --input "$CLI/prompts.jsonl" --output "$CLI/gen_$which.jsonl" \
      --max-new-tokens 40 --temperature 0 --max-batch 4 || { echo "generate ($which) failed"; return 1; }
  done
  local n_ref n_test
  n_ref=$(ids_of "$CLI/gen_ref.jsonl" | wc -l)
  n_test=$(ids_of "$CLI/gen_test.jsonl" | wc -l)
  [ "$n_ref" = 6 ] && [ "$n_test" = 6 ] || { echo "expected 6 results each, got $n_ref (cpu) and $n_test"; return 1; }
  if diff <(ids_of "$CLI/gen_ref.jsonl") <(ids_of "$CLI/gen_test.jsonl") >"$CLI/gen.diff"; then
    echo "6 prompts sharing a 20-token prefix, max-batch 4, 40 new tokens: greedy tokens equal"
  else
    echo "6 prompts, 40 new tokens: greedy tokens DIFFER in $(grep -c '^<' "$CLI/gen.diff") of 6 (gen.diff)"
    return 1
  fi
}
gen_detail() { grep -a "greedy tokens\|failed\|expected" "$1" | tail -1; }
step cli_generate 60 linnet-tp gen_detail cli_generate

# serve: the server on a port of its own, one completion and one streamed chat request.
http_post() {  # URL BODY: the response body
  if command -v curl >/dev/null; then
    sys curl -sS --max-time 60 -H 'Content-Type: application/json' -d "$2" "$1"
  else
    sys "$PY" -c 'import sys, urllib.request as u
r = u.Request(sys.argv[1], sys.argv[2].encode(), {"Content-Type": "application/json"})
sys.stdout.write(u.urlopen(r, timeout=60).read().decode())' "$1" "$2"
  fi
}
http_ok() {  # URL: exit 0 when it answers 200
  if command -v curl >/dev/null; then
    sys curl -sf --max-time 2 "$1" >/dev/null
  else
    sys "$PY" -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null
  fi
}
serve_one() {  # WHICH FLAGS...: completion text and streamed chat content to $CLI/serve_WHICH.*
  local which=$1 port=""
  shift
  "$BIN" serve --model "$MODEL" "$@" --port 0 >"$CLI/serve_$which.out" 2>"$CLI/serve_$which.err" &
  local pid=$!
  for _ in $(seq 1 240); do
    [ -n "$port" ] || port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$CLI/serve_$which.err" | head -1)
    [ -n "$port" ] && http_ok "http://127.0.0.1:$port/health" && break
    kill -0 $pid 2>/dev/null || { echo "serve ($which) exited:"; tail -5 "$CLI/serve_$which.err"; return 1; }
    sleep 0.25
  done
  [ -n "$port" ] || { echo "serve ($which) printed no port"; kill -TERM $pid; return 1; }
  http_post "http://127.0.0.1:$port/v1/completions" \
    '{"prompt": "Once upon a time, there was a little girl named Lily.", "max_tokens": 32, "temperature": 0}' \
    >"$CLI/serve_$which.completion.json"
  http_post "http://127.0.0.1:$port/v1/chat/completions" \
    '{"messages": [{"role": "user", "content": "Tell me a story about a dog."}], "max_tokens": 32, "temperature": 0, "stream": true}' \
    >"$CLI/serve_$which.chat.sse"
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  sed -n 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$CLI/serve_$which.completion.json" >"$CLI/serve_$which.completion.txt"
  grep -a '^data: ' "$CLI/serve_$which.chat.sse" | sed -n 's/.*"content":"\(\([^"\\]\|\\.\)*\)".*/\1/p' | tr -d '\n' \
    >"$CLI/serve_$which.chat.txt"
  grep -aq '^data: \[DONE\]' "$CLI/serve_$which.chat.sse" || { echo "serve ($which): the stream did not end with [DONE]"; return 1; }
  [ -s "$CLI/serve_$which.completion.txt" ] || { echo "serve ($which): no completion text"; cat "$CLI/serve_$which.completion.json"; return 1; }
  [ -s "$CLI/serve_$which.chat.txt" ] || { echo "serve ($which): no streamed content"; return 1; }
}
cli_serve() {
  serve_one ref "${REF_FLAGS[@]}" || return 1
  serve_one test "${TEST_FLAGS[@]}" || return 1
  local ok=0
  cmp -s "$CLI/serve_ref.completion.txt" "$CLI/serve_test.completion.txt" || { echo "completion text DIFFERS"; ok=1; }
  cmp -s "$CLI/serve_ref.chat.txt" "$CLI/serve_test.chat.txt" || { echo "streamed chat text DIFFERS"; ok=1; }
  [ $ok = 0 ] && echo "completion ($(wc -c <"$CLI/serve_test.completion.txt") bytes) and streamed chat ($(grep -ac '^data: {' "$CLI/serve_test.chat.sse") chunks) equal to the CPU's"
  return $ok
}
serve_detail() { grep -a "equal\|DIFFERS\|exited\|did not\|no completion\|no streamed" "$1" | head -2; }
step cli_serve 90 linnet-tp serve_detail cli_serve

# loss: per-document mean NLL, the tested backend against the CPU within 1% (+ 1e-3).
cli_loss() {
  cat >"$CLI/docs.jsonl" <<'EOF'
{"text": "Once upon a time, there was a little girl named Lily."}
{"text": "Once upon a time, in a small house near the woods, there lived a little boy named Tim. Tim loved to play with his red truck every day. One morning, he went outside and saw a big, brown dog sitting under the old tree."}
{"text": "The cat sat on the mat. It was a sunny day and the birds sang in the trees. The cat was happy."}
EOF
  local which
  for which in ref test; do
    local flags="REF_FLAGS[@]"
    [ $which = test ] && flags="TEST_FLAGS[@]"
    "$MPIRUN" -np 1 "$BIN" loss --model "$MODEL" "${!flags}" --input "$CLI/docs.jsonl" --output "$CLI/loss_$which.jsonl" ||
      { echo "loss ($which) failed"; return 1; }
  done
  paste -d' ' <(sed -n 's/.*"mean_nll":\([-0-9.eE+]*\).*/\1/p' "$CLI/loss_ref.jsonl") \
    <(sed -n 's/.*"mean_nll":\([-0-9.eE+]*\).*/\1/p' "$CLI/loss_test.jsonl") | awk '
    NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : 1); if (r > worst) worst = r;
              if (d > 0.01 * $1 + 1e-3) bad++ }
    END { printf "%d documents: mean NLL within %.4f%% of the CPU (bound 1%% + 1e-3)%s\n", n, 100 * worst,
                 bad ? ", " bad " OUTSIDE" : ""; exit (n == 3 && !bad) ? 0 : 1 }'
}
loss_detail() { grep -a "documents\|failed" "$1" | tail -1; }
step cli_loss 60 linnet-tp loss_detail cli_loss

# A full-size random Qwen3-4B from transformers: its logits (f32 math on the bf16 weights)
# against linnet-tp's. Needs python3 with torch and transformers (the GPU image has them).
hf_step() {
  local dir=${TMPDIR:-/tmp}/linnet-gpu-check-hf  # ~8 GB: never under $OUT or the logs
  rm -rf "$dir"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  sys "$PY" "$ROOT/scripts/gpu_transformers_check.py" make --config "$HF_CONFIG" --out "$dir" --seed 1 \
    --prompt-len 64 || return 1
  "$BINDIR/compare_backends" --model "$dir" --ids "$dir/ids.txt" --logits-out "$dir/linnet_logits.f32" \
    --backend "$TEST_BACKEND" || return 1
  sys "$PY" "$ROOT/scripts/gpu_transformers_check.py" compare --out "$dir"
  local rc=$?
  rm -rf "$dir"
  return $rc
}
hf_detail() { grep -aE "^(checkpoint|top-1|max|result)|^skip" "$1"; }
if sys "$PY" -c 'import torch, transformers, safetensors, numpy' 2>/dev/null; then
  step qwen3_4b_hf 200 compare_backends hf_detail hf_step
elif [ "$NO_GPU" = 1 ]; then
  STEPS+=("| qwen3_4b_hf | skipped | 0 | $PY has no torch / transformers here (the GPU image has them) |")
else
  STEPS+=("| qwen3_4b_hf | FAILED | 0 | $PY cannot import torch, transformers, safetensors and numpy |")
  FAILED=1
fi

for s in ${SHAPES#* }; do shape_step "${s%%:*}" "${s#*:}"; done

GTEST_ARGS=()
run_gtest nccl 60 test_nccl -np 1
# Two ranks on one GPU: only the suite that uses the job's tp group (the others make their
# own one-rank groups on MPI_COMM_SELF and ran above).
GTEST_ARGS=(--gtest_filter='Seeds/CudaEngineTest.*')
run_gtest engine_tp2 150 test_cuda_engine -np 2

# --- 4. bench ---------------------------------------------------------------------------
BENCH_FAILED=0
for B in $RUNS; do
  for GRAPHS in eager graphs; do
    log=$LOGS/bench_b${B}_$GRAPHS.log
    t=$(left)
    [ "$t" -gt 90 ] && t=90
    if [ -n "${MISSING[linnet-tp]:-}" ] || [ "$BENCH_FAILED" = 1 ] || [ "$t" -lt 20 ]; then
      ROWS+=("| $B | $GRAPHS | not run ($([ "$BENCH_FAILED" = 1 ] && echo "an earlier bench failed" || echo "budget spent or no binary")) | | | | |")
      continue
    fi
    FLAG=""
    [ "$GRAPHS" = graphs ] && FLAG=--cuda-graphs
    # shellcheck disable=SC2086  # FLAG is one word or none
    if ! run_limited "$t" "$MPIRUN" -np 1 "$BIN" bench --config "$BENCH_CONFIG" --random-weights --backend "$TEST_BACKEND" \
      --batch "$B" --prompt-len $BENCH_P --new-tokens $BENCH_N $FLAG >"$log" 2>&1; then
      tail -20 "$log"
      say "bench batch $B $GRAPHS FAILED (log: $log)"
      ROWS+=("| $B | $GRAPHS | FAILED (see $(basename "$log")) | | | | |")
      FAILED=1
      BENCH_FAILED=1
      continue
    fi
    v() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" "$log"; }
    ON=$(sed -n 's/^cuda graphs: \([a-z]*\).*/\1/p' "$log")
    SPLIT=$(sed -n 's/^decode step split: \([0-9.]*\) ms waiting on the device, \([0-9.]*\) ms on the host; \([0-9.]*\) waits\/step.*/\1 \/ \2, \3/p' "$log")
    ROWS+=("| $B | $GRAPHS (${ON:-?}) | $(v 'prefill tokens\/s') | $(v 'decode tokens\/s') | $(v 'decode ms\/step') | $(v 'achieved GB\/s') | ${SPLIT:-none (no device)} |")
  done
done
# loss_packed over LOSS_B documents of LOSS_P tokens: its tok/s and where the time goes
# (the cross-entropy runs on the device: only 3 numbers a row reach the host).
t=$(left)
[ "$t" -gt 120 ] && t=120
log=$LOGS/bench_loss.log
if [ -n "${MISSING[linnet-tp]:-}" ] || [ "$BENCH_FAILED" = 1 ] || [ "$t" -lt 20 ]; then
  LOSS_ROW="not run (budget spent, no binary or an earlier bench failed)"
elif run_limited "$t" "$MPIRUN" -np 1 "$BIN" bench --config "$BENCH_CONFIG" --random-weights --backend "$TEST_BACKEND" \
  --batch "$LOSS_B" --prompt-len "$LOSS_P" --new-tokens 0 --loss >"$log" 2>&1; then
  LOSS_ROW="$(sed -n 's/^loss tokens\/s: //p' "$log"); $(sed -n 's/^loss split: //p' "$log")"
else
  tail -20 "$log"
  say "bench --loss FAILED (log: $log)"
  LOSS_ROW="FAILED (see $(basename "$log"))"
  FAILED=1
fi
[ "$FAILED" = 0 ] || exit 1
