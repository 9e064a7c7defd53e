#!/usr/bin/env bash
# Speculative decoding benchmark (issue 27): batch 1, greedy, chat prompts through
# `generate --input --max-batch 1`, with and without --speculative-config (prompt
# lookup), on two sets: input-grounded (rewrite / extract / continue-the-code: the answer
# repeats the prompt) and open-ended (stories, explanations). Runs are interleaved
# (plain, speculative, plain, speculative, ...) and each prints output tokens/s; the
# speculative runs also print their guesses, acceptance and tokens per verified step.
# Never a pass/fail: numbers for docs/benchmarks.md. The two runs' outputs are compared
# (greedy: they must be equal) and a difference is reported.
# Usage: scripts/bench_speculative.sh --model DIR [--np N] [--threads N] [--max-tokens T]
#        [--reps R] [--k K] [--min N] [--draft DIR [--draft-quantization Q]] [--build DIR]
#        [--llamacpp BINDIR --gguf FILE [--draft-gguf FILE]]
# --draft DIR: a draft model (method draft_model, same tokenizer) instead of prompt lookup,
# held as --draft-quantization says (the speculative config's "quantization": f32, bf16,
# int8, int4); with --draft-gguf the peer is llama-speculative-simple with that draft
# (--spec-draft-n-max K) instead of llama-lookup (its plain runs stay llama-lookup's with
# no drafts: the same generation loop).
# Defaults: np 1, 256 new tokens, 2 repetitions, k 4, prompt_lookup_min 2 (max 4).
# With --llamacpp (tools/get_llamacpp.sh OUTDIR llama-lookup; OUTDIR/bin) and --gguf (the
# same weights, convert_hf_to_gguf.py --outtype f32): the same prompts, rendered by
# `linnet-tp template`, through llama-lookup (its n-gram lookup decoding, greedy, 2
# threads) with --spec-draft-n-max K and with 0 (plain); its decode-only tokens/s
# (llama.cpp's own "decoded N tokens in S seconds"), summed over the prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
MODEL=""
NP=1
T=256
R=2
K=4
MIN=2
LLAMACPP=""
GGUF=""
DRAFT=""
DRAFT_Q=""
DRAFT_GGUF=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --threads) EXTRA+=(--threads "$2"); shift 2 ;;
    --max-tokens) T=$2; shift 2 ;;
    --reps) R=$2; shift 2 ;;
    --k) K=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --draft) DRAFT=$2; shift 2 ;;
    --draft-quantization) DRAFT_Q=$2; shift 2 ;;
    --draft-gguf) DRAFT_GGUF=$2; shift 2 ;;
    --llamacpp) LLAMACPP=$2; shift 2 ;;
    --gguf) GGUF=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "bench_speculative.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$MODEL" ] || { echo "bench_speculative.sh: --model DIR is required (a chat model, e.g. SmolLM2-135M-Instruct)" >&2; exit 2; }
BIN=$BUILD/launch/linnet-tp
[ -x "$BIN" ] || { echo "bench_speculative.sh: no $BIN (build first)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

python3 - "$TMP" <<'EOF'
import json, sys
tmp = sys.argv[1]
para = ("The old lighthouse stood at the edge of the cliff for over a hundred years. Every night its keeper, "
        "a quiet man named Elias, climbed the one hundred and twelve steps to light the lamp. Ships passing "
        "the rocky coast trusted its beam to guide them safely into the harbor. When the town decided to "
        "replace the lighthouse with an automatic beacon, Elias wrote a letter to the mayor asking to stay "
        "on as its caretaker, and the mayor agreed. In the spring he painted the railings white and mended "
        "the broken windows of the lamp room. In the summer children from the village came to hear his "
        "stories about storms and shipwrecks, and he showed them the logbooks his father had kept. In the "
        "autumn he gathered driftwood for the stove and wrote down the names of the birds that rested on the "
        "gallery. In the winter, when the sea was grey and the wind never stopped, he sat by the window and "
        "watched the new beacon blink on and off, and he was glad that the old tower still had someone to "
        "look after it.")
code = ("def merge_sorted(a, b):\n    result = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
        "        if a[i] <= b[j]:\n            result.append(a[i])\n            i += 1\n        else:\n"
        "            result.append(b[j])\n            j += 1\n    result.extend(a[i:])\n    result.extend(b[j:])\n"
        "    return result\n\n\ndef merge_sort(items):\n    if len(items) <= 1:\n        return list(items)\n"
        "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n    right = merge_sort(items[middle:])\n"
        "    return merge_sorted(left, right)\n\n\ndef is_sorted(items):\n    for i in range(1, len(items)):\n"
        "        if items[i - 1] > items[i]:\n            return False\n    return True\n")
grounded = [
    "Rewrite the following text word for word, changing only 'Elias' to 'Tomas':\n\n" + para,
    "Copy this Python code exactly and add a one-line docstring to each function:\n\n" + code,
    "Copy every sentence of this text that mentions a season, quoting each exactly:\n\n" + para,
    "Here is some Python code. Rewrite it with the variable 'result' renamed to 'merged':\n\n" + code,
]
open_ended = [
    "Write a short story about a dragon who is afraid of the dark.",
    "Explain how rainbows form, for a ten-year-old.",
    "Give me five ideas for a birthday party in winter, with a sentence on each.",
    "What makes a good friend? Answer in a paragraph.",
]
for name, prompts in (("grounded", grounded), ("open", open_ended)):
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
EOF

SPEC="{\"method\": \"ngram\", \"num_speculative_tokens\": $K, \"prompt_lookup_min\": $MIN, \"prompt_lookup_max\": $(( MIN > 4 ? MIN : 4 ))}"
if [ -n "$DRAFT" ]; then
  SPEC="{\"method\": \"draft_model\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": $K"
  [ -n "$DRAFT_Q" ] && SPEC="$SPEC, \"quantization\": \"$DRAFT_Q\""
  SPEC="$SPEC}"
fi
run() {  # set, mode (plain|spec), rep
  local args=(--model "$MODEL" --input "$TMP/$1.jsonl" --output "$TMP/$1.$2.$3.jsonl" --max-batch 1
              --max-new-tokens "$T" --temperature 0 "${EXTRA[@]}")
  [ "$2" = spec ] && args+=(--speculative-config "$SPEC")
  scripts/mpirun.sh -np "$NP" "$BIN" "${args[@]}" >/dev/null 2>"$TMP/err"
  local tps spec_line
  tps=$(grep -o 'new tokens: [0-9]*, [0-9.]* s, [0-9.]* tokens/s' "$TMP/err")
  spec_line=$(grep -o 'speculation.*' "$TMP/err" || true)
  printf '%-9s %-5s rep %s: %s %s\n' "$1" "$2" "$3" "$tps" "$spec_line"
}
echo "model $MODEL, np $NP, batch 1, greedy, $T new tokens a prompt, --speculative-config '$SPEC'; $(lscpu | grep 'Model name' | sed 's/ \+/ /g')"
for set in grounded open; do
  for rep in $(seq 1 "$R"); do
    run "$set" plain "$rep"
    run "$set" spec "$rep"
  done
  if cmp -s <(python3 -c "import json,sys;[print(json.loads(l)['completion_ids']) for l in open(sys.argv[1])]" "$TMP/$set.plain.1.jsonl") \
            <(python3 -c "import json,sys;[print(json.loads(l)['completion_ids']) for l in open(sys.argv[1])]" "$TMP/$set.spec.1.jsonl"); then
    echo "$set: outputs equal with and without speculation"
  else
    echo "$set: OUTPUTS DIFFER with and without speculation" >&2
  fi
done

if [ -n "$LLAMACPP" ]; then
  [ -n "$GGUF" ] || { echo "bench_speculative.sh: --llamacpp needs --gguf FILE" >&2; exit 2; }
  peer() {  # set, mode (plain|lookup)
    local tokens=0 secs=0 line n s f
    for f in "$TMP/$1".prompt.*; do
      # plain: the same binary and flags with no drafts (--spec-draft-n-max 0)
      if [ "$2" = lookup ] && [ -n "$DRAFT_GGUF" ]; then
        "$LLAMACPP/llama-speculative-simple" -m "$GGUF" -md "$DRAFT_GGUF" --spec-type draft-simple -n "$T" -t 2 -td 2 --temp 0 \
          --spec-draft-n-max "$K" -f "$f" >/dev/null 2>"$TMP/peer.err" || true
      else
        "$LLAMACPP/llama-lookup" -m "$GGUF" -n "$T" -t 2 --temp 0 --spec-draft-n-max "$([ "$2" = plain ] && echo 0 || echo "$K")" \
          -f "$f" >/dev/null 2>"$TMP/peer.err" || true
      fi
      line=$(grep -o 'decoded *[0-9]* tokens in *[0-9.]* s' "$TMP/peer.err" | tail -1 || true)
      n=$(echo "$line" | awk '{print $2}'); s=$(echo "$line" | awk '{print $5}')
      [ -n "$n" ] || { echo "llama-$2 printed no timing:"; tail -3 "$TMP/peer.err"; continue; }
      tokens=$((tokens + n)); secs=$(python3 -c "print($secs + $s)")
      [ "$2" = lookup ] && grep -oE '(n_drafted|n_accept) += [0-9]+' "$TMP/peer.err" | tr -s ' ' | tr '\n' ' ' >> "$TMP/$1.lookup.stats" || true
    done
    printf '%-9s llama-%s %-6s: decoded %s tokens in %.2f s, %.1f tokens/s\n' "$1" "$([ "$2" = lookup ] && [ -n "$DRAFT_GGUF" ] && echo speculative-simple || echo lookup)" "$2" "$tokens" "$secs" "$(python3 -c "print($tokens / $secs if $secs else 0)")"
  }
  for set in grounded open; do
    "$BIN" template --model "$MODEL" --input "$TMP/$set.jsonl" |
      python3 -c "import json,sys
for i, l in enumerate(sys.stdin): open(sys.argv[1] + '.prompt.' + str(i), 'w').write(json.loads(l)['text'])" "$TMP/$set"
    for rep in $(seq 1 "$R"); do
      peer "$set" plain
      peer "$set" lookup
    done
    [ -f "$TMP/$set.lookup.stats" ] && echo "$set llama-lookup per prompt: $(cat "$TMP/$set.lookup.stats")"
  done
fi
