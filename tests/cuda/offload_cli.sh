#!/bin/sh
# Expert offload end to end on the GPU (issue #27), through anna-generate and anna-bench.
# Usage: offload_cli.sh ANNA_GENERATE ANNA_BENCH MODEL...
# 1. A one-token prompt then up to 1,000 greedy tokens (a swap plan after every step, 2 cache
#    slots per layer; a 64 KiB host mirror with the rest read from the file, then everything
#    mirrored: the zero-copy path) give the same ids as the all-resident run: one-token steps
#    run the same decode kernels on the same bytes, so the logits are bit-identical and no
#    near-tie can part them.
# 2. anna-bench --parallel 4 (steps routing the union of 4 sequences' experts, the prompt
#    through the offload's 8-token batches) runs without an error and reports swaps.
# Exits 77 (skipped) without a CUDA device.
gen=$1 bench=$2
shift 2
fail=0
for m in "$@"; do
  off="--cached-experts-per-layer 2 --expert-swap-every 1 --host-memory-limit 64KiB"
  a=$("$gen" --model "$m" --device cuda --prompt-ids 7 --max-new-tokens 1000 --print-ids --quiet 2>err.txt)
  if [ $? -ne 0 ]; then
    grep -q "no CUDA device" err.txt && { echo "skipped: no CUDA device"; exit 77; }
    cat err.txt; echo "FAIL $m: all-resident run"; fail=1; continue
  fi
  # staging copies (64 KiB mirror, the rest from the file), then zero-copy (everything mirrored)
  for o in "$off" "--cached-experts-per-layer 2 --expert-swap-every 1"; do
    b=$("$gen" --model "$m" --device cuda --prompt-ids 7 --max-new-tokens 1000 --print-ids $o 2>err.txt)
    rc=$?
    grep "expert offload" err.txt
    if [ $rc -ne 0 ] || [ -z "$a" ] || [ "$a" != "$b" ]; then
      cat err.txt; echo "FAIL $m ($o): offloaded ids differ from the all-resident ones (rc $rc)"; fail=1
    else
      echo "ok $m ($o): $(echo "$a" | tr ',' '\n' | wc -l) ids identical"
    fi
  done
  if ! "$bench" --model "$m" --device cuda --parallel 4 --prompt-len 16 --max-new-tokens 250 --runs 1 $off >out.txt 2>&1 ||
     ! grep -q "expert offload, whole run" out.txt; then
    cat out.txt; echo "FAIL $m: anna-bench --parallel 4 with offload"; fail=1
  else
    grep "expert offload, whole run" out.txt; echo "ok $m: parallel 4"
  fi
done
exit $fail
