"""anna-perplexity against an independent computation: llama-perplexity's chunking redone here
in Python over the logits anna-generate dumps (--dump-logits) for each chunk, on the tiny qwen2
fixture model. Also the --save-logits file (llama.cpp's --kl-divergence-base format) decoded
here, and --kl-base's KL divergence recomputed from two sets of dumped logits.
Needs ANNA_BIN_DIR (the built CLIs) and ANNA_FIXTURES."""

import array
import json
import math
import os
import random
import re
import struct
import subprocess

import pytest

BIN = os.environ.get("ANNA_BIN_DIR", "build/src/cli")
FIX = os.environ.get("ANNA_FIXTURES", os.path.join(os.path.dirname(__file__), "../../../shared/fixtures"))
MODEL = os.path.join(FIX, "qwen2")
CTX = 32
CHUNKS = 3


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    """The qwen2 fixture with a tokenizer that adds a BOS (<|endoftext|>): each chunk's first
    token must then be replaced by it, as llama-perplexity does."""
    d = tmp_path_factory.mktemp("bos")
    for f in ("config.json", "generation_config.json", "model.safetensors", "chat_template.jinja"):
        os.symlink(os.path.join(MODEL, f), d / f)
    tok = json.load(open(os.path.join(MODEL, "tokenizer.json")))
    bos = next(a for a in tok["added_tokens"] if a["content"] == "<|endoftext|>")
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bos["id"]], "tokens": ["<|endoftext|>"]}},
    }
    json.dump(tok, open(d / "tokenizer.json", "w"))
    cfg = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
    cfg["bos_token"] = "<|endoftext|>"
    cfg["add_bos_token"] = True
    json.dump(cfg, open(d / "tokenizer_config.json", "w"))
    return str(d)


def run(*args, ok=True):
    p = subprocess.run([os.path.join(BIN, args[0]), *args[1:]], capture_output=True, text=True, timeout=300)
    assert "Sanitizer" not in p.stderr, p.stderr  # an ASan build: failures must be clean too
    if ok:
        assert p.returncode == 0, p.stderr
    else:
        assert p.returncode != 0, p.stdout
    return p


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rnd = random.Random(7)
    words = ("the model reads a chunk of text and predicts every next token from what came before it "
             "while the cache keeps keys and values for positions already seen").split()
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(" ".join(rnd.choice(words) for _ in range(600)) + "\n")
    return str(path)


def tokens(text_file, model=MODEL):
    out = run("anna-tokenize", "--model-dir", model, "--file", text_file, "--add-special",
              "--no-parse-special").stdout.strip()
    ids = [int(x) for x in out.split(",")]
    empty = run("anna-tokenize", "--model-dir", model, "--text", "", "--add-special").stdout.strip()
    bos = int(empty.split(",")[0]) if empty else None
    return ids, bos


def dump_logits(ids, tmp, *extra, model=MODEL):
    f = os.path.join(tmp, "logits.f32")
    run("anna-generate", "--model-dir", model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "0",
        "--dump-logits", f, "--quiet", *extra)
    a = array.array("f")
    with open(f, "rb") as fh:
        a.frombytes(fh.read())
    V = len(a) // len(ids)
    assert V * len(ids) == len(a)
    return [a[i * V:(i + 1) * V] for i in range(len(ids))], V


def log_softmax(row):
    mx = max(row)
    lse = mx + math.log(sum(math.exp(x - mx) for x in row))
    return [x - lse for x in row]


def reference(text_file, tmp, *extra, model=MODEL):
    """Per scored position: (target, log-probs), in llama-perplexity's order."""
    ids, bos = tokens(text_file, model)
    n_chunk = min(len(ids) // CTX, CHUNKS)
    first = CTX // 2
    out = []
    for c in range(n_chunk):
        chunk = ids[c * CTX:(c + 1) * CTX]
        if bos is not None:
            chunk = [bos] + chunk[1:]
        rows, V = dump_logits(chunk, tmp, *extra, model=model)
        for p in range(first, CTX - 1):
            out.append((ids[c * CTX + p + 1], log_softmax(rows[p])))
    return ids, out


def final_ppl(stdout):
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", stdout)
    assert m, stdout
    return float(m.group(1))


@pytest.mark.parametrize("with_bos", [False, True])
def test_ppl_matches_independent_computation(text_file, tmp_path, bos_model, with_bos):
    model = bos_model if with_bos else MODEL
    ids, bos = tokens(text_file, model)
    assert (bos is not None) == with_bos and (not with_bos or ids[0] == bos)
    _, ref = reference(text_file, str(tmp_path), model=model)
    assert len(ref) == CHUNKS * (CTX - 1 - CTX // 2)
    nlls = [-lp[t] for t, lp in ref]
    want = math.exp(sum(nlls) / len(nlls))
    per = CTX - 1 - CTX // 2
    running = [math.exp(sum(nlls[:k * per]) / (k * per)) for k in range(1, CHUNKS + 1)]
    for batch in ("32", "7"):  # one decode call per chunk, and several
        p = run("anna-perplexity", "--model-dir", model, "--file", text_file, "--ctx", str(CTX), "--chunks",
                str(CHUNKS), "--batch", batch)
        got = final_ppl(p.stdout)
        assert abs(got - want) <= 1e-4 * want + 1e-4, (batch, got, want)
        marks = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", p.stdout)]
        assert len(marks) == CHUNKS
        for a, b in zip(marks, running):
            assert abs(a - b) <= 1e-4 * b + 1e-4


def read_base(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"_logits_"
    n_ctx, V, n_chunk = struct.unpack_from("<Iii", data, 8)
    off = 20
    toks = list(struct.unpack_from("<%di" % (n_ctx * n_chunk), data, off))
    off += 4 * n_ctx * n_chunk
    nv = 2 * ((V + 1) // 2) + 4
    rows = []
    while off < len(data):
        scale, min_lp = struct.unpack_from("<ff", data, off)
        codes = struct.unpack_from("<%dH" % V, data, off + 8)
        rows.append([scale * c + min_lp for c in codes])
        off += 2 * nv
    assert off == len(data)
    return n_ctx, V, n_chunk, toks, rows


def kld(base_lp, q_lp):
    return sum(math.exp(b) * (b - q) for b, q in zip(base_lp, q_lp) if b > -16)


def test_save_logits_format_and_kl(text_file, tmp_path):
    ids, ref = reference(text_file, str(tmp_path))
    base = str(tmp_path / "base.kld")
    run("anna-perplexity", "--model-dir", MODEL, "--file", text_file, "--ctx", str(CTX), "--chunks", str(CHUNKS),
        "--save-logits", base)
    n_ctx, V, n_chunk, toks, rows = read_base(base)
    assert (n_ctx, n_chunk) == (CTX, CHUNKS) and toks == ids[:CTX * CHUNKS]
    assert len(rows) == len(ref)
    for (t, lp), row in zip(ref, rows):
        top = max(lp)
        for a, b in zip(lp, row):
            if a > top - 15.9:  # inside the stored 16-nat window: one code step of error at most
                assert abs(a - b) < 16 / 65535 + 1e-4
    # Same model against its own base: only the 16-bit rounding is left.
    p = run("anna-perplexity", "--model-dir", MODEL, "--kl-base", base)
    m = re.search(r"Mean KLD\s*: ([0-9.e-]+)", p.stdout)
    assert m and float(m.group(1)) < 1e-5, p.stdout
    assert "Same top p         : 100.000 %" in p.stdout
    # A different model (a 4-bit KV cache): the tool's KLD equals the one computed here from
    # anna-generate's logits under the same setting and the decoded base rows.
    _, q = reference(text_file, str(tmp_path), "--kv-cache-quantization", "q4")
    want = sum(kld(row, lp) for row, (_, lp) in zip(rows, q)) / len(q)
    p = run("anna-perplexity", "--model-dir", MODEL, "--kl-base", base, "--kv-cache-quantization", "q4")
    got = float(re.search(r"Mean KLD\s*: ([0-9.e-]+)", p.stdout).group(1))
    assert want > 1e-5, "the q4 cache should move the logits"
    assert abs(got - want) <= 1e-3 * want + 2e-6, (got, want)


def test_errors(text_file, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("a few words only")
    err = run("anna-perplexity", "--model-dir", MODEL, "--file", str(short), "--ctx", "64", ok=False).stderr
    assert "needs at least 128" in err
    bad = tmp_path / "bad.kld"
    bad.write_bytes(b"not a logits file at all")
    err = run("anna-perplexity", "--model-dir", MODEL, "--kl-base", str(bad), ok=False).stderr
    assert "_logits_" in err
    trunc = tmp_path / "trunc.kld"
    trunc.write_bytes(b"_logits_" + struct.pack("<Iii", 32, 1000, 2) + struct.pack("<64i", *range(64)) + b"\0" * 100)
    err = run("anna-perplexity", "--model-dir", MODEL, "--kl-base", str(trunc), ok=False).stderr
    assert "truncated" in err
    wrongv = tmp_path / "wrongv.kld"
    wrongv.write_bytes(b"_logits_" + struct.pack("<Iii", 32, 999, 2))
    assert "vocabulary 999" in run("anna-perplexity", "--model-dir", MODEL, "--kl-base", str(wrongv), ok=False).stderr
    assert "exclude" in run("anna-perplexity", "--model-dir", MODEL, "--kl-base", "x", "--save-logits", "y",
                            ok=False).stderr
