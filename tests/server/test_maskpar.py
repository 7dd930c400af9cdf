"""Structured-output masks on worker threads (issue 30, --mask-threads): the same tokens as the
inline masks. Two servers on the fixture model, one computing masks on the engine thread after
the forward pass (--mask-threads 0), one on 4 workers during it; every request (JSON Schema,
JSON mode, GBNF, n=4 choices so a step holds several constrained rows, sampled at temperature
1 with a seed) must give the same text and finish reasons on both. Requests go one at a time
so both servers batch them the same way. The same request twice also covers a first token
taken from the exact prompt cache (its row is masked inline).
"""
import pytest

from conftest import start_server
from test_grammar import ARITH, JSON_GBNF, PARENS, REGULAR
from test_structured import SCHEMAS, rf

MSG = [{"role": "user", "content": "Reply."}]


@pytest.fixture(scope="module")
def pair(fixture_model):
    args = ("--parallel", "8", "--ctx-size", "1024")
    a = start_server(fixture_model, *args, "--mask-threads", "0")
    b = start_server(fixture_model, *args, "--mask-threads", "4")
    yield a.client(), b.client()
    a.stop()
    b.stop()


def reply(client, seed, **kw):
    r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=120, temperature=1.0, seed=seed,
                                       n=4, **kw)
    return [(c.message.content, c.finish_reason) for c in r.choices]


CASES = ([("schema", s) for s in SCHEMAS[::5]] + [("json_object", None)] +
         [("grammar", g) for g, _ in REGULAR] + [("grammar", g) for g in (ARITH, PARENS, JSON_GBNF)])


@pytest.mark.parametrize("i", range(len(CASES)))
def test_pooled_masks_equal_inline(pair, i):
    kind, what = CASES[i]
    if kind == "schema":
        kw = dict(response_format=rf(what))
    elif kind == "json_object":
        kw = dict(response_format={"type": "json_object"})
    else:
        kw = dict(extra_body={"grammar": what})
    for seed in (i, i):  # the second: the exact prompt cache's first row
        inline, pooled = reply(pair[0], seed, **kw), reply(pair[1], seed, **kw)
        assert inline == pooled
        assert any(t for t, _ in pooled)  # the outputs compared are not all empty


def test_logprobs_are_the_model_s(pair):
    """Logprobs come from the row before the mask: the pool must not mask it first."""
    kw = dict(response_format=rf(SCHEMAS[0]), logprobs=True, top_logprobs=3, max_tokens=40, temperature=1.0,
              seed=5, model="qwen3", messages=MSG)
    out = []
    for c in pair:
        ch = c.chat.completions.create(**kw).choices[0]
        out.append((ch.message.content, [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                                         for t in ch.logprobs.content]))
    assert out[0] == out[1]
    assert out[1][1] and all(lp > -1e30 for _, lp, _ in out[1][1])
