#!/usr/bin/env bash
# A short CPU throughput table of `linnet-tp bench` with random weights: the stories260k
# shape and a ~150M-parameter Llama (scripts/configs/llama-150m.json), at tp 1 and 2.
# Usage: scripts/bench.sh [BUILD_DIR]   (default: build; extra runs: edit RUNS below)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/launch/linnet-tp
[ -x "$BIN" ] || { echo "bench.sh: no $BIN (build first: scripts/build.sh)" >&2; exit 1; }
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
STORIES=../shared/models/stories260k/config.json
# model config | ranks | batch | prompt | new tokens
RUNS=(
  "$STORIES 1 1 64 32"
  "$STORIES 1 8 64 32"
  "scripts/configs/llama-150m.json 1 1 64 16"
  "scripts/configs/llama-150m.json 1 8 64 16"
  "scripts/configs/llama-150m.json 2 1 64 16"
)
echo "| model | tp | batch | prefill tok/s | decode tok/s | ms/step | GB/s per rank |"
echo "|---|---|---|---|---|---|---|"
for run in "${RUNS[@]}"; do
  read -r config tp batch prompt new <<<"$run"
  out=$("${MPIRUN[@]}" -np "$tp" "$BIN" bench --config "$config" --random-weights --backend cpu --threads 1 \
          --batch "$batch" --prompt-len "$prompt" --new-tokens "$new")
  v() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" <<<"$out"; }
  name=$(basename "$config" .json)
  [ "$name" = config ] && name=$(basename "$(dirname "$config")")
  echo "| $name | $tp | $batch |" \
       "$(v 'prefill tokens\/s') | $(v 'decode tokens\/s') | $(v 'decode ms\/step') | $(v 'achieved GB\/s') |"
done
