#!/usr/bin/env python3
"""batch_invariance.py: issue #29's "batched == alone" check against a real anna-serve.

Starts anna-serve twice on one model: with --parallel 1 (every request alone, one after
another) and with --parallel N (all N requests at once, decoded in shared steps), sends the
same N greedy /v1/completions requests (token-id prompts of mixed lengths, ignore_eos,
fixed output length) to both and compares the generated token ids (logprobs off; the text and
the completion token count). Exit 0 when all N are equal. Standard library only, so it runs
on the GPU machine without the openai package.

  bench/batch_invariance.py --server BIN --model FILE [--n 64] [--max-tokens 32]
      [--device cuda] [--server-args "--deterministic"] [--vocab 151936] [--seed 7]
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, binary, model, device, parallel, ctx, extra, log):
        self.port = free_port()
        args = [binary, "--model", model, "--device", device, "--port", str(self.port), "--parallel", str(parallel),
                "--ctx-size", str(ctx)] + extra
        self.log = open(log, "w")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        until = time.time() + 300
        while time.time() < until:
            if self.p.poll() is not None:
                raise RuntimeError(f"anna-serve exited ({self.p.returncode}); see {log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                m = json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5))
                self.model = m["data"][0]["id"]
                return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError("anna-serve did not become ready")

    def complete(self, ids, max_tokens):
        body = json.dumps({"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True, "min_tokens": max_tokens}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            j = json.load(r)
        return j["choices"][0]["text"], j["usage"]["completion_tokens"]

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--vocab", type=int, default=150000, help="prompt ids are drawn below this")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # mixed prompt lengths: some share a step's prefill, some cross 64-token calls
    prompts = [[rng.randrange(min(1000, a.vocab // 2), a.vocab) for _ in range(rng.choice([5, 17, 40, 64, 100, 180]))] for _ in range(a.n)]
    ctx = 256 + a.max_tokens
    extra = a.server_args.split()
    t0 = time.time()
    s1 = Server(a.server, a.model, a.device, 1, ctx, extra, os.path.join(a.out, "inv_alone.log"))
    try:
        alone = [s1.complete(p, a.max_tokens) for p in prompts]
    finally:
        s1.stop()
    t1 = time.time()
    print(f"alone: {a.n} requests in {t1 - t0:.1f} s", flush=True)
    s2 = Server(a.server, a.model, a.device, a.n, ctx, extra, os.path.join(a.out, "inv_batched.log"))
    try:
        with cf.ThreadPoolExecutor(a.n) as ex:
            batched = list(ex.map(lambda p: s2.complete(p, a.max_tokens), prompts))
        h = json.load(urllib.request.urlopen(f"http://127.0.0.1:{s2.port}/healthz", timeout=5))
    finally:
        s2.stop()
    t2 = time.time()
    same = sum(x == y for x, y in zip(alone, batched))
    first = next((i for i, (x, y) in enumerate(zip(alone, batched)) if x != y), None)
    print(f"batched == alone: {same}/{a.n} equal ({a.max_tokens} tokens each; alone {t1 - t0:.1f} s, "
          f"batched {t2 - t1:.1f} s; mean batch seqs {h.get('service', {}).get('mean_batch_seqs')}; "
          f"server args '{a.server_args}')")
    if first is not None:
        print(f"  first difference: request {first} ({len(prompts[first])}-token prompt):\n"
              f"    alone   {alone[first][0][:120]!r}\n    batched {batched[first][0][:120]!r}")
    return 0 if same == a.n else 1


if __name__ == "__main__":
    sys.exit(main())
