#!/usr/bin/env bash
# Device call 1 of session 21: (1) expert offload prefill streaming after the group-scratch fix
# (op family with streaming on, fixtures --offload 2 stream 0/1); (2) where a 64-sequence decode
# step of the 9B shape goes, per kernel (nsys, graph nodes traced) and per op family
# (--profile-runtime), with anna-bench at 1 and 64 sequences; (3) the 35B-A3B shape under an
# 8 GiB limit: prefill streaming vs decode batches vs all resident. Carries
# .gpu/{pack.tar.xz,fx,whl,qwen3_5.gguf}. Results under $OUT, a short table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-50s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a $S
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 6 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1
  python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 6 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk35.log 2>&1 ) &
MK=$!
timeout 150 $P/bin/test_cuda_ops --tests=moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops moe_offload (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | cut -c1-200 | tee -a $S
for m in "--tol 5e-3" "--exact"; do
  for st in 1; do
    r1=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
    r2=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_fused qwen3moe_x gemma4_moe 2>&1 | tail -3 | tr '\n' ' ')
    r3=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 qwen3_5_moe_text 2>&1 | tail -1)
    row "fixtures --offload 2 $m stream=$st" "$r1 | $r2 | zero-copy: $r3"
  done
done
# wait for the 9B file only
while [ ! -e /tmp/s9/qwen3.5-9b-q4_k_rand.gguf ] && kill -0 $MK 2>/dev/null; do sleep 2; done
sleep 3
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
[ -e $F ] || { row "mkshape 9b failed" "$(tail -2 $OUT/mk9.log)"; }
B9="$P/bin/anna-bench --model $F --device cuda --prompt-len 16 --max-new-tokens 64 --runs 2 --warmup 1"
for par in 1 64; do
  r=$(timeout 60 $B9 --parallel $par 2>&1 | tee -a $OUT/bench9.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
  row "9B pp16/tg64 par $par" "$r"
done
timeout 60 $B9 --parallel 64 --profile-runtime >$OUT/prof64.log 2>&1
row "9B par 64 --profile-runtime (rc $?)" ""; grep -iE "matmul|lm_head|attention|gdn|moe|other|total" $OUT/prof64.log | head -10 | tee -a $S
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ] && [ $(left) -gt 250 ]; then
  timeout 120 $NSYS profile -t cuda --cuda-graph-trace=node -o $OUT/n64 -f true \
    $P/bin/anna-bench --model $F --device cuda --prompt-len 16 --max-new-tokens 32 --runs 1 --warmup 0 --parallel 64 >$OUT/nsys.log 2>&1
  timeout 60 $NSYS stats -r cuda_gpu_kern_sum -f csv -o $OUT/k64 $OUT/n64.nsys-rep >>$OUT/nsys.log 2>&1
  row "nsys kernel summary (rc $?)" "$(ls $OUT/k64* 2>/dev/null | head -1)"
  f=$(ls $OUT/k64*.csv 2>/dev/null | head -1)
  [ -n "$f" ] && python3 - "$f" <<'PY' | tee -a $S
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"  kernels total {tot/1e6:.1f} ms over the run")
for r in rows[:22]:
    print(f"  {float(r['Time (%)']):5.1f}% {float(r['Total Time (ns)'])/1e6:8.2f} ms n={r['Instances']:>6} avg {float(r['Avg (ns)'])/1e3:8.1f} us  {r['Name'][:90]}")
PY
  rm -f $OUT/n64.nsys-rep $OUT/*.sqlite
else
  row "nsys" "absent or no time ($NSYS)"
fi
wait $MK
F35=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
[ -n "$F35" ] || row "mkshape 35b failed" "$(tail -2 $OUT/mk35.log)"
B="$P/bin/anna-bench --model $F35 --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1"
OFF="--offload-mode experts --gpu-memory-limit 8GiB"
for c in "stream|$OFF --tuning cuda_offload_prefill_stream=1" "decode batches|$OFF" "all resident|"; do
  [ -n "$F35" ] && [ $(left) -gt 100 ] || { row "skipped" "$c"; continue; }
  name=${c%%|*}; args=${c#*|}
  timeout 90 $B $args >$OUT/b35_"${name// /_}".log 2>&1
  rc=$?
  row "35B-A3B pp512/tg64 $name (rc $rc)" "$(grep -E '^\| +512 ' $OUT/b35_"${name// /_}".log | tail -1 | cut -c1-110)"
  grep -oE "prefill streamed .*per token\)|hit rate [0-9.]+[^,;]*" $OUT/b35_"${name// /_}".log | head -2 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $OUT/b35_"${name// /_}".log | head -2 | tee -a $S
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
