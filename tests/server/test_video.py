"""Video in chat (issue 24): content parts `video_url` (vLLM's form, data:video/...;base64 URLs)
through the official openai client against transformers' greedy outputs
(tools/mkfix_vision.py --e2e-video: Qwen3VLProcessor decodes the clip with torchcodec, samples
frames, writes the "<t seconds>" text per temporal group), a video with an image, streaming, and
every refusal a 400 naming what was wrong (each limit its flag), the server alive afterwards.

The model folder is the e2e_video fixture (its own tokenizer.json with <|video_pad|>, a template
that renders video parts, small-budget processor configs) with the shared qwen3_5 weights."""
import base64
import json
import os

import openai
import pytest

from conftest import FIXTURES, ROOT, start_server

E2E = os.path.join(ROOT, "tests", "fixtures", "qwen3_5_vision", "e2e_video")
CLIPS = os.path.join(ROOT, "tests", "fixtures", "vision_video")
EXP = json.load(open(os.path.join(E2E, "expected.json")))
CASES = {c["name"]: c for c in EXP["cases"]}
MIME = {".mp4": "video/mp4", ".webm": "video/webm", ".mkv": "video/x-matroska", ".png": "image/png"}


@pytest.fixture(scope="module")
def video_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("video_e2e")
    for f in ("config.json", "chat_template.jinja", "preprocessor_config.json", "video_preprocessor_config.json",
              "tokenizer.json"):
        os.symlink(os.path.join(E2E, f), d / f)
    for f in ("model.safetensors", "tokenizer_config.json", "generation_config.json"):
        os.symlink(os.path.join(FIXTURES, "qwen3_5", f), d / f)
    return str(d)


@pytest.fixture(scope="module")
def vsrv(video_model):
    s = start_server(video_model, "--parallel", "4", "--ctx-size", "512")
    yield s
    s.stop()


def data_url(raw, mime):
    return "data:%s;base64,%s" % (mime, base64.b64encode(raw).decode())


def file_url(path):
    return data_url(open(path, "rb").read(), MIME[os.path.splitext(path)[1]])


def vpart(url):
    return {"type": "video_url", "video_url": {"url": url}}


def ipart(url):
    return {"type": "image_url", "image_url": {"url": url}}


def messages(case):
    """The case's messages with each image / video part carrying its file as a data URL."""
    c = CASES[case]
    imgs, vids = iter(c["images"]), iter(c["videos"])
    out = []
    for m in c["messages"]:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "image":
                parts.append(ipart(file_url(os.path.join(E2E, next(imgs)))))
            elif p["type"] == "video":
                parts.append(vpart(file_url(os.path.join(E2E, next(vids)))))
            else:
                parts.append(p)
        out.append({"role": m["role"], "content": parts})
    return out


def ask(cl, msgs, **kw):
    kw.setdefault("max_tokens", EXP["n_gen"])
    return cl.chat.completions.create(model=cl.models.list().data[0].id, messages=msgs, temperature=0, **kw)


@pytest.mark.parametrize("case", ["video", "video_webm", "image_video"])
def test_video_chat_matches_transformers(vsrv, case):
    r = ask(vsrv.client(), messages(case))
    c = CASES[case]
    assert r.choices[0].message.content == c["greedy_text"]
    assert r.usage.prompt_tokens == len(c["prompt_ids"])  # video tokens and timestamp text counted
    assert r.usage.completion_tokens == EXP["n_gen"]


def test_video_chat_streaming(vsrv):
    chunks = ask(vsrv.client(), messages("video"), stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.usage:
            usage = ch.usage
    assert text == CASES["video"]["greedy_text"]
    assert usage.prompt_tokens == len(CASES["video"]["prompt_ids"])


def test_video_requests_at_once(vsrv):
    import concurrent.futures as cf
    cl = vsrv.client()
    names = ["video", "image_video", "video_webm", "video"]
    with cf.ThreadPoolExecutor(4) as ex:
        got = [f.result().choices[0].message.content for f in [ex.submit(ask, cl, messages(c)) for c in names]]
    assert got == [CASES[c]["greedy_text"] for c in names]


def bad_request(cl, msgs, *words):
    with pytest.raises(openai.BadRequestError) as ei:
        ask(cl, msgs, max_tokens=2)
    assert ei.value.status_code == 400
    msg = ei.value.body["message"] if isinstance(ei.value.body, dict) else str(ei.value)
    for w in words:
        assert w.lower() in msg.lower(), msg
    return msg


def user(*parts):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "what happens?"}]}]


def clip(name):
    return open(os.path.join(CLIPS, name), "rb").read()


MP4 = clip("h264_96x64.mp4")
BAD = [
    ("truncated_mp4", vpart(data_url(clip("bad/truncated.mp4"), "video/mp4")), ("video 0", "container")),
    ("truncated_faststart", vpart(data_url(clip("bad/truncated_faststart.mp4"), "video/mp4")), ("truncated",)),
    ("truncated_webm", vpart(data_url(clip("bad/truncated.webm"), "video/webm")), ("truncated",)),
    ("audio_only", vpart(data_url(clip("bad/audio_only.mp4"), "video/mp4")), ("no video stream",)),
    ("garbage", vpart(data_url(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 40, "video/mp4")), ("video 0",)),
    ("cut_in_half", vpart(data_url(MP4[: len(MP4) // 2], "video/mp4")), ("video 0",)),
    ("bad_base64", vpart("data:video/mp4;base64,AAAA!!!notbase64"), ("base64",)),
    ("empty", vpart("data:video/mp4;base64,"), ("empty",)),
    ("not_a_video_type", vpart(data_url(MP4, "image/png")), ("video/",)),
    ("remote_url", vpart("https://example.com/clip.mp4"), ("remote", "data:")),
    ("not_data_url", vpart("file:///etc/passwd"), ("data:",)),
    ("no_url", {"type": "video_url", "video_url": {"uri": "x"}}, ("video_url",)),
]


@pytest.mark.parametrize("name,p,words", BAD, ids=[b[0] for b in BAD])
def test_bad_video_is_400(vsrv, name, p, words):
    bad_request(vsrv.client(), user(p), *words)


def test_video_outside_user_message(vsrv):
    msgs = [{"role": "system", "content": [vpart(file_url(os.path.join(E2E, "h264_96x64.mp4")))]},
            {"role": "user", "content": "hi"}]
    bad_request(vsrv.client(), msgs, "user messages")


def test_video_pad_typed_in_text(vsrv):
    msgs = [{"role": "user", "content": [vpart(file_url(os.path.join(E2E, "h264_96x64.mp4"))),
                                         {"type": "text", "text": "<|video_pad|>"}]}]
    bad_request(vsrv.client(), msgs, "placeholder")


def test_alive_after_bad_video(vsrv):
    test_video_chat_matches_transformers(vsrv, "video")
    r = ask(vsrv.client(), [{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.fixture(scope="module")
def limit_srv(video_model):
    s = start_server(video_model, "--ctx-size", "256", "--max-video-frames", "3", "--max-video-bytes", "25000",
                     "--max-video-pixels", "5000", "--max-videos-per-request", "1", "--max-video-seconds", "2")
    yield s
    s.stop()


LIMITS = [  # clip (bytes, w x h, frames sampled, seconds) -> the limit it breaks
    ("vp9_80x60.webm", "--max-video-bytes"),        # 27263 bytes > 25000
    ("h264_96x64.mp4", "--max-video-pixels"),       # 96 x 64 = 6144 > 5000
    ("vp9_odd_64x45.webm", "--max-video-seconds"),  # 2.5 s > 2
    ("h264_rot180_80x48.mp4", "--max-video-frames"),  # 4 sampled > 3
]


@pytest.mark.parametrize("name,flag", LIMITS, ids=[x[1] for x in LIMITS])
def test_video_limits_are_400_naming_the_flag(limit_srv, name, flag):
    bad_request(limit_srv.client(), user(vpart(file_url(os.path.join(CLIPS, name)))), flag)


def test_video_within_limits_and_too_many(limit_srv):
    tiny = vpart(file_url(os.path.join(CLIPS, "h264_tiny_24x20.mp4")))  # 3 frames, 0.3 s, 24 x 20
    r = ask(limit_srv.client(), user(tiny), max_tokens=2)
    assert r.usage.completion_tokens == 2 and r.usage.prompt_tokens > 4
    bad_request(limit_srv.client(), user(tiny, tiny), "at most 1", "--max-videos-per-request")


def test_video_to_text_only_model():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--ctx-size", "256")
    try:
        bad_request(s.client(), user(vpart(file_url(os.path.join(E2E, "h264_96x64.mp4")))), "text only", "video")
        r = ask(s.client(), [{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.choices[0].message.content is not None
    finally:
        s.stop()


@pytest.fixture(scope="module")
def clip_host():
    """A local HTTP server: /clip.mp4 (the e2e clip), /big.mp4 (over --max-video-bytes), 404 else."""
    import http.server
    import threading
    mp4 = open(os.path.join(E2E, "h264_96x64.mp4"), "rb").read()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/clip.mp4": mp4, "/big.mp4": mp4 * 3}.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()


def test_remote_video_from_allowed_host(video_model, clip_host):
    """http(s) video URLs follow the image policy: fetched only from --allowed-image-domains hosts,
    capped at --max-video-bytes."""
    s = start_server(video_model, "--ctx-size", "256", "--allowed-image-domains", "127.0.0.1",
                     "--max-video-bytes", "40000", "--image-fetch-timeout-seconds", "5")
    try:
        msgs = messages("video")
        msgs[0]["content"][0] = vpart(clip_host + "/clip.mp4")
        r = ask(s.client(), msgs)
        assert r.choices[0].message.content == CASES["video"]["greedy_text"]
        bad_request(s.client(), user(vpart(clip_host + "/big.mp4")), "40000")
        bad_request(s.client(), user(vpart(clip_host + "/nothing.mp4")), "404")
        bad_request(s.client(), user(vpart(clip_host.replace("127.0.0.1", "localhost") + "/clip.mp4")),
                    "--allowed-image-domains")
    finally:
        s.stop()
