"""A local stand-in for the Hugging Face Hub's download routes, for tests of src/hub/.

Reproduces what huggingface_hub and anna's hub_fetch rely on (as huggingface.co answers):
  GET  /api/models/ORG/NAME/revision/REV      {"id", "sha": COMMIT, "siblings": [{"rfilename"}]}
  HEAD /ORG/NAME/resolve/REV/FILE             small (git) files: 200, ETag "<git blob sha1>",
                                              X-Repo-Commit, Content-Length;
                                              LFS files: 302 to the CDN with X-Linked-Etag
                                              "<sha256>", X-Linked-Size, X-Repo-Commit
  GET  the same, and GET /cdn/SHA256 on a second host name (the CDN), with Range (206)
Errors carry X-Error-Code / X-Error-Message as the Hub's do: RepoNotFound,
RevisionNotFound, EntryNotFound (404) and GatedRepo (401 without a token, 403 with a wrong one).

Test knobs, per repo: gated (needs TOKEN), corrupt (the CDN flips a byte of the body, so the
sha256 check must fail) and cut (the CDN's first N full-body answers break off halfway).
Every request is logged (method, path, Range, Authorization, host) in Hub.log.
"""

import hashlib
import json
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "hf_anna_test_token"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, name, files, commit, gated=False, corrupt=False, cut=0):
        self.name, self.files, self.commit = name, dict(files), commit
        self.gated, self.corrupt, self.cut = gated, corrupt, cut


class Hub:
    """The server: Hub.start() serves on 127.0.0.1 (the Hub) and localhost (the CDN)."""

    def __init__(self):
        self.repos = {}
        self.blobs = {}  # sha256 -> (repo, bytes)
        self.log = []
        self.renamed = {}  # old repo id -> new: resolve answers a relative 307, as the Hub does
        self.lock = threading.Lock()

    def add(self, repo):
        self.repos[repo.name] = repo
        for data in repo.files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = (repo, data)

    def start(self):
        hub = self

        class H(Handler):
            pass

        H.hub = hub
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def requests(self, pred=lambda r: True):
        with self.lock:
            return [r for r in self.log if pred(r)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None

    def log_message(self, *a):
        pass

    def _send(self, code, headers=None, body=b"", head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, code, ecode, msg, head):
        body = json.dumps({"error": msg}).encode()
        self._send(code, {"X-Error-Code": ecode, "X-Error-Message": msg, "Content-Type": "application/json"},
                   body, head)

    def _auth_ok(self, repo, head):
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization", "")
        if not auth:
            self._error(401, "GatedRepo", f"Access to model {repo.name} is restricted. You must have access "
                        "to it and be authenticated to access it. Please log in.", head)
            return False
        if auth != f"Bearer {TOKEN}":
            self._error(403, "GatedRepo", f"Access to model {repo.name} is restricted and you are not in the "
                        "authorized list.", head)
            return False
        return True

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        host = self.headers.get("Host", "")
        with self.hub.lock:
            self.hub.log.append({"method": self.command, "path": path, "range": self.headers.get("Range"),
                                 "auth": self.headers.get("Authorization"), "host": host})
        parts = path.strip("/").split("/")
        if parts[0] == "cdn" and len(parts) == 2:
            return self._cdn(parts[1], head)
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self._api(parts[2] + "/" + parts[3], "/".join(parts[5:]), head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), head)
        self._error(404, "NotFound", f"no route {path}", head)

    def _repo(self, name, rev, head):
        repo = self.hub.repos.get(name)
        if not repo:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.", head)
            return None
        if not self._auth_ok(repo, head):
            return None
        if rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return repo

    def _api(self, name, rev, head):
        repo = self._repo(name, rev, head)
        if repo:
            body = json.dumps({"id": repo.name, "modelId": repo.name, "sha": repo.commit,
                               "siblings": [{"rfilename": f} for f in sorted(repo.files)]}).encode()
            self._send(200, {"Content-Type": "application/json"}, body, head)

    def _resolve(self, name, rev, file, head):
        if name in self.hub.renamed:
            loc = "/" + self.hub.renamed[name] + "/resolve/" + rev + "/" + urllib.parse.quote(file)
            return self._send(307, {"Location": loc}, b"", head)
        repo = self._repo(name, rev, head)
        if not repo:
            return
        data = repo.files.get(file)
        if data is None:
            return self._error(404, "EntryNotFound", f"{file} does not exist on \"{rev}\"", head)
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if file.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            # The Hub's ETag on the redirect is the git oid of the pointer; clients use X-Linked-Etag.
            common.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                           "ETag": f'"{git_blob_sha1(b"pointer " + sha.encode())}"',
                           "Location": f"{self.hub.cdn}/cdn/{sha}?repo={urllib.parse.quote(repo.name)}"})
            return self._send(302, common, b"", head)
        common["ETag"] = f'W/"{git_blob_sha1(data)}"'
        return self._send(200, common, data, head)

    def _cdn(self, sha, head):
        entry = self.hub.blobs.get(sha)
        if not entry:
            return self._error(404, "EntryNotFound", "no such blob", head)
        repo, data = entry
        if repo.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end = 0, len(data)
        rng = self.headers.get("Range")
        if rng:
            spec = rng.replace("bytes=", "")
            a, _, b = spec.partition("-")
            start = int(a)
            end = int(b) + 1 if b else len(data)
            if start >= len(data):
                return self._send(416, {"Content-Range": f"bytes */{len(data)}"}, b"", head)
        body = data[start:end]
        hdrs = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "ETag": f'"{sha}"'}
        code = 200
        if rng:
            code = 206
            hdrs["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        cut = False
        with self.hub.lock:
            if repo.cut > 0 and not head and start == 0:
                repo.cut -= 1
                cut = True
        if not cut:
            return self._send(code, hdrs, body, head)
        # Promise the whole body, send half, hang up: the client sees a short transfer.
        self.send_response(code)
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True
        try:
            import socket

            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def fixture_hub(fixtures):
    """The repos the tests use: a real tiny qwen2 folder model from the fixtures, and GGUF-like
    single files (random bytes: the hub does not care what they hold)."""
    rnd = lambda n, seed: hashlib.shake_256(seed.encode()).digest(n)  # noqa: E731
    hub = Hub()
    qwen2 = os.path.join(fixtures, "qwen2")
    folder = {f: open(os.path.join(qwen2, f), "rb").read()
              for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "chat_template.jinja", "model.safetensors")}
    folder["README.md"] = b"# tiny\n"
    folder["onnx/model.onnx"] = rnd(1000, "onnx")
    folder["expected.json"] = b"{}"  # a top-level JSON that is fetched too (harmless)
    hub.add(Repo("anna-test/tiny-qwen2", folder, "1" * 40))
    hub.renamed["anna-test/old-gguf"] = "anna-test/tiny-gguf"
    hub.add(Repo("anna-test/tiny-gguf", {"tiny-q8_0.gguf": rnd(3 << 20, "q8"), "tiny-q4_0.gguf": rnd(1 << 20, "q4"),
                                          "README.md": b"# gguf\n"}, "2" * 40))
    real = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gguf", "qwen2.gguf")
    hub.add(Repo("anna-test/qwen2-gguf", {"qwen2.gguf": open(real, "rb").read()}, "7" * 40))
    hub.add(Repo("anna-test/multi-gguf", {"Multi-0.5B-Q4_K_M.gguf": rnd(40000, "m1"), "Multi-0.5B-Q4_K.gguf": rnd(40000, "m2"),
                                           "Multi-0.5B-Q8_0.gguf": rnd(40000, "m3"), "mmproj-Multi-Q8_0.gguf": rnd(100, "m4"),
                                           "split/Multi-F16-00001-of-00002.gguf": rnd(100, "m5"),
                                           "split/Multi-F16-00002-of-00002.gguf": rnd(100, "m6")}, "8" * 40))
    hub.add(Repo("anna-test/gated", {"config.json": b'{"gated": true}\n', "weights.gguf": rnd(200000, "g")},
                 "3" * 40, gated=True))
    hub.add(Repo("anna-test/corrupt", {"model.gguf": rnd(500000, "c")}, "4" * 40, corrupt=True))
    hub.add(Repo("anna-test/cut", {"model.gguf": rnd(2 << 20, "cut")}, "5" * 40, cut=1))
    hub.add(Repo("anna-test/cut-twice", {"model.gguf": rnd(1 << 20, "cut2")}, "6" * 40, cut=2))
    return hub


if __name__ == "__main__":  # a manual run: python3 tests/hub/hubmock.py FIXTURES
    import sys
    import time

    h = fixture_hub(sys.argv[1]).start()
    print(h.endpoint, flush=True)
    while True:
        time.sleep(3600)
