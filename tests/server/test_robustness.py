"""Bad input, backpressure, disconnects, slow clients, shutdown and load. Every bad request
must get the right 4xx with an OpenAI error object, and the server must keep serving."""
import concurrent.futures as cf
import http.client
import json
import os
import signal
import socket
import threading
import time

import openai
import pytest

from conftest import FIXTURES, start_server

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
U = [{"role": "user", "content": "hi"}]


def j(**kw):
    base = {"model": "qwen3", "messages": U, "max_tokens": 2}
    base.update(kw)
    return json.dumps(base).encode()


def jc(**kw):
    base = {"model": "qwen3", "prompt": "hi", "max_tokens": 2}
    base.update(kw)
    return json.dumps(base).encode()


def drop(key, **kw):
    d = json.loads(j(**kw))
    d.pop(key)
    return json.dumps(d).encode()


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BAD = [
    ("invalid json", CHAT, b"{bad", 400),
    ("empty body", CHAT, b"", 400),
    ("json array", CHAT, b"[]", 400),
    ("json string", CHAT, b'"hi"', 400),
    ("json null", CHAT, b"null", 400),
    ("trailing garbage", CHAT, j() + b"}}", 400),
    ("no messages", CHAT, drop("messages"), 400),
    ("messages string", CHAT, j(messages="hi"), 400),
    ("messages empty", CHAT, j(messages=[]), 400),
    ("message not object", CHAT, j(messages=[1]), 400),
    ("missing role", CHAT, j(messages=[{"content": "x"}]), 400),
    ("bad role", CHAT, j(messages=[{"role": "wizard", "content": "x"}]), 400),
    ("role not string", CHAT, j(messages=[{"role": 5, "content": "x"}]), 400),
    ("content int", CHAT, j(messages=[{"role": "user", "content": 5}]), 400),
    ("content missing", CHAT, j(messages=[{"role": "user"}]), 400),
    ("image part", CHAT, j(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400),
    ("part without type", CHAT, j(messages=[{"role": "user", "content": [{"text": "x"}]}]), 400),
    ("part text int", CHAT, j(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), 400),
    ("model int", CHAT, j(model=3), 400),
    ("unknown model", CHAT, j(model="gpt-9"), 404),
    ("max_tokens negative", CHAT, j(max_tokens=-1), 400),
    ("max_tokens zero", CHAT, j(max_tokens=0), 400),
    ("max_tokens huge", CHAT, j(max_tokens=10 ** 9), 400),
    ("max_tokens string", CHAT, j(max_tokens="10"), 400),
    ("max_tokens fraction", CHAT, j(max_tokens=1.5), 400),
    ("max_completion_tokens negative", CHAT, j(max_completion_tokens=-5), 400),
    ("temperature negative", CHAT, j(temperature=-1), 400),
    ("temperature huge", CHAT, j(temperature=5), 400),
    ("temperature string", CHAT, j(temperature="hot"), 400),
    ("top_p > 1", CHAT, j(top_p=2), 400),
    ("top_k string", CHAT, j(top_k="x"), 400),
    ("min_p negative", CHAT, j(min_p=-0.1), 400),
    ("presence_penalty 3", CHAT, j(presence_penalty=3), 400),
    ("frequency_penalty -3", CHAT, j(frequency_penalty=-3), 400),
    ("repetition_penalty 0", CHAT, j(repetition_penalty=0), 400),
    ("seed string", CHAT, j(seed="abc"), 400),
    ("n zero", CHAT, j(n=0), 400),
    ("n 100", CHAT, j(n=100), 400),
    ("stop five", CHAT, j(stop=["a", "b", "c", "d", "e"]), 400),
    ("stop empty string", CHAT, j(stop=[""]), 400),
    ("stop int", CHAT, j(stop=42), 400),
    ("logprobs string", CHAT, j(logprobs="yes"), 400),
    ("top_logprobs 50", CHAT, j(logprobs=True, top_logprobs=50), 400),
    ("top_logprobs alone", CHAT, j(top_logprobs=2), 400),
    ("stream string", CHAT, j(stream="yes"), 400),
    ("stream_options string", CHAT, j(stream=True, stream_options="x"), 400),
    ("tools object", CHAT, j(tools={"a": 1}), 400),
    ("tools item int", CHAT, j(tools=[1]), 400),
    ("tool without name", CHAT, j(tools=[{"type": "function", "function": {}}]), 400),
    ("tool name with spaces", CHAT, j(tools=[{"type": "function", "function": {"name": "a b"}}]), 400),
    ("tool parameters string", CHAT, j(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400),
    ("tool type wrong", CHAT, j(tools=[{"type": "retrieval", "function": {"name": "f"}}]), 400),
    ("tool_choice bogus", CHAT, j(tools=[TOOL], tool_choice="sometimes"), 400),
    ("tool_choice unknown fn", CHAT, j(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), 400),
    ("tool_choice without tools", CHAT, j(tool_choice="auto"), 400),
    ("template kwargs string", CHAT, j(chat_template_kwargs="x"), 400),
    ("response_format bad", CHAT, j(response_format={"type": "xml"}), 400),
    ("assistant tool_calls garbage", CHAT, j(messages=[{"role": "user", "content": "x"},
                                                         {"role": "assistant", "tool_calls": [{"function": 3}]}]), 400),
    ("bad utf-8", CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', 400),
    ("prompt longer than context", CHAT, j(messages=[{"role": "user", "content": "word " * 3000}]), 400),
    ("completion no prompt", COMP, b'{"model":"qwen3"}', 400),
    ("completion prompt int", COMP, jc(prompt=5), 400),
    ("completion id out of range", COMP, jc(prompt=[999999]), 400),
    ("completion id negative", COMP, jc(prompt=[-1]), 400),
    ("completion empty list", COMP, jc(prompt=[]), 400),
    ("completion empty string", COMP, jc(prompt=""), 400),
    ("completion suffix", COMP, jc(suffix="x"), 400),
    ("completion echo", COMP, jc(echo=True), 400),
    ("completion logprobs 10", COMP, jc(logprobs=10), 400),
    ("completion invalid json", COMP, b"{", 400),
]


def raw(srv, method, path, body=None, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r


def check_error(status, data, want):
    assert status == want, (status, data[:300])
    e = json.loads(data)["error"]
    assert isinstance(e["message"], str) and e["message"]
    assert isinstance(e["type"], str) and "param" in e and "code" in e
    return e


@pytest.mark.parametrize("name,path,body,want", BAD, ids=[b[0] for b in BAD])
def test_bad_request(srv, name, path, body, want):
    status, data, _ = raw(srv, "POST", path, body)
    check_error(status, data, want)


def test_bad_input_suite_size():
    assert len(BAD) + 5 >= 50


@pytest.mark.parametrize("method,path,want", [("GET", CHAT, 405), ("GET", "/nope", 404), ("POST", "/v1/models", 405),
                                              ("DELETE", "/healthz", 405), ("GET", "/v1/models/other", 404)])
def test_bad_route(srv, method, path, want):
    status, data, _ = raw(srv, method, path, b"" if method != "GET" else None)
    check_error(status, data, want)


@pytest.mark.parametrize("path,body,field", [
    (CHAT, j(frobnicate=True), "frobnicate"),
    (CHAT, j(functions=[{"name": "f"}]), "functions"),
    (CHAT, j(cache_prompt=False), "cache_prompt"),
    (CHAT, j(prompt="x"), "prompt"),
    (COMP, jc(messages=U), "messages"),
    (COMP, jc(response_format={"type": "text"}), "response_format"),
    (COMP, jc(store=True), "store"),
])
def test_unknown_fields_are_400(srv, path, body, field):
    # docs/api_fields.md: every accepted field is listed; anything else is named in a 400
    status, data, _ = raw(srv, "POST", path, body)
    err = check_error(status, data, 400)
    assert err["param"] == field and err["code"] == "unsupported_parameter" and field in err["message"], err


def test_noop_fields_accepted(srv):
    noops = dict(user="u1", metadata={"a": "b"}, store=False, service_tier="auto", parallel_tool_calls=True,
                 safety_identifier="s", prompt_cache_key="k")
    status, data, _ = raw(srv, "POST", CHAT, j(**noops))
    assert status == 200 and json.loads(data)["object"] == "chat.completion", data
    status, data, _ = raw(srv, "POST", COMP, jc(user="u1"))
    assert status == 200 and json.loads(data)["object"] == "text_completion", data
    status, data, _ = raw(srv, "POST", CHAT, j(user=5))
    assert check_error(status, data, 400)["param"] == "user"


def test_oversized_body(srv):
    big = j(messages=[{"role": "user", "content": "x" * (2 << 20)}])
    status, data, _ = raw(srv, "POST", CHAT, big)
    check_error(status, data, 413)
    # chunked upload, no Content-Length: refused once it passes the limit
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.putrequest("POST", CHAT)
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    chunk = b"x" * 65536
    try:
        for _ in range(24):
            c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        check_error(r.status, r.read(), 413)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close as soon as it answered
    c.close()
    # a declared size far beyond the limit is refused before the body is sent
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
    sock.settimeout(10)
    head = sock.recv(4096)
    sock.close()
    assert head.startswith(b"HTTP/1.1 413"), head[:100]
    assert srv.health()["status"] == "ok"


def test_still_serving_after_bad_input(srv, client):
    r = client.chat.completions.create(model="qwen3", messages=U, max_tokens=3)
    assert r.choices[0].message.role == "assistant"
    assert srv.health()["service"]["responses_5xx"] == 0


def test_slow_loris():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--http-timeout-seconds", "1")
    try:
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        # meanwhile others are served
        r = s.client().chat.completions.create(model="qwen3", messages=U, max_tokens=2)
        assert r.choices
        sock.settimeout(5)
        t0 = time.time()
        try:
            got = sock.recv(100)
        except ConnectionResetError:
            got = b""
        assert got == b"" and time.time() - t0 < 4.5  # closed by the server's idle timeout
        sock.close()
        # a body trickled a byte at a time never goes idle, but runs out of total time
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        t0 = time.time()
        closed = False
        while time.time() - t0 < 5 and not closed:
            try:
                sock.sendall(b" ")
                time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed and time.time() - t0 < 4
        sock.close()
        assert s.health()["status"] == "ok"
    finally:
        s.stop()


def test_disconnect_frees_slot():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--debug-step-delay-ms", "20")
    try:
        c = s.client()
        stream = c.chat.completions.create(model="qwen3", messages=U, max_tokens=500, stream=True,
                                           extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        assert s.health()["scheduler"]["running"] == 1
        stream.close()
        t0 = time.time()
        h = s.wait_idle(timeout=2)
        assert time.time() - t0 < 1.0
        assert h["memory"]["kv_tokens_used"] == 0 and h["service"]["cancelled"] >= 1
        # a non-stream request whose client goes away
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = j(max_tokens=500, ignore_eos=True)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
        assert s.health()["scheduler"]["running"] == 1
        sock.close()
        s.wait_idle(timeout=2)
        assert c.chat.completions.create(model="qwen3", messages=U, max_tokens=2).choices
    finally:
        s.stop()


def test_queue_full_429():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "1", "--scheduler-max-waiting-requests", "1",
                     "--debug-step-delay-ms", "20")
    try:
        c = s.client()
        stream = c.chat.completions.create(model="qwen3", messages=U, max_tokens=400, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        with cf.ThreadPoolExecutor(1) as ex:
            waiting = ex.submit(lambda: c.chat.completions.create(model="qwen3", messages=U, max_tokens=3))
            # generous: on a loaded machine the second request can take seconds to be queued,
            # and the third must not take its place
            # (the stream's first chunk, the role, comes before the engine admits the first
            # request, so "one waiting" alone may be the first request itself)
            deadline = time.time() + 60
            while time.time() < deadline:
                sch = s.health()["scheduler"]
                if sch["running"] >= 1 and sch["waiting"] >= 1:
                    break
                time.sleep(0.02)
            assert s.health()["scheduler"]["waiting"] == 1
            with pytest.raises(openai.RateLimitError) as ei:
                c.chat.completions.create(model="qwen3", messages=U, max_tokens=3)
            assert ei.value.status_code == 429
            err = ei.value.body
            assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
            stream.close()
            assert waiting.result(timeout=10).choices
        assert s.health()["service"]["rejected_busy"] == 1
    finally:
        s.stop()


def test_sigterm_drains():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--debug-step-delay-ms", "10")
    c = s.client()
    results = {}

    def one(k):
        text, finish, done = "", None, False
        for ch in c.chat.completions.create(model="qwen3", messages=U, max_tokens=60, stream=True,
                                            extra_body={"ignore_eos": True}):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        results[k] = finish

    def nonstream(k):
        r = c.chat.completions.create(model="qwen3", messages=U, max_tokens=40, extra_body={"ignore_eos": True})
        results[k] = r.choices[0].finish_reason

    ts = [threading.Thread(target=one, args=(0,)), threading.Thread(target=nonstream, args=(1,))]
    for t in ts:
        t.start()
    deadline = time.time() + 5
    while s.health()["scheduler"]["running"] < 2 and time.time() < deadline:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(timeout=20)
    assert results == {0: "length", 1: "length"}
    log = s.stop()
    assert "shut down cleanly" in log
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", s.port), timeout=1)


def test_load_with_disconnects():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "8", "--ctx-size", "512")
    c = s.client(timeout=60)
    statuses = []

    def one(i):
        prompt = [{"role": "user", "content": "request %d " % i + "abc " * (i % 7)}]
        try:
            if i % 8 == 3:  # gives up early
                st = c.chat.completions.create(model="qwen3", messages=prompt, max_tokens=64, stream=True,
                                               extra_body={"ignore_eos": True})
                for k, _ in enumerate(st):
                    if k == 2:
                        break
                st.close()
                return "gone"
            if i % 2:
                r = c.chat.completions.create(model="qwen3", messages=prompt, max_tokens=16 + i % 9)
                assert r.choices[0].finish_reason in ("stop", "length")
                assert r.usage.completion_tokens <= 16 + i % 9
                return 200
            text, fin = "", None
            for ch in c.chat.completions.create(model="qwen3", messages=prompt, max_tokens=16, stream=True):
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    fin = ch.choices[0].finish_reason or fin
            assert fin in ("stop", "length")
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    try:
        rss = []
        for rnd in range(2):
            with cf.ThreadPoolExecutor(32) as ex:
                statuses += list(ex.map(one, range(rnd * 120, rnd * 120 + 120)))
            h = s.wait_idle(timeout=10)
            assert h["memory"]["kv_tokens_used"] == 0
            rss.append(h["memory"]["rss_bytes"])
        assert len(statuses) == 240
        assert all(x in (200, "gone") for x in statuses), [x for x in statuses if x not in (200, "gone")]
        h = s.health()
        assert h["service"]["responses_5xx"] == 0
        assert rss[1] - rss[0] < 32 << 20, rss  # no growth between rounds beyond allocator noise
    finally:
        s.stop()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_waiting_streams_do_not_spin():
    """Connections waiting for slow tokens sleep on their request's condition variable."""
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--debug-step-delay-ms", "50")
    try:
        c = s.client()
        t0 = cpu_seconds(s.proc.pid)
        with cf.ThreadPoolExecutor(2) as ex:
            a = ex.submit(lambda: list(c.completions.create(model="qwen3", prompt="hi", max_tokens=20, stream=True,
                                                            extra_body={"ignore_eos": True})))
            b = ex.submit(lambda: list(c.chat.completions.create(model="qwen3", messages=U, max_tokens=20,
                                                                 stream=True, extra_body={"ignore_eos": True})))
            assert a.result() and b.result()
        used = cpu_seconds(s.proc.pid) - t0
        assert used < 0.5, f"server used {used:.2f} s of CPU for two 1-second streams"
    finally:
        s.stop()
