#!/usr/bin/env bash
# kill -9 at a random moment, then --resume: the final output must equal an uninterrupted
# run's, line for line (docs/batch-runs.md, "Journal, --resume and the watchdog").
#
# For `generate --input` (100 prompts, sampled with a seed) and `loss` (100 documents),
# runs the job once uninterrupted, then TRIALS times: starts it again, kills one rank
# (a random one) or mpirun itself with SIGKILL after a random delay within the
# uninterrupted run's duration, reruns the same command with --resume, and compares the
# output with cmp. Prints one line per trial and a summary; exits 1 on any difference.
# Usage: scripts/crash_resume.sh [BUILD_DIR] [TRIALS] [MODEL_DIR]
#   (defaults: build, 10, ../shared/models/stories260k; 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TRIALS=${2:-10}
MODEL=${3:-../shared/models/stories260k}
BIN=$BUILD/launch/linnet-tp
NP=2
[ -x "$BIN" ] || { echo "crash_resume.sh: no $BIN (build first: scripts/build.sh)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "crash_resume.sh: no model at $MODEL" >&2; exit 1; }
work=$(mktemp -d)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT

# 100 prompts of varied length; 100 documents of 3..1000 token ids (awk's rand, seeded).
awk 'BEGIN { srand(7); split("Once upon a time there was a little dog who liked to run", w, " ");
  for (i = 0; i < 100; i++) { n = 1 + int(rand() * 12); p = "";
    for (j = 1; j <= n; j++) p = p (j > 1 ? " " : "") w[j]; printf "{\"prompt\": \"%s\"}\n", p } }' >"$work/prompts.jsonl"
awk 'BEGIN { srand(11); for (d = 0; d < 100; d++) { n = 3 + int(rand() * 998); s = "";
    for (i = 0; i < n; i++) s = s (i ? ", " : "") (1 + int(rand() * 511)); printf "{\"ids\": [%s]}\n", s } }' >"$work/docs.jsonl"

generate_args=(generate --model "$MODEL" --input "$work/prompts.jsonl" --max-new-tokens 300 --temperature 0.8
  --seed 5 --max-batch 2)
loss_args=(loss --model "$MODEL" --input "$work/docs.jsonl" --max-seq-len 256)

run() {  # output-file args...
  local out=$1
  shift
  scripts/mpirun.sh -np "$NP" "$BIN" "$@" --output "$out" >/dev/null 2>>"$work/log"
}

# The pid of world rank $1 of the job whose output is $2 (from each process' environment).
rank_pid() {
  local p
  for p in $(pgrep -x linnet-tp); do
    if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$1" &&
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q -- "$2"; then
      echo "$p"
      return
    fi
  done
}

failures=0
for job in generate loss; do
  if [ "$job" = generate ]; then args=("${generate_args[@]}"); else args=("${loss_args[@]}"); fi
  t0=$(date +%s.%N)
  run "$work/$job.full.jsonl" "${args[@]}"
  dur=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  lines=$(wc -l <"$work/$job.full.jsonl")
  echo "$job: uninterrupted run $dur s, $lines lines"
  for t in $(seq 1 "$TRIALS"); do
    out="$work/$job.$t.jsonl"
    target=$((RANDOM % (NP + 1)))  # NP: mpirun itself
    delay=$(awk -v d="$dur" -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.3 + (d - 0.3) * r / 32768 }')
    scripts/mpirun.sh -np "$NP" "$BIN" "${args[@]}" --output "$out" >/dev/null 2>>"$work/log" &
    job_pid=$!
    sleep "$delay"
    if [ "$target" = "$NP" ]; then
      victim="mpirun"
      pid=
      for p in $(pgrep -x 'mpirun|orterun|prterun' || true); do
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q -- "$out" && pid=$p
      done
    else
      victim="rank $target"
      pid=$(rank_pid "$target" "$out")
    fi
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || victim="$victim (already done)"
    code=0
    wait "$job_pid" || code=$?
    # The ranks of a killed mpirun go on for a few seconds; --resume waits for them.
    left=$(pgrep -f -- "$out" | wc -l || true)
    kept="$( [ -f "$out.journal" ] && echo $(($(wc -l <"$out.journal") - 1)) || echo 0) records"
    [ -f "$out" ] && kept="nothing: the run had finished"
    rc=0
    run "$out" "${args[@]}" --resume || rc=$?
    if [ "$rc" = 0 ] && cmp -s "$out" "$work/$job.full.jsonl"; then verdict=equal; else
      verdict="DIFFERENT (resume exit $rc)"
      failures=$((failures + 1))
    fi
    echo "  trial $t: kill -9 of $victim after $delay s: exit $code, the journal held $kept, ranks still running $left; --resume: $verdict"
  done
done
echo "crash_resume: $failures failure(s) in $((2 * TRIALS)) trials"
[ "$failures" = 0 ]
