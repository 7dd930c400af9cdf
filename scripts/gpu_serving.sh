#!/usr/bin/env bash
# gpu_serving.sh: anna-serve vs llama.cpp's llama-server on the H200 in one device call (issue 29's
# serving benchmark): same GGUF file, same parallel slots and per-slot context, bench/http_bench.py
# vLLM-style random scenarios at several concurrencies, optionally bench/load_test.py; everything
# under a deadline so a call cut short still returns the tables it finished.
#
#   scripts/gpu_serving.sh --prebuilt DIR --src LLAMA.tar.xz [--shape qwen3.5-9b | --gguf FILE]
#       [--engines anna,llama] [--levels 1,16,64,256] [--scenarios fixed,mixed] [--input-len 1024]
#       [--output-len 256] [--requests-per-slot 2] [--parallel 256] [--ctx 2304] [--load]
#       [--load-requests 2000] [--deadline 560] [--device cuda] [--anna-args "..."] [--llama-args "..."]
#       [--fixtures DIR] [--build DIR] [--out DIR]
#   scripts/gpu_serving.sh --pack OUT.tar.xz     (on the dev machine: llama.cpp sources with the server)
#
# --prebuilt DIR: a scripts/gpu_pack.sh pack, unpacked (DIR/bin/anna-serve, DIR/lib); or
#   --anna-serve BIN for a local build (the CPU dry run: --engines anna --device cpu --gguf FILE).
# --src: llama.cpp's sources as `--pack` makes them here from scripts/setup_llamacpp.sh's sdist
#   (gpu_llamacpp.sh's pack leaves out tools/ui, which llama-server links; this one keeps its
#   CMake parts). llama-server is built with CUDA in the background (BUILD, default
#   /tmp/llama-build, kept while the machine is warm) while anna runs, whenever --src is given
#   (so `--engines anna --src ...` builds it for a following `--engines llama` call).
# --shape: tools/mkshape.py writes NAME as a q4_k_rand GGUF (llama-quantize's Q4_K_M tensor mix,
#   random well-formed blocks) under /tmp/shape_NAME_q4r, the path gpu_session.sh / gpu_ab.sh use;
#   the gguf package or its wheel in .gpu/whl/ must be there (as gpu_llamacpp.sh).
# Scenarios (http_bench --scenario random, token-id prompts on /v1/completions, ignore_eos and
#   min_tokens so random weights give fixed lengths): fixed = input-len / output-len exactly;
#   mixed = the same means with --range-ratio 0.75. Each level runs max(8, requests-per-slot x
#   level) requests, all at once. llama-server gets -np PARALLEL -c PARALLEL x CTX (its -c is
#   shared by the slots), anna-serve --parallel PARALLEL --ctx-size CTX.
# --load: bench/load_test.py against anna-serve after its benches (--load-requests at concurrency
#   PARALLEL, 20% early disconnects, 503s with Retry-After admitted): zero 5xx, zero leaked blocks.
# Output: OUT/serving.json (every run's http_bench summary, the load test's), OUT/*.log, and one
# short table last. Exit 0 when every run finished without failed requests and the load test passed.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--pack" ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/gpu_serving.sh --pack OUT.tar.xz" >&2; exit 2; }
  V=$(ls -d "${ANNA_CACHE:-$HOME/.cache/anna}"/llama.cpp/src/llama_cpp_python-*/vendor 2>/dev/null | head -1)
  [ -d "$V/llama.cpp" ] || { echo "gpu_serving: no llama.cpp sources: run scripts/setup_llamacpp.sh" >&2; exit 1; }
  ex=()
  for b in blas cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    ex+=("--exclude=llama.cpp/ggml/src/ggml-$b")
  done
  # tools/ui: only what its CMake step reads when the UI is neither built nor downloaded
  tar -C "$V" -cJf "$2" --exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/tests \
    --exclude=llama.cpp/media --exclude=llama.cpp/tools/ui/src --exclude=llama.cpp/tools/ui/tests \
    --exclude=llama.cpp/tools/ui/static --exclude=llama.cpp/tools/ui/package-lock.json \
    --exclude=llama.cpp/tools/server/tests "--exclude=llama.cpp/tools/server/public*" "${ex[@]}" llama.cpp || exit 1
  ls -la "$2"
  exit 0
fi

PRE="" ANNA_SERVE="" SRC="" SHAPE="qwen3.5-9b" GGUF="" ENGINES="anna,llama" LEVELS="1,16,64,256"
SCEN="fixed,mixed" ILEN=1024 OLEN=256 RPS=2 PAR=256 CTX=2304 LOAD=0 LOADN=2000 DEADLINE=560 DEV=cuda
AARGS="" LARGS="" FIX="../shared/fixtures" BUILD="/tmp/llama-build" OUTD="${OUT:-/tmp/gpu_serving}"
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || case "$1" in --load|-h|--help) ;; *) echo "gpu_serving: $1 needs a value" >&2; exit 2 ;; esac
  case "$1" in
    --prebuilt) PRE="$2"; shift 2 ;;
    --anna-serve) ANNA_SERVE="$2"; shift 2 ;;
    --src) SRC="$2"; shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --engines) ENGINES="$2"; shift 2 ;;
    --levels) LEVELS="$2"; shift 2 ;;
    --scenarios) SCEN="$2"; shift 2 ;;
    --input-len) ILEN="$2"; shift 2 ;;
    --output-len) OLEN="$2"; shift 2 ;;
    --requests-per-slot) RPS="$2"; shift 2 ;;
    --parallel) PAR="$2"; shift 2 ;;
    --ctx) CTX="$2"; shift 2 ;;
    --load) LOAD=1; shift ;;
    --load-requests) LOADN="$2"; shift 2 ;;
    --deadline) DEADLINE="$2"; shift 2 ;;
    --device) DEV="$2"; shift 2 ;;
    --anna-args) AARGS="$2"; shift 2 ;;
    --llama-args) LARGS="$2"; shift 2 ;;
    --fixtures) FIX="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --out) OUTD="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu_serving: unknown flag $1" >&2; exit 2 ;;
  esac
done
isint() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; }
for v in "$ILEN" "$OLEN" "$RPS" "$PAR" "$CTX" "$LOADN" "$DEADLINE"; do
  isint "$v" || { echo "gpu_serving: '$v' is not a positive integer" >&2; exit 2; }
done
[[ "$LEVELS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "gpu_serving: --levels wants 1,16,64,256" >&2; exit 2; }
for e in ${ENGINES//,/ }; do
  case "$e" in anna|llama) ;; *) echo "gpu_serving: --engines: unknown engine $e (anna, llama)" >&2; exit 2 ;; esac
done
for s in ${SCEN//,/ }; do
  case "$s" in fixed|mixed) ;; *) echo "gpu_serving: --scenarios: unknown scenario $s (fixed, mixed)" >&2; exit 2 ;; esac
done
[ $((ILEN + OLEN * 7 / 4 + 64)) -le "$CTX" ] ||
  echo "gpu_serving: warning: --ctx $CTX may not hold a mixed request (input up to 1.75 x $ILEN + output 1.75 x $OLEN)" >&2
if [ -n "$PRE" ]; then ANNA_SERVE="$PRE/bin/anna-serve"; fi
case ",$ENGINES," in *,anna,*)
  [ -x "$ANNA_SERVE" ] || { echo "gpu_serving: anna-serve not found (--prebuilt DIR or --anna-serve BIN)" >&2; exit 2; } ;;
esac
case ",$ENGINES," in *,llama,*)
  [ -f "$SRC" ] || [ -x "$BUILD/bin/llama-server" ] || { echo "gpu_serving: --src LLAMA.tar.xz needed for llama" >&2; exit 2; } ;;
esac
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
mkdir -p "$OUTD"
: >"$OUTD/summary.txt"
row() { printf '%-34s %s\n' "$1" "$2" | tee -a "$OUTD/summary.txt"; }
[ -n "$PRE" ] && export LD_LIBRARY_PATH="$(cd "$PRE" && pwd)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
[ -n "$SRC" ] && SRC=$(cd "$(dirname "$SRC")" && pwd)/$(basename "$SRC")

# 1. llama-server (CUDA) in the background: it takes only CPU while anna has the GPU
# (also with --engines anna when --src is given: call 1 builds it for call 2 on the warm machine)
LB=""
if [ -n "$SRC" ]; then
  if [ ! -x "$BUILD/bin/llama-server" ]; then
    (
      mkdir -p "$BUILD"
      # a tree unpacked from gpu_llamacpp.sh's pack (warm machine) lacks tools/ui: unpack ours over it
      [ -f "$BUILD/llama.cpp/tools/ui/CMakeLists.txt" ] || tar -C "$BUILD" -xJf "$SRC"
      cmake -S "$BUILD/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >"$OUTD/llama-cmake.log" 2>&1 &&
        nice cmake --build "$BUILD" -j"$(nproc)" --target llama-server >"$OUTD/llama-build.log" 2>&1
      echo "rc $? at $(( $(date +%s) - T0 )) s" >"$OUTD/llama-build.rc"
    ) &
    LB=$!
  fi
fi

# 2. the model: a given file, or the shape written once per warm machine
if [ -z "$GGUF" ]; then
  if ! python3 -c "import gguf" 2>/dev/null; then
    for w in ${GGUF_WHEEL:-.gpu/whl/gguf-*.whl}; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/gguf-site; done
    export PYTHONPATH="/tmp/gguf-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  RD=/tmp/shape_${SHAPE}_q4r GGUF=/tmp/shape_${SHAPE}_q4r/$SHAPE-q4_k_rand.gguf
  if [ ! -f "$GGUF" ]; then
    t=$(date +%s)
    rm -rf "$RD"
    python3 tools/mkshape.py "$SHAPE" "$RD" --gguf q4_k_rand --gguf-only --max-gb 0 --jobs 8 --tokenizer "$FIX/tokenizer" \
      --tokenizer-gguf tests/fixtures/gguf/qwen3_5.gguf >"$OUTD/mkshape.log" 2>&1 || tail -3 "$OUTD/mkshape.log"
    row "mkshape $SHAPE q4_k_rand" "$(( $(date +%s) - t )) s, $(du -h "$GGUF" 2>/dev/null | cut -f1)"
  fi
fi
[ -f "$GGUF" ] || { row "model" "missing: $GGUF"; exit 1; }

# 3. one server at a time on the GPU
SPID="" PORT=""
wait_ready() { # URL PATH SECONDS: until it answers 200
  local until=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$until" ]; do
    kill -0 "$SPID" 2>/dev/null || return 1
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1$2" 2>/dev/null && return 0
    sleep 1
  done
  return 1
}
stop_server() {
  [ -n "$SPID" ] || return 0
  kill -TERM "$SPID" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
  SPID=""
}
trap 'stop_server' EXIT
FAILED=0
bench_engine() { # ENGINE
  local eng=$1 url="http://127.0.0.1:$PORT"
  for sc in ${SCEN//,/ }; do
    local rr=0
    [ "$sc" = mixed ] && rr=0.75
    for c in ${LEVELS//,/ }; do
      local rem n=$((RPS * c))
      rem=$(left)
      [ "$n" -lt 8 ] && n=8
      if [ "$rem" -lt 20 ]; then row "$eng $sc c=$c" "skipped: deadline"; continue; fi
      timeout -s INT -k 5 $((rem - 10)) python3 bench/http_bench.py --base-url "$url" --label "$eng" \
        --scenario random --input-len "$ILEN" --output-len "$OLEN" --range-ratio "$rr" --requests "$n" \
        --concurrency "$c" --warmup 1 --timeout 600 --output "$OUTD/bench-$eng-$sc-c$c.json" --output-partial \
        >"$OUTD/bench-$eng-$sc-c$c.log" 2>&1
      local rc=$?
      [ "$rc" -ne 0 ] && FAILED=1
      row "$eng $sc c=$c" "$(python3 - "$OUTD/bench-$eng-$sc-c$c.json" "$rc" <<'PY' 2>/dev/null || echo "rc $rc, no summary"
import json, sys
s = json.load(open(sys.argv[1]))
s = s[-1] if isinstance(s, list) else s
f = lambda v: "?" if v is None else f"{v:.1f}"
print(f"rc {sys.argv[2]}: {s['counts']['successful']}/{s['counts']['requests']} ok, {f(s['output_tok_per_s'])} tok/s, "
      f"TTFT p50 {f(s['ttft_ms']['p50'])} ms, ITL p50/p99 {f(s['itl_ms']['p50'])}/{f(s['itl_ms']['p99'])} ms")
PY
)"
    done
  done
}

for eng in ${ENGINES//,/ }; do
  [ "$(left)" -lt 40 ] && { row "$eng" "skipped: deadline"; continue; }
  PORT=$((18500 + RANDOM % 1000))
  if [ "$eng" = anna ]; then
    # shellcheck disable=SC2086
    "$ANNA_SERVE" --model "$GGUF" --device "$DEV" --parallel "$PAR" --ctx-size "$CTX" --port "$PORT" \
      --scheduler-max-batch-size "$PAR" --max-connections $((PAR * 2 + 16)) --http-timeout-seconds 600 \
      --metrics-log-interval-seconds 30 $AARGS >"$OUTD/anna-serve.log" 2>&1 &
    SPID=$!
    wait_ready "http://127.0.0.1:$PORT" /healthz $(( $(left) < 180 ? $(left) : 180 )) ||
      { row "anna-serve" "did not start: $(tail -2 "$OUTD/anna-serve.log" | tr '\n' ' ')"; FAILED=1; stop_server; continue; }
    row "anna-serve" "up at $(( $(date +%s) - T0 )) s"
  else
    if [ -n "$LB" ]; then
      while kill -0 "$LB" 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done
      kill -0 "$LB" 2>/dev/null || { wait "$LB"; LB=""; }
    fi
    [ -f "$OUTD/llama-build.rc" ] && row "llama-server build" "$(cat "$OUTD/llama-build.rc")"
    [ -x "$BUILD/bin/llama-server" ] || { row "llama-server" "not built: $(tail -3 "$OUTD/llama-build.log" 2>/dev/null | tr '\n' ' ')"; FAILED=1; continue; }
    # shellcheck disable=SC2086
    "$BUILD/bin/llama-server" -m "$GGUF" -ngl 99 -np "$PAR" -c $((PAR * CTX)) --host 127.0.0.1 --port "$PORT" \
      $LARGS >"$OUTD/llama-server.log" 2>&1 &
    SPID=$!
    wait_ready "http://127.0.0.1:$PORT" /health $(( $(left) < 240 ? $(left) : 240 )) ||
      { row "llama-server" "did not start: $(tail -2 "$OUTD/llama-server.log" | tr '\n' ' ')"; FAILED=1; stop_server; continue; }
    row "llama-server" "up at $(( $(date +%s) - T0 )) s"
  fi
  bench_engine "$eng"
  if [ "$eng" = anna ] && [ "$LOAD" = 1 ]; then
    rem=$(left)
    if [ "$rem" -lt 30 ]; then row "load test" "skipped: deadline"; else
      # its own deadline leaves time for the checks after the run; timeout is the backstop
      timeout -k 5 $((rem - 10)) python3 bench/load_test.py --base-url "http://127.0.0.1:$PORT" --requests "$LOADN" \
        --concurrency "$PAR" --disconnect-fraction 0.2 --max-tokens 64 --pid "$SPID" --expect-503 \
        --deadline $((rem * 2 / 3)) --idle-timeout $((rem / 4)) \
        --json "$OUTD/load.json" >"$OUTD/load.log" 2>&1
      rc=$?
      [ "$rc" -ne 0 ] && FAILED=1
      row "load test ($LOADN at c=$PAR)" "rc $rc: $(grep -E '^RESULT|^FAIL' "$OUTD/load.log" | head -3 | tr '\n' ' ')"
    fi
  fi
  stop_server
done
if [ -n "$LB" ]; then # not benchmarked this call: let it finish for the next one, within the deadline
  while kill -0 "$LB" 2>/dev/null && [ "$(left)" -gt 5 ]; do sleep 2; done
  row "llama-server build" "$(cat "$OUTD/llama-build.rc" 2>/dev/null || echo "still running at the deadline")"
fi

# 4. one JSON and one table
python3 - "$OUTD" "$GGUF" "$PAR" "$CTX" "$(( $(date +%s) - T0 ))" <<'PY'
import glob, json, os, sys
sys.path.insert(0, "bench")
import http_bench as hb
out, gguf, par, ctx, secs = sys.argv[1:6]
runs = []
for p in sorted(glob.glob(os.path.join(out, "bench-*.json"))):
    try:
        d = json.load(open(p))
    except (OSError, ValueError):
        continue
    runs += d if isinstance(d, list) else [d]
load = None
if os.path.exists(os.path.join(out, "load.json")):
    load = json.load(open(os.path.join(out, "load.json")))
json.dump({"model": gguf, "parallel": int(par), "ctx": int(ctx), "seconds": int(secs), "runs": runs, "load": load},
          open(os.path.join(out, "serving.json"), "w"), indent=1)
print(f"\n==== gpu_serving ({secs} s): {os.path.basename(gguf)}, {par} slots x {ctx} ====")
for sc in ("fixed", "mixed"):
    rs = [r for r in runs if (r["config"].get("range_ratio") or 0) == (0.75 if sc == "mixed" else 0)]
    if rs:
        print(f"-- {sc}")
        print(hb.format_sweep(rs))
if load:
    print(f"-- load test: {'PASS' if load['passed'] else 'FAIL'} {load['outcomes']} checks={load['checks']}")
PY
exit $FAILED
