#!/usr/bin/env bash
# Tokenizer encoding speed: linnet (bench_tokenizer) vs the Hugging Face `tokenizers`
# Python package, single-threaded, on the same ~1 MB of mixed English / code / CJK text,
# with the Llama-3.1 tokenizer. A benchmark, not a test: it prints both figures and
# checks that both give the same ids.
#
#   scripts/bench_tokenizer.sh [BUILD_DIR=build] [MODEL_DIR=../shared/models/cards/llama-3.1-8b-instruct]
#
# Needs the fixtures venv (scripts/requirements-fixtures.txt) at $VENV (default
# /work/venv-fixtures) for the tokenizers side; without it only linnet's figure is shown.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
model="${2:-$root/../shared/models/cards/llama-3.1-8b-instruct}"
venv="${VENV:-/work/venv-fixtures}"
shared="$root/../shared"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
text="$work/bench.txt"

# The corpus: English prose (the project's and the seed models' documents), C++ code
# (this repository's sources), and CJK paragraphs, interleaved until ~1 MB.
cjk='大型语言模型通过把文本切分成词元来处理输入。分词器的速度和正确性同样重要：一个错误的词元就会改变模型的输出。张量并行把每一层的计算分给多个设备，每个设备只保存自己那一部分权重，然后用全归约把部分结果合并起来。
自然言語処理では、まずテキストをトークンに分割します。日本語には単語の間にスペースがないため、バイト単位のBPEが役に立ちます。今日は天気がいいので、公園を散歩しましょう。
한국어 문장도 토큰으로 나누어 처리합니다. 모델은 각 토큰의 확률을 계산하고 다음 토큰을 고릅니다.
'
prose=("$shared"/DESIGN.md "$shared"/STYLE.md "$shared"/README.md "$root"/README.md "$root"/docs/*.md "$shared"/seeds/*)
mapfile -t code < <(cd "$root" && ls loader/*.cpp loader/*.h runtime/*.cpp parallel/*.cpp launch/*.cpp 2>/dev/null)
: > "$text"
i=0
while [ "$(stat -c %s "$text")" -lt 1000000 ]; do
  cat "${prose[@]}" >> "$text"
  (cd "$root" && cat "${code[$((i % ${#code[@]}))]}" "${code[$(((i + 7) % ${#code[@]}))]}") >> "$text"
  for _ in 1 2 3 4 5 6 7 8; do printf '%s' "$cjk" >> "$text"; done
  i=$((i + 1))
done
head -c 1000000 "$text" | iconv -f UTF-8 -t UTF-8 -c > "$text.cut" && mv "$text.cut" "$text"
echo "text: $(stat -c %s "$text") bytes"

[ -x "$build/tests/bench_tokenizer" ] || cmake --build "$build" --target bench_tokenizer >/dev/null
"$build/tests/bench_tokenizer" "$model" "$text" 5 "$work/linnet.ids"

if [ ! -x "$venv/bin/python" ]; then
  echo "tokenizers: skipped (no venv at $venv)"
  exit 0
fi
RAYON_NUM_THREADS=1 RAYON_RS_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
  "$venv/bin/python" - "$model/tokenizer.json" "$text" "$work/linnet.ids" <<'PY'
import sys, time
import tokenizers
from tokenizers import Tokenizer
path, text_path, ids_path = sys.argv[1:4]
t0 = time.perf_counter()
tok = Tokenizer.from_file(path)
print("load: %.1f ms" % ((time.perf_counter() - t0) * 1e3))
text = open(text_path, encoding="utf-8").read()
nbytes = len(text.encode("utf-8"))
times = []
for _ in range(5):
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    times.append((time.perf_counter() - t0) * 1e3)
mb = nbytes / 1e6
print("tokenizers %s: %d bytes -> %d tokens; first %.1f ms (%.2f MB/s), best of 5 %.1f ms (%.2f MB/s)"
      % (tokenizers.__version__, nbytes, len(ids), times[0], mb / (times[0] / 1e3), min(times),
         mb / (min(times) / 1e3)))
ours = [int(x) for x in open(ids_path)]
print("ids identical:", ours == ids)
sys.exit(0 if ours == ids else 1)
PY
