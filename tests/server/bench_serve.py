#!/usr/bin/env python3
"""Serving benchmark (not part of ctest): starts anna-serve on a model and measures, per
concurrency level, requests/s, output tok/s, TTFT and ITL p50/p99 from the client side
(streamed chat, all requests of a level sent at once, like vLLM bench serve).

usage: bench_serve.py MODEL [--concurrency 1,8,32] [--requests-per-level N] [--max-tokens N]
                      [--server-arg=--flag ...]
"""
import argparse
import concurrent.futures as cf
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Server  # noqa: E402


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one(client, model, i, max_tokens):
    t0 = time.perf_counter()
    first, last, gaps, n = None, None, [], 0
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"Request {i}: write a short story about the sea."}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    for ch in stream:
        now = time.perf_counter()
        if ch.choices and (ch.choices[0].delta.content or ch.choices[0].delta.role is None):
            if first is None:
                first = now
            elif last is not None:
                gaps.append(now - last)
            last = now
        if ch.usage:
            n = ch.usage.completion_tokens
    return first - t0, gaps, n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests-per-level", type=int, default=0, help="default: max(4, concurrency)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--server-arg", action="append", default=[])
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    srv = Server(a.model, "--parallel", str(max(levels)), "--ctx-size", "512", "--model-name", "bench",
                 *a.server_arg, timeout=120)
    c = srv.client(timeout=600)
    one(c, "bench", -1, 2)  # warm up
    print(f"model {a.model}, max_tokens {a.max_tokens}")
    print("conc  reqs  req/s   out tok/s  TTFT p50/p99 ms   ITL p50/p99 ms")
    for conc in levels:
        nreq = a.requests_per_level or max(4, conc)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda i: one(c, "bench", i, a.max_tokens), range(nreq)))
        wall = time.perf_counter() - t0
        ttft = [r[0] * 1000 for r in res]
        itl = [g * 1000 for r in res for g in r[1]]
        toks = sum(r[2] for r in res)
        print(f"{conc:4d}  {nreq:4d}  {nreq / wall:6.2f}  {toks / wall:9.1f}  {pct(ttft, .5):7.0f}/{pct(ttft, .99):<7.0f}"
              f"  {pct(itl, .5):7.1f}/{pct(itl, .99):.1f}")
        sys.stdout.flush()
    h = srv.health()["service"]
    print(f"server: mean batch {h['mean_batch_seqs']:.2f} seqs/step, steps {h['decode_steps']}")
    srv.stop()


if __name__ == "__main__":
    main()
