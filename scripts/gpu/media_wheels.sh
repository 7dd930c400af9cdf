#!/usr/bin/env bash
# media_wheels.sh: the reference packages of the media benchmarks (qwen-asr, qwen-tts and the
# transformers they pin), as wheels in .gpu/mwhl, for scripts/gpu/media_bench.sh to carry to the
# GPU machine (which has torch and a newer transformers but can install nothing).
#
#   scripts/gpu/media_wheels.sh [DIR]      (default .gpu/mwhl; run on this machine, needs PyPI)
#
# Only what the modeling code imports, no dependencies resolved by pip (the device's torch,
# numpy, safetensors, regex, pyyaml, tqdm, filelock, fsspec, packaging are used as they are):
#   qwen-asr 0.0.6, qwen-tts 0.1.1   the reference modeling (their __init__ and the inference
#                                    wrappers are not imported: gradio, librosa, sox, onnxruntime)
#   transformers 4.57.6              qwen-asr's pin (qwen-tts pins 4.57.3: same modeling API;
#                                    bench/media_ref.py prints the version it ran)
#   huggingface_hub <1.0, tokenizers <=0.23.0   transformers 4.57's import-time version checks
#   requests + urllib3 certifi charset_normalizer idna   imported by hub 0.36 / transformers 4.57
# The device side unzips them into a folder put first on PYTHONPATH for the reference processes
# only (python3 -m zipfile -e: no pip needed there). Python 3.12, x86-64 (the device's).
# About 17 MB; the script fails if the folder passes 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.gpu/mwhl}
mkdir -p "$DIR"
PKGS=(qwen-asr==0.0.6 qwen-tts==0.1.1 transformers==4.57.6 "huggingface_hub>=0.34,<1.0" "tokenizers>=0.22,<=0.23.0"
      requests urllib3 certifi charset_normalizer idna)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --implementation cp -d "$DIR" "${PKGS[@]}"
KB=$(du -sk "$DIR" | cut -f1)
echo "media_wheels: $DIR ($((KB / 1024)) MB): $(ls "$DIR" | tr '\n' ' ')"
[ "$KB" -le $((25 * 1024)) ] || { echo "media_wheels: over 25 MB" >&2; exit 1; }
