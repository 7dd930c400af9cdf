"""JSON Schema mask cache (issue 30, --json-mask-cache-mib): the same tokens as computing every
mask. Three servers on the fixture model: the cache off (--json-mask-cache-mib 0), on with the
masks inline on the engine thread, and on with the masks on 4 pool workers; every request
(every 5th conformance schema, n=4 choices sampled at temperature 1 with a seed, so the
4 sequences share the schema's cache entries, and each request twice) must give the same text
and finish reasons on all three. /metrics must show the cache hit (it is really used) on the
two servers that have it and stay empty on the one without.
Also: data/structured_schemas.json (what test_jsonmcache walks) holds test_structured.py's
schemas, so the C test covers the conformance suite as it is.
"""
import json
import os
import re

import pytest

from conftest import start_server
from test_structured import REAL, SCHEMAS, rf

MSG = [{"role": "user", "content": "Reply."}]
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def trio(fixture_model):
    args = ("--parallel", "8", "--ctx-size", "1024")
    off = start_server(fixture_model, *args, "--json-mask-cache-mib", "0", "--mask-threads", "0")
    inline = start_server(fixture_model, *args, "--json-mask-cache-mib", "64", "--mask-threads", "0")
    pooled = start_server(fixture_model, *args, "--json-mask-cache-mib", "64", "--mask-threads", "4")
    yield off, inline, pooled
    for s in (off, inline, pooled):
        s.stop()


def reply(client, seed, **kw):
    r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=120, temperature=1.0, seed=seed,
                                       n=4, **kw)
    return [(c.message.content, c.finish_reason) for c in r.choices]


def cache_metrics(server):
    import urllib.request
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    out = {}
    for k in ("hits_total", "misses_total", "entries", "bytes"):
        m = re.search(r"^anna_json_mask_cache_%s (\d+)$" % k, text, re.M)
        assert m, "no anna_json_mask_cache_%s in /metrics" % k
        out[k] = int(m.group(1))
    return out


CASES = list(range(0, len(SCHEMAS), 5))


@pytest.mark.parametrize("i", CASES)
def test_cached_masks_give_the_same_tokens(trio, i):
    kw = dict(response_format=rf(SCHEMAS[i]))
    for seed in (i, i):  # the second: every state is in the cache by now (and the exact prompt cache)
        outs = [reply(s.client(), seed, **kw) for s in trio]
        assert outs[0] == outs[1] == outs[2]
        assert any(t for t, _ in outs[0])  # the outputs compared are not all empty


def test_cache_is_used(trio):
    off, inline, pooled = (cache_metrics(s) for s in trio)
    assert off == {"hits_total": 0, "misses_total": 0, "entries": 0, "bytes": 0}
    for m in (inline, pooled):
        assert m["hits_total"] > m["misses_total"] > 0
        assert 0 < m["entries"] <= m["misses_total"] and m["bytes"] > 0


def test_bad_budget_is_an_error(fixture_model):
    import subprocess
    from conftest import server_bin
    p = subprocess.run([server_bin(), "--model-dir", fixture_model, "--json-mask-cache-mib", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--json-mask-cache-mib" in p.stderr


def test_schema_file_is_the_conformance_suite():
    with open(os.path.join(HERE, "data", "structured_schemas.json")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    want = list(SCHEMAS) + [s for s, _ in REAL]
    assert lines[:len(want)] == want
    assert len(lines) >= 50
