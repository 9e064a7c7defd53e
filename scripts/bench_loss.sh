#!/usr/bin/env bash
# One sitting of the compute-bound CPU jobs side by side: `loss` over DOCS documents of
# LEN tokens of real English (the license texts in /usr/share/common-licenses, tokenized
# by the model's tokenizer.json), against transformers (the same ids, one document a
# forward pass, labels = input_ids) and llama-perplexity (the same text, -c LEN, DOCS
# chunks); then prefill of 128 and 512 tokens and 32 rows a decode step, against
# llama-bench / llama-batched-bench. Interleaved, REPS rounds, on the same threads.
#
#   scripts/bench_loss.sh MODEL_DIR PYTHON [GGUF]
#
# MODEL_DIR: a Hugging Face checkpoint folder. PYTHON: a venv's python with torch,
# transformers and tokenizers (scripts/requirements-fixtures.txt). GGUF: llama.cpp's f32
# file of the same checkpoint (convert_hf_to_gguf.py --outtype f32); its runs are
# skipped when not given. Environment: LINNET_BIN (build/launch/linnet-tp), LLAMA_BIN
# (folder of llama-perplexity / llama-bench / llama-batched-bench, default
# ../llamacpp/bin as tools/get_llamacpp.sh installs it), THREADS (2), DOCS (16), LEN
# (1024), REPS (2), DTYPE (f32; bf16 runs ours with --weight-dtype bf16 and transformers
# in bfloat16). Developer tool: prints `bench --limits` and one line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/bench_loss.sh MODEL_DIR PYTHON [GGUF]}
py=${2:?usage: scripts/bench_loss.sh MODEL_DIR PYTHON [GGUF]}
gguf=${3:-}
bin=${LINNET_BIN:-build/launch/linnet-tp}
llama=${LLAMA_BIN:-../llamacpp/bin}
threads=${THREADS:-2}
docs=${DOCS:-16}
len=${LEN:-1024}
reps=${REPS:-2}
dtype=${DTYPE:-f32}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$llama
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The text and its ids: DOCS x LEN tokens (the text file for llama-perplexity too).
"$py" - "$model" "$docs" "$len" "$work" <<'EOF'
import json, os, sys
from tokenizers import Tokenizer
model, docs, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
root = "/usr/share/common-licenses"
text = "".join(open(os.path.join(root, f)).read() + "\n" for f in
               ["GPL-3", "GPL-2", "LGPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1", "Artistic", "GFDL-1.3", "CC0-1.0"]
               if os.path.exists(os.path.join(root, f)))
ids = Tokenizer.from_file(os.path.join(model, "tokenizer.json")).encode(text).ids
if len(ids) < docs * n:
    sys.exit(f"the text has {len(ids)} tokens, fewer than {docs} x {n}")
with open(os.path.join(out, "docs.jsonl"), "w") as f:
    for i in range(docs):
        f.write(json.dumps({"ids": ids[i * n:(i + 1) * n]}) + "\n")
open(os.path.join(out, "text.txt"), "w").write(text)
EOF

cat > "$work/tf_loss.py" <<'EOF'
import json, sys, time, torch
from transformers import AutoModelForCausalLM
model, docs_path, threads, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
dt = torch.bfloat16 if dtype == "bf16" else torch.float32
m = AutoModelForCausalLM.from_pretrained(model, dtype=dt, attn_implementation="sdpa").eval()
docs = [torch.tensor(json.loads(l)["ids"]) for l in open(docs_path)]
with torch.no_grad():
    m(docs[0][None, :64], labels=docs[0][None, :64])  # warm-up
    t = time.perf_counter()
    nll = [float(m(d[None], labels=d[None]).loss) * (len(d) - 1) for d in docs]
    dt_s = time.perf_counter() - t
scored = sum(len(d) - 1 for d in docs)
print(f"tokens/s {sum(len(d) for d in docs) / dt_s:.1f}; mean NLL {sum(nll) / scored:.6f}")
EOF

wflags=()
[ "$dtype" = bf16 ] && wflags=(--weight-dtype bf16)
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p'), $threads threads, $dtype"
"$bin" bench --model "$model" --threads "$threads" --prompt-len 16 --new-tokens 1 --limits 2>/dev/null |
  grep -E '^(dram|fma)'
for rep in $(seq "$reps"); do
  out=$("$bin" loss --model "$model" --input "$work/docs.jsonl" --threads "$threads" "${wflags[@]}" 2>/dev/null)
  echo "linnet-tp loss run $rep: $(grep -E '^tokens/s' <<<"$out"); $(grep -E '^mean NLL' <<<"$out")"
  echo "transformers loss run $rep: $("$py" "$work/tf_loss.py" "$model" "$work/docs.jsonl" "$threads" "$dtype" 2>/dev/null)"
  if [ -n "$gguf" ]; then
    t0=$(date +%s.%N)
    pp=$("$llama/llama-perplexity" -m "$gguf" -f "$work/text.txt" -c "$len" --chunks "$docs" -b "$len" -t "$threads" 2>&1)
    t1=$(date +%s.%N)
    spp=$(grep -oE '[0-9.]+ seconds per pass' <<<"$pp" | head -1 | cut -d' ' -f1)
    echo "llama-perplexity run $rep: $(grep -oE 'Final estimate: PPL = [0-9.]+' <<<"$pp"); first pass $spp s ($(echo "$len / $spp" | bc) tokens/s); wall $(echo "$t1 - $t0" | bc) s for $docs x $len tokens ($(echo "$docs * $len / ($t1 - $t0)" | bc) tokens/s, load included)"
  fi
done
for rep in $(seq "$reps"); do
  for p in 128 512; do
    out=$("$bin" bench --model "$model" --threads "$threads" "${wflags[@]}" --prompt-len "$p" --new-tokens 0 2>/dev/null)
    echo "linnet-tp prefill $p run $rep: $(grep -E '^prefill (tokens|matmul)' <<<"$out" | tr '\n' ' ')"
  done
  out=$("$bin" bench --model "$model" --threads "$threads" "${wflags[@]}" --batch 32 --prompt-len 128 --new-tokens 32 2>/dev/null)
  echo "linnet-tp 32 rows run $rep: $(grep -E '^decode (tokens/s|ms/step)' <<<"$out" | tr '\n' ' ')"
  if [ -n "$gguf" ]; then
    echo "llama-bench run $rep: $("$llama/llama-bench" -m "$gguf" -t "$threads" -p 128,512 -n 0 -r 1 2>/dev/null |
      grep -E 'pp(128|512)' | awk -F'|' '{print $(NF-2) ":" $(NF-1)}' | tr -s ' ' | tr '\n' ' ')"
    echo "llama-batched-bench run $rep: $("$llama/llama-batched-bench" -m "$gguf" -t "$threads" -c 8192 -npp 128 -ntg 32 -npl 32 2>&1 |
      grep -E '^\|\s+128' | head -1)"
  fi
done
