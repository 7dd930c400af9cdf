"""Draws finished where the logits are (issues 29 and 30): rows that used to come down whole now
draw from the device's candidates, with the tail past the sorted head walked by the backend's
sample_tail op (pure temperature, min-p) and constrained rows (JSON schema, JSON mode, grammar,
min_tokens with a temperature) masked where the logits are (anna_context_mask_topk). On the CPU
backend every such draw is the token the host sampler draws from the full row, so the default
server must give the same text as the reference server that samples every full row on the host
(--host-sampling, masks inline), seeded, at batch >= 4 (n = 4 choices or 6 prompts in one
request), and must download no row whole (/metrics anna_engine_full_rows_total unchanged).
Requests go one at a time so both servers batch them the same way.
"""
import random

import pytest

from conftest import start_server
from test_grammar import ARITH, JSON_GBNF
from test_serving_controls import prom
from test_structured import SCHEMAS, rf

MSG = [{"role": "user", "content": "Reply."}]


@pytest.fixture(scope="module")
def pair(fixture_model):
    args = ("--parallel", "8", "--ctx-size", "1024")
    dev = start_server(fixture_model, *args, "--mask-threads", "2")
    ref = start_server(fixture_model, *args, "--mask-threads", "0", "--host-sampling")
    yield dev, ref
    dev.stop()
    ref.stop()


def full_rows(srv):
    return prom(srv)["anna_engine_full_rows_total"]


def prompts(n=6, seed=3):
    rnd = random.Random(seed)
    return [[rnd.randrange(6, 1000) for _ in range(8)] for _ in range(n)]


def both(pair, fn):
    dev, ref = pair
    f0 = full_rows(dev)
    a, b = fn(dev.client()), fn(ref.client())
    assert a == b
    assert full_rows(dev) == f0, "a row was downloaded whole"
    return a


def completions(temperature, seed, **extra):
    def fn(c):
        r = c.completions.create(model="qwen3", prompt=prompts(), max_tokens=24, temperature=temperature, seed=seed,
                                 extra_body=extra)
        return sorted((x.index, x.text, x.finish_reason) for x in r.choices)
    return fn


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_pure_temperature(pair, temperature):
    """No top_k, top_p 1, min_p 0: every token can be drawn; the tail op decides past the head."""
    for seed in (1, 2):
        out = both(pair, completions(temperature, seed))
        assert any(t for _, t, _ in out)


@pytest.mark.parametrize("min_p", [0.002, 0.05])
def test_min_p(pair, min_p):
    """min-p keeping the whole sorted head: the tail's kept mass comes from the op first."""
    both(pair, completions(1.3, 5, min_p=min_p))


def test_min_tokens_with_temperature(pair):
    """min_tokens masks the end-of-generation ids where the logits are (the softmax sum is the
    masked row's), instead of downloading the row."""
    out = both(pair, completions(1.0, 9, min_tokens=20, ignore_eos=False))
    assert all(len(t) > 0 for _, t, _ in out)


def chat4(seed, **kw):
    def fn(c):
        r = c.chat.completions.create(model="qwen3", messages=MSG, max_tokens=80, temperature=1.0, seed=seed, n=4,
                                      **kw)
        return [(x.message.content, x.finish_reason) for x in r.choices]
    return fn


@pytest.mark.parametrize("i", range(3))
def test_json_schema(pair, i):
    out = both(pair, chat4(20 + i, response_format=rf(SCHEMAS[i * 7])))
    assert any(t for t, _ in out)


def test_json_object(pair):
    both(pair, chat4(31, response_format={"type": "json_object"}))


@pytest.mark.parametrize("g", [ARITH, JSON_GBNF])
def test_grammar(pair, g):
    both(pair, chat4(41, extra_body={"grammar": g}))


def test_top_p_past_the_head_still_exact(pair):
    """A top-p nucleus reaching past the 256-token head still takes the full row (the one
    fallback of a plain sampled row left): the text is the same either way."""
    dev, ref = pair
    a = completions(1.5, 3, top_p=0.97)(dev.client())
    b = completions(1.5, 3, top_p=0.97)(ref.client())
    assert a == b


def test_mixed_temperatures(pair):
    """Requests at different temperatures in the same steps: the rows whose softmax sum is at
    another temperature than the step's get their candidates again at theirs (one masked-topk
    call per temperature, an empty mask), not the full rows. Sent concurrently so they share
    steps; the CPU backend's rows do not depend on their batch, so the text is the reference's
    however the two servers batch them."""
    from concurrent.futures import ThreadPoolExecutor

    def fn(c):
        def one(args):
            t, seed, extra = args
            r = c.completions.create(model="qwen3", prompt=prompts(4, seed), max_tokens=24, temperature=t, seed=seed,
                                     extra_body=extra)
            return sorted((x.index, x.text, x.finish_reason) for x in r.choices)
        jobs = [(0.7, 1, {}), (1.2, 2, {}), (1.9, 3, {"min_p": 0.01}), (0.0, 4, {}), (1.0, 5, {"top_k": 40})]
        with ThreadPoolExecutor(len(jobs)) as ex:
            return list(ex.map(one, jobs))
    both(pair, fn)


def test_split_prefill_tail_draws(pair, fixture_model):
    """--split-prefill-decode: a step's decode rows are drawn between its two model calls; their
    tail draws go to the device then (before the second call replaces the rows). Requests of
    different prompt lengths arrive together so decode rows and prompt chunks share steps."""
    from concurrent.futures import ThreadPoolExecutor

    split = start_server(fixture_model, "--parallel", "8", "--ctx-size", "1024", "--split-prefill-decode")
    try:
        def fn(c):
            def one(i):
                rnd = random.Random(i)
                p = [rnd.randrange(6, 1000) for _ in range(4 + 60 * i)]
                r = c.completions.create(model="qwen3", prompt=p, max_tokens=32, temperature=1.0, seed=i)
                return r.choices[0].text
            with ThreadPoolExecutor(4) as ex:
                return list(ex.map(one, range(4)))
        f0 = full_rows(split)
        a, b = fn(split.client()), fn(pair[1].client())
        assert a == b
        assert full_rows(split) == f0
    finally:
        split.stop()
