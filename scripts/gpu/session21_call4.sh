#!/usr/bin/env bash
# Device call 4 of session 21: the helpers' CUDA code, first device run — the bf16 tensor-core
# decode kernel (cuda_mmq_bf16 1/2: test family, kernel bench against the int8 form, fixtures at
# 5e-3, 9B decode at 16 / 64 sequences) and device-side sampling (topk, sample_tail families; the
# structured-output cost at batch 64 with device tail draws against --host-sampling). Carries
# .gpu/{pack.tar.xz,fx,whl,qwen3_5.gguf}. Results under $OUT, a short table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-48s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-400} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $S
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 6 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1 ) &
MK=$!
timeout 90 $P/bin/test_cuda_ops --tests=mmq_bf16,topk,sample_tail >$OUT/ops.log 2>&1
row "test_cuda_ops mmq_bf16,topk,sample_tail (rc $?)" "$(tail -n 1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | cut -c1-200 | tee -a $S
grep -iE "tail.*(us|ms)|draws" $OUT/ops.log | tail -n 4 | cut -c1-160 | tee -a $S
timeout 60 $P/bin/test_cuda_ops --bench=mmq_bf16 >$OUT/bench_bf.log 2>&1
row "bench mmq_bf16 (rc $?)" ""; grep -vE "^\s*$" $OUT/bench_bf.log | tail -n 26 | cut -c1-150 | tee -a $S
for m in 1 2; do
  r=$(ANNA_TUNING=cuda_mmq_bf16=$m timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 qwen3_5_moe_text qwen3 qwen3_5_text llama qwen2 2>&1 | tail -n 1)
  row "fixtures 5e-3 cuda_mmq_bf16=$m" "$r"
done
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
[ -e $F ] || { row "mkshape failed" "$(tail -n 2 $OUT/mk9.log)"; cat $S; exit 1; }
B9="$P/bin/anna-bench --model $F --device cuda --prompt-len 16 --max-new-tokens 64 --runs 2 --warmup 1"
for par in 16 64; do
  for m in 0 1 2; do
    [ $(left) -gt 100 ] || break
    r=$(timeout 50 $B9 --parallel $par --tuning cuda_mmq_bf16=$m 2>&1 | tee -a $OUT/bench9.log | grep -E '^\| +[0-9]+ |rror' | tail -n 1)
    row "9B tg par $par cuda_mmq_bf16=$m" "$(echo "$r" | cut -c1-100)"
  done
done
for sa in "device|" "host|--host-sampling"; do
  [ $(left) -gt 60 ] || break
  name=${sa%%|*}; a=${sa#*|}
  timeout $(( $(left) - 10 < 90 ? $(left) - 10 : 90 )) python3 bench/structured_cost.py --serve $P/bin/anna-serve --model $F --batch 64 --max-tokens 48 \
    --kinds none,schema --serve-args "--device cuda --parallel 64 --ctx-size 1024 --mask-threads 8 $a" >$OUT/sc_$name.txt 2>&1
  row "structured cost b64, $name sampling (rc $?)" ""; grep -E "none|schema|step" $OUT/sc_$name.txt | tail -n 4 | cut -c1-150 | tee -a $S
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
