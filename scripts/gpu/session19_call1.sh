#!/usr/bin/env bash
# Device call 1 of session 19 (bench/notes/gpu.md): batch-invariant attention + aligned prompt
# chunks (--deterministic), and where the server loses time at concurrency 64 on the 9B shape
# (GPU utilization sampled by nvidia-smi, server /metrics, http_bench long and short prompts,
# anna-bench's batched decode as the bound). Results under $OUT.
set -u
T0=$(date +%s)
S=$OUT/summary.txt; : >$S
row() { printf '%-44s %s\n' "$1" "$2" | tee -a $S; }
left() { echo $(( ${DEADLINE:-540} - ($(date +%s) - T0) )); }
R=$(pwd)
mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz
P=/tmp/p; export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
( python3 tools/mkshape.py qwen3.5-9b /tmp/s9 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer .gpu/fx/tokenizer \
   --tokenizer-gguf .gpu/qwen3_5.gguf >$OUT/mkshape.log 2>&1 ) &
MK=$!
row "nsys" "$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1 || echo none)"
timeout 150 $P/bin/test_cuda_ops --tests=attention,batch_invariant >$OUT/ops.log 2>&1
row "test_cuda_ops attention,batch_invariant (rc $?)" "$(tail -1 $OUT/ops.log)"; grep -E "FAIL|FATAL" $OUT/ops.log | head -8 | tee -a $S
wait $MK
F=/tmp/s9/qwen3.5-9b-q4_k_rand.gguf
[ -f $F ] || { row "mkshape failed" "$(tail -3 $OUT/mkshape.log)"; cat $S; exit 1; }
mkdir -p $OUT/inv
timeout 150 python3 bench/batch_invariance.py --server $P/bin/anna-serve --model $F --n 64 --max-tokens 32 \
  --server-args=--deterministic --out $OUT/inv >$OUT/inv.txt 2>&1
row "9B batched==alone --deterministic (rc $?)" "$(grep -E 'batched ==|first diff' $OUT/inv.txt | tr '\n' ' ' | cut -c1-300)"
timeout 60 $P/bin/anna-bench --model $F --device cuda --prompt-len 512 --max-new-tokens 128 --runs 1 --warmup 1 --parallel 64 \
  >$OUT/bench64.log 2>&1
row "anna-bench par64 512/128" "$(grep -E '^\| +[0-9]+ ' $OUT/bench64.log | tail -1)"
PORT=18431
$P/bin/anna-serve --model $F --device cuda --parallel 64 --ctx-size 1024 --port $PORT >$OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 60); do curl -sf localhost:$PORT/healthz >/dev/null && break; sleep 1; done
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 >$OUT/util.txt 2>/dev/null &
NP=$!
for sc in "512 128" "16 256"; do
  set -- $sc
  : >$OUT/util.txt
  timeout 150 python3 bench/http_bench.py --base-url http://127.0.0.1:$PORT/v1 --scenario random --input-len $1 --output-len $2 \
    --ignore-eos --requests 128 --concurrency 64 --warmup 0 --output $OUT/hb_$1.json >$OUT/hb_$1.txt 2>&1
  u=$(awk '{s+=$1;n++} END {if(n) printf "%.0f%% of %d samples", s/n, n}' $OUT/util.txt)
  row "serve c64 in=$1 out=$2 (rc $?)" "$(grep -iE 'output tok/s|tok/s' $OUT/hb_$1.txt | head -2 | tr '\n' ' ' | cut -c1-200) gpu util $u"
done
kill $NP 2>/dev/null
curl -s localhost:$PORT/metrics >$OUT/metrics.txt; curl -s localhost:$PORT/healthz >$OUT/healthz.json
kill $SP; wait $SP 2>/dev/null
row "metrics" "$(grep -E '^anna_(step|batch|engine)' $OUT/metrics.txt | head -8 | tr '\n' ' ' | cut -c1-300)"
echo "==== $(( $(date +%s) - T0 )) s ===="; cat $S
