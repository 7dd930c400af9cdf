#!/usr/bin/env python3
"""--weight-quant int4 against the bf16 weights of the same Hugging Face folder, one run.

Scores the same text (teacher forcing) with the folder as stored (bf16) and with
--weight-quant int4 (anna's Q4_K_M mix, cached GGUF): perplexity of each, top-1 agreement and
mean KL(bf16 || int4) over the scored positions; and load times: bf16 folder, int4 with an
empty cache (quantize + write + load) and int4 from the cache.
Usage: bench/int4_eval.py --model-dir DIR [--n-eval 512] [--anna-bin build/src/cli]
Needs numpy. Uses a private cache folder (ANNA_CACHE) under /tmp.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lsm(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--n-eval", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=os.path.join(REPO, "bench", "data", "public_domain_en.txt"))
    ap.add_argument("--anna-bin", default=os.path.join(REPO, "build", "src", "cli"))
    a = ap.parse_args()
    env = dict(os.environ, ANNA_CACHE="/tmp/anna_int4_eval_cache")
    shutil.rmtree(env["ANNA_CACHE"], ignore_errors=True)
    tok = subprocess.run([os.path.join(a.anna_bin, "anna-tokenize"), "--model", a.model_dir, "--file", a.text],
                         check=True, capture_output=True, text=True).stdout.strip()
    ids = [int(x) for x in tok.split(",")][: a.n_eval]
    gen = os.path.join(a.anna_bin, "anna-generate")

    def run(wq, prompt, out=None):
        cmd = [gen, "--model-dir", a.model_dir, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "0",
               "--quiet", "--threads", str(a.threads), "--weight-quant", wq]
        if out:
            cmd += ["--dump-logits", out]
        t0 = time.time()
        subprocess.run(cmd, check=True, env=env)
        return time.time() - t0

    t_bf16 = run("none", ids[:1])
    t_cold = run("int4", ids[:1])
    t_warm = run("int4", ids[:1])
    res = {}
    for wq in ("none", "int4"):
        out = f"/tmp/anna_int4_eval_{wq}.f32"
        run(wq, ids, out)
        res[wq] = np.fromfile(out, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)
    tgt = np.array(ids[1:])
    base = lsm(res["none"])
    print(f"model {a.model_dir}, {len(ids)} tokens of {os.path.basename(a.text)} scored")
    print(f"load + 1-token prefill (wall s): bf16 folder {t_bf16:.2f}, int4 empty cache {t_cold:.2f}, int4 cached {t_warm:.2f}")
    print(f"{'weights':<8} {'ppl':>9} {'top-1 = bf16':>13} {'KL(bf16||x)':>12}")
    for wq in ("none", "int4"):
        lp = lsm(res[wq])
        ppl = float(np.exp(-lp[:-1][np.arange(len(tgt)), tgt].mean()))
        agree = float((res[wq].argmax(-1) == res["none"].argmax(-1)).mean())
        kl = float((np.exp(base) * (base - lp)).sum(-1).mean())
        print(f"{'bf16' if wq == 'none' else wq:<8} {ppl:>9.4f} {agree * 100:>12.2f}% {kl:>12.2e}")


if __name__ == "__main__":
    sys.exit(main())
