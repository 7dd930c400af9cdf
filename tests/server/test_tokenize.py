"""POST /tokenize and /detokenize (llama.cpp's and vLLM's field names) against the
transformers tokenizer's ids (tests fixture tokenizer/expected.json: the qwen3 fixture
model has the same tokenizer.json)."""
import http.client
import json

import pytest

from conftest import FIXTURES

import os

REF = json.load(open(os.path.join(FIXTURES, "tokenizer", "expected.json")))["encode"]


def post(srv, path, obj):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


@pytest.mark.parametrize("case", REF, ids=[str(i) for i in range(len(REF))])
def test_tokenize_matches_reference(srv, case):
    st, d = post(srv, "/tokenize", {"content": case["text"]})
    assert st == 200, d
    assert d["tokens"] == case["ids"]
    assert d["count"] == len(case["ids"]) and d["max_model_len"] == 1024
    st, d2 = post(srv, "/tokenize", {"prompt": case["text"], "model": "qwen3"})  # vLLM's name
    assert st == 200 and d2["tokens"] == case["ids"]
    st, d = post(srv, "/detokenize", {"tokens": case["ids"]})
    assert st == 200, d
    assert d["content"] == case["decoded"] and d["prompt"] == case["decoded"]


def test_special_tokens(srv):
    st, d = post(srv, "/tokenize", {"content": "<|im_end|>"})
    assert st == 200 and len(d["tokens"]) == 1, d
    special = d["tokens"][0]
    st, d = post(srv, "/tokenize", {"content": "<|im_end|>", "parse_special": False})
    assert st == 200 and special not in d["tokens"] and len(d["tokens"]) > 1, d
    st, d = post(srv, "/detokenize", {"tokens": [special]})
    assert st == 200 and d["content"] == "<|im_end|>"


def test_add_special_and_pieces(srv):
    st, plain = post(srv, "/tokenize", {"content": "Hello world"})
    st2, added = post(srv, "/tokenize", {"content": "Hello world", "add_special": True})
    st3, added2 = post(srv, "/tokenize", {"content": "Hello world", "add_special_tokens": True})
    assert st == st2 == st3 == 200
    assert added["tokens"] == added2["tokens"]
    # Qwen adds no BOS: the same ids either way (the flag is still accepted)
    assert plain["tokens"] == REF[0]["ids"] and added["tokens"][-len(plain["tokens"]):] == plain["tokens"]
    st, d = post(srv, "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert st == 200
    assert [t["id"] for t in d["tokens"]] == REF[0]["ids"]
    assert "".join(t["piece"] for t in d["tokens"]) == "Hello world"


def test_empty(srv):
    st, d = post(srv, "/tokenize", {"content": ""})
    assert st == 200 and d["tokens"] == []
    st, d = post(srv, "/detokenize", {"tokens": []})
    assert st == 200 and d["content"] == ""


BAD = [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"prompt": ["a"]}, "prompt"),
    ("/tokenize", {"content": "a", "prompt": "b"}, "prompt"),
    ("/tokenize", {"content": "a", "add_special": "yes"}, "add_special"),
    ("/tokenize", {"content": "a", "add_special": True, "add_special_tokens": False}, "add_special_tokens"),
    ("/tokenize", {"content": "a", "frobnicate": 1}, "frobnicate"),
    ("/tokenize", {"messages": [{"role": "user", "content": "a"}]}, "messages"),
    ("/tokenize", {"content": "a", "model": 3}, "model"),
    ("/tokenize", [1, 2], None),
    ("/tokenize", b"{", None),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "12"}, "tokens"),
    ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
    ("/detokenize", {"tokens": [1, 2.5]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [1000]}, "tokens"),
    ("/detokenize", {"tokens": [2 ** 40]}, "tokens"),
    ("/detokenize", {"tokens": [1], "extra": True}, "extra"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=["%s-%d" % (b[0][1:], i) for i, b in enumerate(BAD)])
def test_bad_input(srv, path, body, param):
    st, d = post(srv, path, body)
    assert st == 400, d
    e = d["error"]
    assert e["type"] == "invalid_request_error" and e["message"]
    assert e["param"] == param, e


def test_get_refused(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("GET", "/tokenize")
    r = c.getresponse()
    r.read()
    assert r.status == 405 and r.getheader("Allow") == "POST"
