#!/usr/bin/env bash
# gpu_ab.sh: one device call that checks a CUDA build and times it against an older build of
# anna-bench on the same real-shape files, alternating the two binaries so drift of the card
# shows up as spread rather than as a difference (a refactor must land "within noise").
#
#   scripts/gpu_ab.sh --new DIR --base BIN [--fixtures DIR] [--shapes "S ..."] [--rounds N]
#                     [--lengths 512,8192] [--skip-checks] [--out DIR]
#
# --new DIR:  a scripts/gpu_pack.sh pack, unpacked (DIR/bin, DIR/lib): its test_cuda_ops,
#             test_fixtures and test_kv_stress run first, then its anna-bench is timed.
# --base BIN: the anna-bench of the build to compare with (it links the same libraries as
#             DIR/lib; pack it with `scripts/gpu_pack.sh` of that commit, or strip and copy it).
# --fixtures: shared fixtures with tokenizer/ (any subset; default ../shared/fixtures).
# --shapes:   tools/mkshape.py shapes written as q4_k_rand GGUF files (default
#             "qwen3.5-9b qwen3.5-35b-a3b"); needs the gguf package or its wheel in .gpu/whl/.
# --rounds N: base/new pairs per shape (default 2): rows print in run order, medians last.
# Rows go to OUT/summary.txt as they come, so a call cut short still reports what it measured.
set -u
cd "$(dirname "$0")/.." || exit 1
NEW="" BASE="" FIX="../shared/fixtures" SHAPES="qwen3.5-9b qwen3.5-35b-a3b" ROUNDS=2 LENS=512,8192 CHECKS=1
OUTD="${OUT:-/tmp/gpu_ab}"
while [ $# -gt 0 ]; do
  case "$1" in
    --new) NEW="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --fixtures) FIX="$2"; shift 2 ;;
    --shapes) SHAPES="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --lengths) LENS="$2"; shift 2 ;;
    --skip-checks) CHECKS=0; shift ;;
    --out) OUTD="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$NEW/bin/anna-bench" ] && [ -x "$BASE" ] || { echo "usage: see the header" >&2; exit 2; }
NEW=$(cd "$NEW" && pwd)
mkdir -p "$OUTD"
: >"$OUTD/summary.txt"
row() { printf '%-40s %s\n' "$1" "$2" | tee -a "$OUTD/summary.txt"; }
T0=$(date +%s)
export LD_LIBRARY_PATH="$NEW/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if ! python3 -c "import gguf" 2>/dev/null; then
  for w in .gpu/whl/gguf-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/gguf-site; done
  export PYTHONPATH="/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH}"
fi

# Shapes are written in the background while the checks run (the checks take the GPU, the
# writer the CPUs and the disk).
(
  for s in $SHAPES; do
    RD=/tmp/shape_${s}_q4r
    [ -f "$RD/$s-q4_k_rand.gguf" ] && continue
    python3 tools/mkshape.py "$s" "$RD" --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer "$FIX/tokenizer" \
      --tokenizer-gguf tests/fixtures/gguf/qwen3_5.gguf >"$OUTD/mkshape-$s.log" 2>&1 || tail -3 "$OUTD/mkshape-$s.log"
    echo "$s $(( $(date +%s) - T0 )) s" >>"$OUTD/mkshape.done"
  done
) &
MK=$!

# Checks: each runs when the pack has its binary (a pack may carry only what a call needs).
if [ "$CHECKS" = 1 ]; then
  if [ -x "$NEW/bin/test_cuda_ops" ]; then
    "$NEW/bin/test_cuda_ops" >"$OUTD/ops.log" 2>&1
    row "test_cuda_ops (rc $?)" "$(tail -1 "$OUTD/ops.log")"
    grep FAIL "$OUTD/ops.log" | head -20
  fi
  FX=""
  for m in qwen3_5 qwen3_5_text qwen3_5_moe_text gemma4_text gemma3_text qwen3 qwen2 llama qwen3_moe; do
    [ -f "$FIX/$m/model.safetensors" ] && FX="$FX $m"
  done
  for mode in "--exact" "--tol 5e-3"; do
    [ -x "$NEW/bin/test_fixtures" ] || break
    [ -n "$FX" ] && row "fixtures $mode:$FX" "$("$NEW/bin/test_fixtures" "$FIX" --device cuda $mode $FX 2>&1 | tail -1)"
    row "fixtures extra $mode" "$("$NEW/bin/test_fixtures" tests/fixtures --device cuda $mode qwen3_5_x \
      qwen3_5_moe_fused gemma4_kv gemma4_moe gemma3_x llama3 qwen3moe_x 2>&1 | tail -1)"
  done
  if [ -x "$NEW/bin/test_kv_stress" ] && [ -f "$FIX/qwen3/model.safetensors" ] && [ -f "$FIX/qwen3_5/model.safetensors" ]; then
    for mode in "" exact; do
      "$NEW/bin/test_kv_stress" "$FIX" cuda $mode >"$OUTD/kv_stress$mode.log" 2>&1
      row "test_kv_stress cuda $mode" "$(tail -1 "$OUTD/kv_stress$mode.log")"
      grep -E 'max|FAIL' "$OUTD/kv_stress$mode.log" | sed 's/^/    /' | cut -c1-110 | tee -a "$OUTD/summary.txt"
    done
  fi
  row "checks done" "$(( $(date +%s) - T0 )) s"
fi
wait "$MK"
cat "$OUTD/mkshape.done" 2>/dev/null

# anna-bench rows: "| prompt | PP tok/s | TTFT | TG tok/s | CPU/wall |" -> "len: pp X tg Y"
bench() {
  "$1" --model "$2" --device cuda --prompt-lengths "$LENS" --max-new-tokens 128 --runs 2 --warmup 1 --batch 2048 2>&1 |
    grep -E '^\| +[0-9]+ ' | awk -F'|' '{gsub(/ +/," "); split($3,p," "); split($5,g," ");
      printf "%s: pp %s tg %s | ", $2, p[1], g[1]}'
}
for s in $SHAPES; do
  F=/tmp/shape_${s}_q4r/$s-q4_k_rand.gguf
  [ -f "$F" ] || { row "$s" "no file (see mkshape-$s.log)"; continue; }
  for r in $(seq "$ROUNDS"); do
    row "$s base #$r" "$(bench "$BASE" "$F")"
    row "$s new  #$r" "$(bench "$NEW/bin/anna-bench" "$F")"
  done
done
echo
echo "==== gpu_ab summary ($(( $(date +%s) - T0 )) s) ===="
cat "$OUTD/summary.txt"
