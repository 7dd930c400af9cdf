#!/usr/bin/env bash
# Device checks of branch i-mmq (issue 29: the int8 decode GEMM at 16-64 tokens, cuda_mmq.cu
# forms 1 and 2 behind tuning cuda_mmq_v2). Run from the repo root on the GPU machine:
#   bash scripts/gpu/mmq_check.sh P
# P: an unpacked pack (scripts/gpu_pack.sh) with bin/ (and lib/). Uses, like the session
# scripts, .gpu/fx (shared fixtures incl. tokenizer/), .gpu/qwen3_5.gguf and
# .gpu/whl/gguf-*.whl (for tools/mkshape.py). Results: $OUT/summary.txt and the logs beside
# it. DEADLINE (s, default 560) bounds the optional parts.
set -u
P=${1:?usage: mmq_check.sh PACK_DIR}
OUT=${OUT:-/tmp/mmq_out}; mkdir -p $OUT
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-48s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m zipfile -e .gpu/whl/gguf-*.whl /tmp/gguf-site 2>/dev/null; export PYTHONPATH=/tmp/gguf-site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!

# 1. correctness: forms 1 and 2 bit-identical to form 0 and within the int8 bound (mmq_v2),
#    the families that run the kernel today
timeout 200 $P/bin/test_cuda_ops --tests=matvec_int8,batch_invariant,mmq_v2 >$OUT/ops.log 2>&1
row "test_cuda_ops matvec_int8,batch_invariant,mmq_v2 (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -12 | tee -a $S
# 2. the kernel alone: 4096x4096 / 12288x4096 Q4_K, 4096x12288 Q6_K at 16/32/64 tokens
timeout 120 $P/bin/test_cuda_ops --bench=mmq >$OUT/bench_mmq.log 2>&1
row "test_cuda_ops --bench=mmq (rc $?)" ""; grep -E "^  mmq" $OUT/bench_mmq.log | tee -a $S
# 3. fixtures at 5e-3 with each form (prefill chunks of 9..64 tokens take the kernel)
FX="qwen3_5_moe_text qwen3"; EX="qwen3_5_x qwen3_5_moe_fused gemma4_moe qwen3moe_x llama3"
for v in 1 2 3; do
  r1=$(ANNA_TUNING=cuda_mmq_v2=$v timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 $FX 2>&1 | tail -1)
  r2=$(ANNA_TUNING=cuda_mmq_v2=$v,cuda_batch_invariant=1 timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda --tol 5e-3 $EX 2>&1 | tail -1)
  row "fixtures cuda_mmq_v2=$v (+batch_invariant extra)" "$r1 | extra: $r2"
done
# 4. the 9B shape end to end: aggregate decode tok/s by form
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
for par in 64 16; do
  for v in 0 1 2 3; do
    [ $(left) -gt 45 ] || { row "out of time" "par $par form $v"; break 2; }
    r=$(timeout 45 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1 \
        --parallel $par --tuning cuda_mmq_v2=$v 2>&1 | tee -a $OUT/bench.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
    row "9B par $par cuda_mmq_v2=$v" "$r"
  done
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
