"""Bytes that are not HTTP (a TLS ClientHello, random binary, a bare line of garbage) must get
a 400 or a closed connection promptly, never a wait for the idle timeout (--http-timeout-
seconds, 60 s by default). Bytes that end a line are answered at once (400, or MHD's own 400 /
505); bytes that never end a line (nothing to parse) are cut by --http-header-timeout-seconds,
here 1 s. Each probe uses a raw socket with a 2-second timeout; the server must keep serving
afterwards."""
import os
import random
import socket
import time

import pytest

from conftest import FIXTURES, start_server

# A TLS 1.2/1.3 ClientHello as curl sends it to https://127.0.0.1 (record header, handshake
# header, version, 32 random bytes, session id, cipher suites, compression, extensions).
CLIENT_HELLO = bytes.fromhex(
    "16030100c4010000c00303" + "11" * 32 + "20" + "22" * 32 +
    "0026c02bc02fc02cc030cca9cca8c009c013c00ac014009c009d002f0035c012000a130113021303" +
    "0100004d000b000403000102000a000a0008001d001700180019000d0018001604030503060308040805" +
    "08060401050106010201000500050100000000ff01000100002300000010000b000908687474702f312e31")

rnd = random.Random(1234)
PROBES = {
    "tls-client-hello": CLIENT_HELLO,
    "random-binary": bytes(rnd.randrange(256) for _ in range(512)),
    "random-no-newline": bytes(rnd.randrange(1, 256) for _ in range(64)).replace(b"\n", b"x").replace(b"\r", b"x"),
    "garbage-line": b"\x00\x01\x02 hello there\r\n\r\n",
    "ssh-banner": b"SSH-2.0-OpenSSH_9.6\r\n",
    "bad-version": b"GET / HTTP/9.9\r\n\r\n",
    "nul-in-method": b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n",
}


def probe(port, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    t0 = time.time()
    s.sendall(data)
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break  # closed
            got += b
            if b"\r\n\r\n" in got and not got.startswith(b"HTTP/1.1 200"):
                break
    except ConnectionResetError:
        pass
    finally:
        s.close()
    return got, time.time() - t0


@pytest.fixture(scope="module")
def nsrv():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "1", "--ctx-size", "256",
                     "--http-header-timeout-seconds", "1")
    yield s
    s.stop()


@pytest.mark.parametrize("name", list(PROBES))
def test_non_http_answered_promptly(nsrv, name):
    srv = nsrv
    # socket.timeout (2 s without an answer or a close) fails the test
    got, dt = probe(srv.port, PROBES[name])
    assert dt < 2
    if got:
        status = got.split(b"\r\n", 1)[0]
        assert status.startswith(b"HTTP/1.") and status.split(b" ")[1] in (b"400", b"505"), got[:200]
    assert srv.health()["status"] == "ok"


def test_header_timeout_spares_slow_but_valid_client(nsrv):
    # a client that sends its request line and headers in pieces, each within the header
    # timeout, is served; once the request is in, the normal idle timeout applies
    s = socket.create_connection(("127.0.0.1", nsrv.port), timeout=10)
    for part in (b"GET /hea", b"lthz HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
        s.sendall(part)
        time.sleep(0.5)
    got = s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    s.close()


def test_unknown_method_is_400(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
    s.sendall(b"FROB /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    got = s.recv(4096)
    s.close()
    assert got.startswith(b"HTTP/1.1 400"), got[:200]
