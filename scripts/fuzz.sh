#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) into build-fuzz/ and
# runs each for SECONDS (default 60), then prints one line per target: executions,
# seconds, crashes, leaks, timeouts, out-of-memory inputs, corpus size. Exits non-zero
# when any target found a crash, leak, timeout or OOM (the inputs are kept in
# build-fuzz/artifacts/<target>/; rerun one with build-fuzz/tests/fuzz/fuzz_<target> FILE).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 20, scripts/fuzz.sh 600 chat_template
#
# Environment: FUZZ_RUNS=N stops each target after N executions (-runs; SECONDS stays a
# cap), FUZZ_JOBS=N build jobs (default: all cores), FUZZ_TIMEOUT=S seconds per input
# (default 25), FUZZ_RSS_MB=M memory limit per target (default 2048).
# Each target starts from its seeds in tests/fuzz/corpus/<target>/ plus what earlier runs
# found (build-fuzz/corpus/<target>/, which is not committed).
# Installs clang-14 and libFuzzer's runtime with apt when they are missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
shift || true
ALL_TARGETS=(safetensors config tokenizer_load tokenizer_codec chat_template request_line)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")
TIMEOUT=${FUZZ_TIMEOUT:-25}
RSS_MB=${FUZZ_RSS_MB:-2048}
JOBS=${FUZZ_JOBS:-$(nproc)}

# --- clang with libFuzzer (Debian packages) ---
find_clang() {
  for c in clang++-14 clang++; do
    if command -v "$c" >/dev/null; then
      local rt
      rt=$("$c" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
      if [ -f "$rt" ]; then
        echo "$c"
        return 0
      fi
    fi
  done
  return 1
}
if ! CXX=$(find_clang); then
  echo "fuzz: installing clang-14 and libclang-rt-14-dev"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
  CXX=$(find_clang) || { echo "fuzz: no clang with libFuzzer after installing" >&2; exit 2; }
fi
CC=${CXX/++/}

# --- build ---
build_start=$(date +%s)
mkdir -p build-fuzz
if ! { cmake -S . -B build-fuzz -DLINNET_FUZZ=ON -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" \
         -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" &&
       cmake --build build-fuzz -j "$JOBS"; } >build-fuzz/build.log 2>&1; then
  tail -n 40 build-fuzz/build.log >&2
  echo "fuzz: the build failed (build-fuzz/build.log)" >&2
  exit 2
fi
echo "fuzz: built ${#TARGETS[@]} targets in $(($(date +%s) - build_start)) s ($CXX, -fsanitize=fuzzer,address,undefined)"

max_len() {
  case $1 in
    safetensors) echo 16384 ;;
    tokenizer_load) echo 65536 ;;
    chat_template | request_line) echo 8192 ;;
    *) echo 4096 ;;
  esac
}
dict() {
  case $1 in
    tokenizer_load) echo tests/fuzz/dict/tokenizer.dict ;;
    tokenizer_codec) echo "" ;;
    *) echo "tests/fuzz/dict/$1.dict" ;;
  esac
}

# --- run ---
status=0
rows=()
for t in "${TARGETS[@]}"; do
  bin=build-fuzz/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
  work=build-fuzz/corpus/$t
  art=build-fuzz/artifacts/$t
  log=build-fuzz/logs/$t.log
  mkdir -p "$work" "$art" "$(dirname "$log")"
  rm -f "$art"/*
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB"
        -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$art/")
  [ -n "${FUZZ_RUNS:-}" ] && args+=(-runs="$FUZZ_RUNS")
  d=$(dict "$t")
  [ -n "$d" ] && args+=(-dict="$d")
  start=$(date +%s)
  rc=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    "$bin" "${args[@]}" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$({ grep -o '^#[0-9]*' "$log" || true; } | tail -n 1 | tr -d '#')
  count() { find "$art" -maxdepth 1 -name "$1-*" | wc -l; }
  crashes=$(count crash)
  leaks=$(count leak)
  timeouts=$(count timeout)
  ooms=$(count oom)
  corpus=$(find "$work" -type f | wc -l)
  # A failure that left no artifact (e.g. the target could not start) still counts.
  if [ "$rc" -ne 0 ] && [ $((crashes + leaks + timeouts + ooms)) -eq 0 ]; then crashes="$crashes (exit $rc)"; fi
  rows+=("$(printf '%-16s %12s %8s %8s %6s %9s %5s %7s' "$t" "${execs:-0}" "$secs" "$crashes" "$leaks" "$timeouts" "$ooms" "$corpus")")
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz: $t failed (exit $rc); log $log, inputs in $art/:" >&2
    grep -E "ERROR: |SUMMARY: |fuzz invariant|runtime error|Test unit written" "$log" | head -n 8 >&2 || true
  fi
done

printf '%-16s %12s %8s %8s %6s %9s %5s %7s\n' target executions seconds crashes leaks timeouts ooms corpus
printf '%s\n' "${rows[@]}"
exit $status
