#!/usr/bin/env bash
# Device checks of branch i-offpre (issue #27 item 4: prefill with offloaded experts,
# cuda_offload.cu off_prefill). Run from the repo root on the GPU machine:
#   bash scripts/gpu/offpre_check.sh P
# P: an unpacked pack (scripts/gpu_pack.sh) with bin/ (and lib/). Uses, like the session
# scripts, .gpu/fx (shared fixtures incl. tokenizer/), .gpu/qwen3_5.gguf and
# .gpu/whl/gguf-*.whl (for tools/mkshape.py). Results: $OUT/summary.txt (a short table) and
# the logs beside it. DEADLINE (s, default 560) bounds the optional parts.
set -u
P=${1:?usage: offpre_check.sh PACK_DIR}
OUT=${OUT:-/tmp/offpre_out}; mkdir -p $OUT
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-52s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m zipfile -e .gpu/whl/gguf-*.whl /tmp/gguf-site 2>/dev/null; export PYTHONPATH=/tmp/gguf-site
# the 35B-A3B shape (random Q4_K weights) in the background while the tests run
( python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!

# 1. the op family: decode cases as before, plus the prefill cases (300 / 64 / 9-token chunks,
#    1 cache slot per layer: streamed vs all-resident at 1e-3, bytes <= distinct x expert,
#    fewer bytes than the decode batches)
timeout 150 $P/bin/test_cuda_ops --tests=moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops moe_offload (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -12 | tee -a $S
grep -E "prefill .*(streamed|decode batches):" $OUT/ops.log | head -8 | tee -a $S

# 2. fixtures with 2 cached experts per layer: their prompts (23+ tokens) are prefill chunks
#    above 8 tokens, so default numerics stream them; exact mode keeps the decode batches
for m in "--tol 5e-3" "--exact"; do
  r1=$(timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
  r2=$(timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_fused qwen3moe_x gemma4_moe 2>&1 | tail -1)
  r3=$(timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 qwen3_5_moe_text 2>&1 | tail -1)
  row "fixtures --offload 2 $m" "$r1 | $r2 | zero-copy: $r3"
done
r=$(ANNA_TUNING=cuda_offload_prefill_stream=0 timeout 60 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
row "fixtures --offload 2, streaming off (A/B)" "$r"

# 3. the bench on the 35B-A3B shape: prefill 512 with an 8 GiB device limit, streaming on /
#    off, and all resident for reference (llama.cpp -ncmoe 30: 350 tok/s prefill at 512)
wait $MK
F=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
if [ -z "$F" ]; then row "mkshape 35b-a3b failed" "$(tail -3 $OUT/mkshape.log)"; cat $S; exit 1; fi
B="$P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 16 --runs 2 --warmup 1"
OFF="--offload-mode experts --gpu-memory-limit 8GiB"
for c in "stream|$OFF" "decode batches|$OFF --tuning cuda_offload_prefill_stream=0" \
         "stream, no host mirror|$OFF --host-memory-limit 0" "all resident|"; do
  [ $(left) -gt 40 ] || { row "out of time" "$c"; break; }
  name=${c%%|*}; args=${c#*|}
  timeout $(( $(left) - 10 )) $B $args >$OUT/bench_"${name// /_}".log 2>&1
  rc=$?
  r=$(grep -E '^\| +512 ' $OUT/bench_"${name// /_}".log | tail -1)
  row "35B-A3B pp512 $name (rc $rc)" "$r"
  grep -oE "prefill streamed .*per token\)" $OUT/bench_"${name// /_}".log | head -1 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $OUT/bench_"${name// /_}".log | head -2 | tee -a $S
done
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
