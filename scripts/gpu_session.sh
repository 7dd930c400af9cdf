#!/usr/bin/env bash
# gpu_session.sh: the whole GPU acceptance run of issue #6 in one device call (~6-7 minutes on
# an H200): correctness first (op tests, memcheck, fixtures in both numerics), llama.cpp built
# in the background meanwhile, then anna vs llama.cpp on real-shape models, then anna's
# runtime knobs given with --ab side by side. Rows go to OUT/summary.txt as they come, so a call cut short
# still reports what it measured.
#
#   scripts/gpu_session.sh --prebuilt DIR --src LLAMA.tar.xz [--fixtures DIR] [--shapes "S ..."]
#                          [--ab "ANNA_TUNING=key=value ..."] [--out DIR]
#
# --prebuilt DIR: DIR/bin and DIR/lib as scripts/gpu_pack.sh packs them (unpacked).
# --src: llama.cpp's sources (scripts/gpu_llamacpp.sh --pack OUT.tar.xz on the dev machine).
# --fixtures DIR: shared fixtures (with tokenizer/; default ../shared/fixtures). Any subset of
#   the models works: the device tool carries 64 MiB with the ~48 MB tree, so carry the packed
#   binaries (~8.5 MB), the llama.cpp sources (~5 MB) and e.g. qwen3_5_moe_text + tokenizer
#   (~2.8 MB as .tar.xz).
# --shapes: tools/mkshape.py shapes written as q4_k_rand GGUF files (llama-quantize's Q4_K_M
#   tensor mix, random well-formed blocks; the 35B-A3B shape at full depth is 20 GB) and run
#   by both engines (default "qwen3.5-9b qwen3.5-35b-a3b").
# --ab: runtime switches (ANNA_TUNING settings, keys in src/base/tuning.h, e.g.
#   "ANNA_TUNING=cuda_moe_deq_mb=512"), each one anna-bench row per shape next to the default
#   (default: none; the A/B variants were retired, bench/RESULTS.md "Variants retired").
# The gguf Python package must be importable, or its wheel in .gpu/whl/ (as gpu_llamacpp.sh).
set -u
cd "$(dirname "$0")/.." || exit 1
PRE="" SRC="" FIX="../shared/fixtures" SHAPES="qwen3.5-9b qwen3.5-35b-a3b"
ABV="" OUTD="${OUT:-/tmp/gpu_session}"
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PRE="$2"; shift 2 ;;
    --src) SRC="$2"; shift 2 ;;
    --fixtures) FIX="$2"; shift 2 ;;
    --shapes) SHAPES="$2"; shift 2 ;;
    --ab) ABV="$2"; shift 2 ;;
    --out) OUTD="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$PRE/bin/test_cuda_ops" ] && [ -f "$SRC" ] || { echo "usage: see the header" >&2; exit 2; }
PRE=$(cd "$PRE" && pwd) SRC=$(cd "$(dirname "$SRC")" && pwd)/$(basename "$SRC")
mkdir -p "$OUTD"
: >"$OUTD/summary.txt"
row() { printf '%-44s %s\n' "$1" "$2" >>"$OUTD/summary.txt"; }
T0=$(date +%s)
export LD_LIBRARY_PATH="$PRE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if ! python3 -c "import gguf" 2>/dev/null; then
  for w in ${GGUF_WHEEL:-.gpu/whl/gguf-*.whl}; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/gguf-site; done
  export PYTHONPATH="/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
BUILD=${LLAMA_BUILD:-/tmp/llama-build}
if [ ! -x "$BUILD/bin/llama-bench" ]; then
  (
    mkdir -p "$BUILD"
    [ -d "$BUILD/llama.cpp" ] || tar -C "$BUILD" -xJf "$SRC"
    cmake -S "$BUILD/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$OUTD/llama-cmake.log" 2>&1 &&
      nice cmake --build "$BUILD" --target llama-bench llama-quantize >"$OUTD/llama-build.log" 2>&1
    echo "rc $? at $(( $(date +%s) - T0 )) s" >"$OUTD/llama-build.rc"
  ) &
  LB=$!
fi

# 1. correctness (the GPU is ours; the llama.cpp build only takes CPU)
"$PRE/bin/test_cuda_ops" >"$OUTD/ops.log" 2>&1
row "test_cuda_ops" "$(tail -1 "$OUTD/ops.log")"
grep FAIL "$OUTD/ops.log" | head -20
timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 \
  "$PRE/bin/test_cuda_ops" >"$OUTD/memcheck.log" 2>&1
row "memcheck test_cuda_ops" "$(grep 'ERROR SUMMARY' "$OUTD/memcheck.log" | tail -1)"
FX="" GG=""
for m in qwen3_5 qwen3_5_text qwen3_5_moe_text gemma4_text gemma3_text qwen3 qwen2 llama qwen3_moe; do
  [ -f "$FIX/$m/model.safetensors" ] && FX="$FX $m"
  [ -f "$FIX/$m/expected.json" ] && [ -f "tests/fixtures/gguf/$m.gguf" ] && GG="$GG $m"
done
for mode in "--exact" "--tol 5e-3"; do
  [ -n "$FX" ] && row "fixtures $mode:$FX" "$("$PRE/bin/test_fixtures" "$FIX" --device cuda $mode $FX 2>&1 | tail -1)"
  row "fixtures extra $mode" "$("$PRE/bin/test_fixtures" tests/fixtures --device cuda $mode qwen3_5_x qwen3_5_moe_fused \
    gemma4_kv gemma4_moe gemma3_x llama3 qwen3moe_x 2>&1 | tail -1)"
  [ -n "$GG" ] && row "fixtures gguf $mode:$GG" "$("$PRE/bin/test_fixtures" "$FIX" --gguf tests/fixtures/gguf --device cuda \
    $mode $GG 2>&1 | tail -1)"
done
# layer split (issue 31, one GPU): two and three stages on cuda:0 bit-identical to none
[ -x "$PRE/bin/test_layer_split" ] &&
  row "layer split cuda:0 x2/x3" "$("$PRE/bin/test_layer_split" "$FIX" tests/fixtures --device cuda 2>&1 | tail -1)"
"$PRE/bin/test_cuda_ops" --bench >"$OUTD/bench.log" 2>&1
grep -E 'matvec (Q4_K|Q6_K|Q8_0) +n=1 12288x4096 int8|attention decode|moe decode n=1 int8' "$OUTD/bench.log" |
  sed 's/^ *//' >>"$OUTD/summary.txt"

# 2. anna vs llama.cpp on each shape, then the variants (anna-bench rows)
[ -n "${LB:-}" ] && wait "$LB"
[ -f "$OUTD/llama-build.rc" ] && row "llama.cpp build" "$(cat "$OUTD/llama-build.rc")"
for s in $SHAPES; do
  RD=/tmp/shape_${s}_q4r
  if [ ! -f "$RD/$s-q4_k_rand.gguf" ]; then
    rm -rf "$RD"
    python3 tools/mkshape.py "$s" "$RD" --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer "$FIX/tokenizer" \
      --tokenizer-gguf tests/fixtures/gguf/qwen3_5.gguf >"$OUTD/mkshape-$s.log" 2>&1 || tail -3 "$OUTD/mkshape-$s.log"
  fi
  OUT="$OUTD/l_$s" FIX="$FIX" scripts/gpu_llamacpp.sh --src "$SRC" --anna "$PRE" --shape "$s" --quant q4_k_rand \
    --lengths 512,8192 --build "$BUILD" >"$OUTD/l_$s.out" 2>&1
  sed -n '/summary/,$p' "$OUTD/l_$s.out" | grep -E 'prefill|decode' >>"$OUTD/summary.txt"
  for v in $ABV; do
    r=$(env "$v" "$PRE/bin/anna-bench" --model "$RD/$s-q4_k_rand.gguf" --device cuda --prompt-lengths 512,8192 \
      --max-new-tokens 128 --runs 2 --warmup 1 --batch 2048 2>&1 | grep -E '^\| +(512|8192) ' |
      awk -F'|' '{printf "%s: prefill %s decode %s | ", $2, $3, $5}' | tr -s ' ')
    row "ab $s [$v]" "$r"
  done
done
echo
echo "==== gpu_session summary ($(( $(date +%s) - T0 )) s) ===="
cat "$OUTD/summary.txt"
