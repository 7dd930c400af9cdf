#!/usr/bin/env bash
# Device call 2 of session 19: --deterministic end to end after the fused-GDN fix (9B shape and a
# hybrid fixture through the server), test_cuda_ops batch_invariant/attention/gdn. Results under $OUT.
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
timeout 150 $P/bin/test_cuda_ops --tests=attention,batch_invariant,gdn >$OUT/ops.log 2>&1
row "test_cuda_ops attention,batch_invariant,gdn (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL" $OUT/ops.log | head -8 | tee -a $S
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
for a in "--deterministic" ""; do
  mkdir -p $OUT/inv$a
  timeout 150 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
    --server-args="$a" --out $OUT/inv$a >$OUT/inv$a.txt 2>&1
  row "9B batched==alone '$a' (rc $?)" "$(grep -E 'batched ==|first diff' $OUT/inv$a.txt | tr '\n' ' ' | cut -c1-200)"
done
mkdir -p $OUT/invq
timeout 100 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model .gpu/qwen3_5.gguf --vocab 1000 --n 32 --max-tokens 32 \
  --server-args="--deterministic" --out $OUT/invq >$OUT/invq.txt 2>&1
row "qwen3_5 fixture batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==' $OUT/invq.txt | cut -c1-120)"
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
