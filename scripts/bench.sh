#!/usr/bin/env bash
# The CPU benchmark table of the issue's goals: `linnet-tp bench` with random weights on
# the SmolLM2-135M shape (scripts/configs/smollm2-135m.json) and a 1.1B Llama shape
# (scripts/configs/llama-1.1b.json), f32 and bf16 weights, and each figure beside the
# limit that binds it on this machine, measured first by `bench --limits`: DRAM read
# bandwidth (decode reads every weight once a step) and the f32 fma peak (prefill and
# many rows a step). Never a pass/fail: numbers for docs/benchmarks.md and the notes.
# Usage: scripts/bench.sh [BUILD_DIR] [--quick]   (default build/; --quick: fewer runs)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    *) BUILD=$a ;;
  esac
done
BIN=$BUILD/launch/linnet-tp
[ -x "$BIN" ] || { echo "bench.sh: no $BIN (build first: scripts/build.sh)" >&2; exit 1; }
CORES=$(nproc)
MPIRUN=(scripts/mpirun.sh)
S=scripts/configs/smollm2-135m.json
L=scripts/configs/llama-1.1b.json

bench() {  # ranks threads config dtype batch prompt new
  "${MPIRUN[@]}" -np "$1" "$BIN" bench --config "$3" --random-weights --backend cpu --threads "$2" \
    --weight-dtype "$4" --batch "$5" --prompt-len "$6" --new-tokens "$7" "${@:8}"
}
v() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" <<<"$2" | head -1; }

limits=$(bench 1 "$CORES" "$S" f32 1 8 2 --limits)
BW=$(sed -n "s/^dram read GB\/s: .*, \([0-9.]*\) (.*/\1/p" <<<"$limits")
BW1=$(sed -n "s/^dram read GB\/s: \([0-9.]*\) (1 thread).*/\1/p" <<<"$limits")
PEAK=$(sed -n "s/^fma peak GFLOP\/s: .*, \([0-9.]*\) (.*/\1/p" <<<"$limits")
ISA=$(sed -n "s/^cpu kernels: \([a-z0-9]*\).*/\1/p" <<<"$limits")
echo "machine: $CORES cores, $ISA kernels; DRAM read $BW1 GB/s (1 core), $BW GB/s (all); f32 fma peak $PEAK GFLOP/s (all cores)"
echo
echo "| run | weights | tok/s | bound (the limit that binds) | % of bound |"
echo "|---|---|---|---|---|"
row() {  # label dtype tok/s bound-tok/s what
  local pct
  pct=$(awk -v a="$3" -v b="$4" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "-" }')
  echo "| $1 | $2 | $3 | $(awk -v b="$4" 'BEGIN { printf "%.1f", b }') ($5) | $pct |"
}
# decode batch 1: bound = DRAM bandwidth / weight bytes a step
decode1() {  # label config dtype ranks threads
  local out bytes tok
  out=$(bench "$4" "$5" "$2" "$3" 1 16 64)
  tok=$(v 'decode tokens\/s' "$out")
  bytes=$(sed -n 's/^weight bytes per decode step: \([0-9]*\) per rank.*/\1/p' <<<"$out")
  row "$1" "$3" "$tok" "$(awk -v bw="$BW" -v b="$bytes" -v r="$4" 'BEGIN { print bw * 1e9 / (b * r) }')" "DRAM"
}
# prefill: bound = fma peak / matmul flops a token (2 per weight)
prefill() {  # label config dtype prompt
  local out bytes elem tok
  out=$(bench 1 "$CORES" "$2" "$3" 1 "$4" 2)
  tok=$(v 'prefill tokens\/s' "$out")
  bytes=$(sed -n 's/^weight bytes per decode step: \([0-9]*\) per rank.*/\1/p' <<<"$out")
  elem=4; [ "$3" = f32 ] || elem=2
  row "$1" "$3" "$tok" "$(awk -v p="$PEAK" -v b="$bytes" -v e="$elem" 'BEGIN { print p * 1e9 / (2 * b / e) }')" "fma peak"
}
# B rows a step: bound = max(weight bytes / bandwidth, flops / peak) per step
rows() {  # label config dtype batch
  local out bytes elem tok
  out=$(bench 1 "$CORES" "$2" "$3" "$4" 16 32)
  tok=$(v 'decode tokens\/s' "$out")
  bytes=$(sed -n 's/^weight bytes per decode step: \([0-9]*\) per rank.*/\1/p' <<<"$out")
  elem=4; [ "$3" = f32 ] || elem=2
  row "$1" "$3" "$tok" "$(awk -v bw="$BW" -v p="$PEAK" -v b="$bytes" -v e="$elem" -v B="$4" \
    'BEGIN { t1 = b / (bw * 1e9); t2 = 2 * (b / e) * B / (p * 1e9); t = t1 > t2 ? t1 : t2; print B / t }')" "max(DRAM, fma)"
}

decode1 "decode batch 1, 135M" "$S" f32 1 "$CORES"
decode1 "decode batch 1, 135M" "$S" bf16 1 "$CORES"
decode1 "decode batch 1, 1.1B" "$L" bf16 1 "$CORES"
[ "$QUICK" = 1 ] || decode1 "decode batch 1, 1.1B" "$L" f32 1 "$CORES"
[ "$QUICK" = 1 ] || [ "$CORES" -lt 2 ] || decode1 "decode batch 1, 1.1B, tp 2 x 1 thread" "$L" bf16 2 1
prefill "prefill 128, 135M" "$S" f32 128
[ "$QUICK" = 1 ] || prefill "prefill 128, 135M" "$S" bf16 128
prefill "prefill 64, 1.1B" "$L" f32 64
rows "8 rows a step, 135M" "$S" f32 8
rows "32 rows a step, 135M" "$S" f32 32
