#!/usr/bin/env bash
# Device call 3 of session 19: after the merges (encoders on the context's device, offload prefill
# streaming, batch-invariant GDN): op families, the ASR API on CUDA, --deterministic end to end on
# the 9B shape. Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-44s %s\n' "$1" "$2" | tee -a $S; }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!
timeout 200 $P/bin/test_cuda_ops --tests=attention,batch_invariant,gdn,moe_offload,encoder >$OUT/ops.log 2>&1
row "test_cuda_ops 5 families (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | tee -a $S
if [ -x $P/bin/test_asr_api ]; then
  timeout 100 $P/bin/test_asr_api tests/fixtures/qwen3_asr tests/fixtures/audio .gpu/fx/qwen3 --device cuda --exact >$OUT/asr.log 2>&1
  row "test_asr_api --device cuda --exact (rc $?)" "$(tail -1 $OUT/asr.log)"; grep -E "FAIL" $OUT/asr.log | head -4 | tee -a $S
fi
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
mkdir -p $OUT/inv
timeout 150 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
  --server-args="--deterministic" --out $OUT/inv >$OUT/inv.txt 2>&1
row "9B batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==|first diff' $OUT/inv.txt | tr '\n' ' ' | cut -c1-200)"
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
