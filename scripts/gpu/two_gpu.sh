#!/usr/bin/env bash
# two_gpu.sh: issue 31 on a machine with two GPUs (device kind nvidia-h100-x2 / nvidia-h200-x2).
# Run from the repo root:
#   bash scripts/gpu/two_gpu.sh [PACK_DIR]
# PACK_DIR: an unpacked scripts/gpu_pack.sh archive (bin/, lib/); default: .gpu/pack.tar.xz
# unpacked into /tmp/p. Like the session scripts it uses .gpu/fx (the shared fixtures),
# .gpu/qwen3_5.gguf and .gpu/whl/gguf-*.whl (tools/mkshape.py), .gpu/owhl/*.whl (the openai
# client for bench/http_bench.py) and, when present, .gpu/llama.tar.xz (llama.cpp's source,
# `scripts/gpu_llamacpp.sh --pack`: llama-bench and llama-server are built in the background)
# or LLAMA_BIN=DIR with those binaries already built.
#
# 1. correctness on cuda:0,cuda:1: test_layer_split --two-gpus; test_tensor_parallel with the
#    shards on the two GPUs over NCCL and over the host all-reduce, and two shards on cuda:0;
# 2. the Qwen3.5-35B-A3B shape (random Q4_K weights, tools/mkshape.py): anna-bench prefill 512
#    and decode 128, then anna-serve + http_bench at concurrency 64 (512 in, 128 out), each on
#    1 GPU, layer split over both, tensor parallel 2 (nccl; host too when time allows);
# 3. llama.cpp on the same file, --split-mode none|layer|row (llama-bench; llama-server at
#    concurrency 64 when built in time).
# PARTS (default "tests bench serve llama") picks sections; DEADLINE (s, default 560) bounds
# the run (a device call has 600 s). Results: $OUT/summary.txt (printed last as a table) and
# the logs beside it.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/two_gpu_out}; mkdir -p "$OUT"
S=$OUT/summary.txt; : >"$S"
PARTS=${PARTS:-tests bench serve llama}
row() { printf '%-58s %s\n' "$1" "$2" | tee -a "$S"; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - T0) )); }
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
P=${1:-}
if [ -z "$P" ]; then mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz && P=/tmp/p; fi
export LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# NCCL: the binaries open libnccl.so.2 at run time (cuda_comm.cu); the machine's PyTorch wheel has it
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0] + '/lib')" 2>/dev/null)
[ -n "$NCCL_DIR" ] && export LD_LIBRARY_PATH=$NCCL_DIR:$LD_LIBRARY_PATH
row "nccl library" "${NCCL_DIR:-not found (tensor parallel falls back to the host all-reduce)}"
for w in .gpu/whl/*.whl .gpu/owhl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
row "GPUs" "$NG: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tr '\n' ';')"
[ "$NG" -ge 2 ] || { row "need two GPUs" "stopping"; cat "$S"; exit 1; }
row "topology" "$(nvidia-smi topo -m 2>/dev/null | sed -n 2p | tr -s ' ' | cut -c1-80)"

# the 35B-A3B shape while the tests run
F=/tmp/s35/qwen3.5-35b-a3b-q4_k_rand.gguf
if want bench || want serve || want llama; then
  ( [ -f $F ] || python3 tools/mkshape.py qwen3.5-35b-a3b /tmp/s35 --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
      --tokenizer .gpu/fx/tokenizer --tokenizer-gguf .gpu/qwen3_5.gguf >"$OUT/mkshape.log" 2>&1 ) &
  MK=$!
fi
# llama.cpp in the background (CUDA, sm_90a)
LB=${LLAMA_BIN:-/tmp/llama-build/bin}
if want llama && [ ! -x "$LB/llama-bench" ] && [ -f .gpu/llama.tar.xz ]; then
  ( mkdir -p /tmp/llama-build && cd /tmp/llama-build && { [ -d llama.cpp ] || tar -xJf "$OLDPWD/.gpu/llama.tar.xz"; } &&
    cmake -S llama.cpp -B . -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$OUT/llama-cmake.log" 2>&1 &&
    nice cmake --build . -j"$(nproc)" --target llama-bench llama-server >"$OUT/llama-build.log" 2>&1
    echo "rc $?" >"$OUT/llama-build.rc" ) &
fi

# ---- 1. correctness ----
if want tests; then
  timeout 150 $P/bin/test_layer_split .gpu/fx tests/fixtures --two-gpus >"$OUT/layer_split.log" 2>&1
  row "test_layer_split cuda:0,cuda:1 (rc $?)" "$(tail -1 "$OUT/layer_split.log")"
  grep -E "FAIL" "$OUT/layer_split.log" | head -5 | tee -a "$S"
  for c in "nccl|--devices cuda:0,cuda:1 --tp-comm nccl" "host|--devices cuda:0,cuda:1 --tp-comm host" \
           "one GPU, 2 shards|"; do
    name=${c%%|*}; args=${c#*|}
    timeout 120 $P/bin/test_tensor_parallel .gpu/fx tests/fixtures --device cuda $args >"$OUT/tp_${name%%,*}.log" 2>&1
    row "test_tensor_parallel $name (rc $?)" "$(tail -1 "$OUT/tp_${name%%,*}.log")"
    grep -E "FAIL|max \|logit" "$OUT/tp_${name%%,*}.log" | sort | uniq -c | sort -rn | head -4 | tee -a "$S"
  done
fi

# the configurations compared below: label|anna flags
CONFS=("1 GPU|--device cuda:0" "layer split 2|--device cuda:0,cuda:1 --layer-split auto"
       "TP 2 nccl|--device cuda:0,cuda:1 --tensor-parallel 2 --tp-comm nccl"
       "TP 2 host|--device cuda:0,cuda:1 --tensor-parallel 2 --tp-comm host")
if want bench || want serve || want llama; then
  wait $MK
  [ -f $F ] || { row "mkshape 35b-a3b failed" "$(tail -3 "$OUT/mkshape.log")"; cat "$S"; exit 1; }
fi

# ---- 2a. anna-bench: prefill 512, decode 128 (one sequence) and 64 sequences ----
if want bench; then
  for c in "${CONFS[@]}"; do
    name=${c%%|*}; args=${c#*|}; tag=${name// /_}
    [ $(left) -gt 60 ] || { row "out of time" "bench $name"; break; }
    timeout 100 $P/bin/anna-bench --model $F $args --prompt-len 512 --max-new-tokens 128 --runs 1 --warmup 1 \
      >"$OUT/bench_$tag.log" 2>&1
    row "anna-bench 35B-A3B pp512/tg128 $name (rc $?)" "$(grep -E '^\| +512 ' "$OUT/bench_$tag.log" | tail -1 | tr -s ' ')"
    grep -iE "error" "$OUT/bench_$tag.log" | head -2 | tee -a "$S"
  done
fi

# ---- 2b. anna-serve + http_bench at concurrency 64 ----
serve_one() { # label, server command...; prints output tok/s
  local tag=$1; shift
  local port=$((18500 + RANDOM % 400))
  "$@" --port $port >"$OUT/serve_$tag.log" 2>&1 &
  local sp=$!
  for i in $(seq 180); do  # /v1/models answers on both servers once the model is loaded
    kill -0 $sp 2>/dev/null || break
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$port/v1/models" 2>/dev/null && break
    sleep 1
  done
  timeout $(( $(left) > 150 ? 150 : $(left) - 5 )) python3 bench/http_bench.py --base-url http://127.0.0.1:$port/v1 \
    --scenario random --input-len 512 --output-len 128 --ignore-eos --requests 128 --concurrency 64 --warmup 0 \
    --output "$OUT/hb_$tag.json" >"$OUT/hb_$tag.txt" 2>&1
  local rc=$?
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  echo "rc $rc $(grep -iE 'output tok/s' "$OUT/hb_$tag.txt" | head -1 | tr -s ' ')$(grep -iE 'error' "$OUT/serve_$tag.log" | head -1 | cut -c1-120)"
}
if want serve; then
  for c in "${CONFS[@]}"; do
    name=${c%%|*}; args=${c#*|}; tag=${name// /_}
    [ $(left) -gt 90 ] || { row "out of time" "serve $name"; break; }
    row "anna-serve c64 512/128 $name" "$(serve_one "$tag" $P/bin/anna-serve --model $F $args --parallel 64 --ctx-size 1024)"
  done
fi

# ---- 3. llama.cpp on the same file ----
if want llama; then
  while [ ! -f "$OUT/llama-build.rc" ] && [ ! -x "$LB/llama-bench" ] && [ -f .gpu/llama.tar.xz ] && [ $(left) -gt 120 ]; do
    sleep 5
  done
  if [ -x "$LB/llama-bench" ]; then
    for sm in none layer row; do
      [ $(left) -gt 60 ] || { row "out of time" "llama-bench -sm $sm"; break; }
      timeout 120 "$LB/llama-bench" -m $F -p 512 -n 128 -ngl 99 -sm $sm -r 1 -o md >"$OUT/llama_$sm.md" 2>&1
      row "llama-bench -sm $sm (rc $?)" "$(grep -E 'pp512|tg128' "$OUT/llama_$sm.md" | awk -F'|' '{printf "%s %s; ", $(NF-2), $(NF-1)}')"
    done
    if [ -x "$LB/llama-server" ]; then
      for sm in none layer row; do
        [ $(left) -gt 90 ] || { row "out of time" "llama-server -sm $sm"; break; }
        row "llama-server c64 512/128 -sm $sm" "$(serve_one "llama_$sm" "$LB/llama-server" -m $F -ngl 99 -sm $sm -np 64 -c 65536 --host 127.0.0.1)"
      done
    fi
  else
    row "llama.cpp" "not built ($(cat "$OUT/llama-build.rc" 2>/dev/null || echo 'no .gpu/llama.tar.xz or LLAMA_BIN'))"
  fi
fi
echo "==== $(( $(date +%s) - T0 )) s ===="
cat "$S"
