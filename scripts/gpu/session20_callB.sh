#!/usr/bin/env bash
# Device call B of session 20: --deterministic batched == alone after the GDN change (9B shape),
# the structured-output cost at batch 64 on the GPU with the JSON Schema mask cache (issue 30's
# 5% target) and without it, offload end to end after session 19's prefill streaming
# (test_fixtures --offload 2, both streaming settings) and the 35B-A3B shape with an 8 GiB
# device limit (prefill 512 and decode, streaming on / off, all resident). Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-50s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1 ) &
MK9=$!
( python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk35.log 2>&1 ) &
MK35=$!
for m in "--tol 5e-3" "--exact"; do
  for st in 0 1; do
    r1=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
    r2=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_fused qwen3moe_x gemma4_moe 2>&1 | tail -1)
    r3=$(ANNA_TUNING=cuda_offload_prefill_stream=$st timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 qwen3_5_moe_text 2>&1 | tail -1)
    row "fixtures --offload 2 $m stream=$st" "$r1 | $r2 | zero-copy: $r3"
  done
done
wait $MK9
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
mkdir -p $OUT/inv
timeout 110 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
  --server-args="--deterministic" --out $OUT/inv >$OUT/inv.txt 2>&1
row "9B batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==' $OUT/inv.txt | cut -c1-120)"
grep -A3 "first diff" $OUT/inv.txt | cut -c1-160 | tee -a $S
for c in "cache|--mask-threads 8" "no cache|--mask-threads 8 --json-mask-cache-mib 0"; do
  [ $(left) -gt 200 ] || break
  name=${c%%|*}; args=${c#*|}
  timeout 90 python3 bench/structured_cost.py --serve $P/bin/anna-serve --model $F --batch 64 --max-tokens 64 \
    --kinds none,schema --serve-args "--device cuda --parallel 64 --ctx-size 1024 $args" >$OUT/sc_"${name// /_}".txt 2>&1
  row "structured cost b64 $name (rc $?)" "$(grep -E 'schema' $OUT/sc_"${name// /_}".txt | tail -1 | cut -c1-110)"
done
wait $MK35
F35=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
[ -n "$F35" ] || { row "mkshape 35b failed" "$(tail -2 $OUT/mk35.log)"; }
B="$P/bin/anna-bench --model $F35 --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1"
OFF="--offload-mode experts --gpu-memory-limit 8GiB"
for c in "stream|$OFF --tuning cuda_offload_prefill_stream=1" "decode batches|$OFF" "all resident|"; do
  [ -n "$F35" ] && [ $(left) -gt 50 ] || { row "skipped" "$c"; continue; }
  name=${c%%|*}; args=${c#*|}
  timeout $(( $(left) - 10 )) $B $args >$OUT/b35_"${name// /_}".log 2>&1
  rc=$?
  row "35B-A3B pp512/tg64 $name (rc $rc)" "$(grep -E '^\| +512 ' $OUT/b35_"${name// /_}".log | tail -1 | cut -c1-110)"
  grep -oE "prefill streamed .*per token\)|hit rate [0-9.]+" $OUT/b35_"${name// /_}".log | head -2 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $OUT/b35_"${name// /_}".log | head -2 | tee -a $S
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
