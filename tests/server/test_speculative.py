"""Speculative decoding in the server (--speculative ngram): greedy outputs equal plain
decoding's, for requests decoded alone and together with others (some of which cannot take
windows: logprobs), on a classic transformer, the hybrid Qwen3.5 (GDN state rolled back on
rejection) and the real default model, where drafts are accepted. Sampled and penalised
requests speculate too (speculative sampling): with one seed they give plain sampling's text;
usage.completion_tokens_details counts accepted / rejected drafts, /metrics per drafter;
"speculative": true / false in the body opts in / out of the server's default."""
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
    for args, msg in ((["--speculative", "eagle"], "not supported"), (["--speculative", "draft"], "needs --draft-model"),
                      (["--speculative", "ngram", "--ngram-min", "5", "--ngram-max", "2"], "exceeds")):
        p = subprocess.run([server_bin(), "--model", "x", *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and msg in p.stderr, p.stderr


def sampled(client, model, prompt, seed, max_tokens=40, **extra):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.8, top_p=0.95,
                                  seed=seed, extra_body={"ignore_eos": True, "top_k": 40, **extra})
    return r


def metric(srv, name):
    import urllib.request
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# Sampled requests (temperature, top-k/p, a repetition penalty) speculate: the same seed gives
# the text plain sampling gives (one draw per emitted token), alone and batched with greedy
# neighbours; usage and /metrics count the drafts; greedy still equals plain.
@pytest.mark.parametrize("model", ["qwen3", "qwen3_5"])
def test_speculative_sampled(model):
    plain = start_server(os.path.join(FIXTURES, model), "--parallel", "4", "--ctx-size", "256")
    spec = start_server(os.path.join(FIXTURES, model), "--parallel", "4", "--ctx-size", "256",
                        "--speculative", "ngram", "--draft-max", "5")
    try:
        a, b = plain.client(), spec.client()
        pen = {"repetition_penalty": 1.1}
        want = [sampled(a, model, p, 100 + i, **(pen if i % 2 else {})).choices[0].text for i, p in enumerate(PROMPTS)]
        got = [sampled(b, model, p, 100 + i, **(pen if i % 2 else {})) for i, p in enumerate(PROMPTS)]
        assert [r.choices[0].text for r in got] == want
        details = [r.usage.completion_tokens_details for r in got]
        assert all(d is not None for d in details), details
        acc = sum(d.accepted_prediction_tokens for d in details)
        rej = sum(d.rejected_prediction_tokens for d in details)
        assert acc + rej > 0 and acc >= 0 and rej >= 0
        # batched with greedy neighbours: the same texts
        with cf.ThreadPoolExecutor(6) as ex:
            fut = [ex.submit(sampled, b, model, p, 100 + i, **(pen if i % 2 else {})) for i, p in enumerate(PROMPTS)]
            gfut = [ex.submit(greedy, b, model, p) for p in PROMPTS[:2]]
            got2 = [f.result().choices[0].text for f in fut]
            g2 = [f.result() for f in gfut]
        assert got2 == want
        assert g2 == [greedy(a, model, p) for p in PROMPTS[:2]]
        st = spec_stats(spec)
        assert metric(spec, 'anna_spec_decode_draft_tokens_total{drafter="ngram"}') == st["drafted"] > 0
        assert metric(spec, 'anna_spec_decode_accepted_tokens_total{drafter="ngram"}') == st["accepted"]
        assert metric(plain, 'anna_spec_decode_draft_tokens_total{drafter="ngram"}') == 0
        assert spec.wait_idle()["memory"]["kv_tokens_used"] == 0
    finally:
        plain.stop()
        spec.stop()


# "speculative": true opts in on a server whose default is off; false opts out where it is on.
def test_speculative_per_request():
    model = "qwen3"
    off = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "256")
    on = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "256", "--speculative", "ngram")
    try:
        a, b = off.client(), on.client()
        p = PROMPTS[0]
        assert spec_stats(off)["default"] is False and spec_stats(on)["default"] is True
        want = greedy(a, model, p)
        r = a.completions.create(model=model, prompt=p, max_tokens=40, temperature=0,
                                 extra_body={"ignore_eos": True, "speculative": True})
        assert r.choices[0].text == want
        d = r.usage.completion_tokens_details
        assert d is not None and d.accepted_prediction_tokens + d.rejected_prediction_tokens > 0
        assert spec_stats(off)["windows"] > 0
        w0 = spec_stats(on)["windows"]
        r = b.completions.create(model=model, prompt=p, max_tokens=40, temperature=0,
                                 extra_body={"ignore_eos": True, "speculative": False})
        assert r.choices[0].text == want
        assert r.usage.completion_tokens_details is None or \
            r.usage.completion_tokens_details.accepted_prediction_tokens is None
        assert spec_stats(on)["windows"] == w0
        # chat completions take the field too; a non-boolean is a 400 naming it
        import openai
        with pytest.raises(openai.BadRequestError) as ei:
            b.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      extra_body={"speculative": "yes"})
        assert "speculative" in str(ei.value)
        r = b.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], max_tokens=20,
                                      temperature=0, extra_body={"speculative": True})
        assert r.usage.completion_tokens_details is not None
    finally:
        off.stop()
        on.stop()
