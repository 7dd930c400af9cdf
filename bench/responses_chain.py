#!/usr/bin/env python3
"""A 5-turn /v1/responses conversation, turn by turn TTFT (request sent -> first
response.output_text.delta) and usage.cached_tokens, in three ways:
  chain:  previous_response_id (the server splices the stored prompt + reply ids)
  items:  the whole conversation re-sent as input items every turn (the template re-renders it)
Run once against a server with the prompt cache and once against one started with
--no-prompt-cache for the baseline:
  python3 bench/responses_chain.py http://127.0.0.1:PORT [--turns 5] [--max-tokens 32]
"""
import argparse
import json
import time

import openai

INSTR = ("You are a careful senior engineer reviewing C code for a small inference runtime. "
         "Answer precisely, cite the function you mean, and keep answers under three sentences. ") * 12
QUESTIONS = ["What does a KV cache store?", "Why are its blocks reference counted?",
             "When is a block copied on write?", "What happens when the pool runs out?",
             "How would you test the eviction order?", "Summarize in one line."]


def turn(c, model, **kw):
    t0 = time.perf_counter()
    ttft, final = None, None
    for ev in c.responses.create(model=model, stream=True, temperature=0, **kw):
        if ev.type == "response.output_text.delta" and ttft is None:
            ttft = time.perf_counter() - t0
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    return (ttft if ttft is not None else time.perf_counter() - t0), final


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=600)
    model = c.models.list().data[0].id
    out = {}
    for mode in ("chain", "items"):
        prev, items, rows = None, [], []
        for t in range(a.turns):
            q = QUESTIONS[t] + f" (run {mode}; one short sentence)"
            if mode == "chain":
                ttft, r = turn(c, model, instructions=INSTR, input=q, previous_response_id=prev,
                               max_output_tokens=a.max_tokens)
                prev = r.id
            else:
                items.append({"role": "user", "content": q})
                ttft, r = turn(c, model, instructions=INSTR, input=items, max_output_tokens=a.max_tokens)
                items.append({"role": "assistant", "content": r.output_text})
            rows.append({"turn": t + 1, "ttft_ms": round(ttft * 1000, 1), "input_tokens": r.usage.input_tokens,
                         "cached_tokens": r.usage.input_tokens_details.cached_tokens, "status": r.status,
                         "output_tokens": r.usage.output_tokens})
        out[mode] = rows
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
