#!/usr/bin/env python3
"""Multi-turn chat TTFT: the prefix-cache workload (issue: paged KV / prefix sharing).

A conversation of --turns turns: the same long system prompt, then the growing history (each
assistant reply is appended as sent back by the server). Every turn re-sends everything, as
chat clients do, and the time to the first streamed token is recorded. With a working prefix
cache, turns 2..N cost only their new tokens. Servers are measured one after another, each with
a fresh conversation (a per-run tag in the system prompt keeps earlier runs from hitting).

--canned-replies (for random-weight models, which may stream no text): each turn is timed as
one request for a single token (prefill + one step, i.e. the TTFT), and the history grows by a
fixed reply text instead of the model's; the new tokens per turn are then the canned reply plus
the next question, the same for every server.

Usage:
  bench/multiturn.py --base-url http://127.0.0.1:8092 --label anna \\
                     [--base-url http://127.0.0.1:8091 --label llama.cpp] [--turns 10] [--canned-replies]
Needs the `openai` package.
"""
import argparse
import os
import random
import statistics
import sys
import time

from openai import OpenAI

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = ["What is the first sentence about?", "Summarise the second passage in one line.",
             "Which author wrote about a whale?", "Name a city mentioned in the text.",
             "What year is the oldest passage from?", "Give one word that describes the tone.",
             "Which passage is the shortest?", "Quote three words from the Gettysburg Address.",
             "What is the main theme overall?", "Thank you. One final sentence, please."]


CANNED = ("Thank you for the question. Based on the text above, the answer is short: it is in the passage, "
          "and I have nothing more to add to it.")


def run(base, label, turns, max_tokens, system, canned=False):
    c = OpenAI(base_url=base.rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=600)
    model = c.models.list().data[0].id
    msgs = [{"role": "system", "content": system}]
    rows = []
    for t in range(turns):
        msgs.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        if canned:
            t0 = time.perf_counter()
            r = c.chat.completions.create(model=model, messages=msgs, max_tokens=1, temperature=0,
                                          extra_body={"ignore_eos": True})
            ttft = time.perf_counter() - t0
            msgs.append({"role": "assistant", "content": CANNED})
            rows.append((t + 1, r.usage.prompt_tokens if r.usage else None, ttft))
            continue
        t0 = time.perf_counter()
        ttft, text, usage = None, [], None
        stream = c.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(ch.choices[0].delta.content)
            if getattr(ch, "usage", None):
                usage = ch.usage
        msgs.append({"role": "assistant", "content": "".join(text)})
        rows.append((t + 1, usage.prompt_tokens if usage else None, ttft))
    return label, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", action="append", required=True)
    ap.add_argument("--label", action="append")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--canned-replies", action="store_true")
    ap.add_argument("--text", default=os.path.join(REPO, "bench", "data", "public_domain_en.txt"))
    a = ap.parse_args()
    labels = a.label or [f"server{i}" for i in range(len(a.base_url))]
    text = open(a.text, encoding="utf-8").read()
    results = []
    for base, label in zip(a.base_url, labels):
        tag = f"[run {random.randrange(1 << 30)}] "
        system = tag + "You answer questions about this text briefly.\n\n" + text
        results.append(run(base, label, a.turns, a.max_tokens, system, a.canned_replies))
    turns = len(results[0][1])
    head = "| turn | prompt tokens | " + " | ".join(f"{l} TTFT ms" for l, _ in results) + " |"
    head += " new tokens |" if turns else ""
    print(head)
    print("|" + "---|" * (3 + len(results)))
    for i in range(turns):
        pt = results[0][1][i][1]
        new = pt - results[0][1][i - 1][1] if i and pt and results[0][1][i - 1][1] else pt
        cells = " | ".join(f"{r[i][2] * 1e3:.0f}" if r[i][2] else "n/a" for _, r in results)
        print(f"| {i + 1} | {pt} | {cells} | {new} |")
    for label, r in results:
        later = [x[2] for x in r[1:] if x[2]]
        if later and r[0][2]:
            print(f"{label}: turn 1 {r[0][2] * 1e3:.0f} ms, turns 2-{turns} median {statistics.median(later) * 1e3:.0f} ms")
        else:
            print(f"{label}: no streamed text (random-weight models may emit only special tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
