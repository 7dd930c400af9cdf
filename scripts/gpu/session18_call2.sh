#!/usr/bin/env bash
# Device call 2 of session 18 (bench/notes/gpu.md): anna-serve vs llama-server on the 9B shape,
# then the load test, through scripts/gpu_serving.sh. Needs .gpu/pack.tar.xz (scripts/gpu_pack.sh),
# .gpu/llama.tar.xz (scripts/gpu_serving.sh --pack), .gpu/whl/gguf-*.whl, .gpu/qwen3_5.gguf,
# .gpu/fx/tokenizer. Results under $OUT.
set -u
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
mkdir -p tests/fixtures/gguf && cp -n .gpu/qwen3_5.gguf tests/fixtures/gguf/
bash scripts/gpu_serving.sh --prebuilt /tmp/p --src .gpu/llama.tar.xz --shape qwen3.5-9b --engines anna,llama \
  --levels 1,16,64,256 --scenarios fixed --input-len 512 --output-len 128 --requests-per-slot 2 --parallel 256 \
  --ctx 1024 --load --load-requests 1000 --deadline ${DEADLINE:-560} --fixtures .gpu/fx --out $OUT
