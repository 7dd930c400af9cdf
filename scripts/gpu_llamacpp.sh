#!/usr/bin/env bash
# gpu_llamacpp.sh: anna vs llama.cpp's CUDA build on the GPU machine, same GGUF files, same
# run, in one call of the device tool; prints one table last.
#
#   scripts/gpu_llamacpp.sh --src TARBALL --anna DIR (--gguf FILE ... | --shape NAME [--layers N]
#                           [--quant q4_k_m,bf16]) [--lengths 512,8192] [--build DIR] [--out DIR]
#
# --src: llama.cpp sources as a .tar.xz holding llama.cpp/ (the copy vendored in
#   llama-cpp-python's sdist, trimmed of docs/models/tests/other backends to travel; make it
#   with `scripts/gpu_llamacpp.sh --pack OUT.tar.xz` on the dev machine).
# --anna: folder with bin/anna-bench (built with -DANNA_CUDA=ON) and lib/ (its shared libs).
# --gguf FILE: a model both engines run (repeatable).
# --shape NAME: write a tools/mkshape.py shape as a bf16 GGUF (while llama.cpp builds), then
#   llama-quantize it to each --quant type (bf16 = the file itself). --layers N truncates the
#   depth (the 35B-A3B shape's bf16 file does not fit the machine's disk otherwise).
#   --quant q4_k_rand: mkshape's random well-formed Q4_K / Q6_K file (llama-quantize's Q4_K_M
#   tensor mix) written directly, no bf16 file: the 35B-A3B shape at full depth fits (~20 GB)
#   and both engines read the same bytes.
# --build: where llama.cpp is built (default /tmp/llama-build: kept while the machine is warm).
# Both engines: prefill tok/s of --lengths prompts and decode tok/s of 128 tokens after the
# first length; llama-bench -r 2 (its defaults: n_batch 2048, n_ubatch 512), anna-bench
# --runs 2 --batch 2048. Achieved decode bandwidth = bytes read per token (every tensor but
# the token embedding, which a token reads one row of; of MoE expert tensors the k/E share a
# token selects) x tok/s, against a measured copy.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--pack" ]; then
  # shellcheck disable=SC1090
  . "${ANNA_CACHE:-$HOME/.cache/anna}/llama.cpp/env.sh" 2>/dev/null || true
  V=$(ls -d "${ANNA_CACHE:-$HOME/.cache/anna}"/llama.cpp/src/llama_cpp_python-*/vendor | head -1)
  ex=()
  for b in blas cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    ex+=("--exclude=llama.cpp/ggml/src/ggml-$b")
  done
  tar -C "$V" -cJf "$2" --exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/tests \
    --exclude=llama.cpp/media --exclude=llama.cpp/tools/ui "--exclude=llama.cpp/tools/server/public*" "${ex[@]}" llama.cpp
  ls -la "$2"
  exit $?
fi
SRC="" ANNA="" GGUFS=() SHAPE="" LAYERS="" QUANT="q4_k_m,bf16" LENS="512,8192" BUILD="/tmp/llama-build"
OUTD="${OUT:-/tmp/gpu_llamacpp}"
while [ $# -gt 0 ]; do
  case "$1" in
    --src) SRC="$2"; shift 2 ;;
    --anna) ANNA="$2"; shift 2 ;;
    --gguf) GGUFS+=("$2"); shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    --layers) LAYERS="$2"; shift 2 ;;
    --quant) QUANT="$2"; shift 2 ;;
    --lengths) LENS="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --out) OUTD="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -n "$SRC" ] && [ -n "$ANNA" ] && { [ ${#GGUFS[@]} -gt 0 ] || [ -n "$SHAPE" ]; } || { echo "usage: see the header" >&2; exit 2; }
mkdir -p "$OUTD" "$BUILD"
ROWS=()
# Rows also go to OUT/summary.txt as they come, so a run cut short still reports.
row() { ROWS+=("$(printf '%-44s %s' "$1" "$2")"); printf '%-44s %s\n' "$1" "$2" >>"$OUTD/summary.txt"; }
T0=$(date +%s)
# gguf-py (tools/mkshape.py, the tensor sizes below): the wheel carried with the call, unpacked
# (its dependencies numpy, pyyaml, requests, tqdm are in the GPU image).
if ! python3 -c "import gguf" 2>/dev/null; then
  for w in ${GGUF_WHEEL:-.gpu/whl/gguf-*.whl}; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/gguf-site; done
  export PYTHONPATH="/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
for d in /usr/local/cuda/lib64 "$ANNA/lib"; do [ -d "$d" ] && export LD_LIBRARY_PATH="$(cd "$d" && pwd):${LD_LIBRARY_PATH:-}"; done

# 1. llama.cpp (background) and the model (foreground, single-threaded python) at once
if [ ! -x "$BUILD/bin/llama-bench" ] || [ ! -x "$BUILD/bin/llama-quantize" ]; then
  (
    [ -d "$BUILD/llama.cpp" ] || tar -C "$BUILD" -xJf "$SRC"
    cmake -S "$BUILD/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$OUTD/llama-cmake.log" 2>&1 &&
      cmake --build "$BUILD" -j"$(nproc)" --target llama-bench llama-quantize >"$OUTD/llama-build.log" 2>&1
    echo "rc $? in $(( $(date +%s) - T0 )) s" >"$OUTD/llama-build.rc"
  ) &
  BUILD_PID=$!
fi
if [ -n "$SHAPE" ]; then
  SD=/tmp/shape_${SHAPE}${LAYERS:+_L$LAYERS}
  BF="$SD/$SHAPE-bf16.gguf"
  if [ ! -f "$BF" ] && [ -n "$(echo ",$QUANT," | sed 's/,q4_k_rand,/,/g; s/^,*//; s/,*$//')" ]; then
    t0=$(date +%s)
    rm -rf "$SD"
    python3 tools/mkshape.py "$SHAPE" "$SD" --gguf bf16 --gguf-only --max-gb 0 --jobs 8 ${LAYERS:+--layers $LAYERS} \
      --tokenizer "${FIX:-.gpu/fx}/tokenizer" --tokenizer-gguf tests/fixtures/gguf/qwen3_5.gguf >"$OUTD/mkshape.log" 2>&1 ||
      tail -5 "$OUTD/mkshape.log"
    row "mkshape $SHAPE${LAYERS:+ ($LAYERS layers)} bf16 gguf" "$(( $(date +%s) - t0 )) s, $(du -h "$BF" | cut -f1)"
  fi
fi
[ -n "${BUILD_PID:-}" ] && wait "$BUILD_PID"
[ -f "$OUTD/llama-build.rc" ] && row "llama.cpp build (llama-bench, llama-quantize)" "$(cat "$OUTD/llama-build.rc")"
[ -x "$BUILD/bin/llama-bench" ] || { tail -20 "$OUTD/llama-build.log"; printf '%s\n' "${ROWS[@]}"; exit 1; }
if [ -n "$SHAPE" ]; then
  for q in ${QUANT//,/ }; do
    if [ "$q" = bf16 ]; then GGUFS+=("$BF"); continue; fi
    if [ "$q" = q4_k_rand ]; then
      RD=${SD}_q4r
      if [ ! -f "$RD/$SHAPE-q4_k_rand.gguf" ]; then
        t0=$(date +%s)
        rm -rf "$RD"
        python3 tools/mkshape.py "$SHAPE" "$RD" --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 \
          ${LAYERS:+--layers $LAYERS} --tokenizer "${FIX:-.gpu/fx}/tokenizer" \
          --tokenizer-gguf tests/fixtures/gguf/qwen3_5.gguf >"$OUTD/mkshape-q4r.log" 2>&1 || tail -5 "$OUTD/mkshape-q4r.log"
        row "mkshape $SHAPE q4_k_rand gguf" "$(( $(date +%s) - t0 )) s, $(du -h "$RD/$SHAPE-q4_k_rand.gguf" | cut -f1)"
      fi
      GGUFS+=("$RD/$SHAPE-q4_k_rand.gguf")
      continue
    fi
    QF="$SD/$SHAPE-$q.gguf"
    if [ ! -f "$QF" ]; then
      t0=$(date +%s)
      "$BUILD/bin/llama-quantize" "$BF" "$QF" "$(echo "$q" | tr a-z A-Z)" "$(nproc)" >"$OUTD/quantize-$q.log" 2>&1 ||
        tail -5 "$OUTD/quantize-$q.log"
      row "llama-quantize $q" "$(( $(date +%s) - t0 )) s, $(du -h "$QF" | cut -f1)"
    fi
    GGUFS+=("$QF")
  done
fi

# 2. the ceiling: a device-to-device copy of 2 GiB (bytes read + written per second)
COPY=$(python3 - <<'PY' 2>/dev/null
import torch
a = torch.empty(1 << 29, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"{2 * a.numel() * 4 * 10 / (s.elapsed_time(e) / 1e3) / 1e9:.0f}")
PY
)
row "device copy (torch, read + write)" "${COPY:-?} GB/s"

# 3. the two engines on each file
FIRST=${LENS%%,*}
for G in "${GGUFS[@]}"; do
  [ -f "$G" ] || continue
  name=$(basename "$G" .gguf)
  rbytes=$(python3 - "$G" <<'PY'
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
def num(key):
    f = r.fields.get(f"{arch}.{key}")
    return int(f.parts[-1][0]) if f else 0
# MoE: a token reads k of the E experts' rows of each *_exps tensor
share = num("expert_used_count") / num("expert_count") if num("expert_count") else 1.0
print(int(sum(int(t.n_bytes) * (share if "_exps" in t.name else 1.0)
              for t in r.tensors if t.name != "token_embd.weight")))
PY
)
  "$BUILD/bin/llama-bench" -m "$G" -p "$LENS" -n 128 -ngl 99 -r 2 -o md >"$OUTD/llama-$name.md" 2>&1
  "$ANNA/bin/anna-bench" --model "$G" --device cuda --prompt-lengths "$LENS" --max-new-tokens 128 --runs 2 --warmup 1 \
    --batch "${ANNA_BATCH:-2048}" >"$OUTD/anna-$name.txt" 2>&1 ||
    { tail -3 "$OUTD/anna-$name.txt"; row "$name anna-bench --batch ${ANNA_BATCH:-2048}" "FAILED, again with --batch 512";
      "$ANNA/bin/anna-bench" --model "$G" --device cuda --prompt-lengths "$LENS" --max-new-tokens 128 --runs 2 \
        --warmup 1 --batch 512 >"$OUTD/anna-$name.txt" 2>&1; }
  cat "$OUTD/llama-$name.md" "$OUTD/anna-$name.txt" | grep -E "^\|"
  # llama-bench md rows: | model | size | params | backend | ngl | test | t/s |
  lpp() { grep -E "\| +pp$1 +\|" "$OUTD/llama-$name.md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'; }
  ltg=$(grep -E "\| +tg128 +\|" "$OUTD/llama-$name.md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
  # anna-bench rows: | prompt | PP tok/s | TTFT | TG tok/s | CPU/wall |
  app() { grep -E "^\| +$1 \|" "$OUTD/anna-$name.txt" | awk -F'|' '{print $3}' | awk '{print $1}'; }
  atg=$(grep -E "^\| +$FIRST \|" "$OUTD/anna-$name.txt" | awk -F'|' '{print $5}' | awk '{print $1}')
  for L in ${LENS//,/ }; do
    a=$(app "$L") l=$(lpp "$L")
    row "$name prefill $L (tok/s)" "anna ${a:-?} | llama.cpp ${l:-?} | $(python3 -c "print(f'{float(\"$a\")/float(\"$l\"):.2f}x')" 2>/dev/null || echo '?')"
  done
  row "$name decode 128 after $FIRST (tok/s)" "anna ${atg:-?} | llama.cpp ${ltg:-?} | $(python3 -c "print(f'{float(\"$atg\")/float(\"$ltg\"):.2f}x')" 2>/dev/null || echo '?')"
  row "$name decode bandwidth (GB/s)" "$(python3 -c "b=$rbytes; print(f'{b/1e9:.2f} GB/token: anna {b*float(\"$atg\")/1e9:.0f}, llama.cpp {b*float(\"$ltg\")/1e9:.0f}')" 2>/dev/null || echo '?')"
done
echo
echo "==== gpu_llamacpp summary ($(( $(date +%s) - T0 )) s) ===="
printf '%s\n' "${ROWS[@]}"
