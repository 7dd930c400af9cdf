#!/usr/bin/env bash
# Device call 2 of session 21: expert offload with experts of different sizes per layer (the op
# family's new Q4_K + Q6_K-down case), then the Qwen3.5-35B-A3B shape (q4_k_rand, llama.cpp's
# Q4_K_M tensor mix) under --gpu-memory-limit 8GiB as issue 27 asks: prefill 512 / 8192, decode,
# prefill streaming on / off, hit rates and bytes per token, against all resident; page cache warm
# (the file was just written) and, where the machine lets us drop it, cold. Carries
# .gpu/{pack.tar.xz,fx,whl,qwen3_5.gguf}. Results under $OUT, a short table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-52s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $S
nproc | sed 's/^/host cores: /' | tee -a $S; free -g | sed -n 2p | tee -a $S
( python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 6 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk35.log 2>&1 ) &
MK=$!
timeout 150 $P/bin/test_cuda_ops --tests=moe_offload >$OUT/ops.log 2>&1
row "test_cuda_ops moe_offload (rc $?)" "$(tail -1 $OUT/ops.log)"
grep -E "FAIL|FATAL|\(\+0x" $OUT/ops.log | head -8 | cut -c1-200 | tee -a $S
wait $MK
F35=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
[ -n "$F35" ] || { row "mkshape 35b failed" "$(tail -n 2 $OUT/mk35.log)"; cat $S; exit 1; }
ls -la $F35 | tee -a $S
B="$P/bin/anna-bench --model $F35 --device cuda --max-new-tokens 128 --runs 2 --warmup 1 --batch 2048"
OFF="--offload-mode experts --gpu-memory-limit 8GiB"
run35() { # name, args, prompt lengths
  local name=$1 args=$2 lens=$3 f=$OUT/b35_${1// /_}.log
  [ $(left) -gt 60 ] || { row "skipped (time)" "$name"; return; }
  timeout $(( $(left) - 30 < 150 ? $(left) - 30 : 150 )) $B --prompt-lengths $lens $args >$f 2>&1
  local rc=$?
  grep -E '^\| +[0-9]+ ' $f | while read -r l; do row "35B $name (rc $rc)" "$(echo "$l" | cut -c1-120)"; done
  grep -oE "prefill streamed .*per token\)|hit rate [0-9.]+[^,;]*|VRAM[^|]*|expert offload:[^;]*" $f | sort -u | head -4 | cut -c1-200 | sed 's/^/    /' | tee -a $S
  [ $rc = 0 ] || grep -iE "error" $f | head -2 | tee -a $S
}
run35 "8GiB stream" "$OFF --tuning cuda_offload_prefill_stream=1" 512,8192
run35 "8GiB decode batches" "$OFF" 512,8192
run35 "all resident" "" 512,8192
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  run35 "8GiB stream cold cache" "$OFF --tuning cuda_offload_prefill_stream=1 --runs 1 --warmup 0" 512
else
  row "cold page cache" "not possible here (drop_caches refused)"
fi
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
