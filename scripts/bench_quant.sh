#!/usr/bin/env bash
# One sitting of weight dtypes side by side: linnet-tp's bf16, int8 and int4 (quantized at
# load), and int4 with int8 activations (--activation-dtype int8, "int4-a8"), against
# llama.cpp's BF16, Q8_0 and Q4_K_M GGUFs of the same checkpoint, decode batch 1 and
# prefill, interleaved, on the same threads.
#
#   scripts/bench_quant.sh MODEL_DIR [GGUF_PREFIX]
#
# MODEL_DIR: a Hugging Face checkpoint folder. GGUF_PREFIX: llama.cpp's files
# GGUF_PREFIX-BF16.gguf, -Q8_0.gguf, -Q4_K_M.gguf (convert_hf_to_gguf.py --outtype bf16,
# then llama-quantize); skipped when not given. Environment: LINNET_BIN (default
# build/launch/linnet-tp), LLAMA_BENCH (default: llama-bench on PATH, else
# ../llamacpp/bin/llama-bench as tools/get_llamacpp.sh installs it), THREADS (2),
# PROMPT (128), NEW (32), REPS (2: each of ours is run REPS times, llama-bench -r REPS).
# Prints `bench --limits` first (DRAM read, fma peak), then one line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/bench_quant.sh MODEL_DIR [GGUF_PREFIX]}
prefix=${2:-}
bin=${LINNET_BIN:-build/launch/linnet-tp}
threads=${THREADS:-2}
prompt=${PROMPT:-128}
new=${NEW:-32}
reps=${REPS:-2}
llama=${LLAMA_BENCH:-$(command -v llama-bench || echo ../llamacpp/bin/llama-bench)}

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p'), $threads threads"
"$bin" bench --model "$model" --threads "$threads" --prompt-len 16 --new-tokens 1 --limits 2>/dev/null |
  grep -E '^(dram|fma)'
for rep in $(seq "$reps"); do
  for dt in bf16 int8 int4 int4-a8; do
    flags=(--weight-dtype "${dt%-a8}")
    [[ $dt == *-a8 ]] && flags+=(--activation-dtype int8)
    out=$("$bin" bench --model "$model" --threads "$threads" "${flags[@]}" --prompt-len "$prompt" \
      --new-tokens "$new" 2>/dev/null)
    printf 'linnet-tp %-7s run %d: %s; %s; %s; %s\n' "$dt" "$rep" \
      "$(grep -oE '^weights: .*per rank' <<<"$out" | sed 's/^weights: checkpoint (//')" \
      "$(grep -E '^prefill tokens/s' <<<"$out" | cut -d' ' -f1-3)" \
      "$(grep -E '^decode tokens/s' <<<"$out")" "$(grep -E '^achieved GB/s' <<<"$out")"
  done
  if [[ -n "$prefix" && -x "$llama" ]]; then
    for q in BF16 Q8_0 Q4_K_M; do
      [[ -f "$prefix-$q.gguf" ]] || continue
      "$llama" -m "$prefix-$q.gguf" -t "$threads" -p "$prompt" -n "$new" -r 1 2>/dev/null |
        grep -E "pp$prompt|tg$new" | awk -F'|' -v q="$q" -v r="$rep" \
        '{gsub(/ +/," "); printf "llama.cpp %-6s run %d: %s %s\n", q, r, $7, $8}'
    done
  fi
done
