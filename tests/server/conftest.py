"""Fixtures for the anna-serve end-to-end suite.

Every test talks to the real server binary (ANNA_SERVE_BIN, set by ctest; otherwise the
first build folder that has one) started on a free port ("--port 0": the server logs the
port it bound). At teardown the server gets SIGTERM and must exit 0 with no sanitizer
report in its log, so an ASan build of the binary checks for leaks and memory errors too.
ANNA_SERVE_ARGS (shell words) is appended to every server's command line: on the GPU machine
ANNA_SERVE_ARGS="--device cuda" runs the whole suite against the CUDA backend.
"""
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.request

import openai
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.environ.get("ANNA_FIXTURES") or os.path.join(ROOT, "..", "shared", "fixtures")
DEFAULT_MODEL = os.path.expanduser("~/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf")


def server_bin():
    b = os.environ.get("ANNA_SERVE_BIN")
    if b:
        return b
    found = sorted(glob.glob(os.path.join(ROOT, "build*", "src", "cli", "anna-serve")), key=os.path.getmtime)
    if not found:
        raise RuntimeError("anna-serve not built: set ANNA_SERVE_BIN or build the anna-serve target")
    return found[-1]


LIVE = []  # every server started, so none outlives the session even when a test fails early


def pytest_sessionfinish(session, exitstatus):
    for s in LIVE:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


class Server:
    """One anna-serve process; .url, .port, .log() and helpers for raw HTTP."""

    def __init__(self, model, *args, timeout=60):
        self.cmd = [server_bin(), "--model-dir" if os.path.isdir(model) else "--model", model,
                    "--port", "0", "--threads", "2", *args, *shlex.split(os.environ.get("ANNA_SERVE_ARGS", ""))]
        self.lines = []
        env = dict(os.environ)
        # Under ASan a small quarantine keeps RSS comparable between rounds of the load test.
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4:detect_leaks=1"
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", env=env)
        LIVE.append(self)
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()
        deadline = time.time() + timeout
        self.port = None
        self.scheme = "http"
        while time.time() < deadline and self.port is None:
            for ln in list(self.lines):
                m = re.search(r"listening on (https?)://[^:]+:(\d+)", ln)
                if m:
                    self.scheme, self.port = m.group(1), int(m.group(2))
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("anna-serve did not start:\n" + self.log())
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"

    def _pump(self):
        for ln in self.proc.stdout:
            self.lines.append(ln)

    def log(self):
        return "".join(self.lines)

    def client(self, **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 120)
        return openai.OpenAI(base_url=self.url + "/v1", api_key="anna", **kw)

    def get_json(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def health(self):
        try:
            return self.get_json("/healthz")
        except urllib.error.HTTPError as e:  # 503 while draining still carries the body
            return json.loads(e.read())

    def wait_idle(self, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = self.health()
            if h["scheduler"]["running"] == 0 and h["scheduler"]["waiting"] == 0:
                return h
            time.sleep(0.05)
        raise AssertionError("server not idle: %r" % self.health()["scheduler"])

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("anna-serve did not exit after SIGTERM:\n" + self.log()[-4000:])
        self._t.join(timeout=5)
        log = self.log()
        assert "Sanitizer" not in log and "runtime error:" not in log, log[-8000:]
        assert rc == 0, "exit %d\n%s" % (rc, log[-4000:])
        return log


@pytest.fixture(scope="session")
def fixture_model():
    return os.path.join(FIXTURES, "qwen3")


@pytest.fixture(scope="module")
def srv(fixture_model):
    s = Server(fixture_model, "--parallel", "8", "--ctx-size", "1024", "--debug-hooks", "--max-body-bytes", "1048576",
               "--reasoning-format", "deepseek", "--log-format", "json")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def start_server(model, *args, **kw):
    return Server(model, *args, **kw)
