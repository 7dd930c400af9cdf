#!/usr/bin/env python3
"""Writes two small SentencePiece-style tokenizer.json files and their reference ids (from
Hugging Face `tokenizers`), for the tokenizer.json path of Llama-2 / Gemma style models:
  spm_legacy/    normalizer Prepend("▁") + Replace(" ", "▁"), decoder Replace + ByteFallback
                 + Fuse + Strip(1), byte_fallback, fuse_unk, <s> template   (Llama 2)
  spm_metaspace/ pre_tokenizer Metaspace(prepend_scheme first, split false), decoder
                 Metaspace, byte_fallback                                   (Mistral style)
The vocabulary is trained here on a small corpus; <0x00>..<0xFF> are model vocab entries
as in the real files. Run: python3 gen_spm_json.py (needs `pip install tokenizers`)."""
import json
import os
from tokenizers import Tokenizer, models, trainers, normalizers, pre_tokenizers, decoders, processors

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = [
    "the quick brown fox jumps over the lazy dog", "hello world, hello there",
    "tokenizers split text into pieces", "byte fallback covers everything else",
    "numbers 123 456 and code def f(x): return x", "the theory of the thing is that",
] * 20
TEXTS = ["hello world", "Hello World!", "  two leading", "the fox\tand\nthe dog",
         "unseen: 你好 😀 ñ", "<s>inside</s> text", "", " ", "x", "abc   def  "]


def build(kind):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if kind == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                             initial_alphabet=list("▁abcdefghijklmnopqrstuvwxyz"))
    tok.train_from_iterator(CORPUS, tr)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for b in range(256):
        vocab["<0x%02X>" % b] = n + b
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return Tokenizer.from_str(json.dumps(j)), j


def main():
    out = {"texts": TEXTS, "tokenizers": []}
    for kind in ("legacy", "metaspace"):
        tok, j = build(kind)
        d = os.path.join(HERE, "spm_" + kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(j, f, ensure_ascii=False)
        cases = []
        for t in TEXTS:
            ids = tok.encode(t, add_special_tokens=False).ids
            cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        out["tokenizers"].append({"name": "spm_" + kind, "cases": cases,
                                  "special_ids": tok.encode(TEXTS[0]).ids})
    with open(os.path.join(HERE, "spm_expected.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
