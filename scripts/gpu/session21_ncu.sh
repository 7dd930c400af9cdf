#!/usr/bin/env bash
# Device call 7 of session 21: ncu of the two decode GEMM kernels at 64 sequences (int8 k_mmq and
# bf16 k_mbf) inside the 9B shape's decode steps, to see why both sit at ~60 us for a 28 MB weight.
# Carries .gpu/{pack.tar.xz,whl,qwen3_5.gguf,fx/tokenizer}.
set -u
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/site; for w in .gpu/whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site 2>/dev/null; done
PYTHONPATH=/tmp/site python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
  --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mk9.log 2>&1
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
for k in "k_mmq|0" "k_mbf|1"; do
  name=${k%%|*}; m=${k#*|}
  timeout 120 $NCU --kernel-name regex:"^${name}\$|${name}<" --launch-skip ${SKIP:-1500} --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    $P/bin/anna-bench --model $F --device cuda --prompt-len 16 --max-new-tokens 48 --runs 1 --warmup 0 --parallel 64 \
    --tuning cuda_mmq_bf16=$m >$OUT/ncu_$name.txt 2>&1
  echo "== $name rc $?"
  grep -E "^  [a-z_]+.*\(|Grid Size|Block Size|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Dynamic Shared" $OUT/ncu_$name.txt | head -60 | cut -c1-140
done
