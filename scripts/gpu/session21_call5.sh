#!/usr/bin/env bash
# Device call 5 of session 21: (1) the corrected sample_tail test, the bf16 decode kernel's test
# family and the CUDA i-quant decoders (IQ2_XXS/XS/S, IQ3_XXS/S) in every op family that takes them;
# (2) the Qwen3.5-122B-A10B shape at a 2-bit i-quant with 16 GiB of VRAM and a 24 GiB host mirror
# (so the file tier is used): anna-bench prefill 512 / decode; (3) scripts/gpu/media_bench.sh
# (vision, ASR, TTS against the references) with what time is left. Carries .gpu/{pack.tar.xz,
# whl,qwen3_5.gguf,fx/tokenizer,owhl,mwhl}. Table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-52s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/site; for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $S
( PYTHONPATH=/tmp/site python3 tools/mkshape.py qwen3.5-122b-a10b /tmp/s122 --gguf ${IQ_GGUF:-iq2_m_rand} --gguf-only --max-gb 0 --jobs 6 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk122.log 2>&1 ) &
MK=$!
timeout 120 $P/bin/test_cuda_ops --tests=${IQ_TESTS:-sample_tail,mmq_bf16} >$OUT/ops.log 2>&1
row "test_cuda_ops ${IQ_TESTS:-sample_tail,mmq_bf16} (rc $?)" "$(tail -n 1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -10 | cut -c1-180 | tee -a $S
wait $MK
F=$(ls /tmp/s122/*.gguf 2>/dev/null | head -1)
if [ -n "$F" ]; then
  ls -la $F | tee -a $S
  timeout 150 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 64 --runs 1 --warmup 1 --batch 2048 \
    --offload-mode experts --gpu-memory-limit 16GiB --host-memory-limit 24GiB >$OUT/b122.log 2>&1
  rc=$?
  row "122B-A10B 16 GiB VRAM + 24 GiB host (rc $rc)" "$(grep -E '^\| +512 ' $OUT/b122.log | cut -c1-110)"
  grep -oE "expert offload:[^;]*|hit rate [0-9.]+[^,;]*|from the (file|weights)[^,;]*|prefill streamed .*per token\)" $OUT/b122.log | sort -u | head -5 | cut -c1-200 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $OUT/b122.log | head -3 | tee -a $S
  rm -rf /tmp/s122
else
  row "mkshape 122b failed" "$(tail -n 2 $OUT/mk122.log)"
fi
if [ $(left) -gt 200 ]; then
  mkdir -p $OUT/media
  OUT=$OUT/media timeout $(( $(left) - 10 )) bash scripts/gpu/media_bench.sh --deadline $(( $(left) - 25 )) >$OUT/media.txt 2>&1
  row "media_bench (rc $?)" ""; tail -n 25 $OUT/media.txt | tee -a $S
else
  row "media_bench" "skipped (time)"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
