"""Idle keep-alive connections must not starve new clients (issue 30: "a few hundred idle
keep-alive connections made a new request time out").

500 sockets each make one keep-alive request (GET /healthz, HTTP/1.1, read the whole reply) and
then stay open doing nothing, as a client pool or a browser does. A new client must still get
its chat completion within a few seconds, and the idle ones are closed by the server after the
keep-alive idle timeout (--http-keepalive-timeout-seconds), never held forever. Also
--max-connections-per-ip caps one address and is a clean refusal, not a hang."""
import socket
import time

import pytest

from conftest import FIXTURES, start_server

N_IDLE = 500


def keepalive_get(port, path="/healthz"):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        b = s.recv(65536)
        if not b:
            raise AssertionError("closed before the reply: %r" % got)
        got += b
    head, body = got.split(b"\r\n\r\n", 1)
    n = int([ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
    while len(body) < n:
        body += s.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def is_closed(s):
    s.settimeout(0.01)
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


@pytest.fixture(scope="module")
def srv():
    s = start_server(f"{FIXTURES}/qwen3", "--parallel", "4", "--ctx-size", "512", "--http-keepalive-timeout-seconds",
                     "6")
    yield s
    s.stop()


def test_new_request_with_500_idle_keepalive_connections(srv):
    idle = []
    try:
        for _ in range(N_IDLE):
            idle.append(keepalive_get(srv.port))
        t0 = time.time()
        r = srv.client(timeout=10).chat.completions.create(
            model="qwen3", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
        dt = time.time() - t0
        assert r.choices[0].message.content is not None
        assert dt < 5, "a new request took %.1f s with %d idle connections" % (dt, N_IDLE)
        # A second new connection also works while all the idle ones are still open.
        s = keepalive_get(srv.port)
        s.close()
        # The idle ones are closed by the server after the keep-alive timeout (6 s here).
        time.sleep(8)
        n_closed = sum(is_closed(s) for s in idle)
        assert n_closed == len(idle), "%d of %d idle connections still open" % (len(idle) - n_closed, len(idle))
    finally:
        for s in idle:
            s.close()
    # And the server keeps serving afterwards.
    assert srv.get_json("/healthz")["status"] in ("ok", "ready")


def test_per_ip_limit_refuses_cleanly():
    s = start_server(f"{FIXTURES}/qwen3", "--parallel", "2", "--ctx-size", "512", "--max-connections-per-ip", "8")
    idle = []
    try:
        for _ in range(8):
            idle.append(keepalive_get(s.port))
        # The ninth from the same address is refused at once (closed), not left hanging.
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.time()
        try:
            got = c.recv(4096)
        except ConnectionResetError:
            got = b""
        assert time.time() - t0 < 3
        assert got == b"" or got.startswith(b"HTTP/1.1 503"), got[:200]
        c.close()
        for x in idle:
            x.close()
        idle = []
        time.sleep(0.3)
        keepalive_get(s.port).close()  # room again once they are gone
    finally:
        for x in idle:
            x.close()
        s.stop()
