#!/usr/bin/env bash
# Device call C1 of session 20: the int8 decode GEMM forms (tuning cuda_mmq_v2 0..3: bits, kernel
# times, the 9B shape's 64-sequence decode), tensor parallel 2 on one GPU (two shards on cuda:0
# vs unsplit, fixtures), --deterministic batched == alone after the GDN change, and the
# structured-output cost at batch 64 with / without the JSON Schema mask cache. Carries
# .gpu/{pack.tar.xz,fx,tpx,whl,qwen3_5.gguf}. Results under $OUT, a short table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-50s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1 ) &
MK9=$!
timeout 150 $P/bin/test_cuda_ops --tests=matvec_int8,batch_invariant,mmq_v2 >$OUT/ops.log 2>&1
row "test_cuda_ops matvec_int8,batch_invariant,mmq_v2 (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | tee -a $S
timeout 90 $P/bin/test_cuda_ops --bench=mmq >$OUT/bench_mmq.log 2>&1
row "test_cuda_ops --bench=mmq (rc $?)" ""; grep -E "^  mmq" $OUT/bench_mmq.log | tee -a $S
for v in 1 2 3; do
  r1=$(ANNA_TUNING=cuda_mmq_v2=$v timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 qwen3_5_moe_text qwen3 qwen3_5_text 2>&1 | tail -1)
  r2=$(ANNA_TUNING=cuda_mmq_v2=$v,cuda_batch_invariant=1 timeout 60 $P/bin/test_fixtures .gpu/tpx --device cuda --tol 5e-3 llama3 gemma3_x 2>&1 | tail -1)
  row "fixtures cuda_mmq_v2=$v (+batch_invariant)" "$r1 | $r2"
done
timeout 120 $P/bin/test_tensor_parallel .gpu/fx .gpu/tpx --device cuda >$OUT/tp.log 2>&1
row "test_tensor_parallel --device cuda (rc $?)" "$(tail -1 $OUT/tp.log)"; grep -E "FAIL" $OUT/tp.log | head -6 | tee -a $S
wait $MK9
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
[ -e $F ] || { row "mkshape failed" "$(tail -2 $OUT/mk9.log)"; cat $S; exit 1; }
for v in 0 1 2 3; do
  [ $(left) -gt 300 ] || { row "out of time" "form $v"; break; }
  r=$(timeout 60 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1 \
      --parallel 64 --tuning cuda_mmq_v2=$v 2>&1 | tee -a $OUT/bench9.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
  row "9B par 64 cuda_mmq_v2=$v" "$r"
done
mkdir -p $OUT/inv
timeout 100 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
  --server-args="--deterministic" --out $OUT/inv >$OUT/inv.txt 2>&1
row "9B batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==' $OUT/inv.txt | cut -c1-110)"
grep -A2 "first diff" $OUT/inv.txt | cut -c1-160 | tee -a $S
for c in "cache|--mask-threads 8" "no cache|--mask-threads 8 --json-mask-cache-mib 0"; do
  [ $(left) -gt 80 ] || break
  name=${c%%|*}; args=${c#*|}
  timeout 80 python3 bench/structured_cost.py --serve $P/bin/anna-serve --model $F --batch 64 --max-tokens 48 \
    --kinds none,schema --serve-args "--device cuda --parallel 64 --ctx-size 1024 $args" >$OUT/sc_"${name// /_}".txt 2>&1
  row "structured cost b64 $name (rc $?)" ""; grep -E "none|schema" $OUT/sc_"${name// /_}".txt | tail -3 | tee -a $S
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
