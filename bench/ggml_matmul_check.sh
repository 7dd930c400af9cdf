#!/usr/bin/env bash
# Builds and runs bench/ggml_matmul_check.c: anna's CPU matmul vs ggml's, same inputs.
# Needs the llama.cpp build of scripts/setup_llamacpp.sh and anna's build/ (Release).
set -euo pipefail
cd "$(dirname "$0")/.."
LC=${ANNA_CACHE:-$HOME/.cache/anna}/llama.cpp
GGML_INC=$(ls -d "$LC"/src/llama_cpp_python-*/vendor/llama.cpp/ggml/include | head -1)
BIN=${ANNA_BUILD_DIR:-build}
OUT=$(mktemp -d)
cc -O2 -std=c11 -I src -I include -I "$GGML_INC" bench/ggml_matmul_check.c "$BIN/src/libanna.a" \
   -L "$LC/build/bin" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$LC/build/bin" \
   $(pkg-config --libs jansson libpcre2-8 libutf8proc 2>/dev/null) -lpthread -lm -o "$OUT/ggml_matmul_check"
"$OUT/ggml_matmul_check" "${1:-2}"
