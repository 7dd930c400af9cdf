#!/usr/bin/env python3
"""KV-cache quantization: quality and speed against the exact (f32) cache, one model, one run.

For each mode (none, f16, q8, q4, turboquant 4/3/2 bits; --modes picks some) anna scores the same text (teacher
forcing: the cache written during the prompt is the quantized one, so every position after
the first reads quantized keys and values) and decodes a fixed number of tokens:
  perplexity, top-1 agreement and mean KL against mode none, KV bytes per token,
  decode tok/s relative to none.
Usage: bench/kvquant_eval.py --model FILE.gguf [--n-eval 512] [--anna-bin build/src/cli]
Needs numpy.
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = [("none", []), ("f16", ["--kv-cache-quantization", "f16"]), ("q8", ["--kv-cache-quantization", "q8"]), ("q4", ["--kv-cache-quantization", "q4"]),
         ("turboquant 4", ["--kv-cache-quantization", "turboquant", "--kv-cache-quant-bits", "4"]),
         ("turboquant 3", ["--kv-cache-quantization", "turboquant", "--kv-cache-quant-bits", "3"]),
         ("turboquant 2", ["--kv-cache-quantization", "turboquant", "--kv-cache-quant-bits", "2"]),
         # --kv-cache-residual-len: the newest 128 positions of each query's past read in f32
         ("q4+r128", ["--kv-cache-quantization", "q4", "--kv-cache-residual-len", "128"]),
         ("turboquant 4+r128", ["--kv-cache-quantization", "turboquant", "--kv-cache-quant-bits", "4",
                                "--kv-cache-residual-len", "128"]),
         ("turboquant 2+r128", ["--kv-cache-quantization", "turboquant", "--kv-cache-quant-bits", "2",
                                "--kv-cache-residual-len", "128"])]


def lsm(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-eval", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=os.path.join(REPO, "bench", "data", "public_domain_en.txt"))
    ap.add_argument("--modes", default="", help="comma-separated subset of the modes (none is always run)")
    ap.add_argument("--anna-bin", default=os.path.join(REPO, "build", "src", "cli"))
    a = ap.parse_args()
    tok = subprocess.run([os.path.join(a.anna_bin, "anna-tokenize"), "--model", a.model, "--file", a.text],
                         check=True, capture_output=True, text=True).stdout.strip()
    ids = [int(x) for x in tok.split(",")][: a.n_eval]
    gen = os.path.join(a.anna_bin, "anna-generate")
    res = {}
    modes = [m for m in MODES if not a.modes or m[0] == "none" or m[0] in a.modes.split(",")]
    for name, flags in modes:
        out = "/tmp/anna_kvq.f32"
        subprocess.run([gen, "--model", a.model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "0",
                        "--dump-logits", out, "--quiet", "--threads", str(a.threads)] + flags, check=True)
        lg = np.fromfile(out, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)
        p = subprocess.run([gen, "--model", a.model, "--prompt-ids", ",".join(map(str, ids[:128])), "--max-new-tokens",
                            str(a.gen), "--threads", str(a.threads), "--temperature", "0", "--print-ids"] + flags,
                           check=True, capture_output=True, text=True).stderr
        m = re.search(r"generated (\d+) tok, ([\d.]+) tok/s \| KV (\d+) B/token", p)
        res[name] = (lg, float(m.group(2)), int(m.group(3)))
    base = lsm(res["none"][0])
    tgt = np.array(ids[1:])
    print(f"model {os.path.basename(a.model)}, {len(ids)} tokens scored, decode {a.gen} tokens after a 128-token prompt")
    print(f"{'KV cache':<14} {'bytes/token':>11} {'ppl':>9} {'top-1 = f32':>12} {'KL(f32||x)':>11} {'decode tok/s':>13} {'vs f32':>7}")
    for name, _ in modes:
        lg, tps, kvb = res[name]
        lp = lsm(lg)
        ppl = float(np.exp(-lp[np.arange(len(tgt)), tgt].mean()))
        agree = float((lg.argmax(-1) == res["none"][0].argmax(-1)).mean())
        kl = float((np.exp(base) * (base - lp)).sum(-1).mean())
        print(f"{name:<14} {kvb:>11} {ppl:>9.4f} {agree * 100:>11.2f}% {kl:>11.2e} {tps:>13.1f} {tps / res['none'][1]:>6.2f}x")


if __name__ == "__main__":
    sys.exit(main())
