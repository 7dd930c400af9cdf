#!/usr/bin/env bash
# Device call of session 21: issue 27's side by side, same run — the Qwen3.5-35B-A3B shape
# (q4_k_rand, llama.cpp's Q4_K_M tensor mix; both engines read the same file) with an 8 GiB VRAM
# budget: anna's expert offload (--gpu-memory-limit 8GiB) against llama.cpp's CUDA build with
# its MoE-on-CPU offload (-ncmoe N, swept around the budget, VRAM peak sampled with
# nvidia-smi), plus both all resident. llama.cpp builds in the background (16 cores) while anna
# runs. Carries .gpu/{pack.tar.xz,llama.tar.xz,fx/tokenizer,whl,qwen3_5.gguf}. Table last.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-58s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-575} - ($(date +%s) - T0) )); }
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $S
LB=/tmp/llama-build; mkdir -p $LB
( tar -C $LB -xJf .gpu/llama.tar.xz &&
  cmake -S $LB/llama.cpp -B $LB -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >$OUT/llama-cmake.log 2>&1 &&
  nice cmake --build $LB -j14 --target llama-bench >$OUT/llama-build.log 2>&1; echo "rc $? at $(( $(date +%s) - T0 )) s" >$OUT/llama-build.rc ) &
BP=$!
python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 4 \
   --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk35.log 2>&1
F=$(ls /tmp/s35/*.gguf 2>/dev/null | head -1)
[ -n "$F" ] || { row "mkshape failed" "$(tail -n 2 $OUT/mk35.log)"; cat $S; exit 1; }
peak() { # command...: runs it with nvidia-smi sampling; prints the peak MiB used to $OUT/peak
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >$OUT/smi.txt 2>/dev/null & local sp=$!
  "$@"; local rc=$?
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  sort -n $OUT/smi.txt | tail -1 >$OUT/peak; return $rc
}
AB="$P/bin/anna-bench --model $F --device cuda --prompt-lengths 512,8192 --max-new-tokens 128 --runs 2 --warmup 1 --batch 2048"
for c in "anna 8GiB offload|--offload-mode experts --gpu-memory-limit 8GiB" "anna all resident|"; do
  name=${c%%|*}; args=${c#*|}
  peak timeout 150 $AB $args >$OUT/"${name// /_}".log 2>&1
  rc=$?
  grep -E '^\| +[0-9]+ ' $OUT/"${name// /_}".log | while read -r l; do row "$name (rc $rc, peak $(cat $OUT/peak) MiB)" "$(echo "$l" | cut -c1-110)"; done
done
wait $BP
row "llama.cpp build" "$(cat $OUT/llama-build.rc 2>/dev/null)"
LBIN=$LB/bin/llama-bench
[ -x $LBIN ] || { tail -n 5 $OUT/llama-build.log | tee -a $S; cat $S; exit 1; }
for n in 30 28 0; do
  [ $(left) -gt 70 ] || { row "llama skipped (time)" "-ncmoe $n"; continue; }
  t=$(( $(left) - 20 < 140 ? $(left) - 20 : 140 ))
  peak timeout $t $LBIN -m $F -ngl 99 -ncmoe $n -p 512 -n 128 -r 2 -fa on -t 16 >$OUT/llama_ncmoe$n.log 2>&1
  rc=$?
  grep -E "pp512|tg128" $OUT/llama_ncmoe$n.log | while read -r l; do row "llama.cpp -ncmoe $n (rc $rc, peak $(cat $OUT/peak) MiB)" "$(echo "$l" | awk -F'|' '{print $(NF-2), $(NF-1)}')"; done
  [ $rc = 0 ] || tail -n 3 $OUT/llama_ncmoe$n.log | tee -a $S
done
[ $(left) -gt 60 ] && { peak timeout $(( $(left) - 15 )) $LBIN -m $F -ngl 99 -ncmoe 0 -p 8192 -n 0 -r 1 -fa on >$OUT/llama_p8192.log 2>&1;
  grep -E "pp8192" $OUT/llama_p8192.log | while read -r l; do row "llama.cpp all resident pp8192" "$(echo "$l" | awk -F'|' '{print $(NF-1)}')"; done; }
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
