#!/usr/bin/env bash
# ppl_vs_llamacpp.sh: anna-perplexity against llama-perplexity on one GGUF and one text, then
# each tool's KL divergence against the other's --kl-divergence-base file (the two share the
# format), so the figures and the file format are checked both ways (bench/notes/hfpull.md).
#
#   bench/ppl_vs_llamacpp.sh [--model FILE.gguf] [--text FILE] [--ctx 512] [--chunks 4]
#                            [--threads 2] [--anna-bin DIR] [--out DIR]
#
# Defaults: the default model, docs/ARCHITECTURE.md + README.md as the text, build/src/cli.
# Needs llama.cpp from scripts/setup_llamacpp.sh (its env.sh). Each base file is
# chunks x (ctx/2 - 1) x (vocab + 4) x 2 bytes (~78 MB per chunk of 512 for a 152k vocab).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ANNA_CACHE:-$HOME/.cache/anna}"
MODEL="$CACHE/models/qwen2.5-coder-0.5b-instruct.gguf" TEXT="" CTX=512 CHUNKS=4 THREADS=2
ANNA=build/src/cli OUT="${TMPDIR:-/tmp}/ppl_vs_llamacpp"
while (($#)); do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --text) TEXT="$2"; shift 2 ;;
    --ctx) CTX="$2"; shift 2 ;;
    --chunks) CHUNKS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --anna-bin) ANNA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck disable=SC1091
. "$CACHE/llama.cpp/env.sh" || { echo "no llama.cpp: run scripts/setup_llamacpp.sh" >&2; exit 2; }
mkdir -p "$OUT"
if [[ -z "$TEXT" ]]; then
  TEXT="$OUT/text.txt"
  cat docs/ARCHITECTURE.md README.md > "$TEXT"
fi
L() { LD_LIBRARY_PATH="$LLAMA_CPP_LIB_PATH" "$LLAMA_CPP_BIN/llama-perplexity" "$@"; }
L -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" -b "$CTX" \
  --kl-divergence-base "$OUT/llama.kld" > "$OUT/llama.log" 2>&1
"$ANNA/anna-perplexity" --model "$MODEL" --file "$TEXT" --ctx "$CTX" --chunks "$CHUNKS" \
  --threads "$THREADS" --save-logits "$OUT/anna.kld" > "$OUT/anna.log" 2>&1
"$ANNA/anna-perplexity" --model "$MODEL" --kl-base "$OUT/llama.kld" --threads "$THREADS" \
  > "$OUT/anna_vs_llama.log" 2>&1
L -m "$MODEL" --kl-divergence-base "$OUT/anna.kld" --kl-divergence -c "$CTX" -t "$THREADS" \
  -b "$CTX" > "$OUT/llama_vs_anna.log" 2>&1
echo "== llama-perplexity";  grep -E '^\[1\]|Final estimate' "$OUT/llama.log" | sed 's/^.* I //'
echo "== anna-perplexity";   grep -E '^\[1\]|Final estimate' "$OUT/anna.log"
echo "== anna vs llama.cpp's base"; grep -E 'Mean PPL|Mean KLD|Maximum KLD|Same top|RMS' "$OUT/anna_vs_llama.log"
echo "== llama.cpp vs anna's base"; grep -E 'Mean PPL|Mean +KLD|Maximum KLD|Same top|RMS Δp' "$OUT/llama_vs_anna.log"
