#!/usr/bin/env bash
# anna-quantize --type int4 against llama.cpp's own pipeline on the same HF folder:
#   anna-quantize --type bf16 (its converter output; test_quantize checks it equals
#   convert_hf_to_gguf.py on the fixtures) -> llama-quantize Q4_K_M  vs  anna-quantize --type int4,
# tensor for tensor (type, dims, bytes). Then llama-perplexity loads anna's int4 file.
# Needs scripts/setup_llamacpp.sh's build plus its llama-quantize target, and anna's build/.
#   bench/llamacpp_quantize_check.sh HF_DIR [TEXT]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$1
TEXT=${2:-bench/data/public_domain_en.txt}
LC=${ANNA_CACHE:-$HOME/.cache/anna}/llama.cpp
BIN=${ANNA_BUILD_DIR:-build}
OUT=$(mktemp -d)
[ -x "$LC/build/bin/llama-quantize" ] || nice -n 10 cmake --build "$LC/build" -j2 --target llama-quantize >&2
cc -O2 -std=c11 -I src bench/gguf_tensor_cmp.c "$BIN/src/libanna.a" \
   $(pkg-config --libs jansson libpcre2-8 libutf8proc 2>/dev/null) -lpthread -lm -o "$OUT/gguf_tensor_cmp"
"$BIN/src/cli/anna-quantize" --model-dir "$DIR" --type bf16 --out "$OUT/bf16.gguf"
"$BIN/src/cli/anna-quantize" --model-dir "$DIR" --type int4 --out "$OUT/anna-int4.gguf"
"$LC/build/bin/llama-quantize" "$OUT/bf16.gguf" "$OUT/llama-q4km.gguf" Q4_K_M > "$OUT/quantize.log" 2>&1 ||
  { tail -20 "$OUT/quantize.log"; exit 1; }
echo "anna-quantize int4 vs llama-quantize Q4_K_M:"
"$OUT/gguf_tensor_cmp" "$OUT/anna-int4.gguf" "$OUT/llama-q4km.gguf" || true
echo "llama-perplexity on anna's int4 file (3 chunks of 256):"
"$LC/build/bin/llama-perplexity" -m "$OUT/anna-int4.gguf" -f "$TEXT" -c 256 --chunks 3 -t 2 2>&1 |
  grep -E "Final estimate| E |failed" || true
rm -rf "$OUT"
