#!/usr/bin/env bash
# Builds and runs bench/ggml_quant_check.c: anna's Q4_K/Q6_K/Q5_0/Q8_0 encoders vs ggml's
# ggml_quantize_chunk, byte for byte. Needs the llama.cpp build of scripts/setup_llamacpp.sh
# (libggml-base is enough) and anna's build/.
#   bench/ggml_quant_check.sh [MODEL.gguf [GOLDEN_OUT]]
# MODEL (default: the default model) supplies real weight rows; GOLDEN_OUT rewrites the ctest
# golden (tests/fixtures/quant/golden.bin).
set -euo pipefail
cd "$(dirname "$0")/.."
LC=${ANNA_CACHE:-$HOME/.cache/anna}/llama.cpp
GGML_INC=$(ls -d "$LC"/src/llama_cpp_python-*/vendor/llama.cpp/ggml/include | head -1)
BIN=${ANNA_BUILD_DIR:-build}
OUT=$(mktemp -d)
cc -O2 -std=c11 -I src -I include -I "$GGML_INC" bench/ggml_quant_check.c "$BIN/src/libanna.a" \
   -L "$LC/build/bin" -lggml-base -Wl,-rpath,"$LC/build/bin" \
   $(pkg-config --libs jansson libpcre2-8 libutf8proc 2>/dev/null) -lpthread -lm -o "$OUT/ggml_quant_check"
MODEL=${1:-${ANNA_CACHE:-$HOME/.cache/anna}/models/qwen2.5-coder-0.5b-instruct.gguf}
"$OUT/ggml_quant_check" "$MODEL" ${2:+"$2"}
