#!/usr/bin/env bash
# Device call script of session 17 (bench/notes/gpu.md): run from the repo root on the GPU
# machine with .gpu/ holding pack.tar.xz (scripts/gpu_pack.sh), whl/gguf-*.whl, qwen3_5.gguf
# (tests/fixtures/gguf) and fx/ (shared fixtures incl. tokenizer/); results under $OUT.
# session 17 call A: checks of main + decode MMQ / KV quant / batch-invariant switches, batched == alone, parallel bench
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-46s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m zipfile -e .gpu/whl/gguf-*.whl /tmp/gguf-site; export PYTHONPATH=/tmp/gguf-site
FIX=.gpu/fx
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $S
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer $FIX/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1; echo "mkshape rc $? $(( $(date +%s) - T0 )) s" >> $OUT/mk.done ) &
timeout 200 $P/bin/test_cuda_ops >$OUT/ops.log 2>&1; row "test_cuda_ops (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL" $OUT/ops.log | head -30 | tee -a $S
FX="qwen3 qwen3_5 qwen3_5_moe_text gemma4_text llama"
EX="qwen3_5_x qwen3_5_moe_fused gemma4_kv gemma4_moe gemma3_x llama3 qwen3moe_x qwen3_yarn qwen3_5_yarn"
for tm in "|--exact" "|--tol 5e-3" "cuda_decode_mmq=1|--tol 5e-3" "cuda_kv_quant=1|--exact" "cuda_kv_quant=1|--tol 5e-3" "cuda_batch_invariant=1|--tol 5e-3"; do
  tun=${tm%%|*} mode=${tm#*|}
  r1=$(ANNA_TUNING=$tun timeout 60 $P/bin/test_fixtures $FIX --device cuda $mode $FX 2>&1 | tail -1)
  r2=$(ANNA_TUNING=$tun timeout 60 $P/bin/test_fixtures tests/fixtures --device cuda $mode $EX 2>&1 | tail -1)
  row "fixtures [$tun] $mode" "$r1 | extra: $r2"
done
for m in "|" "|exact" "cuda_decode_mmq=1|"; do
  tun=${m%%|*} md=${m#*|}
  ANNA_TUNING=$tun timeout 60 $P/bin/test_kv_stress $FIX cuda $md >$OUT/kvs.log 2>&1; row "kv_stress [$tun] $md" "$(tail -1 $OUT/kvs.log)"
done
wait; cat $OUT/mk.done | tee -a $S
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
row "checks done" "$(( $(date +%s) - T0 )) s"
for sa in "--deterministic" "--tuning cuda_decode_mmq=1"; do
  [ $(left) -gt 150 ] || break
  r=$(timeout 150 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 --server-args "$sa" --out $OUT 2>&1 | grep -A3 "batched ==" | tr '\n' ' ')
  row "9B inv [$sa]" "$r"
done
for m in "1 cuda_decode_mmq=0" "1 cuda_batch_invariant=1" "16 cuda_decode_mmq=0" "16 cuda_decode_mmq=1" "64 cuda_decode_mmq=0" "64 cuda_decode_mmq=1" "64 cuda_batch_invariant=1" "8 cuda_decode_mmq=0" "32 cuda_decode_mmq=1"; do
  [ $(left) -gt 40 ] || break
  set -- $m
  r=$(timeout 60 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1 --parallel $1 --tuning $2 2>&1 | tee -a $OUT/bench.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
  row "9B par $1 $2" "$r"
done
if [ $(left) -gt 100 ]; then
  r=$(timeout $(( $(left) - 10 )) $P/bin/anna-bench --model $F --device cuda --prompt-len 262112 --ctx-size 262144 --max-new-tokens 32 --runs 1 --warmup 0 --batch 2048 2>&1 | tee -a $OUT/bench262k.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
  row "9B 262112-token prompt" "$r"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
