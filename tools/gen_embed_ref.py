#!/usr/bin/env python3
"""Expected /v1/embeddings vectors for tests/server/test_embeddings.py, from transformers.

Qwen3-Embedding's pooling: the last token's last_hidden_state (after the final norm), L2
normalized, on the tokenizer's default encoding (add_special_tokens=True). Run in the hf venv:
  ~/.cache/anna/venvs/hf/bin/python tools/gen_embed_ref.py [FIXTURE_DIR] [OUT_JSON]
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
fixture = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared", "fixtures", "qwen3")
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "tests", "server", "data", "embed_ref_qwen3.json")

TEXTS = ["Hello there", "The quick brown fox jumps over the lazy dog.", "x",
         "Embeddings pool the last token of the sequence, then normalize the vector to unit length. " * 4]
IDS = [[5, 17, 300, 42, 999], [7]]

tok = AutoTokenizer.from_pretrained(fixture)
model = AutoModel.from_pretrained(fixture, dtype=torch.float32).eval()

cases = []
with torch.no_grad():
    for kind, inp in [("text", t) for t in TEXTS] + [("ids", i) for i in IDS]:
        ids = tok(inp)["input_ids"] if kind == "text" else inp
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        v = F.normalize(h, dim=0)
        cases.append({"kind": kind, "input": inp, "n_tokens": len(ids), "embedding": [round(float(x), 7) for x in v]})
with open(out, "w") as f:
    json.dump({"fixture": os.path.basename(os.path.normpath(fixture)), "pooling": "last_token, l2-normalized",
               "hidden": model.config.hidden_size, "cases": cases}, f, indent=0)
print("wrote", out, len(cases), "cases")
