#!/usr/bin/env bash
# gpu_llamacpp.sh: the llama.cpp CUDA peer on the GPU machine, side by side with anna on one
# GGUF, in one call of the device tool.
#
#   scripts/gpu_llamacpp.sh --src TARBALL --anna BIN_DIR --gguf FILE [--build DIR] [--out DIR]
#
# --src: llama.cpp sources as a .tar.xz holding llama.cpp/ (the copy vendored in
#   llama-cpp-python's sdist, trimmed of docs/models/tests/other backends to travel; make it
#   with `scripts/gpu_llamacpp.sh --pack OUT.tar.xz` on the dev machine).
# --anna: folder holding anna-generate built with -DANNA_CUDA=ON (and lib/ beside it, if any).
# --gguf: the model both engines run (e.g. a tools/mkshape.py shape).
# --build: where llama.cpp is built (default .gpu/llama-build: inside the checkout, ignored,
#   so a second call on a warm machine reuses it).
# Prints one table last: prefill tok/s (512-token prompt) and decode tok/s (128 tokens).
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
SRC="" ANNA="" GGUF="" BUILD=".gpu/llama-build" OUTD="${OUT:-/tmp/gpu_llamacpp}"
while [ $# -gt 0 ]; do
  case "$1" in
    --src) SRC="$2"; shift 2 ;;
    --anna) ANNA="$2"; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --out) OUTD="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -n "$SRC" ] && [ -n "$ANNA" ] && [ -n "$GGUF" ] || { echo "usage: see the header" >&2; exit 2; }
mkdir -p "$OUTD" "$BUILD"
ROWS=()
row() { ROWS+=("$(printf '%-40s %s' "$1" "$2")"); }

if [ ! -x "$BUILD/bin/llama-bench" ]; then
  t0=$(date +%s)
  [ -d "$BUILD/llama.cpp" ] || tar -C "$BUILD" -xJf "$SRC"
  cmake -S "$BUILD/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$OUTD/llama-cmake.log" 2>&1 || { tail -20 "$OUTD/llama-cmake.log"; exit 1; }
  # Bounded so the table still prints; a second call on the warm machine resumes the build.
  timeout "${LLAMA_BUILD_TIMEOUT:-420}" cmake --build "$BUILD" -j"$(nproc)" --target llama-bench >"$OUTD/llama-build.log" 2>&1
  row "llama.cpp build" "rc $? in $(( $(date +%s) - t0 )) s ($(grep -c '^\[' "$OUTD/llama-build.log") steps)"
fi
if [ -x "$BUILD/bin/llama-bench" ]; then
  "$BUILD/bin/llama-bench" -m "$GGUF" -p 512 -n 128 -ngl 99 -r 3 -o md 2>&1 | tee "$OUTD/llama-bench.md"
  pp=$(grep -E "pp512" "$OUTD/llama-bench.md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
  tg=$(grep -E "tg128" "$OUTD/llama-bench.md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
  row "llama.cpp CUDA $(basename "$GGUF")" "prefill ${pp:-?} tok/s (512) | decode ${tg:-?} tok/s (128)"
fi
[ -d "$ANNA/../lib" ] && export LD_LIBRARY_PATH="$(cd "$ANNA/../lib" && pwd):${LD_LIBRARY_PATH:-}"
IDS=$(python3 -c 'print(",".join(str((i * 37 + 11) % 997) for i in range(512)))')
for run in 1 2 3; do
  "$ANNA/anna-generate" --model "$GGUF" --device cuda --prompt-ids "$IDS" --max-new-tokens 128 2>&1 >/dev/null |
    grep '^\[anna\]' | tail -1
done | tee "$OUTD/anna.txt"
row "anna CUDA $(basename "$GGUF") (3 runs)" "$(sed -E 's/.*prompt ([0-9]+) tok, ([0-9.]+) tok\/s \| generated ([0-9]+) tok, ([0-9.]+) tok\/s.*/\2|\4/' "$OUTD/anna.txt" | tr '\n' ' ')(prefill|decode tok/s)"
echo
echo "==== gpu_llamacpp summary ===="
printf '%s\n' "${ROWS[@]}"
