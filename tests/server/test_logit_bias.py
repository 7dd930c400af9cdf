"""logit_bias validated as OpenAI validates it: keys are strings of non-negative integers
below the vocabulary size (1000 for the qwen3 fixture), values numbers in [-100, 100];
anything else a 400 whose message names the offending key. The server does not apply a
bias yet: a valid non-empty map is a 400 "unsupported_parameter" (never silently
ignored); null and {} are accepted."""
import json

import openai
import pytest

from test_robustness import CHAT, COMP, raw

BASE = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def body(path, lb):
    d = dict(BASE) if path == CHAT else {"model": "qwen3", "prompt": "hi", "max_tokens": 2}
    d["logit_bias"] = lb
    return json.dumps(d).encode()


BAD = [
    ({"abc": 1}, "abc"),
    ({"-1": 1}, "-1"),
    ({"1.5": 1}, "1.5"),
    ({"": 1}, "''"),
    ({" 5": 1}, "' 5'"),
    ({"+5": 1}, "+5"),
    ({"0x10": 1}, "0x10"),
    ({"1000": 1}, "1000"),  # the vocabulary is 0..999
    ({"99999999999999999999999": 1}, "99999999999999999999999"),
    ({"5": 101}, "5"),
    ({"5": -100.5}, "5"),
    ({"5": "10"}, "5"),
    ({"5": None}, "5"),
    ({"5": True}, "5"),
    ({"5": [1]}, "5"),
    ([5, 1], None),
    ("5:1", None),
    (5, None),
]


@pytest.mark.parametrize("path", [CHAT, COMP], ids=["chat", "completion"])
@pytest.mark.parametrize("lb,named", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_logit_bias(srv, path, lb, named):
    status, data, _ = raw(srv, "POST", path, body(path, lb))
    assert status == 400, (status, data[:300])
    e = json.loads(data)["error"]
    assert e["param"] == "logit_bias" and e["type"] == "invalid_request_error", e
    assert e["code"] == "invalid_value" or e["code"] == "invalid_type", e
    if named is not None:
        assert named.strip("'") in e["message"] or named in e["message"], e["message"]


@pytest.mark.parametrize("lb", [None, {}])
def test_empty_logit_bias_accepted(srv, lb):
    status, data, _ = raw(srv, "POST", CHAT, body(CHAT, lb))
    assert status == 200, data[:300]


@pytest.mark.parametrize("lb", [{"5": 10}, {"0": -100, "999": 100}, {"12": 0.5}])
def test_valid_logit_bias_not_silently_ignored(srv, lb):
    status, data, _ = raw(srv, "POST", CHAT, body(CHAT, lb))
    assert status == 400, data[:300]
    e = json.loads(data)["error"]
    assert e["param"] == "logit_bias" and e["code"] == "unsupported_parameter", e


def test_openai_client_bad_key(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="qwen3", messages=BASE["messages"], max_tokens=2,
                                       logit_bias={"hello": 5})
    assert ei.value.status_code == 400 and "hello" in ei.value.message
