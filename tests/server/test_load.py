"""The load test (bench/load_test.py) at small scale against anna-serve on a fixture model, and
the server accounting it relies on: a client gone early is 499 (never a 500), 503s are counted,
an idle /healthz shows the pool as it is, and KV blocks are accounted by holder.

Its own ctest, server_load (~10 s); server_pytest skips this file.
"""
import http.client
import json
import os
import socket
import sys
import time
import urllib.request

import pytest

from conftest import ROOT, start_server

sys.path.insert(0, os.path.join(ROOT, "bench"))
import load_test  # noqa: E402


def metrics(srv):
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        return load_test.prom(r.read())


@pytest.fixture(scope="module")
def small_pool(fixture_model):
    # 24 blocks of 64 for 16 slots: the load preempts; two exact-cache entries hold blocks at rest.
    s = start_server(fixture_model, "--parallel", "16", "--ctx-size", "512", "--kv-blocks", "24",
                     "--prompt-cache-size", "2", "--log-format", "json")
    yield s
    s.stop()


def test_load_small(small_pool, tmp_path):
    out = tmp_path / "load.json"
    rc = load_test.main(["--base-url", small_pool.url, "--requests", "200", "--concurrency", "16",
                         "--disconnect-fraction", "0.2", "--max-tokens", "32", "--pid", str(small_pool.proc.pid),
                         "--expect-503", "--expect-preemptions", "--json", str(out)])
    s = json.loads(out.read_text())
    assert rc == 0, s["failures"][:10] or s["checks"]
    assert s["outcomes"].get("ok", 0) > 100 and s["outcomes"].get("disconnected", 0) > 20, s["outcomes"]
    # the server saw the clients leave and counted them as such, not as errors
    assert s["server"]["client_closed"] >= 20 and s["server"]["responses_5xx"] == s["server"]["responses_503"]
    kb = s["server"]["kv_blocks"]
    assert kb["unaccounted"] == 0 and kb["held_by_sequences"] == 0 and kb["used"] <= kb["held_by_exact_cache"], kb


def send_half_and_close(srv, path="/v1/chat/completions"):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]}).encode()
    sk = socket.create_connection(("127.0.0.1", srv.port))
    sk.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
               % (path.encode(), len(body)) + body[: len(body) // 2])
    time.sleep(0.05)
    sk.close()


def test_client_gone_mid_upload_is_499_not_500(small_pool):
    m0 = metrics(small_pool)
    for _ in range(3):
        send_half_and_close(small_pool)
    deadline = time.time() + 10
    while time.time() < deadline and metrics(small_pool)["anna_client_closed_total"] < m0["anna_client_closed_total"] + 3:
        time.sleep(0.05)
    m1 = metrics(small_pool)
    assert m1["anna_client_closed_total"] == m0["anna_client_closed_total"] + 3
    assert m1["anna_responses_5xx_total"] == m0["anna_responses_5xx_total"]
    assert '"status":499' in small_pool.log()


def test_503_is_counted_with_retry_after(fixture_model):
    s = start_server(fixture_model, "--parallel", "2", "--ctx-size", "512", "--kv-blocks", "2", "--kv-block-len", "16")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "qwen3", "prompt": "word " * 100}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read())
        assert r.status == 503 and r.getheader("Retry-After") and body["error"]["code"] == "resources_exhausted"
        # counted when the connection completes, which may trail the client reading the answer
        deadline = time.time() + 10
        while time.time() < deadline and metrics(s)["anna_responses_503_total"] < 1:
            time.sleep(0.05)
        m = metrics(s)
        assert m["anna_responses_503_total"] == 1 and m["anna_responses_5xx_total"] == 1
        assert s.health()["service"]["responses_503"] == 1
    finally:
        s.stop()


def test_idle_healthz_counts_blocks_after_cancel(fixture_model):
    # No exact cache: at rest every block is free or a cached prefix. A stream cut mid-way is
    # cancelled between steps; the idle engine must still publish the blocks it gave back.
    s = start_server(fixture_model, "--parallel", "4", "--ctx-size", "512", "--debug-step-delay-ms", "20")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                     body=json.dumps({"model": "qwen3", "prompt": "alpha " * 150, "max_tokens": 200,
                                      "ignore_eos": True, "stream": True}))
        r = conn.getresponse()
        assert r.status == 200
        for _ in range(6):  # three events: the prompt is in the cache, a few tokens decoded
            r.readline()
        busy = s.health()["kv_blocks"]
        assert busy["used"] > 0 and busy["held_by_sequences"] >= busy["used"], busy
        load_test.hang_up(conn)
        h = s.wait_idle()
        deadline = time.time() + 5
        while time.time() < deadline and h["kv_blocks"]["used"]:
            time.sleep(0.05)
            h = s.health()
        kb = h["kv_blocks"]
        assert kb["used"] == 0 and kb["held_by_sequences"] == 0 and kb["unaccounted"] == 0, kb
        assert kb["free"] + kb["cached"] == kb["total"]
        m = metrics(s)
        assert m["anna_kv_blocks_unaccounted"] == 0 and m["anna_kv_blocks_held_sequences"] == 0
    finally:
        s.stop()
