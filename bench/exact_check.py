#!/usr/bin/env python3
"""Who is right? anna and llama.cpp against an exact reference on a real GGUF.

Both engines run quantized weights; neither is the truth. The truth for a quantized file is
the model computed with those exact (dequantized) weights and exact arithmetic. This script
computes that reference in float64 with numpy (weights dequantized by the `gguf` package,
llama.cpp's own Python library), for the archs of the registry models (llama, qwen2,
gemma3), then scores both engines against it on the same token ids (tokenized by llama.cpp):

  top-1 agreement with the reference, max |logit - ref|, mean KL(ref || engine),
  perplexity of each, and anna-vs-llama.cpp agreement.

Usage (needs scripts/setup_llamacpp.sh, a built anna, and `pip install gguf numpy`):
  bench/exact_check.py --model FILE.gguf [--n-eval 256] [--anna-bin build/src/cli] [--anna-args=--exact]
Runs its llama.cpp half under the llama.cpp venv's python (numpy + the binding); the
reference (gguf's numpy dequantize + float64 math) runs in this python.
"""
import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("ANNA_CACHE") or os.path.expanduser("~/.cache/anna")


def reference_logits(path, ids):
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)
    T = {t.name: t for t in r.tensors}

    def W(name):
        t = T[name]
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(x) for x in reversed(t.shape)]
        return a.reshape(shape) if len(shape) > 1 else a.reshape(-1)

    def has(name):
        return name in T

    def kv(key, default=None):
        if key not in r.fields:
            return default
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return v.tolist()[0] if len(v) == 1 else v.tolist()

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    g = lambda k, d=None: kv(f"{arch}.{k}", d)
    L, H = int(g("block_count")), int(g("embedding_length"))
    nh, nkv = int(g("attention.head_count")), int(g("attention.head_count_kv"))
    D = int(g("attention.key_length", H // nh))
    eps = float(g("attention.layer_norm_rms_epsilon"))
    theta = float(g("rope.freq_base", 10000.0))
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    gemma = arch == "gemma3"
    emb = W("token_embd.weight")
    x = emb[np.array(ids)]
    if gemma:
        x = x * np.float64(np.float32(np.sqrt(H)))

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v, base, interleaved, factor=1.0):  # v [n, heads, D]
        half = D // 2
        inv = 1.0 / base ** (np.arange(half) * 2.0 / D) / factor
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = v.copy()
        if interleaved:
            a, b = v[..., 0::2], v[..., 1::2]
            out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        else:
            a, b = v[..., :half], v[..., half:]
            out[..., :half], out[..., half:] = a * c - b * s, b * c + a * s
        return out

    def gelu(a):
        return 0.5 * a * (1 + np.tanh(0.7978845608028654 * (a + 0.044715 * a ** 3)))

    window = int(g("attention.sliding_window", 0) or 0)
    scale_factor = float(g("rope.scaling.factor", 1.0) or 1.0)
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W(p + "attn_norm.weight"))
        q = h @ W(p + "attn_q.weight").T
        k = h @ W(p + "attn_k.weight").T
        v = h @ W(p + "attn_v.weight").T
        if has(p + "attn_q.bias"):
            q, k, v = q + W(p + "attn_q.bias"), k + W(p + "attn_k.bias"), v + W(p + "attn_v.bias")
        q, k, v = q.reshape(n, nh, D), k.reshape(n, nkv, D), v.reshape(n, nkv, D)
        if has(p + "attn_q_norm.weight"):
            q, k = rms(q, W(p + "attn_q_norm.weight")), rms(k, W(p + "attn_k_norm.weight"))
        sliding = gemma and (i + 1) % 6 != 0
        base = float(g("rope.freq_base_swa", 10000.0)) if sliding else theta
        fac = 1.0 if sliding else scale_factor
        q, k = rope(q, base, arch == "llama", fac), rope(k, base, arch == "llama", fac)
        grp = nh // nkv
        k, v = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D)
        mask = np.tril(np.ones((n, n), dtype=bool))
        if sliding and window:
            mask &= (pos[:, None] - pos[None, :]) < window
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(n, nh * D) @ W(p + "attn_output.weight").T
        if gemma:
            o = rms(o, W(p + "post_attention_norm.weight"))
        x = x + o
        h = rms(x, W(p + "ffn_norm.weight"))
        a, b = h @ W(p + "ffn_gate.weight").T, h @ W(p + "ffn_up.weight").T
        act = gelu(a) if gemma else a / (1 + np.exp(-a))
        f = (act * b) @ W(p + "ffn_down.weight").T
        if gemma:
            f = rms(f, W(p + "post_ffw_norm.weight"))
        x = x + f
    x = rms(x, W("output_norm.weight"))
    out = W("output.weight") if has("output.weight") else emb
    return x @ out.T


def worker(a):
    """llama.cpp half, under the llama.cpp venv: tokenize and score with the binding."""
    import numpy as np
    import llama_cpp

    text = open(a.text, encoding="utf-8").read()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.n_eval + 16, n_batch=512, n_threads=a.threads,
                          n_threads_batch=a.threads, logits_all=True, verbose=False)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[: a.n_eval]
    llm.eval(ids)
    np.save(a.tmp + ".llama.npy", np.array(llm.scores[: len(ids)], dtype=np.float32))
    print(json.dumps({"ids": ids}))


def compare(a, ids):
    import numpy as np

    lc = np.load(a.tmp + ".llama.npy").astype(np.float64)
    anna = os.path.join(a.anna_bin, "anna-generate")
    subprocess.run([anna, "--model", a.model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "0",
                    "--dump-logits", a.tmp, "--quiet", "--threads", str(a.threads)] + a.anna_args.split(), check=True)
    an = np.fromfile(a.tmp, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)
    ref = reference_logits(a.model, ids)
    vocab = min(ref.shape[1], lc.shape[1], an.shape[1])
    ref, lc, an = ref[:, :vocab], lc[:, :vocab], an[:, :vocab]

    def lsm(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    pr = lsm(ref)
    tgt = np.array(ids[1:])

    def score(z):
        pz = lsm(z)
        return {
            "top1_vs_ref": float((z.argmax(-1) == ref.argmax(-1)).mean()),
            "max_abs_logit_diff": float(np.abs(z - ref).max()),
            "kl_ref_mean": float((np.exp(pr) * (pr - pz)).sum(-1).mean()),
            "ppl": float(np.exp(-pz[np.arange(len(tgt)), tgt].mean())),
        }

    return {"model": os.path.basename(a.model), "n_tokens": len(ids), "reference_ppl": score(ref)["ppl"],
            "anna": score(an), "llama.cpp": score(lc),
            "anna_vs_llama_top1": float((an.argmax(-1) == lc.argmax(-1)).mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-eval", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=os.path.join(REPO, "bench", "data", "public_domain_en.txt"))
    ap.add_argument("--anna-bin", default=os.path.join(REPO, "build", "src", "cli"))
    ap.add_argument("--anna-args", default="",
                    help="extra anna-generate flags, e.g. --anna-args=--exact (exact f32 matmuls)")
    ap.add_argument("--tmp", default="/tmp/anna_exact_check.f32")
    ap.add_argument("--json", dest="json_out", help="also write the results here")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._worker:
        return worker(a)
    env = dict(os.environ)
    for line in open(os.path.join(CACHE, "llama.cpp", "env.sh")):
        if line.startswith("export ") and "=" in line:
            k, v = line[7:].strip().split("=", 1)
            env[k] = v.strip('"')
    env["PYTHONPATH"] = os.pathsep.join([env.get("LLAMA_CPP_PYTHONPATH", ""), env.get("PYTHONPATH", "")])
    py = env.get("LLAMA_CPP_PY", sys.executable)
    proc = subprocess.run([py, os.path.abspath(__file__), "--_worker"] + sys.argv[1:], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return 1
    ids = json.loads(proc.stdout.strip().splitlines()[-1])["ids"]
    r = compare(a, ids)
    if a.json_out:
        json.dump(r, open(a.json_out, "w"), indent=1)
    print(f"model {r['model']}  tokens {r['n_tokens']}  reference ppl {r['reference_ppl']:.4f}")
    print(f"{'engine':<10} {'top-1 = ref':>12} {'max|logit-ref|':>15} {'KL(ref||x)':>11} {'ppl':>9}")
    for e in ("anna", "llama.cpp"):
        s = r[e]
        print(f"{e:<10} {s['top1_vs_ref']:>12.4f} {s['max_abs_logit_diff']:>15.4f} {s['kl_ref_mean']:>11.2e} {s['ppl']:>9.4f}")
    print(f"anna vs llama.cpp top-1 agreement: {r['anna_vs_llama_top1']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
