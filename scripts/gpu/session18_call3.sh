#!/usr/bin/env bash
# Device call 3 of session 18 (bench/notes/gpu.md): the encoder ops and kinds on CUDA, the offload
# family rerun, layer split on one device, a profile of the 64-sequence step, batch invariance in
# --deterministic mode. Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-40s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
R=$(pwd)
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/gguf-*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
mkdir -p tests/fixtures/gguf && cp .gpu/qwen3_5.gguf tests/fixtures/gguf/
( python3 tools/mkshape.py qwen3.5-9b /tmp/shape_qwen3.5-9b_q4r --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 4 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!
timeout 100 $P/bin/test_cuda_ops --tests=encoder,moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops encoder,moe_offload (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -12 | tee -a $S
timeout 120 $P/bin/test_cuda_encoders .gpu/fx $R >$OUT/enc.log 2>&1
row "test_cuda_encoders (rc $?)" "$(tail -1 $OUT/enc.log)"; grep -E "FAIL|FATAL" $OUT/enc.log | head -8 | tee -a $S
if [ -x $P/bin/test_layer_split ]; then
  timeout 90 $P/bin/test_layer_split .gpu/fx tests/fixtures --device cuda >$OUT/split.log 2>&1; row "test_layer_split cuda (rc $?)" "$(tail -1 $OUT/split.log)"
fi
wait $MK
F=/tmp/shape_qwen3.5-9b_q4r/qwen3.5-9b-q4_k_rand.gguf
timeout 60 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 1 --warmup 1 --parallel 64 \
  --profile-runtime >$OUT/prof64.log 2>&1
row "9B par 64 profile (rc $?)" "$(grep -A3 'profile-runtime' $OUT/prof64.log | tr '\n' ' ' | cut -c1-300)"
if [ $(left) -gt 60 ]; then
  mkdir -p $OUT/inv
  timeout $(( $(left) - 10 )) python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
    --server-args=--deterministic --out $OUT/inv >$OUT/inv.txt 2>&1
  row "9B batched==alone --deterministic (rc $?)" "$(tr '\n' ' ' < $OUT/inv.txt | cut -c1-300)"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
