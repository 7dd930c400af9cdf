"""Model drafters in the server (issue 28): --speculative mtp (the checkpoint's MTP head,
tests/fixtures/qwen3_5_mtp dense and MoE) and --draft-model PATH (a second model with the
same vocabulary). Greedy replies equal plain decoding's, alone, streamed and with concurrent
neighbours (some of which cannot take windows: logprobs, sampled); a seeded sampled request
gives plain sampling's text; the model itself as its own draft model has every draft
accepted; errors name what was wrong (no MTP head, a draft model path that does not load, a
vocabulary mismatch, contradictory flags). Random-weight fixtures: the MTP head's drafts are
almost never accepted (bench/notes/mtp.md), so only the draft-model test checks acceptance."""
import concurrent.futures as cf
import os
import subprocess

import pytest

from conftest import FIXTURES, ROOT, server_bin, start_server

MTP = os.path.join(ROOT, "tests", "fixtures", "qwen3_5_mtp")
PROMPTS = ["a b c d e a b c d e a b c d e a b c", "def add(x, y):\n    return x + y\n\ndef add(x, y):\n",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "The cat sat. The cat sat. The cat"]


def mtp_model(name, tmp_path_factory):
    """The fixture folder; the MoE one has no tokenizer (its tests use ids): the dense one's
    tokenizer files (the same 1000-token vocabulary) beside links to its config and weights."""
    src = os.path.join(MTP, name)
    if os.path.exists(os.path.join(src, "tokenizer.json")):
        return src
    d = tmp_path_factory.mktemp("mtp_" + name)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(d, f))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.join(MTP, "dense", f), os.path.join(d, f))
    return str(d)


def greedy(client, model, prompt, max_tokens=32, **extra):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text, r.usage


def streamed(client, model, prompt, max_tokens=32):
    text = ""
    for ch in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True}):
        if ch.choices:
            text += ch.choices[0].text or ""
    return text


def sampled(client, model, prompt, seed, max_tokens=32):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.8, top_p=0.95,
                                  seed=seed, extra_body={"ignore_eos": True, "top_k": 40})
    return r.choices[0].text, r.usage


def spec_stats(srv):
    return srv.get_json("/healthz")["speculative"]


def metric(srv, name):
    import urllib.request
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def check_equal_plain(plain, spec, drafter):
    a, b = plain.client(), spec.client()
    m = a.models.list().data[0].id
    want = [greedy(a, m, p)[0] for p in PROMPTS]
    alone = [greedy(b, m, p) for p in PROMPTS]
    assert [t for t, _ in alone] == want
    for _, u in alone:  # every request speculated: usage says how its drafts went
        d = u.completion_tokens_details
        assert d is not None and d.accepted_prediction_tokens + d.rejected_prediction_tokens > 0, u
    assert [streamed(b, m, p) for p in PROMPTS] == want
    with cf.ThreadPoolExecutor(8) as ex:
        fut = [ex.submit(greedy, b, m, p) for p in PROMPTS]
        # neighbours that decode plainly (logprobs) or sample in the same steps
        ex.submit(lambda: b.completions.create(model=m, prompt="x y", max_tokens=24, temperature=0.9, seed=3,
                                               extra_body={"ignore_eos": True}))
        ex.submit(lambda: b.completions.create(model=m, prompt="x y", max_tokens=24, temperature=0, logprobs=2,
                                               extra_body={"ignore_eos": True}))
        sfut = [ex.submit(streamed, b, m, p) for p in PROMPTS[:2]]
        got = [f.result()[0] for f in fut]
        got_s = [f.result() for f in sfut]
    assert got == want and got_s == want[:2]
    st = spec_stats(spec)
    assert st["drafter"] == drafter and st["windows"] > 0 and st["drafted"] > 0, st
    assert metric(spec, f'anna_spec_decode_draft_tokens_total{{drafter="{drafter}"}}') == st["drafted"]
    assert metric(spec, f'anna_spec_decode_accepted_tokens_total{{drafter="{drafter}"}}') == st["accepted"]
    # a seeded sampled request: plain sampling's text (speculative sampling keeps the draws),
    # alone and four at once with a greedy neighbour (sampled windows verified together)
    want_s = [sampled(a, m, p, 7 + i)[0] for i, p in enumerate(PROMPTS)]
    for i, p in enumerate(PROMPTS[:2]):
        t, u = sampled(b, m, p, 7 + i)
        assert t == want_s[i]
        assert u.completion_tokens_details is not None
    with cf.ThreadPoolExecutor(5) as ex:
        fut = [ex.submit(sampled, b, m, p, 7 + i) for i, p in enumerate(PROMPTS)]
        g = ex.submit(greedy, b, m, PROMPTS[0])
        assert [f.result()[0] for f in fut] == want_s and g.result()[0] == want[0]
    assert spec.wait_idle()["memory"]["kv_tokens_used"] == 0
    return st


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_mtp_equals_plain(name, tmp_path_factory):
    model = mtp_model(name, tmp_path_factory)
    args = ("--parallel", "4", "--ctx-size", "256")
    plain = start_server(model, *args)
    spec = start_server(model, *args, "--speculative", "mtp", "--draft-max", "3")
    try:
        check_equal_plain(plain, spec, "mtp")
        assert spec_stats(plain)["drafter"] == "ngram" and spec_stats(plain)["windows"] == 0
    finally:
        plain.stop()
        spec.stop()


# MTP through a small batch: windows are cut to the rows left (k = 0 windows keep the head in
# step); without the prompt cache (whose checkpoints the hybrid model's rollback used to borrow)
@pytest.mark.parametrize("extra", [("--batch-size", "6"), ("--no-prompt-cache",)], ids=["small-batch", "no-cache"])
def test_mtp_small_batch(extra):
    model = os.path.join(MTP, "dense")
    plain = start_server(model, "--parallel", "4", "--ctx-size", "256")
    spec = start_server(model, "--parallel", "4", "--ctx-size", "256", "--speculative", "mtp", "--draft-max", "4",
                        *extra)
    try:
        a, b = plain.client(), spec.client()
        m = a.models.list().data[0].id
        want = [greedy(a, m, p)[0] for p in PROMPTS]
        with cf.ThreadPoolExecutor(4) as ex:
            got = [f.result()[0] for f in [ex.submit(greedy, b, m, p) for p in PROMPTS]]
        assert got == want
    finally:
        plain.stop()
        spec.stop()


# The model itself as its draft model: every draft is the target's own greedy choice. The
# draft context follows the target's prompt chunks (an 8-row batch cuts prompts into several
# and leaves some steps without window rows, after which the draft model catches up; 16-token
# KV blocks let a longer prompt reuse a cached prefix, which the draft takes with its first chunk).
@pytest.mark.parametrize("model,extra", [("qwen3", ()), ("qwen3_5", ()), ("qwen3", ("--batch-size", "8")),
                                         ("qwen3_5", ("--kv-block-len", "16"))],
                         ids=["qwen3", "qwen3_5", "qwen3-batch8", "qwen3_5-prefix"])
def test_draft_model_self(model, extra):
    path = os.path.join(FIXTURES, model)
    args = ("--parallel", "4", "--ctx-size", "256")
    plain = start_server(path, *args)
    spec = start_server(path, *args, "--draft-model", path, "--draft-max", "4", *extra)
    try:
        check_equal_plain(plain, spec, "draft")
        # greedy windows of the draft's own greedy tokens: all accepted (the sampled ones in
        # check_equal_plain reject some, the greedy ones none); a fresh count over greedy only
        st = spec_stats(spec)
        a0, d0 = st["accepted"], st["drafted"]
        b = spec.client()
        m = b.models.list().data[0].id
        with cf.ThreadPoolExecutor(4) as ex:
            us = [f.result()[1] for f in [ex.submit(greedy, b, m, p) for p in PROMPTS]]
        st = spec_stats(spec)
        assert st["drafted"] - d0 > 0 and st["accepted"] - a0 == st["drafted"] - d0, st
        assert all(u.completion_tokens_details.rejected_prediction_tokens == 0 for u in us)
        assert all(u.completion_tokens_details.accepted_prediction_tokens > 0 for u in us)
        # a prompt that extends an earlier one: its cached prefix, then the rest in chunks
        long = " ".join(PROMPTS * 2)
        a = plain.client()
        for p in (long, long + " and then some more words to extend it"):
            t, u = greedy(b, m, p)
            assert t == greedy(a, m, p)[0]
            assert u.completion_tokens_details.rejected_prediction_tokens == 0, u
    finally:
        plain.stop()
        spec.stop()


# "speculative": true opts in to the draft model on a server whose default is off
def test_draft_model_opt_in():
    path = os.path.join(FIXTURES, "qwen3")
    srv = start_server(path, "--parallel", "2", "--ctx-size", "256", "--speculative", "none", "--draft-model", path)
    try:
        c = srv.client()
        st = spec_stats(srv)
        assert st["drafter"] == "draft" and st["default"] is False
        t, u = greedy(c, "qwen3", PROMPTS[0])
        assert spec_stats(srv)["windows"] == 0
        t2, u2 = greedy(c, "qwen3", PROMPTS[0], speculative=True)
        assert t2 == t and u2.completion_tokens_details.accepted_prediction_tokens > 0
    finally:
        srv.stop()


def run_fail(*args):
    p = subprocess.run([server_bin(), *args, "--port", "0", "--threads", "2"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0, p.stderr
    return p.stderr


def test_speculative_model_errors(tmp_path):
    qwen3, gemma = os.path.join(FIXTURES, "qwen3"), os.path.join(FIXTURES, "gemma3_text")
    # no MTP head: refused at start, naming the model
    e = run_fail("--model-dir", qwen3, "--speculative", "mtp")
    assert "no MTP head" in e and "qwen3" in e, e
    # a draft model that does not load: the flag and the path named
    bad = str(tmp_path / "nowhere")
    e = run_fail("--model-dir", qwen3, "--draft-model", bad)
    assert "--draft-model" in e and bad in e, e
    # another vocabulary: the same sizes, two tokens' ids swapped in the draft's tokenizer
    import json
    other = tmp_path / "swapped"
    other.mkdir()
    for f in os.listdir(gemma):
        if f != "tokenizer.json":
            os.symlink(os.path.join(gemma, f), other / f)
    tok = json.load(open(os.path.join(gemma, "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    e = run_fail("--model-dir", qwen3, "--draft-model", str(other))
    assert "--draft-model" in e and f"token {vocab[b]} is" in e, e
    # another vocabulary size: the 512-token qwen3_yarn fixture
    e = run_fail("--model-dir", qwen3, "--draft-model", os.path.join(ROOT, "tests", "fixtures", "qwen3_yarn"))
    assert "--draft-model" in e and "vocabulary of 512 tokens" in e, e
    # contradictory flags: usage errors (exit 2) before anything loads
    for args, msg in ((["--speculative", "draft"], "needs --draft-model"),
                      (["--speculative", "ngram", "--draft-model", qwen3], "goes with --speculative draft"),
                      (["--speculative", "eagle"], "not supported")):
        p = subprocess.run([server_bin(), "--model", "x", *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and msg in p.stderr, p.stderr


# A KV pool too small for the running set: sequences are preempted and recomputed; the model
# drafters forget them and catch up (MTP: the recomputed prompt + generated ids through the
# head; draft model: prefilled again), and the greedy text is the default pool's plain text.
@pytest.mark.parametrize("drafter", ["mtp", "draft"])
def test_model_drafters_preemption(drafter):
    model = os.path.join(MTP, "dense") if drafter == "mtp" else os.path.join(FIXTURES, "qwen3")
    shape = ("--parallel", "3", "--ctx-size", "256", "--batch-size", "64", "--kv-block-len", "16")
    flags = ("--speculative", "mtp") if drafter == "mtp" else ("--draft-model", model)
    small = start_server(model, *shape, "--kv-blocks", "9", *flags, "--draft-max", "3")
    ref = start_server(model, *shape)
    prompts = [[100 + (j * 37 + k * 11) % 800 for j in range(20 + 7 * k)] for k in range(3)]

    def run(s):
        c = s.client()
        r = c.completions.create(model=c.models.list().data[0].id, prompt=prompts, max_tokens=60, temperature=0,
                                 extra_body={"ignore_eos": True})
        return [(ch.text, ch.finish_reason) for ch in sorted(r.choices, key=lambda ch: ch.index)]

    try:
        assert run(small) == run(ref)
        h = small.wait_idle()
        assert h["scheduler"]["preemptions"] > 0, h["scheduler"]
        assert h["speculative"]["drafter"] == drafter and h["speculative"]["windows"] > 0, h["speculative"]
        assert h["memory"]["kv_tokens_used"] == 0
    finally:
        small.stop()
        ref.stop()


# A prompt longer than a step's draft catch-up (256 tokens): the second time the exact cache
# answers it, and the draft model catches up over several steps while the slot decodes
# plainly, then drafts; a third request extends it (a cached prefix to catch up on).
def test_draft_model_catch_up():
    path = os.path.join(FIXTURES, "qwen3")
    args = ("--parallel", "2", "--ctx-size", "1024")
    plain = start_server(path, *args)
    spec = start_server(path, *args, "--draft-model", path, "--draft-max", "4")
    ids = [100 + (j * 37) % 800 for j in range(700)]
    try:
        a, b = plain.client(), spec.client()
        for p in (ids, ids, ids + [5, 6, 7]):
            want = a.completions.create(model="qwen3", prompt=p, max_tokens=40, temperature=0,
                                        extra_body={"ignore_eos": True}).choices[0].text
            r = b.completions.create(model="qwen3", prompt=p, max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True})
            d = r.usage.completion_tokens_details
            assert r.choices[0].text == want
            assert d.accepted_prediction_tokens > 0 and d.rejected_prediction_tokens == 0, d
    finally:
        plain.stop()
        spec.stop()
