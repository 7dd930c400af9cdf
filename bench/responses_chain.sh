#!/bin/bash
# usage: bench/responses_chain.sh OUT [extra anna-serve flags]: bench/responses_chain.py against the default
# model on a fresh server (port 0), the JSON result to OUT, the server log to OUT.server.log
out=$(realpath -m "$1"); shift
cd "$(dirname "$0")/.."
./build/src/cli/anna-serve --model ~/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf --port 0 --threads 2 --ctx-size 4096 --parallel 2 "$@" > "$out.server.log" 2>&1 &
pid=$!
for i in $(seq 60); do port=$(grep -o "listening on http://[^:]*:[0-9]*" "$out.server.log" | grep -o "[0-9]*$"); [ -n "$port" ] && break; sleep 1; done
timeout 1200 python3 bench/responses_chain.py http://127.0.0.1:$port > $out 2>&1
kill $pid; wait $pid
