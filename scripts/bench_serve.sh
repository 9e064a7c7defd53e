#!/usr/bin/env bash
# Load benchmark of `linnet-tp serve`: C concurrent streaming clients
# (tests/bench_serve_client) send P prompts to a server on NP ranks; prints requests/s,
# output tokens/s, time to first token and inter-token latency (p50/p99), then the same
# prompts with the same settings through `generate --input` (continuous batching, no
# HTTP) and the ratio of output tokens/s. Never a pass/fail: numbers for docs/benchmarks.md.
# Usage: scripts/bench_serve.sh [--model DIR] [--np N] [--clients C] [--prompts P]
#        [--max-tokens T] [--max-batch B] [--threads N] [--build DIR]
# Defaults: stories260k, np 1, 16 clients, 128 prompts, 128 tokens each, --max-batch 16.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
MODEL=../shared/models/stories260k
NP=1
C=16
P=128
T=128
B=16
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --clients) C=$2; shift 2 ;;
    --prompts) P=$2; shift 2 ;;
    --max-tokens) T=$2; shift 2 ;;
    --max-batch) B=$2; shift 2 ;;
    --threads) EXTRA+=(--threads "$2"); shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "bench_serve.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BIN=$BUILD/launch/linnet-tp
CLIENT=$BUILD/tests/bench_serve_client
for f in "$BIN" "$CLIENT"; do [ -x "$f" ] || { echo "bench_serve.sh: no $f (build first)" >&2; exit 1; }; done
MPIRUN=(scripts/mpirun.sh)
TMP=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# P prompts, greedy, T new tokens each; the same lines serve as generate --input.
subjects=(cat dog girl boy bird fish king frog tree ball)
for ((i = 0; i < P; i++)); do
  printf '{"prompt": "Once upon a time, there was a %s who %d", "max_tokens": %d, "temperature": 0}\n' \
    "${subjects[$((i % 10))]}" "$i" "$T"
done > "$TMP/requests.jsonl"
sed 's/"max_tokens"/"max_new_tokens"/' "$TMP/requests.jsonl" > "$TMP/input.jsonl"

"${MPIRUN[@]}" -np "$NP" "$BIN" serve --model "$MODEL" --port 0 --max-batch "$B" ${EXTRA[@]+"${EXTRA[@]}"} 2> "$TMP/serve.err" &
SERVER_PID=$!
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\) .*/\1/p' "$TMP/serve.err" | head -1)
  if [ -n "$PORT" ] && grep -q "serve: ready" "$TMP/serve.err"; then break; fi
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$TMP/serve.err" >&2; exit 1; }
RANK0=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' "$TMP/serve.err" | head -1)
# A warm-up pass (first-touch of the KV pool and the weights), then the measured one.
"$CLIENT" "$PORT" "$TMP/requests.jsonl" "$C" > /dev/null
serve=$("$CLIENT" "$PORT" "$TMP/requests.jsonl" "$C")
kill -TERM "$RANK0"
wait "$SERVER_PID" || true
SERVER_PID=""

"${MPIRUN[@]}" -np "$NP" "$BIN" --model "$MODEL" --input "$TMP/input.jsonl" --max-batch "$B" ${EXTRA[@]+"${EXTRA[@]}"} > /dev/null 2> "$TMP/gen.err"
gen_tps=$(sed -n 's/.*, \([0-9.]*\) tokens\/s,.*/\1/p' "$TMP/gen.err" | tail -1)
gen_s=$(sed -n 's/.*new tokens: [0-9]*, \([0-9.]*\) s,.*/\1/p' "$TMP/gen.err" | tail -1)

python_free_json() {  # field of the client's JSON line
  sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" <<<"$serve"
}
rps=$(python_free_json requests_per_s)
tps=$(python_free_json output_tokens_per_s)
echo "model $(basename "$MODEL"), np $NP, $C concurrent streaming clients, $P prompts x $T new tokens (greedy), --max-batch $B ${EXTRA[*]+${EXTRA[*]}}"
echo
echo "| run | requests/s | output tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |"
echo "|---|---|---|---|---|"
printf '| serve | %.1f | %.0f | %.1f / %.1f | %.2f / %.2f |\n' "$rps" "$tps" "$(python_free_json ttft_ms_p50)" \
  "$(python_free_json ttft_ms_p99)" "$(python_free_json itl_ms_p50)" "$(python_free_json itl_ms_p99)"
printf '| generate --input | %.1f | %.0f | | |\n' "$(awk -v p="$P" -v s="$gen_s" 'BEGIN { print p / s }')" "$gen_tps"
echo
awk -v a="$tps" -v b="$gen_tps" 'BEGIN { printf "serve / generate output tokens/s: %.0f%%\n", 100 * a / b }'
