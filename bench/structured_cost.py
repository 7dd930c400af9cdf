#!/usr/bin/env python3
"""What structured output costs per decode step at a batch (issue 30: "mask cost under 5% of a
decode step at batch 64"): B concurrent unconstrained requests, then B concurrent constrained
ones of the same length, against a running anna-serve (or one this script starts).

    bench/structured_cost.py --base-url http://127.0.0.1:8080 --batch 64 --max-tokens 128
    bench/structured_cost.py --serve build/src/cli/anna-serve --model M.gguf --batch 64 \\
        --serve-args "--device cuda"

Every request streams `max_tokens` tokens (ignore_eos, so no request ends early; the
constrained ones use grammars whose sentences never have to end, so each step computes a real
mask). Per request, the step time is (last token time - first token time) / (tokens - 1) as
the client sees it; a phase's figure is the median over its requests. The ratio
constrained / unconstrained - 1 is the mask's share of a step (all masks of a step run on the
engine thread before sampling, so they add to every sequence's step). Constraint kinds
(--kinds, default all):
  none     no constraint (the baseline once more: repeat it to see the noise)
  free     grammar  root ::= [^\\n]*                      (a loop: the mask cache's best case)
  string   grammar  a JSON object whose one string never closes (JSON grammar, in-string)
  bounded  grammar  root ::= [^\\n]{1,1000}               (a new state every token: a full
                                                          vocabulary walk every step)
  schema   response_format json_schema {"text": string}  (the JSON Schema mask inside a free
                                                          string)
Prints a table; --json OUT writes it. Exit status 1 when a request failed.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

JSON_STRING_GBNF = r'''root ::= "{\"text\": \"" char*
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
'''

KINDS = {
    "none": {},  # the baseline again (--kinds free,none,...): how noisy the machine is
    "free": {"grammar": "root ::= [^\\n]*\n"},
    "string": {"grammar": JSON_STRING_GBNF},
    "bounded": {"grammar": "root ::= [^\\n]{1,1000}\n"},
    "schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "object", "properties": {"text": {"type": "string"}},
                                "required": ["text"], "additionalProperties": False}}}},
}


def one(url: urllib.parse.ParseResult, body: dict, out: list, idx: int) -> None:
    c = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=3600)
    times = []
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out[idx] = {"error": "HTTP %d: %s" % (r.status, r.read()[:300])}
            return
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("choices") and (ev["choices"][0].get("delta") or {}).get("content"):
                times.append(time.perf_counter())
                buf += ev["choices"][0]["delta"]["content"].encode()
            if ev.get("usage"):
                out[idx] = {"tokens": ev["usage"]["completion_tokens"], "times": times, "text": buf.decode()}
        if out[idx] is None:
            out[idx] = {"error": "no usage chunk"}
    except Exception as e:  # noqa: BLE001 - reported, not raised: one failure must not hide the rest
        out[idx] = {"error": repr(e)}
    finally:
        c.close()


def phase(url, model, batch, max_tokens, extra, prompt):
    bodies = []
    for i in range(batch):
        b = {"model": model, "messages": [{"role": "user", "content": "%s (%d)" % (prompt, i)}],
             "max_tokens": max_tokens, "temperature": 1.0, "seed": i, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True}}
        b.update(extra)
        bodies.append(b)
    out = [None] * batch
    th = [threading.Thread(target=one, args=(url, bodies[i], out, i)) for i in range(batch)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    errors = [o["error"] for o in out if "error" in o]
    steps = []
    for o in out:
        if "error" in o or len(o["times"]) < 2:
            continue
        # a chunk may carry several tokens (the stream coalesces): time per token, not per chunk
        steps.append((o["times"][-1] - o["times"][0]) / max(1, o["tokens"] - 1))
    return {"wall_s": wall, "errors": errors[:3], "n_errors": len(errors),
            "tokens": sum(o.get("tokens", 0) for o in out),
            "step_ms": statistics.median(steps) * 1e3 if steps else None,
            "tok_per_s": sum(o.get("tokens", 0) for o in out) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server")
    ap.add_argument("--serve", help="anna-serve binary to start (with --model)")
    ap.add_argument("--model", help="model for --serve")
    ap.add_argument("--serve-args", default="", help="more anna-serve arguments")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--kinds", default="free,string,bounded,schema")
    ap.add_argument("--prompt", default="Write a long story about a lighthouse keeper.")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    proc = None
    if a.serve:
        if not a.model:
            ap.error("--serve needs --model")
        cmd = [a.serve, "--model-dir" if os.path.isdir(a.model) else "--model", a.model, "--port", "0",
               "--parallel", str(a.batch), *shlex.split(a.serve_args)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        port = None
        for line in proc.stdout:
            sys.stderr.write(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            print("the server did not start", file=sys.stderr)
            return 1
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        a.base_url = "http://127.0.0.1:%d" % port
    if not a.base_url:
        ap.error("--base-url or --serve")
    url = urllib.parse.urlparse(a.base_url)
    try:
        c = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=30)
        c.request("GET", "/v1/models")
        model = json.loads(c.getresponse().read())["data"][0]["id"]
        # warm-up: a short constrained and a short plain request (vocabulary tables built once)
        phase(url, model, 1, 4, KINDS["free"], a.prompt)
        phase(url, model, 1, 4, {}, a.prompt)
        rows = []
        base = phase(url, model, a.batch, a.max_tokens, {}, a.prompt)
        rows.append(("none", base))
        for k in a.kinds.split(","):
            rows.append((k, phase(url, model, a.batch, a.max_tokens, KINDS[k], a.prompt)))
        print("batch %d, %d tokens each, server %s" % (a.batch, a.max_tokens, a.base_url))
        print("%-8s %10s %10s %10s %8s" % ("kind", "step ms", "tok/s", "vs none", "errors"))
        for k, r in rows:
            ratio = (r["step_ms"] / base["step_ms"] - 1) * 100 if r["step_ms"] and base["step_ms"] else float("nan")
            r["overhead_pct"] = ratio
            print("%-8s %10.2f %10.1f %9.1f%% %8d" % (k, r["step_ms"] or float("nan"), r["tok_per_s"], ratio,
                                                      r["n_errors"]))
            for e in r["errors"]:
                print("   error:", e)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"batch": a.batch, "max_tokens": a.max_tokens, "rows": dict(rows)}, f, indent=1)
        return 1 if any(r["n_errors"] for _, r in rows) else 0
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
