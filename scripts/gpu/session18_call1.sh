#!/usr/bin/env bash
# Device call script of session 17 (bench/notes/gpu.md): run from the repo root on the GPU
# machine with .gpu/ holding pack.tar.xz (scripts/gpu_pack.sh), whl/gguf-*.whl, qwen3_5.gguf
# (tests/fixtures/gguf) and fx/ (shared fixtures incl. tokenizer/); results under $OUT.
# session 18 call 1: split-K MMQ checks + bench on/off, offload tests, batch invariance --deterministic
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-44s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-450} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m zipfile -e .gpu/whl/gguf-*.whl /tmp/gguf-site; export PYTHONPATH=/tmp/gguf-site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
timeout 90 $P/bin/test_cuda_ops --tests=matvec_int8,batch_invariant,matmul_group,moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops 4 families (rc $?)" "$(tail -1 $OUT/ops.log)"; grep FAIL $OUT/ops.log | head -8 | tee -a $S
FX="qwen3_5_moe_text qwen3"; EX="qwen3_5_x qwen3_5_moe_fused gemma4_moe qwen3moe_x llama3"
r1=$(timeout 40 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 $FX 2>&1 | tail -1)
r2=$(timeout 40 $P/bin/test_fixtures tests/fixtures --device cuda --tol 5e-3 $EX 2>&1 | tail -1)
row "fixtures default 5e-3" "$r1 | extra: $r2"
for m in "--exact" "--tol 5e-3"; do
  r1=$(timeout 40 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_text 2>&1 | tail -1)
  r2=$(timeout 40 $P/bin/test_fixtures tests/fixtures --device cuda $m --offload 2 --offload-host 65536 qwen3_5_moe_fused qwen3moe_x gemma4_moe 2>&1 | tail -1)
  r3=$(timeout 40 $P/bin/test_fixtures .gpu/fx --device cuda $m --offload 2 qwen3_5_moe_text 2>&1 | tail -1)
  row "fixtures --offload 2 $m" "$r1 | $r2 | zero-copy: $r3"
done
wait
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
r1=$(ANNA_TUNING=cuda_mmq_split_k=1 timeout 40 $P/bin/test_fixtures .gpu/fx --device cuda --tol 5e-3 $FX 2>&1 | tail -1)
r2=$(ANNA_TUNING=cuda_mmq_split_k=1,cuda_batch_invariant=1 timeout 40 $P/bin/test_fixtures tests/fixtures --device cuda --tol 5e-3 $EX 2>&1 | tail -1)
row "fixtures split_k=1 (+batch_invariant extra)" "$r1 | extra: $r2"
R=$(pwd); (cd /tmp && timeout 60 sh $R/tests/cuda/offload_cli.sh $P/bin/anna-generate $P/bin/anna-bench $R/.gpu/off/*.gguf) >$OUT/offload_cli.log 2>&1; row "offload_cli.sh (rc $?)" "$(tail -1 $OUT/offload_cli.log)"
for m in "1 cuda_decode_mmq=0" "1 cuda_batch_invariant=1" "1 cuda_batch_invariant=1,cuda_mmq_split_k=1" "16 cuda_decode_mmq=1" "16 cuda_mmq_split_k=1" "64 cuda_decode_mmq=1" "64 cuda_mmq_split_k=1" "64 cuda_batch_invariant=1,cuda_mmq_split_k=1"; do
  [ $(left) -gt 30 ] || break
  set -- $m
  r=$(timeout 40 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 2 --warmup 1 --parallel $1 --tuning $2 2>&1 | tee -a $OUT/bench.log | grep -E '^\| +[0-9]+ |rror' | tail -1)
  row "9B par $1 $2" "$r"
done
if [ $(left) -gt 40 ]; then
  mkdir -p $OUT/inv
  timeout $(( $(left) - 5 )) python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
    --server-args "--deterministic" --out $OUT/inv >$OUT/inv.txt 2>&1
  row "9B batched==alone --deterministic (rc $?)" "$(tr '\n' ' ' < $OUT/inv.txt | cut -c1-400)"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
