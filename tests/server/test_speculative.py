"""Speculative decoding in the server (--speculative ngram): greedy outputs equal plain
decoding's, for requests decoded alone and together with others (some of which cannot take
windows: sampled, logprobs, penalties), on a classic transformer, the hybrid Qwen3.5 (GDN
state rolled back on rejection) and the real default model, where drafts are accepted."""
import concurrent.futures as cf
import os

import pytest

from conftest import DEFAULT_MODEL, FIXTURES, start_server

PROMPTS = ["a b c d e a b c d e a b c d e a b c", "def add(x, y):\n    return x + y\n\ndef add(x, y):\n",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "The cat sat. The cat sat. The cat"]


def greedy(client, model, prompt, max_tokens=40, **extra):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text


def spec_stats(srv):
    return srv.get_json("/healthz")["speculative"]


# the last case: a batch (8 rows) smaller than four windows of 5 drafts: windows are cut to fit
@pytest.mark.parametrize("model,extra", [("qwen3", ()), ("qwen3_5", ()), ("qwen3_5", ("--batch-size", "8"))],
                         ids=["qwen3", "qwen3_5", "qwen3_5-small-batch"])
def test_speculative_equals_plain(model, extra):
    plain = start_server(os.path.join(FIXTURES, model), "--parallel", "4", "--ctx-size", "256")
    spec = start_server(os.path.join(FIXTURES, model), "--parallel", "4", "--ctx-size", "256",
                        "--speculative", "ngram", "--draft-max", "5", *extra)
    try:
        a, b = plain.client(), spec.client()
        want = [greedy(a, model, p) for p in PROMPTS]
        got_alone = [greedy(b, model, p) for p in PROMPTS]
        assert got_alone == want
        with cf.ThreadPoolExecutor(6) as ex:
            fut = [ex.submit(greedy, b, model, p) for p in PROMPTS]
            # neighbours that decode plainly in the same steps
            ex.submit(lambda: b.completions.create(model=model, prompt="x y", max_tokens=30, temperature=0.9,
                                                   seed=3, extra_body={"ignore_eos": True}))
            ex.submit(lambda: b.completions.create(model=model, prompt="x y", max_tokens=30, temperature=0,
                                                   logprobs=2, extra_body={"ignore_eos": True}))
            got = [f.result() for f in fut]
        assert got == want
        st = spec_stats(spec)
        assert st["drafter"] == "ngram" and st["draft_max"] == 5
        assert st["windows"] > 0 and st["drafted"] > 0, st
        assert spec.wait_idle()["memory"]["kv_tokens_used"] == 0
        assert spec_stats(plain)["windows"] == 0
    finally:
        plain.stop()
        spec.stop()


def test_speculative_real_model_accepts():
    if not os.path.exists(DEFAULT_MODEL):
        pytest.skip(f"{DEFAULT_MODEL} not fetched (scripts/fetch_default_model.sh)")
    code = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n")
    msg = [{"role": "user", "content": "Rewrite this code exactly, renaming w to width:\n\n" + code}]
    plain = start_server(DEFAULT_MODEL, "--parallel", "2", "--ctx-size", "512")
    spec = start_server(DEFAULT_MODEL, "--parallel", "2", "--ctx-size", "512", "--speculative", "ngram")
    try:
        outs = []
        for srv in (plain, spec):
            c = srv.client()
            r = c.chat.completions.create(model=c.models.list().data[0].id, messages=msg, max_tokens=48, temperature=0)
            outs.append(r.choices[0].message.content)
        assert outs[0] == outs[1]
        st = spec_stats(spec)
        assert st["accepted"] > 0, st
    finally:
        plain.stop()
        spec.stop()


def test_speculative_flags():
    import subprocess
    from conftest import server_bin
    for args, msg in ((["--speculative", "eagle"], "not supported"), (["--draft-max", "3"], "need --speculative"),
                      (["--speculative", "ngram", "--ngram-min", "5", "--ngram-max", "2"], "exceeds")):
        p = subprocess.run([server_bin(), "--model", "x", *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
