"""API keys on anna-serve (--api-key, --api-key-file, --auth-health): Bearer auth with the
official openai client where it applies, raw HTTP for what the client cannot send (no
header, other schemes). Every refusal must be a 401 with an OpenAI error object
(type invalid_request_error, code invalid_api_key) and WWW-Authenticate: Bearer."""
import http.client
import json
import os
import subprocess

import openai
import pytest

from conftest import FIXTURES, server_bin, start_server

KEY = "sk-anna-test-key-0123456789abcdef"
FILE_KEYS = ["sk-file-key-one", "sk-file-key-two"]
MODEL = os.path.join(FIXTURES, "qwen3")
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory):
    p = tmp_path_factory.mktemp("auth") / "keys.txt"
    p.write_text("# anna keys\n%s\n\n  %s  \r\n" % tuple(FILE_KEYS))
    return str(p)


@pytest.fixture(scope="module")
def asrv(keyfile):
    s = start_server(MODEL, "--parallel", "2", "--ctx-size", "256", "--api-key", KEY, "--api-key-file", keyfile)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hsrv():
    s = start_server(MODEL, "--parallel", "1", "--ctx-size", "256", "--api-key", KEY, "--auth-health")
    yield s
    s.stop()


def raw(srv, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = dict((k.lower(), v) for k, v in r.getheaders())
    c.close()
    return r.status, data, hdrs


def check_401(status, data, hdrs):
    assert status == 401, (status, data[:300])
    assert hdrs.get("www-authenticate") == "Bearer"
    e = json.loads(data)["error"]
    assert e["type"] == "invalid_request_error" and e["code"] == "invalid_api_key" and e["message"]


def chat(srv, key):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=60)
    return c.chat.completions.create(model="qwen3", messages=MSG, max_tokens=2, temperature=0)


def test_no_key(asrv):
    body = json.dumps({"model": "qwen3", "messages": MSG, "max_tokens": 2}).encode()
    check_401(*raw(asrv, "POST", "/v1/chat/completions", body))
    check_401(*raw(asrv, "GET", "/v1/models"))


@pytest.mark.parametrize("bad", ["wrong", KEY[:-1] + ("0" if KEY[-1] != "0" else "1"), KEY[:-1], KEY + "x",
                                 KEY.upper(), FILE_KEYS[0] + FILE_KEYS[1]],
                         ids=["wrong", "last-byte", "prefix", "longer", "case", "two-keys-joined"])
def test_wrong_key_openai_client(asrv, bad):
    with pytest.raises(openai.AuthenticationError) as ei:
        chat(asrv, bad)
    assert ei.value.status_code == 401
    assert ei.value.code == "invalid_api_key"
    assert ei.value.response.headers.get("www-authenticate") == "Bearer"


def test_right_key_openai_client(asrv):
    r = chat(asrv, KEY)
    assert r.object == "chat.completion" and r.choices[0].message.content is not None
    c = openai.OpenAI(base_url=asrv.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in c.models.list().data] == ["qwen3"]
    # streaming goes through the same check
    chunks = list(c.chat.completions.create(model="qwen3", messages=MSG, max_tokens=2, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_key_file_two_keys(asrv):
    for k in FILE_KEYS:
        assert chat(asrv, k).object == "chat.completion"


@pytest.mark.parametrize("hdr", ["Basic " + KEY, KEY, "Bearer", "Bearer ", "Bearer  ", "Token " + KEY, "Bearer" + KEY])
def test_other_schemes_refused(asrv, hdr):
    check_401(*raw(asrv, "GET", "/v1/models", headers={"Authorization": hdr}))


def test_scheme_case_insensitive(asrv):
    st, data, _ = raw(asrv, "GET", "/v1/models", headers={"Authorization": "bearer " + KEY})
    assert st == 200, data


def test_other_routes_need_key(asrv):
    # unknown routes too: a 404 would tell a stranger which routes exist
    check_401(*raw(asrv, "GET", "/v1/nope"))
    check_401(*raw(asrv, "POST", "/tokenize", json.dumps({"content": "hi"}).encode()))
    check_401(*raw(asrv, "POST", "/detokenize", json.dumps({"tokens": [1]}).encode()))
    st, data, _ = raw(asrv, "POST", "/tokenize", json.dumps({"content": "hi"}).encode(),
                      {"Authorization": "Bearer " + KEY})
    assert st == 200 and json.loads(data)["tokens"], data


def test_oversized_body_without_key(asrv):
    # a body far over --max-body-bytes is refused before it is read: still a 401 first
    c = http.client.HTTPConnection("127.0.0.1", asrv.port, timeout=30)
    c.putrequest("POST", "/v1/chat/completions")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(1 << 30))
    c.endheaders()
    r = c.getresponse()
    data = r.read()
    check_401(r.status, data, dict((k.lower(), v) for k, v in r.getheaders()))
    c.close()


def test_health_open_by_default(asrv):
    for path in ("/healthz", "/metrics"):
        st, data, _ = raw(asrv, "GET", path)
        assert st == 200, (path, data[:200])


def test_health_closed_with_auth_health(hsrv):
    for path in ("/healthz", "/metrics"):
        check_401(*raw(hsrv, "GET", path))
        check_401(*raw(hsrv, "GET", path, headers={"Authorization": "Bearer " + KEY[:-1]}))
        st, data, _ = raw(hsrv, "GET", path, headers={"Authorization": "Bearer " + KEY})
        assert st == 200, (path, data[:200])
    assert chat(hsrv, KEY).object == "chat.completion"


def test_no_keys_no_auth(srv):
    # the shared server has no keys: any (or no) Authorization header is fine
    st, _, _ = raw(srv, "GET", "/v1/models")
    assert st == 200
    st, _, _ = raw(srv, "GET", "/v1/models", headers={"Authorization": "Bearer whatever"})
    assert st == 200


@pytest.mark.parametrize("content,args,want", [
    ("", [], "holds no key"),
    ("# only a comment\n\n", [], "holds no key"),
    ("good-key\nbad key with spaces\n", [], "line 2"),
    ("x" * 600 + "\n", [], "longer than"),
    (None, ["--api-key", ""], "empty API key"),
    (None, ["--api-key-file", "/nonexistent/keys"], "/nonexistent/keys"),
    (None, ["--auth-health"], "--auth-health needs"),
], ids=["empty-file", "comment-only", "blank-inside", "too-long", "empty-flag", "missing-file", "auth-health-alone"])
def test_bad_key_config_refused(tmp_path, content, args, want):
    if content is not None:
        p = tmp_path / "keys"
        p.write_text(content)
        args = ["--api-key-file", str(p)]
    r = subprocess.run([server_bin(), "--model-dir", MODEL, "--port", "0", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert want in r.stderr, r.stderr[-2000:]
