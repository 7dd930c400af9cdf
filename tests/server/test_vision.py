"""Images in chat (issue 24): content parts `image_url` with data: URLs through the official
openai client against transformers' greedy outputs (tools/mkfix_vision.py --e2e), and every
refusal a 400 naming what was wrong, the server alive afterwards.

The model folder is the e2e fixture (config with the tokenizer's own vision ids, a chat template
that renders image parts, a small-pixel processor config) with the shared qwen3_5 fixture's
weights and tokenizer linked beside it."""
import base64
import json
import os
import struct
import zlib

import openai
import pytest

from conftest import FIXTURES, ROOT, start_server

E2E = os.path.join(ROOT, "tests", "fixtures", "qwen3_5_vision", "e2e")
EXP = json.load(open(os.path.join(E2E, "expected.json")))
CASES = {c["name"]: c for c in EXP["cases"]}


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision_e2e")
    for f in ("config.json", "chat_template.jinja", "preprocessor_config.json"):
        os.symlink(os.path.join(E2E, f), d / f)
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        os.symlink(os.path.join(FIXTURES, "qwen3_5", f), d / f)
    return str(d)


@pytest.fixture(scope="module")
def vsrv(vision_model):
    s = start_server(vision_model, "--parallel", "4", "--ctx-size", "512", "--max-images-per-request", "2",
                     "--max-image-pixels", "1000000", "--max-image-bytes", "200000")
    yield s
    s.stop()


def data_url(raw, mime="image/png"):
    return "data:%s;base64,%s" % (mime, base64.b64encode(raw).decode())


def img(name):
    raw = open(os.path.join(E2E, name), "rb").read()
    return data_url(raw, "image/jpeg" if name.endswith(".jpg") else "image/png")


def part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def messages(case):
    """The case's messages with each image part carrying its file as a data URL."""
    c = CASES[case]
    files = iter(c["images"])
    out = []
    for m in c["messages"]:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = [part(img(next(files))) if p["type"] == "image" else p for p in m["content"]]
        out.append({"role": m["role"], "content": parts})
    return out


def ask(cl, msgs, **kw):
    kw.setdefault("max_tokens", EXP["n_gen"])
    return cl.chat.completions.create(model=cl.models.list().data[0].id, messages=msgs, temperature=0, **kw)


@pytest.mark.parametrize("case", ["one_image", "two_images", "cli_two_images"])
def test_image_chat_matches_transformers(vsrv, case):
    r = ask(vsrv.client(), messages(case))
    c = CASES[case]
    assert r.choices[0].message.content == c["greedy_text"]
    assert r.usage.prompt_tokens == len(c["prompt_ids"])  # visual tokens counted
    assert r.usage.completion_tokens == EXP["n_gen"]


def test_image_chat_streaming(vsrv):
    chunks = ask(vsrv.client(), messages("one_image"), stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.usage:
            usage = ch.usage
    assert text == CASES["one_image"]["greedy_text"]
    assert usage.prompt_tokens == len(CASES["one_image"]["prompt_ids"])


def test_two_image_requests_at_once_and_repeated(vsrv):
    """Concurrent image requests decode in one batch; a repeat of the same image prompt (prompts
    shorter than a block: no prefix reuse here, see test_repeated_image_hits_prefix_cache) gives the
    same answer, and a different image at the same pad
    positions gives its own."""
    import concurrent.futures as cf
    cl = vsrv.client()
    with cf.ThreadPoolExecutor(4) as ex:
        fs = [ex.submit(ask, cl, messages(c)) for c in ("one_image", "two_images", "one_image", "cli_two_images")]
        got = [f.result().choices[0].message.content for f in fs]
    assert got == [CASES[c]["greedy_text"] for c in ("one_image", "two_images", "one_image", "cli_two_images")]
    other = messages("one_image")
    other[0]["content"][0] = part(img("tall.jpg"))
    # the tiny random model picks the same first token for both images (transformers too: logits
    # differ by ~0.3, the argmax not), so compare the chosen token's log-probability
    first = ask(cl, messages("one_image"), max_tokens=1, logprobs=True).choices[0].logprobs.content[0]
    r = ask(cl, other, max_tokens=1, logprobs=True)
    assert r.usage.prompt_tokens == len(CASES["one_image"]["prompt_ids"]) + 2  # 8 pads instead of 6
    lp = r.choices[0].logprobs.content[0]
    assert lp.token != first.token or abs(lp.logprob - first.logprob) > 1e-3, (lp, first)


def png_header(w, h):
    """A PNG signature + IHDR chunk claiming w x h (valid CRC), then a truncated IDAT."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 10) + b"IDAT" + b"\0" * 4


def jpeg_header(w, h):
    """SOI, a baseline SOF0 claiming w x h with 3 components, an SOS header, a little data."""
    sof = struct.pack(">BHHB", 8, h, w, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    sos = b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00"
    return (b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof + b"\xff\xda" +
            struct.pack(">H", len(sos) + 2) + sos + b"\0" * 16 + b"\xff\xd9")


def bad_request(cl, msgs, *words):
    with pytest.raises(openai.BadRequestError) as ei:
        ask(cl, msgs, max_tokens=2)
    assert ei.value.status_code == 400
    msg = ei.value.body["message"] if isinstance(ei.value.body, dict) else str(ei.value)
    for w in words:
        assert w.lower() in msg.lower(), msg
    return msg


def user(*parts):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "what is it?"}]}]


BAD = [
    ("corrupt", part(data_url(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)), ("PNG",)),
    ("truncated", part(data_url(open(os.path.join(E2E, "wide.png"), "rb").read()[:300])), ("PNG", "truncated")),
    ("bad_base64", part("data:image/png;base64,iVBORw0K!!!notbase64"), ("base64",)),
    ("unsupported_format", part(data_url(b"BM" + b"\0" * 60, "image/bmp")), ("format",)),
    ("not_an_image_type", part("data:text/plain;base64,aGVsbG8="), ("image/",)),
    ("png_50000", part(data_url(png_header(50000, 50000))), ("50000", "--max-image-pixels")),
    ("jpeg_50000", part(data_url(jpeg_header(50000, 50000), "image/jpeg")), ("50000", "--max-image-pixels")),
    ("too_large_bytes", part(data_url(b"\x89PNG" + b"\0" * 300000)), ("--max-image-bytes",)),
    ("remote_url", part("https://example.com/cat.png"), ("remote", "data:")),
    ("http_url", part("http://169.254.169.254/latest"), ("remote",)),
    ("not_data_url", part("file:///etc/passwd"), ("data:",)),
    ("bad_detail", {"type": "image_url", "image_url": {"url": img("wide.png"), "detail": "ultra"}}, ("detail",)),
]


@pytest.mark.parametrize("name,p,words", BAD, ids=[b[0] for b in BAD])
def test_bad_image_is_400(vsrv, name, p, words):
    bad_request(vsrv.client(), user(p), *words)


def test_too_many_images(vsrv):
    u = part(img("wide.png"))
    bad_request(vsrv.client(), user(u, u, u), "at most 2", "--max-images-per-request")


def test_image_outside_user_message(vsrv):
    msgs = [{"role": "system", "content": [part(img("wide.png"))]}, {"role": "user", "content": "hi"}]
    bad_request(vsrv.client(), msgs, "user messages")


def test_pad_token_typed_in_text(vsrv):
    msgs = [{"role": "user", "content": [part(img("wide.png")), {"type": "text", "text": "<|image_pad|>"}]}]
    bad_request(vsrv.client(), msgs, "placeholder")


def test_alive_after_bad_input(vsrv):
    test_image_chat_matches_transformers(vsrv, "one_image")
    r = ask(vsrv.client(), [{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_image_to_text_only_model():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--ctx-size", "256")
    try:
        bad_request(s.client(), user(part(img("wide.png"))), "text only")
        r = ask(s.client(), [{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.choices[0].message.content is not None
    finally:
        s.stop()


def test_image_requests_survive_preemption(vision_model):
    """A pool of 8 blocks of 16 positions for 4 slots: four image sequences (29 prompt tokens + 8
    generated) outgrow it together and get preempted; a resumed one runs the tower and its prompt
    again, then the tokens it had generated, and still gives transformers' greedy text."""
    # the four requests arrive within the coalescing wait and steps are slowed, so they run together
    s = start_server(vision_model, "--parallel", "4", "--ctx-size", "128", "--kv-block-len", "16", "--kv-blocks", "8",
                     "--no-prompt-cache", "--scheduler-batch-wait-ms", "300", "--debug-step-delay-ms", "10")
    try:
        import concurrent.futures as cf
        cl = s.client()
        # each prompt takes 2 blocks (29 tokens) and needs a third at position 32: the four fill
        # the pool at admission and preempt each other while generating
        names = ["one_image"] * 4
        with cf.ThreadPoolExecutor(4) as ex:
            fs = [ex.submit(ask, cl, messages(c)) for c in names]
            got = [f.result().choices[0].message.content for f in fs]
        assert got == [CASES[c]["greedy_text"] for c in names]
        assert s.health()["scheduler"]["preemptions"] > 0
    finally:
        s.stop()


@pytest.fixture(scope="module")
def image_host():
    """A local HTTP server: /wide.png, /big.png (300 KB), /redirect (302 to /wide.png), 404 else."""
    import http.server
    import threading
    wide = open(os.path.join(E2E, "wide.png"), "rb").read()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/wide.png": wide, "/big.png": b"\x89PNG" + b"\0" * 300000}.get(self.path)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/wide.png")
                self.end_headers()
                return
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture(scope="module")
def fetch_srv(vision_model):
    s = start_server(vision_model, "--allowed-image-domains", "127.0.0.1,*.example.org", "--max-image-bytes", "200000",
                     "--image-fetch-timeout-seconds", "5")
    yield s
    s.stop()


def test_remote_image_from_allowed_host(fetch_srv, image_host):
    msgs = messages("one_image")
    msgs[0]["content"][0] = part(image_host + "/wide.png")
    r = ask(fetch_srv.client(), msgs)
    assert r.choices[0].message.content == CASES["one_image"]["greedy_text"]
    assert r.usage.prompt_tokens == len(CASES["one_image"]["prompt_ids"])


@pytest.mark.parametrize("path,words", [
    ("http://localhost:{port}/wide.png", ("'localhost'", "--allowed-image-domains")),
    ("http://127.0.0.2:{port}/wide.png", ("'127.0.0.2'", "not among")),
    ("{host}/missing.png", ("HTTP status 404",)),
    ("{host}/redirect", ("302", "redirects are not followed")),
    ("{host}/big.png", ("over 200000 bytes", "--max-image-bytes")),
    ("http://127.0.0.1@evil.example.com:{port}/wide.png", ("'evil.example.com'",)),
])
def test_remote_image_refusals(fetch_srv, image_host, path, words):
    port = image_host.rsplit(":", 1)[1]
    bad_request(fetch_srv.client(), user(part(path.format(host=image_host, port=port))), *words)


def noise_png(seed, w=128, h=128):
    """A w x h RGB PNG of seeded noise (incompressible: every image distinct)."""
    import random
    rnd = random.Random(seed)
    rows = b"".join(b"\0" + bytes(rnd.getrandbits(8) for _ in range(3 * w)) for _ in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def metrics(s):
    import urllib.request
    with urllib.request.urlopen(s.url + "/metrics") as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line.startswith("anna_mm_"):
                k, v = line.split()
                out[k] = float(v)
        return out


def metrics_when(s, want, timeout=5):
    """/metrics once its anna_mm_* values include `want` (the engine publishes after each step)."""
    import time
    deadline = time.time() + timeout
    while True:
        m = metrics(s)
        if all(m.get(k) == v for k, v in want.items()) or time.time() > deadline:
            return m
        time.sleep(0.05)


def test_encoder_cache_budget_lru(vision_model):
    """--mm-cache-mib 1: each 128x128 noise image (max_pixels 16384: 64 patches) costs 64 x 1536
    f32 pixels + 16 x 128 f32 rows = 401408 bytes, so two fit and a third evicts the least
    recently used. Hits give the same answer as the tower; /metrics counts hits, misses,
    evictions and bytes. The prefix cache is off so every request meets the encoder cache."""
    s = start_server(vision_model, "--ctx-size", "256", "--no-prompt-cache", "--mm-cache-mib", "1")
    try:
        cl = s.client()
        A, B, C = (data_url(noise_png(i)) for i in range(3))
        q = lambda u: ask(cl, user(part(u)), max_tokens=4)
        a1 = q(A).choices[0].message.content
        assert metrics_when(s, {"anna_mm_cache_misses_total": 1})["anna_mm_cache_entries"] == 1
        a2 = q(A).choices[0].message.content
        mm = metrics_when(s, {"anna_mm_cache_hits_total": 1})
        assert a2 == a1
        assert mm["anna_mm_cache_hits_total"] == 1 and mm["anna_mm_cache_misses_total"] == 1
        assert mm["anna_mm_cache_bytes"] == 401408 and mm["anna_mm_cache_budget_bytes"] == 1 << 20
        q(B), q(C)  # C needs room: A (least recently used) goes
        mm = metrics_when(s, {"anna_mm_cache_misses_total": 3})
        assert mm["anna_mm_cache_evictions_total"] == 1 and mm["anna_mm_cache_entries"] == 2
        assert mm["anna_mm_cache_bytes"] == 2 * 401408
        q(C)  # still cached
        assert metrics_when(s, {"anna_mm_cache_hits_total": 2})["anna_mm_cache_misses_total"] == 3
        a3 = q(A).choices[0].message.content  # evicted: the tower again, same answer
        mm = metrics_when(s, {"anna_mm_cache_misses_total": 4})
        assert a3 == a1 and mm["anna_mm_cache_evictions_total"] == 2 and mm["anna_mm_tower_runs_total"] == 4
    finally:
        s.stop()


def test_encoder_cache_off(vision_model):
    s = start_server(vision_model, "--ctx-size", "256", "--no-prompt-cache", "--mm-cache-mib", "0")
    try:
        for _ in range(2):
            r = ask(s.client(), messages("one_image"))
            assert r.choices[0].message.content == CASES["one_image"]["greedy_text"]
        mm = metrics_when(s, {"anna_mm_tower_runs_total": 2})
        assert mm["anna_mm_tower_runs_total"] == 2 and mm["anna_mm_cache_hits_total"] == 0
        assert mm["anna_mm_cache_misses_total"] == 0 and mm["anna_mm_cache_budget_bytes"] == 0
        assert mm["anna_mm_cache_bytes"] == 0
    finally:
        s.stop()


def prefix_metrics(s):
    import urllib.request
    with urllib.request.urlopen(s.url + "/metrics") as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line.startswith(("anna_prefix_cache_", "anna_prompt_cache_", "anna_mm_")):
                k, v = line.split()
                out[k] = float(v)
        return out


def ask_lp(cl, msgs):
    r = ask(cl, msgs, logprobs=True)
    return r.choices[0].message.content, [t.logprob for t in r.choices[0].logprobs.content]


def test_repeated_image_hits_prefix_cache(vision_model):
    """Blocks of 16 positions with a GDN state snapshot at each boundary: the first block of
    one_image's 29-token prompt holds the whole image (pads keyed by its content). The same
    image + text again reuses that block (16 cached tokens, the tower does not run) and answers
    the same; another image of the same size at the same positions (same token ids) gets no
    false hit and answers as a server without prefix caching does."""
    args = ("--ctx-size", "256", "--kv-block-len", "16", "--prompt-cache-block", "16", "--prompt-cache-size", "0")
    s = start_server(vision_model, *args)
    ref = start_server(vision_model, *args[:-6], "--no-prompt-cache")
    try:
        cl, rc = s.client(), ref.client()
        first = ask_lp(cl, messages("one_image"))
        assert first[0] == CASES["one_image"]["greedy_text"]
        s.wait_idle()
        m0 = metrics_when(s, {"anna_mm_tower_runs_total": 1})
        p0 = prefix_metrics(s)
        again = ask_lp(cl, messages("one_image"))
        s.wait_idle()
        p1 = prefix_metrics(s)
        assert again[0] == first[0]
        assert max(abs(a - b) for a, b in zip(again[1], first[1])) < 1e-4
        assert p1["anna_prefix_cache_hit_tokens_total"] - p0["anna_prefix_cache_hit_tokens_total"] == 16
        assert p1["anna_mm_tower_runs_total"] == m0["anna_mm_tower_runs_total"]  # the image came from the cache
        # another image, same size (same grid, same 6 pads at the same positions): no false hit
        other = messages("one_image")
        other[0]["content"][0] = part(data_url(noise_png(7, 90, 64)))
        got = ask_lp(cl, other)
        s.wait_idle()
        p2 = prefix_metrics(s)
        assert p2["anna_prefix_cache_hit_tokens_total"] == p1["anna_prefix_cache_hit_tokens_total"]
        assert p2["anna_mm_tower_runs_total"] == p1["anna_mm_tower_runs_total"] + 1
        want = ask_lp(rc, other)
        assert got[0] == want[0]
        assert max(abs(a - b) for a, b in zip(got[1], want[1])) < 1e-4
        # and it differs from the first image's answer somewhere (the check can fail)
        assert got != first
        # the other image repeated hits its own blocks
        ask_lp(cl, other)
        s.wait_idle()
        assert prefix_metrics(s)["anna_prefix_cache_hit_tokens_total"] == p2["anna_prefix_cache_hit_tokens_total"] + 16
    finally:
        s.stop()
        ref.stop()


def test_mmproj_server(vision_model):
    """anna-serve --mmproj: the e2e folder with its tower from the llama.cpp mmproj GGUF
    (tools/mkfix_mmproj.py) answers as transformers; a text GGUF of another hidden size + the
    mmproj is a startup error naming the mismatch."""
    mmproj = os.path.join(ROOT, "tests", "fixtures", "mmproj", "qwen3_5.mmproj.gguf")
    s = start_server(vision_model, "--ctx-size", "256", "--mmproj", mmproj)
    try:
        r = ask(s.client(), messages("one_image"))
        assert r.choices[0].message.content == CASES["one_image"]["greedy_text"]
        assert r.usage.prompt_tokens == len(CASES["one_image"]["prompt_ids"])
    finally:
        s.stop()
    import subprocess
    from conftest import server_bin
    other = os.path.join(ROOT, "tests", "fixtures", "gguf", "qwen3_5_x.gguf")
    p = subprocess.run([server_bin(), "--model", other, "--mmproj", mmproj, "--port", "0"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert "projection_dim) 128 does not match the text model's hidden size 96" in p.stdout + p.stderr
