"""POST /v1/embeddings against transformers: tests/server/data/embed_ref_qwen3.json holds the
last-token, L2-normalized last_hidden_state of the qwen3 fixture for a few inputs, written by
tools/gen_embed_ref.py (the hf venv). --batch-size 16 makes the 128-token input run in
several prefill chunks on the reserved sequence."""
import base64
import json
import os
import struct
import threading

import openai
import pytest

from conftest import FIXTURES, HERE, start_server

REF = json.load(open(os.path.join(HERE, "data", "embed_ref_qwen3.json")))
MODEL = "qwen3"


@pytest.fixture(scope="module")
def esrv():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--ctx-size", "512", "--batch-size", "16",
                     "--embeddings", "--debug-step-delay-ms", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ec(esrv):
    return esrv.client()


def close(v, ref, tol=1e-4):
    assert len(v) == len(ref) == REF["hidden"]
    diff = max(abs(a - b) for a, b in zip(v, ref))
    cos = sum(a * b for a, b in zip(v, ref))
    assert diff < tol and cos > 0.9999, (diff, cos)
    assert abs(sum(a * a for a in v) - 1) < 1e-4


@pytest.mark.parametrize("k", range(len(REF["cases"])))
def test_matches_transformers(ec, k):
    case = REF["cases"][k]
    r = ec.embeddings.create(model=MODEL, input=case["input"])
    assert len(r.data) == 1 and r.data[0].index == 0 and r.object == "list"
    assert r.usage.prompt_tokens == r.usage.total_tokens == case["n_tokens"]
    close(r.data[0].embedding, case["embedding"])


def test_batch_of_inputs_in_order(ec):
    cases = [c for c in REF["cases"] if c["kind"] == "text"]
    r = ec.embeddings.create(model=MODEL, input=[c["input"] for c in cases])
    assert [d.index for d in r.data] == list(range(len(cases)))
    for d, c in zip(r.data, cases):
        close(d.embedding, c["embedding"])
    assert r.usage.prompt_tokens == sum(c["n_tokens"] for c in cases)
    ids = [c for c in REF["cases"] if c["kind"] == "ids"]
    r = ec.embeddings.create(model=MODEL, input=[c["input"] for c in ids])
    for d, c in zip(r.data, ids):
        close(d.embedding, c["embedding"])


def test_base64_equals_float(ec):
    case = REF["cases"][1]
    raw = ec.embeddings.with_raw_response.create(model=MODEL, input=case["input"], encoding_format="base64")
    b = json.loads(raw.http_response.text)["data"][0]["embedding"]
    assert isinstance(b, str)
    v = struct.unpack("<%df" % REF["hidden"], base64.b64decode(b))
    close(v, case["embedding"])


def test_dimensions(ec):
    r = ec.embeddings.create(model=MODEL, input="x", dimensions=REF["hidden"])
    assert len(r.data[0].embedding) == REF["hidden"]
    with pytest.raises(openai.BadRequestError) as ei:
        ec.embeddings.create(model=MODEL, input="x", dimensions=64)
    assert "dimensions" in str(ei.value)


@pytest.mark.parametrize("body,needle", [
    ({"input": ""}, "empty"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "empty"),
    ({"input": [5, -1]}, "token ids"),
    ({"input": [1000000]}, "token ids"),
    ({"input": {"a": 1}}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "pooling": "mean"}, "pooling"),
    ({"input": "word " * 600}, "context"),
])
def test_bad_input_is_400(ec, body, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        ec.embeddings.create(model=MODEL, **{"input": body.pop("input")}, extra_body=body or None)
    assert needle in str(ei.value), str(ei.value)


def test_alongside_generation(esrv, ec):
    """Embeddings run on the engine thread between generation steps: both finish, and the
    vectors are unchanged while sequences decode."""
    out, errs = [], []

    def gen():
        try:
            out.append(ec.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=40, temperature=0))
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)

    th = [threading.Thread(target=gen) for _ in range(2)]
    [t.start() for t in th]
    case = REF["cases"][3]
    for _ in range(3):
        close(ec.embeddings.create(model=MODEL, input=case["input"]).data[0].embedding, case["embedding"])
    [t.join() for t in th]
    assert not errs and len(out) == 2 and all(o.usage.completion_tokens == 40 for o in out)
    kv = esrv.wait_idle()["kv_blocks"]
    assert kv["unaccounted"] == 0 and kv["held_by_sequences"] == 0, kv  # the reserved sequence gave its blocks back


def test_off_without_the_flag():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "1", "--ctx-size", "256")
    try:
        with pytest.raises(openai.BadRequestError) as ei:
            s.client().embeddings.create(model=MODEL, input="x")
        assert "--embeddings" in str(ei.value)
    finally:
        s.stop()
