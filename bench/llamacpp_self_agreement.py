#!/usr/bin/env python3
"""How well does llama.cpp agree with itself when only its attention precision changes?

Teacher-forced top-1 agreement over the first 512 tokens of bench/data/public_domain_en.txt
between llama.cpp runs with the default f16 KV cache, an f32 KV cache and flash attention,
and anna's default (anna-generate --dump-logits). Run with the llama.cpp venv's python:
  source ~/.cache/anna/llama.cpp/env.sh
  $LLAMA_CPP_PY bench/llamacpp_self_agreement.py MODEL.gguf build/src/cli/anna-generate
"""
import os, subprocess, sys, tempfile

import numpy as np
sys.path.insert(0, os.environ["LLAMA_CPP_PYTHONPATH"])
import llama_cpp
model, anna = sys.argv[1], sys.argv[2]
text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "public_domain_en.txt"), "rb").read().decode()
def run(**kw):
    llm = llama_cpp.Llama(model_path=model, n_ctx=528, n_batch=512, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, **kw)
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:512]
    llm.eval(ids); ll = np.array(llm.scores[:len(ids)], dtype=np.float32); del llm
    return ids, ll
ids, base = run()
_, f32kv = run(type_k=0, type_v=0)
_, fa = run(flash_attn=True)
out = os.path.join(tempfile.mkdtemp(), "anna.f32")
subprocess.run([anna, "--model", model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "0", "--dump-logits", out, "--threads", "2", "--quiet"], check=True)
al = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)[:, :base.shape[1]]
ag = lambda a, b: (a.argmax(1) == b.argmax(1)).mean()
print(f"llama f16kv vs llama f32kv {ag(base, f32kv):.4f} | vs llama FA {ag(base, fa):.4f}")
print(f"anna vs llama f16kv {ag(al, base):.4f} | anna vs llama f32kv {ag(al, f32kv):.4f} | anna vs llama FA {ag(al, fa):.4f}")
