"""anna-serve over HTTPS (--ssl-cert-file / --ssl-key-file, libmicrohttpd's GnuTLS) with the
official openai client (http_client=httpx.Client(verify=an SSL context of the cert)) trusting a self-signed certificate made here by openssl."""
import os
import shutil
import socket
import ssl
import subprocess

import openai
import pytest

try:  # the openai client's own HTTP library: httpx2 in openai 3.x, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx

from conftest import FIXTURES, server_bin, start_server

MODEL = "qwen3"
QWEN3 = os.path.join(FIXTURES, "qwen3")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.fail("openssl is not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tsrv(certs):
    cert, key = certs
    s = start_server(QWEN3, "--parallel", "2", "--ctx-size", "512", "--debug-hooks", "--ssl-cert-file", cert,
                     "--ssl-key-file", key)
    yield s
    s.stop()


def test_openai_client_over_https(tsrv, certs):
    assert tsrv.url.startswith("https://"), tsrv.url
    with httpx.Client(verify=ssl.create_default_context(cafile=certs[0])) as h:
        c = openai.OpenAI(base_url=tsrv.url + "/v1", api_key="anna", max_retries=0, http_client=h)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                      extra_body={"anna_debug_output": "Hello over TLS."})
        assert r.choices[0].message.content == "Hello over TLS."
        chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
                                                extra_body={"anna_debug_output": "streamed"}))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "streamed"
        rr = c.responses.create(model=MODEL, input="hi", extra_body={"anna_debug_output": "ok"})
        assert rr.output_text == "ok"
        assert [m.id for m in c.models.list().data] == [MODEL]


def test_certificate_is_the_one_served(tsrv, certs):
    # the client's default trust store does not know the self-signed certificate
    with httpx.Client() as h:
        c = openai.OpenAI(base_url=tsrv.url + "/v1", api_key="anna", max_retries=0, http_client=h)
        with pytest.raises(openai.APIConnectionError):
            c.models.list()
    # and the handshake presents exactly the file's certificate
    pem = ssl.get_server_certificate(("127.0.0.1", tsrv.port))
    with open(certs[0]) as f:
        assert ssl.PEM_cert_to_DER_cert(pem) == ssl.PEM_cert_to_DER_cert(f.read())


def test_plain_http_gets_no_answer(tsrv):
    """Plain HTTP on the TLS port is not served (the server answers with a TLS alert or closes)."""
    with socket.create_connection(("127.0.0.1", tsrv.port), timeout=10) as so:
        so.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        try:
            while len(data) < 64:
                b = so.recv(64)
                if not b:
                    break
                data += b
        except (socket.timeout, ConnectionResetError):
            pass
    assert not data.startswith(b"HTTP/"), data


def run_fail(*args):
    p = subprocess.run([server_bin(), "--model-dir", QWEN3, "--port", "0", "--threads", "2", *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "Sanitizer" not in p.stderr, p.stderr
    return p.stderr


def test_bad_tls_flags(certs, tmp_path):
    cert, key = certs
    assert "go together" in run_fail("--ssl-cert-file", cert)
    missing = str(tmp_path / "missing.pem")
    err = run_fail("--ssl-cert-file", missing, "--ssl-key-file", key)
    assert "--ssl-cert-file" in err and missing in err and "No such file" in err, err
    notpem = tmp_path / "notpem.pem"
    notpem.write_text("hello")
    err = run_fail("--ssl-cert-file", cert, "--ssl-key-file", str(notpem))
    assert "--ssl-key-file" in err and "not a PEM file" in err, err
    # a PEM that is not a key (the certificate given as the key): GnuTLS refuses it, and says so
    err = run_fail("--ssl-cert-file", cert, "--ssl-key-file", cert)
    assert "cannot start HTTPS" in err, err
