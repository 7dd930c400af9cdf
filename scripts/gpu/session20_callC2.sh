#!/usr/bin/env bash
# Device call C2 of session 20: expert offload after session 19's prefill streaming — the op
# family with the test's reference fixed (i-offfix: path letters per step, stream off / on), the
# fixtures end to end with --offload 2 (streaming 0 / 1, exact and 5e-3, partial mirror and
# zero-copy), the encoder op family, and the 35B-A3B shape with an 8 GiB device limit (prefill
# 512 and decode: streaming on / off, all resident). Optional: MMQ_FORM=N adds the engine
# profile at concurrency 64 on the 9B shape with that cuda_mmq_v2 form. Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-50s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk35.log 2>&1 ) &
MK35=$!
if [ -n "${MMQ_FORM:-}" ]; then
  ( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
     --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1 ) &
  MK9=$!
fi
timeout 200 $P/bin/test_cuda_ops --tests=moe_offload,encoder >$OUT/ops.log 2>&1
row "test_cuda_ops moe_offload,encoder (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x|host addresses" $OUT/ops.log | head -10 | tee -a $S
grep -E "paths|path" $OUT/ops.log | head -6 | cut -c1-150 | tee -a $S
for m in "--tol 5e-3" "--exact"; do
  for st in 0 1; do
    r1=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
    r2=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_fused qwen3moe_x gemma4_moe 2>&1 | tail -1)
    r3=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 qwen3_5_moe_text 2>&1 | tail -1)
    row "fixtures --offload 2 $m stream=$st" "$r1 | $r2 | zero-copy: $r3"
  done
done
wait $MK35
F35=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
[ -n "$F35" ] || row "mkshape 35b failed" "$(tail -2 $OUT/mk35.log)"
B="$P/bin/anna-bench --model $F35 --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1"
OFF="--offload-mode experts --gpu-memory-limit 8GiB"
for c in "stream|$OFF --tuning cuda_offload_prefill_stream=1" "decode batches|$OFF" "all resident|"; do
  [ -n "$F35" ] && [ $(left) -gt 150 ] || { row "skipped" "$c"; continue; }
  name=${c%%|*}; args=${c#*|}
  timeout 120 $B $args >$OUT/b35_"${name// /_}".log 2>&1
  rc=$?
  row "35B-A3B pp512/tg64 $name (rc $rc)" "$(grep -E '^\| +512 ' $OUT/b35_"${name// /_}".log | tail -1 | cut -c1-110)"
  grep -oE "prefill streamed .*per token\)|hit rate [0-9.]+[^,;]*" $OUT/b35_"${name// /_}".log | head -2 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $OUT/b35_"${name// /_}".log | head -2 | tee -a $S
done
if [ -n "${MMQ_FORM:-}" ] && [ $(left) -gt 100 ]; then
  wait $MK9
  timeout $(( $(left) - 10 )) bash scripts/gpu/engine_profile.sh $P /tmp/s9/qwen3.5-9b-q4_k_rand.gguf --levels 64 \
    --input-len 16 --output-len 256 --requests-per-level 2 --variant "--tuning cuda_mmq_v2=$MMQ_FORM" --out $OUT/ep >$OUT/ep.txt 2>&1
  row "engine_profile c64 16/256 cuda_mmq_v2=$MMQ_FORM (rc $?)" ""
  grep -E "^\|  +16 |output tok/s|forward ms/step|host \(step" $OUT/ep.txt | head -8 | tee -a $S
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
