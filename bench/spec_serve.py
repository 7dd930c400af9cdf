#!/usr/bin/env python3
"""Speculative decoding through anna-serve: decode tok/s and acceptance per drafter.

  spec_serve.py --model PATH [--modes off,ngram,mtp,draft] [--draft-model PATH]
                [--prompt-file bench/notes/spec_prompt.txt] [--max-tokens 128] [--rounds 2]
                [--threads 1] [--serve build/src/cli/anna-serve] [--prompt-ids 1,2,3]

One server per mode (--speculative none / ngram / mtp / draft with --draft-model, default the
model itself), the same chat request (greedy, streamed with usage) sent --rounds times, modes
alternated round by round so drift on a shared machine hits them alike; the first request of
each server is a warm-up and is not counted. Reports, per mode and round: decode tok/s (tokens
after the first / time after the first), TTFT, completion tokens, accepted and rejected drafts
(usage.completion_tokens_details), and whether the text equals the off mode's. --prompt-ids
sends a completions request of those ids instead (fixtures without a chat template).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time

import openai


def start(serve, model, threads, args):
    cmd = [serve, "--model-dir" if os.path.isdir(model) else "--model", model, "--port", "0", "--threads",
           str(threads), "--parallel", "1", "--ctx-size", "2048", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines = []
    threading.Thread(target=lambda: [lines.append(ln) for ln in p.stdout], daemon=True).start()
    t0 = time.time()
    while time.time() - t0 < 300:
        for ln in list(lines):
            m = re.search(r"listening on http://[^:]+:(\d+)", ln)
            if m:
                return p, int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    raise SystemExit("anna-serve did not start: " + " ".join(cmd) + "\n" + "".join(lines))


def one(client, model, prompt, ids, max_tokens):
    t0 = time.time()
    first = None
    text, usage = "", None
    kw = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
    if ids:
        it = client.completions.create(prompt=ids, extra_body={"ignore_eos": True}, **kw)
    else:
        it = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
    for ch in it:
        if ch.usage:
            usage = ch.usage
        if ch.choices:
            piece = ch.choices[0].text if ids else ch.choices[0].delta.content
            if piece:
                if first is None:
                    first = time.time()
                text += piece
    t1 = time.time()
    n = usage.completion_tokens
    d = usage.completion_tokens_details
    acc = d.accepted_prediction_tokens if d and d.accepted_prediction_tokens is not None else 0
    rej = d.rejected_prediction_tokens if d and d.rejected_prediction_tokens is not None else 0
    dec = (n - 1) / (t1 - first) if first and t1 > first and n > 1 else 0.0
    return dict(text=text, n=n, acc=acc, rej=rej, ttft=(first or t1) - t0, tps=dec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--modes", default="off,ngram")
    ap.add_argument("--draft-model")
    ap.add_argument("--draft-max", type=int, default=6)
    ap.add_argument("--prompt-file", default=os.path.join(os.path.dirname(__file__), "notes", "spec_prompt.txt"))
    ap.add_argument("--prompt-ids")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--serve", default="build/src/cli/anna-serve")
    a = ap.parse_args()
    prompt = open(a.prompt_file).read()
    ids = [int(x) for x in a.prompt_ids.split(",")] if a.prompt_ids else None
    flags = {"off": ["--speculative", "none"], "ngram": ["--speculative", "ngram"], "mtp": ["--speculative", "mtp"],
             "draft": ["--speculative", "draft", "--draft-model", a.draft_model or a.model]}
    modes = a.modes.split(",")
    servers = {}
    try:
        for m in modes:
            servers[m] = start(a.serve, a.model, a.threads, flags[m] + ["--draft-max", str(a.draft_max)])
        clients = {m: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
                   for m, (_, port) in servers.items()}
        names = {m: c.models.list().data[0].id for m, c in clients.items()}
        for m in modes:  # warm-up
            one(clients[m], names[m], prompt, ids, 8)
        ref = None
        rows = []
        for r in range(a.rounds):
            for m in modes:
                res = one(clients[m], names[m], prompt, ids, a.max_tokens)
                if m == "off" and ref is None:
                    ref = res["text"]
                rows.append((r, m, res))
        print(f"model {a.model}, {a.threads} thread(s), draft-max {a.draft_max}, max_tokens {a.max_tokens}")
        print("| round | mode | decode tok/s | TTFT s | tokens | accepted | rejected | acceptance | same text as off |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r, m, x in rows:
            tot = x["acc"] + x["rej"]
            same = "-" if ref is None else ("yes" if x["text"] == ref else "NO")
            print(f"| {r} | {m} | {x['tps']:.1f} | {x['ttft']:.2f} | {x['n']} | {x['acc']} | {x['rej']} | "
                  f"{100.0 * x['acc'] / tot if tot else 0:.1f}% | {same} |")
    finally:
        for p, _ in servers.values():
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
