#!/usr/bin/env bash
# Device call A of session 20 (after the session-19 merges): op families, the media API tests
# with their encoders on CUDA, where anna-serve's decode step goes at concurrency 64 (engine
# profile, decode-only), --deterministic batched == alone on the 9B shape, and ncu on the int8
# decode GEMM (k_mmq) at 64 tokens. Results under $OUT; a short table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-46s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-540} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!
# test_speech_api reads its fixtures under the source dir it was built in
mkdir -p /work 2>/dev/null && [ ! -e /work/main ] && ln -s "$PWD" /work/main 2>/dev/null
timeout 150 $P/bin/test_cuda_ops --tests=attention,batch_invariant,gdn,moe_offload,encoder >$OUT/ops.log 2>&1
row "test_cuda_ops 5 families (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | tee -a $S
timeout 60 $P/bin/test_asr_api tests/fixtures/qwen3_asr tests/fixtures/audio .gpu/fx/qwen3 --device cuda --exact >$OUT/asr.log 2>&1
row "test_asr_api cuda --exact (rc $?)" "$(tail -1 $OUT/asr.log)"; grep -E "FAIL" $OUT/asr.log | head -4 | tee -a $S
VE=/tmp/ve; mkdir -p $VE
for f in config.json chat_template.jinja preprocessor_config.json; do ln -sf $PWD/tests/fixtures/qwen3_5_vision/e2e/$f $VE/$f; done
for f in model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do ln -sf $PWD/.gpu/fxv/qwen3_5/$f $VE/$f; done
timeout 60 $P/bin/test_vision_api $VE tests/fixtures/qwen3_5_vision/e2e .gpu/fx/qwen3 --device cuda --exact >$OUT/vision.log 2>&1
row "test_vision_api cuda --exact (rc $?)" "$(tail -1 $OUT/vision.log)"; grep -E "FAIL" $OUT/vision.log | head -4 | tee -a $S
# (test_video_api: the pack is built without FFmpeg to stay under the carry limit)
timeout 60 $P/bin/test_speech_api --device cuda >$OUT/speech.log 2>&1
row "test_speech_api cuda (rc $?)" "$(tail -1 $OUT/speech.log)"; grep -E "FAIL" $OUT/speech.log | head -4 | tee -a $S
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
[ -e $F ] || { row "mkshape failed" "$(tail -2 $OUT/mkshape.log)"; cat $S; exit 1; }
# the server's decode step at 64 (16 in / 256 out), with the engine's own ceiling first
timeout 170 bash scripts/gpu/engine_profile.sh $P $F --levels 64 --input-len 16 --output-len 256 \
  --requests-per-level 2 --out $OUT/ep >$OUT/ep.txt 2>&1
row "engine_profile c64 16/256 (rc $?)" "see ep.txt"
grep -E "^\||output tok/s|TPOT|ms/step|host|forward|sample|step" $OUT/ep.txt | head -40 | tee -a $S
if [ $(left) -gt 150 ]; then
  mkdir -p $OUT/inv
  timeout 110 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
    --server-args="--deterministic" --out $OUT/inv >$OUT/inv.txt 2>&1
  row "9B batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==|first diff' $OUT/inv.txt | tr '\n' ' ' | cut -c1-200)"
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 15 )) $NCU --kernel-name regex:k_mmq --launch-skip 40 --launch-count 8 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis \
    $P/bin/anna-bench --model $F --device cuda --parallel 64 --prompt-len 16 --max-new-tokens 6 --runs 1 --warmup 0 \
    >$OUT/ncu.txt 2>&1
  row "ncu k_mmq (rc $?)" "$(grep -cE '^  k_mmq' $OUT/ncu.txt) kernels"
  grep -E "k_mmq|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Grid Size|Block Size|Dynamic Shared|Stall|Warp Cycles Per Issued" $OUT/ncu.txt | head -60 >$OUT/ncu_short.txt
else
  row "ncu" "absent or out of time ($NCU)"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S; echo; cat $OUT/ncu_short.txt 2>/dev/null | head -60
