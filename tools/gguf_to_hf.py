#!/usr/bin/env python3
"""GGUF (qwen2 / qwen3) -> a Hugging Face bf16 folder, to give the int4 path a real-shaped
bf16 source when only a GGUF is at hand (bench/notes/int4.md).

Dequantizes every tensor with the `gguf` package (pip install gguf numpy), rounds to bf16
and writes config.json + model.safetensors under the transformers names; tokenizer.json and
tokenizer_config.json are copied from --tokenizer-dir (the GGUF's own vocabulary must match
it: the script checks the token count). Only families whose GGUF layout is the HF layout
(no q/k permutation) are accepted: qwen2, qwen3.

Usage: tools/gguf_to_hf.py MODEL.gguf OUT_DIR --tokenizer-dir DIR
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def hf_name(n):
    if n in NAMES:
        return NAMES[n]
    if n.startswith("blk."):
        _, i, rest = n.split(".", 2)
        if rest in BLK:
            return f"model.layers.{i}.{BLK[rest]}"
    raise SystemExit(f"error: no Hugging Face name for tensor {n}")


def to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--tokenizer-dir", required=True)
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if arch not in ("qwen2", "qwen3"):
        raise SystemExit(f"error: architecture {arch} is not supported (have: qwen2, qwen3)")
    os.makedirs(a.out, exist_ok=True)
    tensors = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type) if t.tensor_type not in (GGMLQuantizationType.F32,) else np.asarray(t.data)
        shape = [int(s) for s in reversed(t.shape.tolist())]
        while len(shape) > 1 and shape[0] == 1:
            shape = shape[1:]
        tensors[hf_name(t.name)] = (to_bf16(np.asarray(x, dtype=np.float32).reshape(shape)), shape)
    # safetensors: 8-byte header length, JSON header (padded to 8), data
    header, off, order = {"__metadata__": {"format": "pt"}}, 0, sorted(tensors)
    for n in order:
        arr, shape = tensors[n]
        header[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(len(hj).to_bytes(8, "little"))
        f.write(hj)
        for n in order:
            f.write(tensors[n][0].tobytes())
    emb = tensors["model.embed_tokens.weight"][1]
    k = lambda s, d=None: field(r, f"{arch}.{s}", d)
    n_head = int(k("attention.head_count"))
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "Qwen3ForCausalLM"],
        "model_type": arch,
        "hidden_size": int(k("embedding_length")),
        "intermediate_size": int(k("feed_forward_length")),
        "num_hidden_layers": int(k("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(k("attention.head_count_kv", n_head)),
        "head_dim": int(k("attention.key_length", int(k("embedding_length")) // n_head)),
        "max_position_embeddings": int(k("context_length", 32768)),
        "rms_norm_eps": float(k("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(k("rope.freq_base", 10000.0)),
        "vocab_size": int(emb[0]),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(r, "tokenizer.ggml.eos_token_id"),
    }
    cfg = {kk: (int(v) if isinstance(v, np.integer) else v) for kk, v in cfg.items() if v is not None}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer_dir, fn), os.path.join(a.out, fn))
    tj = json.load(open(os.path.join(a.out, "tokenizer.json")))
    n_tok = len(tj["model"]["vocab"]) + sum(1 for t in tj.get("added_tokens", []) if t["content"] not in tj["model"]["vocab"])
    n_gguf = len(field(r, "tokenizer.ggml.tokens", []))
    if n_tok > n_gguf:
        raise SystemExit(f"error: tokenizer has {n_tok} tokens, the GGUF {n_gguf}")
    print(f"{a.out}: {len(tensors)} tensors, {off / 2**20:.1f} MiB bf16")


if __name__ == "__main__":
    sys.exit(main())
