#!/usr/bin/env bash
# engine_profile.sh: where anna-serve's engine thread spends its time at concurrency 1, 16 and 64
# (issue 29), in one device call. Starts anna-serve with --engine-profile, runs bench/http_bench.py
# (--scenario random, token-id prompts, fixed output length) at each level, scrapes /metrics
# before and after each level and prints bench/engine_phases.py's phase table (steps by kind,
# rows per step, CUDA graph steps, forward ms per step kind, host phases per step and per token).
# The engine's own ceiling (anna-bench batched decode of the top level's sequences) runs first.
#
#   scripts/gpu/engine_profile.sh BUILD_DIR MODEL.gguf [options]
#     --device D          (default cuda)
#     --levels 1,16,64    concurrency levels
#     --input-len 512 --output-len 128 --requests-per-level 2 (x concurrency, at least 8)
#     --parallel 64 --ctx 1024   anna-serve --parallel / --ctx-size
#     --variant 'ARGS'    repeatable: a server variant (extra anna-serve arguments; '' = defaults),
#                         each restarted and run at every level, e.g.
#                         --variant '' --variant '--scheduler-prefill-interval-steps 4'
#     --no-bench          skip the anna-bench reference
#     --out DIR           logs, scrapes, JSON (default ${OUT:-/tmp/engine_profile})
# MODEL: a GGUF file, or a model folder (the CPU dry run: BUILD_DIR MODEL_DIR --device cpu).
# BUILD_DIR: a build folder (src/cli/anna-serve) or an unpacked scripts/gpu_pack.sh pack
# (bin/anna-serve). http_bench needs the openai package (PYTHONPATH to its unpacked wheels).
# Output: the tables on stdout; OUT/summary.jsonl (one JSON line per variant x level).
set -u
BUILD=${1:?usage: engine_profile.sh BUILD_DIR MODEL.gguf [options]}
GGUF=${2:?usage: engine_profile.sh BUILD_DIR MODEL.gguf [options]}
shift 2
DEV=cuda LEVELS=1,16,64 ILEN=512 OLEN=128 RPL=2 PAR=64 CTX=1024 BENCH=1
OUTD=${OUT:-/tmp/engine_profile}
VARIANTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEV="$2"; shift 2 ;;
    --levels) LEVELS="$2"; shift 2 ;;
    --input-len) ILEN="$2"; shift 2 ;;
    --output-len) OLEN="$2"; shift 2 ;;
    --requests-per-level) RPL="$2"; shift 2 ;;
    --parallel) PAR="$2"; shift 2 ;;
    --ctx) CTX="$2"; shift 2 ;;
    --variant) VARIANTS+=("$2"); shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    --out) OUTD="$2"; shift 2 ;;
    *) echo "engine_profile: unknown option $1" >&2; exit 2 ;;
  esac
done
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("")
HERE=$(cd "$(dirname "$0")/../.." && pwd)
SERVE="$BUILD/src/cli/anna-serve" ABENCH="$BUILD/src/cli/anna-bench"
[ -x "$SERVE" ] || SERVE="$BUILD/bin/anna-serve"
[ -x "$ABENCH" ] || ABENCH="$BUILD/bin/anna-bench"
[ -x "$SERVE" ] || { echo "engine_profile: no anna-serve under $BUILD" >&2; exit 2; }
MARG=(--model "$GGUF")
[ -d "$GGUF" ] && MARG=(--model-dir "$GGUF") # an HF folder (the CPU dry run on a fixture)
[ -e "$GGUF" ] || { echo "engine_profile: no model $GGUF" >&2; exit 2; }
python3 -c 'import openai' 2>/dev/null || { echo "engine_profile: http_bench needs the openai package" >&2; exit 2; }
mkdir -p "$OUTD"
: >"$OUTD/summary.jsonl"
TOP=${LEVELS##*,}

if [ "$BENCH" = 1 ] && [ -x "$ABENCH" ]; then
  echo "== anna-bench: batched decode of $TOP sequences (the engine's ceiling), prompt $ILEN, $OLEN tokens"
  "$ABENCH" "${MARG[@]}" --device "$DEV" --parallel "$TOP" --prompt-len "$ILEN" --max-new-tokens "$OLEN" \
    --runs 2 --warmup 1 2>&1 | tee "$OUTD/anna-bench.log" | grep -E '^\|' | tail -2
fi

SPID=""
stop_server() {
  [ -n "$SPID" ] || return 0
  kill -TERM "$SPID" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.25; done
  kill -KILL "$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
  SPID=""
}
trap stop_server EXIT

vi=0
for VAR in "${VARIANTS[@]}"; do
  vi=$((vi + 1))
  PORT=$((18500 + RANDOM % 1000))
  # shellcheck disable=SC2086
  "$SERVE" "${MARG[@]}" --device "$DEV" --parallel "$PAR" --ctx-size "$CTX" --port "$PORT" \
    --scheduler-max-batch-size "$PAR" --max-connections $((PAR * 2 + 16)) --http-timeout-seconds 600 \
    --engine-profile 10 $VAR >"$OUTD/serve-v$vi.log" 2>&1 &
  SPID=$!
  URL="http://127.0.0.1:$PORT"
  up=0
  for _ in $(seq 1 600); do
    curl -sf "$URL/healthz" >/dev/null 2>&1 && { up=1; break; }
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.5
  done
  echo
  echo "== variant $vi: anna-serve ${VAR:-(defaults)}"
  if [ "$up" != 1 ]; then echo "did not start: $(tail -3 "$OUTD/serve-v$vi.log")"; stop_server; continue; fi
  for c in ${LEVELS//,/ }; do
    n=$((RPL * c)); [ "$n" -lt 8 ] && n=8
    tag="v$vi-c$c"
    curl -s "$URL/metrics" >"$OUTD/$tag.before.prom"
    python3 "$HERE/bench/http_bench.py" --base-url "$URL" --label "$tag" --scenario random --input-len "$ILEN" \
      --output-len "$OLEN" --requests "$n" --concurrency "$c" --warmup 1 --timeout 600 \
      --output "$OUTD/$tag.json" --output-partial >"$OUTD/$tag.log" 2>&1
    rc=$?
    # (the scrapes bracket http_bench's one warm-up request too: one request's steps more)
    curl -s "$URL/metrics" >"$OUTD/$tag.after.prom"
    [ "$rc" -ne 0 ] && echo "(http_bench rc $rc: $(tail -2 "$OUTD/$tag.log" | tr '\n' ' '))"
    python3 "$HERE/bench/engine_phases.py" "$OUTD/$tag.before.prom" "$OUTD/$tag.after.prom" \
      --bench "$OUTD/$tag.json" --label "c=$c"
    python3 "$HERE/bench/engine_phases.py" "$OUTD/$tag.before.prom" "$OUTD/$tag.after.prom" \
      --bench "$OUTD/$tag.json" --label "v$vi ${VAR:-defaults} c=$c" --json >>"$OUTD/summary.jsonl"
  done
  grep -h "engine profile" "$OUTD/serve-v$vi.log" | tail -3 | cut -c1-600
  stop_server
done
