#!/usr/bin/env python3
"""Streaming speech at several concurrencies through anna-serve's /v1/audio/speech (issue 26).

Starts nothing: point it at a running anna-serve that serves a Qwen3-TTS folder. For each
concurrency N it opens N streams at once (response_format pcm: 16-bit 24 kHz mono, so bytes
are audio time), ROUNDS times, through the official openai client's streaming response
(urllib when the openai package is absent), and prints per N:
  first_ms   time to the first audio byte (p50 / p90 / max over the streams)
  rtf_x      audio seconds / seconds from request to last byte, mean per stream
  realtime   streams whose playback, started at their first byte, never ran dry: every chunk
             arrived before the audio already received had played out (50 ms slack)
  audio_s/s  audio seconds delivered per wall second, all streams together
`--max-frames F` sends "debug_max_frames" (the server needs --debug-hooks): random-weight
talkers rarely sample codec eos, so utterances are capped to F frames (12.5 per second).

  python3 bench/tts_concurrency.py --url http://127.0.0.1:8080 -c 1,16,64 --max-frames 100
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

RATE = 24000
SLACK = 0.05


def stream_urllib(url, body):
    req = urllib.request.Request(url + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        while True:
            b = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
            if not b:
                break
            yield b


def one(client, url, body):
    """[(t since request, bytes)] for one stream."""
    t0 = time.perf_counter()
    chunks = []
    if client is not None:
        extra = {k: v for k, v in body.items() if k not in ("model", "input", "voice", "response_format")}
        with client.audio.speech.with_streaming_response.create(
                model=body["model"], input=body["input"], voice=body["voice"], response_format="pcm",
                extra_body=extra) as r:
            for b in r.iter_bytes():
                chunks.append((time.perf_counter() - t0, len(b)))
    else:
        for b in stream_urllib(url, body):
            chunks.append((time.perf_counter() - t0, len(b)))
    return chunks


def judge(chunks):
    """(first byte s, audio s, total s, real-time?) of one stream."""
    if not chunks:
        return None
    first = chunks[0][0]
    have, ok = 0.0, True
    for t, n in chunks:
        if t - first > have + SLACK and have > 0:
            ok = False  # playback of what had arrived ended before this chunk came
        have += n / 2 / RATE
    return first, have, chunks[-1][0], ok


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("-c", "--concurrency", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--text", default="Hello there, this is a benchmark of streaming speech synthesis.")
    ap.add_argument("--voice", default="ryan")
    ap.add_argument("--language", default="english")
    ap.add_argument("--max-frames", type=int, default=0, help="debug_max_frames per request (server --debug-hooks)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--urllib", action="store_true", help="plain urllib instead of the openai client")
    a = ap.parse_args()
    client = None
    if not a.urllib:
        try:
            import openai
            client = openai.OpenAI(base_url=a.url + "/v1", api_key="anna", max_retries=0, timeout=600)
        except ImportError:
            client = None
    model = a.model
    if not model:
        model = json.load(urllib.request.urlopen(a.url + "/v1/models", timeout=30))["data"][0]["id"]
    body = {"model": model, "input": a.text, "voice": a.voice, "response_format": "pcm", "language": a.language}
    if a.max_frames:
        body["debug_max_frames"] = a.max_frames
    one(client, a.url, body)  # warm-up
    rows = []
    print("%5s %6s %9s %9s %9s %8s %7s %9s %10s" % ("N", "reqs", "first_p50", "first_p90", "first_max", "audio_s",
                                                     "rtf_x", "realtime", "audio_s/s"), flush=True)
    for n in [int(x) for x in a.concurrency.split(",")]:
        res = []
        t0 = time.perf_counter()
        for _ in range(a.rounds):
            out = [None] * n

            def run(i):
                try:
                    out[i] = judge(one(client, a.url, body))
                except Exception as e:  # counted as a failed stream
                    out[i] = ("error", str(e))

            ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            res += out
        wall = time.perf_counter() - t0
        good = [r for r in res if r and r[0] != "error"]
        errs = [r for r in res if not r or r[0] == "error"]
        if not good:
            print("%5d all %d streams failed: %s" % (n, len(res), errs[:1]), flush=True)
            rows.append({"n": n, "failed": len(res)})
            continue
        first = [g[0] * 1e3 for g in good]
        row = {"n": n, "reqs": len(res), "failed": len(errs), "first_ms_p50": pct(first, 0.5),
               "first_ms_p90": pct(first, 0.9), "first_ms_max": max(first),
               "audio_s_mean": statistics.mean(g[1] for g in good),
               "rtf_x_mean": statistics.mean(g[1] / g[2] for g in good),
               "realtime_streams": sum(1 for g in good if g[3]), "audio_s_per_s": sum(g[1] for g in good) / wall}
        rows.append(row)
        print("%5d %6d %9.0f %9.0f %9.0f %8.2f %7.2f %5d/%-3d %10.1f%s" % (
            n, len(res), row["first_ms_p50"], row["first_ms_p90"], row["first_ms_max"], row["audio_s_mean"],
            row["rtf_x_mean"], row["realtime_streams"], len(res), row["audio_s_per_s"],
            "  (%d failed: %s)" % (len(errs), errs[0][1][:80] if errs[0] else "") if errs else ""), flush=True)
        if a.json:  # after every row: a caller's timeout keeps the rows done
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
