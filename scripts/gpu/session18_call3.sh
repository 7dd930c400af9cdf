#!/usr/bin/env bash
# Device call 3 of session 18 (bench/notes/gpu.md): the encoder ops and kinds on CUDA, the offload
# family rerun, a profile of the 64-sequence step, anna-serve vs llama-server (http_bench with the
# openai client from .gpu/owhl), batch invariance in --deterministic mode. Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-40s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
R=$(pwd)
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/gguf-*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
mkdir -p tests/fixtures/gguf && cp .gpu/qwen3_5.gguf tests/fixtures/gguf/
B=/tmp/llama-build
( mkdir -p $B && tar -C $B -xJf .gpu/llama.tar.xz &&
  cmake -S $B/llama.cpp -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >$OUT/llama-cmake.log 2>&1 &&
  nice cmake --build $B -j14 --target llama-server >$OUT/llama-build.log 2>&1; echo "rc $? at $(( $(date +%s) - T0 )) s" >$OUT/llama.rc ) &
LB=$!
( python3 tools/mkshape.py qwen3.5-9b /tmp/shape_qwen3.5-9b_q4r --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 4 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!
timeout 100 $P/bin/test_cuda_ops --tests=encoder,moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops encoder,moe_offload (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -12 | tee -a $S
timeout 120 $P/bin/test_cuda_encoders .gpu/fx $R >$OUT/enc.log 2>&1
row "test_cuda_encoders (rc $?)" "$(tail -1 $OUT/enc.log)"; grep -E "FAIL|FATAL" $OUT/enc.log | head -8 | tee -a $S
if [ -x $P/bin/test_layer_split ]; then
  timeout 60 $P/bin/test_layer_split --device cuda >$OUT/split.log 2>&1; row "test_layer_split cuda (rc $?)" "$(tail -1 $OUT/split.log)"
fi
wait $MK
F=/tmp/shape_qwen3.5-9b_q4r/qwen3.5-9b-q4_k_rand.gguf
timeout 60 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 1 --warmup 1 --parallel 64 \
  --profile-runtime >$OUT/prof64.log 2>&1
row "9B par 64 profile (rc $?)" "$(grep -A3 'profile-runtime' $OUT/prof64.log | tr '\n' ' ' | cut -c1-300)"
bash scripts/gpu_serving.sh --prebuilt $P --engines anna --levels 1,16,64,256 --scenarios fixed --input-len 512 \
  --output-len 128 --requests-per-slot 2 --parallel 256 --ctx 1024 --deadline $(( $(left) - 200 )) --fixtures .gpu/fx \
  --out $OUT/anna >/dev/null 2>&1
cat $OUT/anna/summary.txt >> $S
if [ $(left) -gt 260 ]; then
  mkdir -p $OUT/inv
  timeout 90 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
    --server-args=--deterministic --out $OUT/inv >$OUT/inv.txt 2>&1
  row "9B batched==alone --deterministic (rc $?)" "$(tr '\n' ' ' < $OUT/inv.txt | cut -c1-300)"
fi
wait $LB; row "llama-server build" "$(cat $OUT/llama.rc)"
bash scripts/gpu_serving.sh --engines llama --levels 1,16,64,256 --scenarios fixed --input-len 512 \
  --output-len 128 --requests-per-slot 2 --parallel 256 --ctx 1024 --deadline $(( $(left) - 10 )) --fixtures .gpu/fx \
  --out $OUT/llama >/dev/null 2>&1
cat $OUT/llama/summary.txt >> $S
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
