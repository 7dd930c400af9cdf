"""Long audio over /v1/audio/transcriptions (issue 25): a clip longer than --audio-chunk-seconds is
cut as qwen-asr cuts it (tools/mkfix_asr_chunk.py: tests/fixtures/qwen3_asr/long, 23 s cut every
6 s into 4 pieces at the reference's own boundaries), the pieces decode side by side as choices of
one engine request, and the transcript is their texts joined as qwen-asr joins them. Checked
through the official openai client: verbose_json has a segment per piece starting at the
reference's offsets whose tokens begin with the reference's greedy ids, and whose texts (each
parsed as qwen-asr parses a piece) concatenate to the text; json/text/srt/vtt agree; the stream's
deltas add up to its done event and to the json text; a short clip stays one piece."""
import json
import os

import pytest

from conftest import ROOT, start_server

ASR = os.path.join(ROOT, "tests", "fixtures", "qwen3_asr")
LONG = os.path.join(ASR, "long")
EXP = json.load(open(os.path.join(LONG, "expected.json")))
PIECES = EXP["model"]["pieces"]


@pytest.fixture(scope="module")
def lsrv():
    s = start_server(ASR, "--parallel", "4", "--ctx-size", "1024", "--max-body-bytes", "4194304",
                     "--max-audio-seconds", "60", "--audio-chunk-seconds", "6")
    yield s
    s.stop()


def transcribe(srv, path=os.path.join(LONG, "long.wav"), **kw):
    with open(path, "rb") as f:
        return srv.client().audio.transcriptions.create(model="qwen3_asr", file=f, **kw)


def test_pieces_are_the_reference_pieces(lsrv):
    r = transcribe(lsrv, response_format="verbose_json", timestamp_granularities=["segment"])
    assert abs(r.duration - EXP["seconds"]) < 1e-3
    assert len(r.segments) == len(PIECES) == 4
    for seg, p in zip(r.segments, PIECES):
        assert abs(seg.start - p["offset"]) < 1e-6, (seg.start, p["offset"])
        assert seg.tokens[:len(p["ids"])] == p["ids"], (seg.tokens[:8], p["ids"])
    assert r.segments[-1].end == r.duration
    # (the texts run to 512 tokens here, so qwen-asr's repetition fix reshapes them: the exact
    # joined text of the reference's 8 ids is cli_transcribe_chunks' and test_asr_chunk's check)
    assert "".join(s.text for s in r.segments) == r.text


def test_formats_agree(lsrv):
    full = transcribe(lsrv).text
    assert transcribe(lsrv, response_format="text") == full
    v = transcribe(lsrv, response_format="verbose_json", timestamp_granularities=["segment"])
    srt = transcribe(lsrv, response_format="srt")
    cues = [c for c in srt.split("\n\n") if c.strip()]
    want = [s for s in v.segments if s.text]
    assert len(cues) == len(want)
    assert cues[1].split("\n")[1] == "00:00:04,900 --> 00:00:15,600"
    assert "".join(c.split("\n", 2)[2] for c in cues) == full
    vtt = transcribe(lsrv, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:04.900\n")


def test_stream_deltas_add_up(lsrv):
    whole = transcribe(lsrv).text
    with open(os.path.join(LONG, "long.wav"), "rb") as f:
        events = list(lsrv.client().audio.transcriptions.create(model="qwen3_asr", file=f, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) >= 2 and events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text == whole
    u = events[-1].usage
    assert u.input_token_details.audio_tokens == sum(p["tokens"] for p in PIECES)
    assert u.input_tokens == u.input_token_details.audio_tokens + u.input_token_details.text_tokens


def test_short_clip_is_one_piece(lsrv):
    r = transcribe(lsrv, os.path.join(ROOT, "tests", "fixtures", "audio", "sweep_8k_mono.wav"),
                   response_format="verbose_json", timestamp_granularities=["segment"])
    assert len(r.segments) == 1 and r.segments[0].start == 0
