#!/usr/bin/env python3
"""Transcription throughput of anna-serve at several concurrencies (issue 25).

Starts nothing: point it at a running anna-serve that serves a Qwen3-ASR model. For each
concurrency N it sends N * ROUNDS requests of the same clip through the official openai client,
N in flight at a time (all-at-once arrivals per round), and prints per N: requests, wall
seconds, requests/s, audio-seconds per wall second (RTFx of the aggregate), mean latency and
the output tokens per second (from the streamed done event's usage, stream=true), and the mean
tokens per engine step from /metrics (1.0: no batching; the media prompts' prefill runs outside
the counted steps, each prompt's last token inside them).

  python3 bench/asr_concurrency.py --url http://127.0.0.1:8080 --file clip.wav -c 1,4,8
"""
import argparse
import re
import statistics
import threading
import time
import urllib.request

import openai


def one(client, path, language, stream):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        kw = {"language": language} if language else {}
        if not stream:
            client.audio.transcriptions.create(model=MODEL, file=f, **kw)
            return time.perf_counter() - t0, 0
        ev = list(client.audio.transcriptions.create(model=MODEL, file=f, stream=True, **kw))
    done = ev[-1]
    return time.perf_counter() - t0, done.usage.output_tokens


def counters(url):
    """(engine steps, tokens over all steps) from /metrics."""
    m = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    get = lambda k: float(re.search(r"^%s (\S+)$" % k, m, re.M).group(1))
    return get("anna_decode_steps_total"), get("anna_batch_tokens_total")


def main():
    global MODEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--seconds", type=float, required=True, help="the clip's duration")
    ap.add_argument("-c", "--concurrency", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--language", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--no-stream", action="store_true", help="json responses (no output token counts)")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="anna", max_retries=0, timeout=600)
    MODEL = a.model or client.models.list().data[0].id
    stream = not a.no_stream
    one(client, a.file, a.language, stream)  # warm-up: encoder backend, first-touch pages
    print("%5s %5s %8s %8s %10s %9s %9s %10s" % ("N", "reqs", "wall_s", "req/s", "audio_s/s", "lat_ms", "out_tok/s",
                                                 "tok/step"))
    for n in [int(x) for x in a.concurrency.split(",")]:
        lat, toks = [], []
        s0, k0 = counters(a.url)
        t0 = time.perf_counter()
        for _ in range(a.rounds):
            out = [None] * n

            def run(i):
                out[i] = one(client, a.file, a.language, stream)

            ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            lat += [o[0] for o in out]
            toks += [o[1] for o in out]
        wall = time.perf_counter() - t0
        s1, k1 = counters(a.url)
        reqs = n * a.rounds
        print("%5d %5d %8.2f %8.2f %10.1f %9.0f %9.0f %10.2f" % (n, reqs, wall, reqs / wall, reqs * a.seconds / wall,
                                                                1000 * statistics.mean(lat), sum(toks) / wall,
                                                                (k1 - k0) / max(s1 - s0, 1)))


MODEL = None
if __name__ == "__main__":
    main()
