#!/usr/bin/env bash
# gpu_pack.sh: a CUDA build's binaries, with the shared libraries the GPU machine's image may
# lack, in one .tar.xz to carry with a device call (that machine has the CUDA toolkit and
# PyTorch but not our Debian -dev dependencies, and nothing can be installed there).
#
#   scripts/gpu_pack.sh [BUILD_DIR] OUT.tar.xz
#
# BUILD_DIR (default build-cuda) is configured and built first if it has no test_cuda_ops:
#   cmake -S . -B BUILD_DIR -DANNA_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
#     -DCMAKE_CUDA_ARCHITECTURES=90a-real -DANNA_NATIVE=OFF -DANNA_FFMPEG=OFF -DCMAKE_C_FLAGS=-march=x86-64-v3
# (x86-64-v3: the GPU host's CPU need not be this one; without FFmpeg, whose libraries would
# triple the archive past the device tool's carry limit). Layout of the archive: bin/ (test_cuda_ops,
# test_fixtures, test_kv_stress, anna-generate, anna-bench, anna-serve, and test_cuda_encoders /
# test_layer_split / test_tensor_parallel and the media API tests test_vision_api / test_video_api / test_asr_api /
# test_speech_api (their --device cuda mode), anna-transcribe / anna-speak (scripts/gpu/media_bench.sh) when
# built; stripped) and lib/
# (every library they link from the Debian system directories, except glibc's own, libstdc++
# and libgcc; CUDA's own libraries are the machine's). Unpack it on the GPU machine and pass
# the folder to scripts/gpu_check.sh --prebuilt or scripts/gpu_llamacpp.sh --anna. Keep the
# archive under the device tool's carry limit (64 MiB with the working tree): ~6-7 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 1 ]; then BUILD=build-cuda OUTF=$1; elif [ $# -eq 2 ]; then BUILD=$1 OUTF=$2; else
  echo "usage: scripts/gpu_pack.sh [BUILD_DIR] OUT.tar.xz" >&2
  exit 2
fi
if [ ! -x "$BUILD/tests/cuda/test_cuda_ops" ]; then
  cmake -S . -B "$BUILD" -DANNA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DANNA_NATIVE=OFF -DANNA_FFMPEG=OFF -DCMAKE_C_FLAGS=-march=x86-64-v3 >/dev/null
  nice cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_ops test_fixtures test_kv_stress test_layer_split test_tensor_parallel test_cuda_encoders anna-generate \
    anna-bench anna-serve anna-transcribe anna-speak test_vision_api test_video_api test_asr_api test_speech_api >/dev/null
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"
BINS=("$BUILD/tests/cuda/test_cuda_ops" "$BUILD/tests/engine/test_fixtures" "$BUILD/tests/engine/test_kv_stress"
      "$BUILD/src/cli/anna-generate" "$BUILD/src/cli/anna-bench" "$BUILD/src/cli/anna-serve")
# device tests built when their targets exist in this tree (copied when present)
for b in "$BUILD/tests/cuda/test_cuda_encoders" "$BUILD/tests/engine/test_layer_split" "$BUILD/tests/engine/test_tensor_parallel" \
  "$BUILD/tests/engine/test_vision_api" "$BUILD/tests/engine/test_video_api" "$BUILD/tests/engine/test_asr_api" \
  "$BUILD/tests/engine/test_speech_api" "$BUILD/src/cli/anna-transcribe" "$BUILD/src/cli/anna-speak"; do
  [ -x "$b" ] && BINS+=("$b")
done
# GPU_PACK_ONLY="name name ...": only those binaries (a smaller archive for a call that needs few)
if [ -n "${GPU_PACK_ONLY:-}" ]; then
  KEEP=()
  for b in "${BINS[@]}"; do
    case " $GPU_PACK_ONLY " in *" $(basename "$b") "*) KEEP+=("$b") ;; esac
  done
  BINS=("${KEEP[@]}")
fi
for b in "${BINS[@]}"; do
  [ -x "$b" ] || { echo "gpu_pack: missing $b (build it first)" >&2; exit 1; }
  cp "$b" "$STAGE/bin/"
  strip "$STAGE/bin/$(basename "$b")"
done
# The system libraries they link, minus the ones every Linux machine has and CUDA's.
ldd "${BINS[@]}" | awk '$3 ~ /^\/(usr\/)?lib\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
    libcu*|libnv*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
XZ_OPT="-9 -T2" tar -C "$STAGE" -cJf "$OUTF" bin lib
echo "gpu_pack: $OUTF ($(du -h "$OUTF" | cut -f1)): $(ls "$STAGE/bin" | tr '\n' ' ')| lib: $(ls "$STAGE/lib" | tr '\n' ' ')"
