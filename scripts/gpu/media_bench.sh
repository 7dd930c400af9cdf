#!/usr/bin/env bash
# media_bench.sh: the media benchmark rows of issues 24 (vision), 25 (ASR) and 26 (TTS) in one
# device call: anna and the reference on the same random weights, same machine, same run.
#
#   scripts/gpu/media_bench.sh [--device cuda|cpu] [--tiny] [--bin DIR] [--python PY] [--client-python PY]
#                              [--only vision,asr,tts]
#                              [--vision-text-layers N] [--deadline S]
#
# Device call (results under $OUT; the last lines are the table):
#   carry: .gpu/pack.tar.xz (scripts/gpu_pack.sh: anna-bench, anna-serve, anna-transcribe, anna-speak),
#          .gpu/owhl (openai client wheels), .gpu/mwhl (scripts/gpu/media_wheels.sh; optional)
#   command: bash scripts/gpu/media_bench.sh
# Here (CPU, shrunk shapes, the same code path): scripts/gpu/media_bench.sh --device cpu --tiny \
#   --bin build/src/cli --python ~/.cache/anna/venvs/media/bin/python --client-python python3
#   (OUT defaults to /tmp/media_bench; --python runs mkshape and the references, --client-python the
#   openai clients: by default --python with .gpu/owhl on PYTHONPATH)
#
# What runs (each part under `timeout`, skipped when the deadline is near):
#  shapes   tools/mkshape_media.py writes asr-0.6b, tts-0.6b and vision-9b (the 9B tower on a 9B-wide
#           text model of --vision-text-layers layers, default 4: the whole 9B text is ~19 GB more to
#           write and load than fits one call) in parallel, in the background.
#  vision   anna-bench --image (448x448, 1024x1024): tower ms and image+text TTFT (decode +
#           preprocess + tower + prefill, encoder cache emptied each run); reference: the machine's
#           transformers Qwen3_5ForConditionalGeneration (sdpa, bf16), or a "skip" line.
#  asr      8 s clip (one 8-s attention window: the reference's sdpa path attends over the whole
#           clip, anna per window, the same thing up to 8 s), 32 new tokens per request on both sides (anna-transcribe --max-new 32;
#           anna-serve --max-completion-tokens 32; the reference's min = max new tokens).
#           Single stream: anna-transcribe of the clip x1 and x11 in one process each (files run
#           one after another; the difference / 10 is the per-clip time without load and warm-up).
#           Concurrency 32 and 128: bench/asr_concurrency.py through anna-serve (--no-prompt-cache, encoder cache off: every
#           request encodes and prefills). Reference: qwen-asr + transformers 4.57 from .gpu/mwhl,
#           batches of 1, 32, 128 (its transformers backend batches a list of clips).
#  tts      50 frames (4 s of audio) per utterance on both sides. anna-speak --stream (one cold
#           process: first chunk and RTF as it prints them); anna-serve /v1/audio/speech streaming
#           pcm, bench/tts_concurrency.py at 1, 16, 64 (debug_max_frames 50; requests are
#           serialized in anna's speech server today). Reference: qwen-tts generate + the codec's
#           chunked_decode, batch 1 and 16 (no streaming output: first audio = the whole utterance).
# Outputs: $OUT/*.json|*.txt|*.log and $OUT/summary.txt (the table, also printed last).
set -u
T0=$(date +%s)
DEV=cuda TINY=0 BIN="" PY=python3 CPY="" ONLY=vision,asr,tts VTL=4 DEADLINE=470
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEV=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    --bin) BIN=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --client-python) CPY=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --vision-text-layers) VTL=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    *) echo "media_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/media_bench}
mkdir -p "$OUT"
S=$OUT/summary.txt; : >"$S"
W=${MEDIA_WORK:-/tmp/media_work}
rm -rf "$W"; mkdir -p "$W"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
say() { echo "[media $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.log" >&2; }
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# cap a part's timeout to what is left (minus a margin for the table)
budget() { local b=$1 l; l=$(( $(left) - 10 )); [ "$l" -lt "$b" ] && b=$l; [ "$b" -lt 5 ] && b=5; echo "$b"; }

# ---- binaries and Python packages
if [ -z "$BIN" ]; then
  mkdir -p /tmp/p && tar -C /tmp/p -xJf .gpu/pack.tar.xz || { echo "media_bench: no .gpu/pack.tar.xz" >&2; exit 1; }
  BIN=/tmp/p/bin
  # the pack's Debian libraries for anna's binaries only: Python (torch, ssl) keeps its own
  AENV=(env "LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}")
else
  AENV=(env)
fi
for b in anna-bench anna-serve anna-transcribe anna-speak; do
  [ -x "$BIN/$b" ] || say "missing $BIN/$b (scripts/gpu_pack.sh packs it when built)"
done
SITE=$W/site REF=$W/mref
mkdir -p "$SITE"
for w in .gpu/owhl/*.whl; do [ -e "$w" ] && "$PY" -m zipfile -e "$w" "$SITE"; done
# the benchmark clients: --client-python as it is, else PY with the carried openai wheels
if [ -n "$CPY" ]; then CLIENT_PY=$CPY; else CLIENT_PY="env PYTHONPATH=$SITE:${PYTHONPATH:-} $PY"; fi
HAVE_MWHL=0
if ls .gpu/mwhl/*.whl >/dev/null 2>&1; then
  mkdir -p "$REF"
  for w in .gpu/mwhl/*.whl; do "$PY" -m zipfile -e "$w" "$REF"; done
  HAVE_MWHL=1
fi
REF_PY="env PYTHONPATH=$REF:${PYTHONPATH:-} $PY"
SYS_PY="$PY"
say "device $DEV tiny $TINY bin $BIN; mwhl $HAVE_MWHL; $($PY -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)' 2>&1 | tail -1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt" >&2

# ---- inputs and shapes (background)
"$PY" bench/media_ref.py inputs "$W/in" --seconds 8 2>>"$OUT/progress.log"
SZ=(); [ "$TINY" = 1 ] && SZ=(--tiny)
declare -A MK
for k in asr tts vision; do
  want "$k" || continue
  shape=$k-0.6b; [ "$k" = vision ] && shape=vision-9b
  extra=(); [ "$k" = vision ] && extra=(--text-layers "$VTL")
  ( "$PY" tools/mkshape_media.py "$shape" "$W/$k" "${SZ[@]}" "${extra[@]}" >"$OUT/mkshape_$k.log" 2>&1 ) &
  MK[$k]=$!
done
ready() { wait "${MK[$1]}" && [ -s "$W/$1/config.json" ] || { say "mkshape $1 failed: $(tail -2 "$OUT/mkshape_$1.log")"; return 1; }; }

PORT=18900
serve_start() {  # dir log args...: starts anna-serve, waits for /health; sets SP
  local dir=$1 log=$2; shift 2
  PORT=$((PORT + 1))
  "${AENV[@]}" "$BIN/anna-serve" --model-dir "$dir" --port $PORT --device "$DEV" "$@" >"$log" 2>&1 &
  SP=$!
  local tries=$(( $(budget 120) * 2 ))
  for _ in $(seq 1 $tries); do
    "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && return 0
    kill -0 $SP 2>/dev/null || { say "anna-serve exited: $(tail -2 "$log")"; return 1; }
    sleep 0.5
  done
  say "anna-serve not up after $((tries / 2)) s"; return 1
}
serve_stop() { [ -n "${SP:-}" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null; SP=""; }
trap serve_stop EXIT

# ---- ASR
if want asr && ready asr; then
  say "asr: anna"
  A=$W/in/clip.wav
  for n in 1 11; do
    files=(); for _ in $(seq $n); do files+=("$A"); done
    t=$(date +%s%N)
    pi=(); [ "$n" = 1 ] && pi=(--print-ids)  # the ids, for the greedy check against the reference
    timeout "$(budget 90)" "${AENV[@]}" "$BIN/anna-transcribe" --model-dir "$W/asr" --device "$DEV" --max-new 32 --no-progress \
      "${pi[@]}" "${files[@]}" >"$OUT/asr_transcribe_$n.txt" 2>&1
    rc=$?
    echo "$(( ($(date +%s%N) - t) / 1000000 )) $rc" >"$OUT/asr_transcribe_$n.ms"
  done
  if serve_start "$W/asr" "$OUT/asr_serve.log" --parallel 128 --ctx-size 512 --max-completion-tokens 32 \
       --no-prompt-cache --mm-cache-mib 0 --http-timeout-seconds 600; then
    timeout "$(budget 150)" $CLIENT_PY -u bench/asr_concurrency.py --url "http://127.0.0.1:$PORT" --file "$A" --seconds 8 \
      -c 1,32,128 --rounds 2 >"$OUT/asr_concurrency.txt" 2>&1
    say "asr_concurrency rc $?: $(tail -3 "$OUT/asr_concurrency.txt" | tr '\n' '|')"
  fi
  serve_stop
  if [ "$HAVE_MWHL" = 1 ] && [ "$(left)" -gt 60 ]; then
    say "asr: reference"
    bs=1,32,128; [ "$TINY" = 1 ] && [ "$DEV" = cpu ] && bs=1,4
    timeout "$(budget 120)" $REF_PY bench/media_ref.py asr "$W/asr" --device "$DEV" --wav "$A" --max-new 32 \
      --batches $bs $([ "$DEV" = cpu ] && echo --dtype f32) >"$OUT/asr_ref.json" 2>"$OUT/asr_ref.log"
    say "asr reference rc $?"
  else
    say "asr reference skipped: $([ "$HAVE_MWHL" = 1 ] && echo "out of time" || echo "no .gpu/mwhl (scripts/gpu/media_wheels.sh)")"
  fi
fi

# ---- TTS
if want tts && ready tts; then
  say "tts: anna"
  timeout "$(budget 60)" "${AENV[@]}" "$BIN/anna-speak" --model-dir "$W/tts" --device "$DEV" --text "Hello there, this is a benchmark of streaming speech synthesis." \
    --speaker ryan --language english --stream --max-frames 50 >/dev/null 2>"$OUT/tts_speak.txt"
  say "anna-speak rc $?: $(tail -1 "$OUT/tts_speak.txt")"
  # greedy codes of 8 frames (the reference's greedy_codes: 9 asked, 8 come out), for the table's check
  timeout "$(budget 40)" "${AENV[@]}" "$BIN/anna-speak" --model-dir "$W/tts" --device "$DEV" --text "Hello there, this is a benchmark of streaming speech synthesis." \
    --speaker ryan --language english --greedy --print-codes --max-frames 8 --out "$W/greedy.wav" >"$OUT/tts_greedy_codes.txt" 2>&1
  if serve_start "$W/tts" "$OUT/tts_serve.log" --debug-hooks --http-timeout-seconds 600; then
    cs=1,16,64; [ "$TINY" = 1 ] && [ "$DEV" = cpu ] && cs=1,4
    timeout "$(budget 150)" $CLIENT_PY -u bench/tts_concurrency.py --url "http://127.0.0.1:$PORT" -c $cs --max-frames 50 \
      --json "$OUT/tts_concurrency.json" >"$OUT/tts_concurrency.txt" 2>&1
    say "tts_concurrency rc $?: $(tail -3 "$OUT/tts_concurrency.txt" | tr '\n' '|')"
  fi
  serve_stop
  if [ "$HAVE_MWHL" = 1 ] && [ "$(left)" -gt 60 ]; then
    say "tts: reference"
    bs=1,16; [ "$DEV" = cpu ] && bs=1
    fr=50; [ "$DEV" = cpu ] && fr=12
    timeout "$(budget 150)" $REF_PY bench/media_ref.py tts "$W/tts" --device "$DEV" --frames $fr --batches $bs --greedy-frames 9 \
      $([ "$DEV" = cpu ] && echo --dtype f32) >"$OUT/tts_ref.json" 2>"$OUT/tts_ref.log"
    say "tts reference rc $?"
  else
    say "tts reference skipped"
  fi
fi

# ---- vision
if want vision && ready vision; then
  say "vision: anna"
  for n in 448 1024; do
    timeout "$(budget 90)" "${AENV[@]}" "$BIN/anna-bench" --model-dir "$W/vision" --device "$DEV" --prompt "Describe this image." \
      --image "$W/in/img$n.png" --max-new-tokens 1 --runs 3 --json >"$OUT/vision_anna_$n.json" 2>"$OUT/vision_anna_$n.log"
    say "anna-bench $n rc $?"
  done
  if [ "$(left)" -gt 45 ]; then
    say "vision: reference"
    timeout "$(budget 120)" $SYS_PY bench/media_ref.py vision "$W/vision" --device "$DEV" \
      --images "$W/in/img448.png,$W/in/img1024.png" $([ "$DEV" = cpu ] && echo --dtype f32) \
      >"$OUT/vision_ref.json" 2>"$OUT/vision_ref.log"
    say "vision reference rc $?"
  fi
fi

# ---- table
"$PY" bench/media_table.py "$OUT" --device "$DEV" $([ "$TINY" = 1 ] && echo --tiny) --vision-text-layers "$VTL" | tee "$S"
echo "==== $(( $(date +%s) - T0 )) s ===="
