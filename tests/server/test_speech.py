"""POST /v1/audio/speech in anna-serve's speech mode, through the official openai client.

The model folder is assembled in a temporary directory from the repository's random-weight
fixtures: tests/fixtures/qwen3_tts (talker), tests/fixtures/qwen3_tts_codec as its
speech_tokenizer/, and the Qwen2.5 tokenizer.json that scripts/fetch_tokenizers.sh puts in
~/.cache/anna/tokenizers/qwen2.5 (the fixture's cases were tokenized with it). Checks:
- every response_format but aac decodes with libsndfile (ctypes) at 24 kHz to the expected
  length; pcm is byte-identical to `anna-speak --stream` with the server's chunking and seed;
- with_streaming_response yields the same bytes in several chunks, with the format's
  Content-Type; stream_format=sse gives speech.audio.delta events whose base64 audio
  concatenates to the same bytes, then one speech.audio.done with usage;
- bad input is a 4xx naming the field and the process stays up;
- a client that leaves mid-stream cancels its synthesis at once (debug_delay_ms hook);
- speed (libavfilter atempo): 2.0 gives about half the samples, 0.5 about twice;
- a VoiceDesign folder (tests/fixtures/qwen3_tts_design, same weights) answers with the
  instructions as anna-speak --instructions does (pcm byte-identical), needs instructions, and
  ignores the voice OpenAI's clients must send; the 0.6B CustomVoice refuses instructions;
- voice cloning with a Base folder (tests/fixtures/qwen3_tts_clone): POST /v1/audio/voices
  (multipart name + file + transcript) registers the clip's x-vector, GET lists it (and a
  CustomVoice model's presets), /v1/audio/speech with that voice equals anna-speak --ref-audio
  byte for byte; bad names, clips and voices are 400s naming the field.
"""
import base64
import ctypes
import ctypes.util
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import ROOT, Server, server_bin

TOK = os.path.expanduser(os.path.join(os.environ.get("ANNA_CACHE", "~/.cache/anna"), "tokenizers", "qwen2.5",
                                      "tokenizer.json"))
TEXT = "Hello there, this is a test."
NAME = "qwen3-tts-fixture"


@pytest.fixture(scope="module")
def model_dir():
    assert os.path.exists(TOK), "needs scripts/fetch_tokenizers.sh (the qwen2.5 tokenizer.json)"
    d = tempfile.mkdtemp(prefix="anna_tts_")
    fx = os.path.join(ROOT, "tests", "fixtures")
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(fx, "qwen3_tts", f), os.path.join(d, f))
    os.symlink(os.path.join(fx, "qwen3_tts_codec"), os.path.join(d, "speech_tokenizer"))
    os.symlink(TOK, os.path.join(d, "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def tts(model_dir):
    s = Server(model_dir, "--model-name", NAME, "--debug-hooks")
    yield s
    s.stop()


def post(srv, body, timeout=60):
    req = urllib.request.Request(srv.url + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


_SF = None


def sndfile():
    global _SF
    if _SF is None:
        _SF = ctypes.CDLL(ctypes.util.find_library("sndfile") or "libsndfile.so.1")
        _SF.sf_open.restype = ctypes.c_void_p
        _SF.sf_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
        _SF.sf_readf_float.restype = ctypes.c_int64
        _SF.sf_readf_float.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        _SF.sf_close.argtypes = [ctypes.c_void_p]
    return _SF


class SfInfo(ctypes.Structure):
    _fields_ = [("frames", ctypes.c_int64), ("samplerate", ctypes.c_int), ("channels", ctypes.c_int),
                ("format", ctypes.c_int), ("sections", ctypes.c_int), ("seekable", ctypes.c_int)]


def decode(data, ext):
    """(sample rate, channels, frames read to the end) as libsndfile decodes data."""
    sf = sndfile()
    with tempfile.NamedTemporaryFile(suffix="." + ext) as f:
        f.write(data)
        f.flush()
        info = SfInfo()
        h = sf.sf_open(f.name.encode(), 0x10, ctypes.byref(info))  # SFM_READ
        assert h, "libsndfile cannot open the %s answer" % ext
        buf = (ctypes.c_float * 8192)()
        n = 0
        while True:
            k = sf.sf_readf_float(h, buf, 8192 // max(info.channels, 1))
            if k <= 0:
                break
            n += k
        sf.sf_close(h)
        return info.samplerate, info.channels, n


def speak_bin():
    return os.path.join(os.path.dirname(server_bin()), "anna-speak")


def reference_pcm(model_dir, voice="ryan", seed=0):
    """anna-speak --stream with the server's defaults: sampling, seed 0, chunks 2 then 16."""
    r = subprocess.run([speak_bin(), "--model-dir", model_dir, "--text", TEXT, "--speaker", voice, "--seed", str(seed),
                        "--first-chunk-frames", "2", "--chunk-frames", "16", "--stream"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def test_pcm_matches_cli(tts, model_dir):
    client = tts.client()
    audio = client.audio.speech.create(model=NAME, voice="ryan", input=TEXT, response_format="pcm")
    data = audio.content
    ref = reference_pcm(model_dir)
    assert len(data) > 0 and len(data) % (2 * 1920) == 0
    assert data == ref


@pytest.mark.parametrize("fmt,ext,tol", [("wav", "wav", 0), ("flac", "flac", 0), ("mp3", "mp3", 2400),
                                         ("opus", "ogg", 2400)])
def test_formats_decode(tts, model_dir, fmt, ext, tol):
    n_ref = len(reference_pcm(model_dir)) // 2
    client = tts.client()
    resp = client.audio.speech.with_raw_response.create(model=NAME, voice="ryan", input=TEXT, response_format=fmt)
    assert resp.headers["content-type"] == {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg",
                                            "opus": "audio/ogg"}[fmt]
    rate, ch, n = decode(resp.content, ext)
    assert (rate, ch) == (24000, 1)
    assert n_ref - tol <= n <= n_ref + tol, (n, n_ref)


def test_streaming_response(tts, model_dir):
    client = tts.client()
    chunks = []
    with client.audio.speech.with_streaming_response.create(model=NAME, voice="vivian", input=TEXT,
                                                            response_format="pcm", extra_body={"seed": 4}) as r:
        assert r.headers["content-type"] == "audio/pcm"
        assert r.headers.get("transfer-encoding") == "chunked"
        for c in r.iter_bytes(chunk_size=None):
            chunks.append(c)
    data = b"".join(chunks)
    assert data == reference_pcm(model_dir, voice="vivian", seed=4)
    # 36 frames: a 2-frame first chunk then 16-frame ones leave as separate writes
    assert len(data) == 36 * 1920 * 2


def test_sse(tts, model_dir):
    st, hdr, body = post(tts, {"model": NAME, "input": TEXT, "voice": "ryan", "response_format": "pcm",
                               "stream_format": "sse"})
    assert st == 200 and hdr["Content-Type"] == "text/event-stream"
    events = [json.loads(ln[6:]) for ln in body.decode().split("\n") if ln.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) >= 2
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio == reference_pcm(model_dir)
    u = done["usage"]
    assert u["input_tokens"] == 16 and u["output_tokens"] == len(audio) // (2 * 1920)
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]


@pytest.mark.parametrize("body,status,param", [
    ({"model": NAME, "input": "", "voice": "ryan"}, 400, "input"),
    ({"model": NAME, "input": "a" * 100000, "voice": "ryan"}, 400, "input"),
    ({"model": NAME, "input": TEXT, "voice": "alloy"}, 400, "voice"),
    ({"model": NAME, "input": TEXT}, 400, "voice"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "response_format": "aac"}, 400, "response_format"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "response_format": "ogg"}, 400, "response_format"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "speed": 0.1}, 400, "speed"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "speed": 9}, 400, "speed"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "instructions": "whisper"}, 400, "instructions"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "stream_format": "ws"}, 400, "stream_format"),
    ({"model": NAME, "input": TEXT, "voice": "ryan", "temperature": 0.5}, 400, "temperature"),
    ({"model": "gpt-4o-mini-tts", "input": TEXT, "voice": "ryan"}, 404, "model"),
    ({"model": NAME, "input": 5, "voice": "ryan"}, 400, "input"),
])
def test_bad_input(tts, body, status, param):
    st, _, out = post(tts, body)
    err = json.loads(out)["error"]
    assert st == status and err["param"] == param, (st, err)
    assert param in err["message"] or status == 404


def test_bad_language_and_json(tts):
    st, _, out = post(tts, {"model": NAME, "input": TEXT, "voice": "ryan", "language": "klingon"})
    assert st == 400 and "klingon" in json.loads(out)["error"]["message"]
    req = urllib.request.Request(tts.url + "/v1/audio/speech", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    with pytest.raises(openai.BadRequestError):
        tts.client().audio.speech.create(model=NAME, voice="alloy", input=TEXT)
    assert tts.get_json("/healthz")["status"] == "ok"


def test_text_routes_refused(tts):
    st, _, out = post(tts, {})  # sanity: the speech route answers
    assert st == 400
    req = urllib.request.Request(tts.url + "/v1/chat/completions", data=b"{}",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 404 and b"speech model" in e.value.read()
    assert tts.get_json("/v1/models")["data"][0]["id"] == NAME


def busy(srv):
    return srv.get_json("/healthz")["busy"]


def test_disconnect_mid_stream(tts):
    # seed 4 makes 36 frames; 1-frame chunks with 300 ms after each: about 11 s if not cancelled
    body = json.dumps({"model": NAME, "input": TEXT, "voice": "vivian", "seed": 4, "response_format": "pcm",
                       "debug_delay_ms": 300}).encode()
    s = socket.create_connection(("127.0.0.1", tts.port), timeout=30)
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 1920 * 2:
        got += s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")
    assert busy(tts) == 1
    t0 = time.time()
    s.close()
    while busy(tts) and time.time() - t0 < 5:
        time.sleep(0.05)
    assert busy(tts) == 0, "synthesis still running after the client left"
    assert time.time() - t0 < 2.0
    time.sleep(0.2)
    assert "cancelled: client gone" in tts.log()
    # the next request is served normally
    st, _, out = post(tts, {"model": NAME, "input": TEXT, "voice": "ryan", "response_format": "pcm"})
    assert st == 200 and len(out) > 0


def test_speech_on_text_model_refused(fixture_model):
    s = Server(fixture_model)
    try:
        st, _, out = post(s, {"model": "x", "input": TEXT, "voice": "ryan"})
        assert st == 400 and "not a speech model" in json.loads(out)["error"]["message"]
    finally:
        s.stop()


def test_speed_stretches(tts):
    client = tts.client()
    n1 = len(client.audio.speech.create(model=NAME, voice="vivian", input=TEXT, response_format="pcm",
                                        extra_body={"seed": 4}).content) // 2
    n2 = len(client.audio.speech.create(model=NAME, voice="vivian", input=TEXT, response_format="pcm", speed=2.0,
                                        extra_body={"seed": 4}).content) // 2
    rate, ch, n05 = decode(client.audio.speech.create(model=NAME, voice="vivian", input=TEXT, response_format="wav",
                                                      speed=0.5, extra_body={"seed": 4}).content, "wav")
    assert (rate, ch) == (24000, 1)
    assert abs(n2 - n1 / 2) <= 0.05 * n1 / 2, (n1, n2)
    assert abs(n05 - n1 * 2) <= 0.05 * n1 * 2, (n1, n05)


@pytest.fixture(scope="module")
def design_dir():
    assert os.path.exists(TOK), "needs scripts/fetch_tokenizers.sh (the qwen2.5 tokenizer.json)"
    d = tempfile.mkdtemp(prefix="anna_tts_design_")
    fx = os.path.join(ROOT, "tests", "fixtures")
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.realpath(os.path.join(fx, "qwen3_tts_design", f)), os.path.join(d, f))
    os.symlink(os.path.join(fx, "qwen3_tts_codec"), os.path.join(d, "speech_tokenizer"))
    os.symlink(TOK, os.path.join(d, "tokenizer.json"))
    return d


DESIGN = "A calm, deep male voice, speaking slowly."


def test_voice_design(design_dir):
    s = Server(design_dir, "--model-name", NAME)
    try:
        client = s.client()
        data = client.audio.speech.create(model=NAME, voice="alloy", input=TEXT, response_format="pcm",
                                          instructions=DESIGN).content
        r = subprocess.run([speak_bin(), "--model-dir", design_dir, "--text", TEXT, "--instructions", DESIGN,
                            "--seed", "0", "--first-chunk-frames", "2", "--chunk-frames", "16", "--stream"],
                           capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        assert len(data) > 0 and data == r.stdout
        st, _, out = post(s, {"model": NAME, "input": TEXT, "voice": "alloy"})
        err = json.loads(out)["error"]
        assert st == 400 and err["param"] == "instructions" and "VoiceDesign" in err["message"]
    finally:
        s.stop()


def multipart(fields, files, boundary="ANNAVOICEBOUNDARY"):
    out = b""
    for k, v in fields.items():
        out += b"--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n" % (
            boundary.encode(), k.encode(), v.encode())
    for k, (fname, data) in files.items():
        out += b"--%s\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s\"\r\nContent-Type: audio/wav\r\n\r\n" % (
            boundary.encode(), k.encode(), fname.encode()) + data + b"\r\n"
    return out + b"--%s--\r\n" % boundary.encode(), "multipart/form-data; boundary=" + boundary


def post_form(srv, url, fields, files):
    body, ctype = multipart(fields, files)
    req = urllib.request.Request(srv.url + url, data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def clone_dir():
    assert os.path.exists(TOK), "needs scripts/fetch_tokenizers.sh (the qwen2.5 tokenizer.json)"
    d = tempfile.mkdtemp(prefix="anna_tts_clone_")
    fx = os.path.join(ROOT, "tests", "fixtures")
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.realpath(os.path.join(fx, "qwen3_tts_clone", f)), os.path.join(d, f))
    os.symlink(os.path.join(fx, "qwen3_tts_codec"), os.path.join(d, "speech_tokenizer"))
    os.symlink(TOK, os.path.join(d, "tokenizer.json"))
    return d


def test_voice_clone_register_and_speak(clone_dir, tts):
    ref = os.path.join(ROOT, "tests", "fixtures", "qwen3_tts_clone", "ref.wav")
    wav = open(ref, "rb").read()
    s = Server(clone_dir, "--model-name", NAME)
    try:
        st, out = post_form(s, "/v1/audio/voices", {"name": "me", "transcript": "a reference"}, {"file": ("r.wav", wav)})
        assert st == 200 and out["id"] == "me" and out["type"] == "cloned", out
        listed = json.loads(urllib.request.urlopen(s.url + "/v1/audio/voices", timeout=30).read())["data"]
        assert [v["id"] for v in listed] == ["me"] and listed[0]["transcript"] == "a reference"
        data = s.client().audio.speech.create(model=NAME, voice="me", input=TEXT, response_format="pcm").content
        r = subprocess.run([speak_bin(), "--model-dir", clone_dir, "--text", TEXT, "--ref-audio", ref, "--seed", "0",
                            "--first-chunk-frames", "2", "--chunk-frames", "16", "--stream"],
                           capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        assert len(data) > 0 and data == r.stdout
        # bad input: unknown voice, no name, a bad name, not audio, a too short clip
        st, _, out = post(s, {"model": NAME, "input": TEXT, "voice": "nobody"})
        assert st == 400 and json.loads(out)["error"]["param"] == "voice"
        assert post_form(s, "/v1/audio/voices", {}, {"file": ("r.wav", wav)})[0] == 400
        st, out = post_form(s, "/v1/audio/voices", {"name": "a/b"}, {"file": ("r.wav", wav)})
        assert st == 400 and out["error"]["param"] == "name"
        st, out = post_form(s, "/v1/audio/voices", {"name": "x"}, {"file": ("r.wav", b"not audio at all")})
        assert st == 400 and out["error"]["param"] == "file", out
        st, out = post_form(s, "/v1/audio/voices", {"name": "x"}, {"file": ("r.wav", wav[:44 + 400])})
        assert st == 400 and out["error"]["param"] == "file", out
        assert urllib.request.urlopen(s.url + "/healthz", timeout=30).status == 200
    finally:
        s.stop()
    # a CustomVoice model lists its presets and refuses to register a voice
    listed = json.loads(urllib.request.urlopen(tts.url + "/v1/audio/voices", timeout=30).read())["data"]
    assert {v["id"] for v in listed} == {"vivian", "ryan", "eric"} and all(v["type"] == "preset" for v in listed)
    st, out = post_form(tts, "/v1/audio/voices", {"name": "me"}, {"file": ("r.wav", wav)})
    assert st == 400 and "Base" in out["error"]["message"]


def test_debug_max_frames_caps_the_utterance(tts, model_dir):
    # --debug-hooks: "debug_max_frames" caps the frames (benchmarks of random-weight talkers, which
    # rarely sample codec eos: scripts/gpu/media_bench.sh); the same bytes as anna-speak --max-frames
    st, _, out = post(tts, {"model": NAME, "input": TEXT, "voice": "ryan", "response_format": "pcm",
                            "debug_max_frames": 2})
    assert st == 200 and len(out) == 2 * 1920 * 2, (st, len(out))
    r = subprocess.run([speak_bin(), "--model-dir", model_dir, "--text", TEXT, "--speaker", "ryan", "--seed", "0",
                        "--first-chunk-frames", "2", "--chunk-frames", "16", "--max-frames", "2", "--stream"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout == out, r.stderr.decode()
    st, _, out = post(tts, {"model": NAME, "input": TEXT, "voice": "ryan", "debug_max_frames": 0})
    assert st == 400 and json.loads(out)["error"]["param"] == "debug_max_frames"
