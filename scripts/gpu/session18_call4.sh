#!/usr/bin/env bash
# Device call 4 of session 18 (bench/notes/gpu.md): anna-serve vs llama-server on the 9B shape
# (bench/http_bench.py needs the openai client: its wheels in .gpu/owhl), llama-server built from
# .gpu/llama.tar.xz in the background while anna runs. Results under $OUT.
set -u
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
for w in .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
mkdir -p tests/fixtures/gguf && cp .gpu/qwen3_5.gguf tests/fixtures/gguf/
bash scripts/gpu_serving.sh --prebuilt /tmp/p --src .gpu/llama.tar.xz --shape qwen3.5-9b --engines anna,llama \
  --levels 1,16,64,256 --scenarios fixed --input-len 512 --output-len 128 --requests-per-slot 2 --parallel 256 \
  --ctx 1024 --deadline ${DEADLINE:-560} --fixtures .gpu/fx --out $OUT
