#!/usr/bin/env bash
# One command: install, build, fetch the default model, and chat with it.
#   scripts/quickstart.sh ["your prompt"] [more anna-generate flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(bash scripts/setup.sh)
MODEL=$(bash scripts/fetch_default_model.sh | tail -n 1)
PROMPT="${1:-Write a C function that reverses a string in place, and explain it briefly.}"
shift || true
exec "$BUILD/src/cli/anna-generate" --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 256 "$@"
