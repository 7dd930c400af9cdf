"""Tests for bench/load_test.py's checks against tests/bench/stub_server.py (no model): a good
server passes, every kind of broken answer fails. The run against anna-serve itself is the
server_load ctest (tests/server/test_load.py).

Run: python3 -m pytest -q tests/bench/test_load_test.py
"""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, HERE)

import load_test as lt  # noqa: E402
from stub_server import StubConfig, StubServer  # noqa: E402


@pytest.fixture
def stub(request):
    cfg = getattr(request, "param", None) or StubConfig(ttft=0.002, itl=0.001)
    s = StubServer(cfg)
    s.start()
    yield s
    s.stop()


def run(stub, capsys, tmp_path, *extra):
    out = tmp_path / "s.json"
    rc = lt.main(["--base-url", stub.base_url, "--no-server-checks", "--max-n", "1", "--requests", "40",
                  "--concurrency", "8", "--json", str(out), *extra])
    text = capsys.readouterr().out
    return rc, json.loads(out.read_text()), text


def test_good_server_passes_with_disconnects(stub, capsys, tmp_path):
    rc, s, text = run(stub, capsys, tmp_path, "--disconnect-fraction", "0.3")
    assert rc == 0, s["failures"]
    assert s["outcomes"]["ok"] > 15 and s["outcomes"]["disconnected"] > 5
    assert text.rstrip().endswith("RESULT PASS")
    assert any(r.get("stream") for r in stub.state.requests) and any(not r.get("stream") for r in stub.state.requests)
    assert any(isinstance(r.get("prompt"), str) for r in stub.state.requests)
    assert any("messages" in r for r in stub.state.requests)


@pytest.mark.parametrize("stub", [StubConfig(ttft=0.001, itl=0.001, garbage_sse=True)], indirect=True)
def test_non_json_event_fails(stub, capsys, tmp_path):
    rc, s, text = run(stub, capsys, tmp_path, "--disconnect-fraction", "0")
    assert rc == 1 and any("not JSON" in f for f in s["failures"]) and "RESULT FAIL" in text


@pytest.mark.parametrize("stub", [StubConfig(ttft=0.001, itl=0.001, cut_after=3)], indirect=True)
def test_stream_without_done_fails(stub, capsys, tmp_path):
    rc, s, _ = run(stub, capsys, tmp_path, "--disconnect-fraction", "0", "--stream-fraction", "1")
    assert rc == 1 and any("[DONE]" in f or "Error" in f for f in s["failures"])


@pytest.mark.parametrize("stub", [StubConfig(ttft=0.001, itl=0.001, fail_every=4)], indirect=True)
def test_500_fails_even_with_expect_503(stub, capsys, tmp_path):
    rc, s, _ = run(stub, capsys, tmp_path, "--disconnect-fraction", "0", "--expect-503")
    assert rc == 1 and sum("HTTP 500" in f for f in s["failures"]) >= 5


@pytest.mark.parametrize("stub", [StubConfig(ttft=0.001, itl=0.001, usage=False)], indirect=True)
def test_missing_usage_fails(stub, capsys, tmp_path):
    rc, s, _ = run(stub, capsys, tmp_path, "--disconnect-fraction", "0")
    assert rc == 1 and any("usage" in f for f in s["failures"])


def test_usage_and_block_checks():
    p = lt.Plan(index=0, route="chat", stream=False, usage=True, n=1, max_tokens=4, ignore_eos=True, stop=None,
                shared=False, disconnect="", cut_after=0, words=["a"])
    assert lt.check_usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}, p, "u") == (3, 4)
    for bad in ({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 8},
                {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},  # ignore_eos: must be 4
                {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4},
                {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}, None):
        with pytest.raises(lt.Bad):
            lt.check_usage(bad, p, "u")
    ok = {"kv_blocks": {"total": 10, "used": 2, "free": 5, "cached": 3, "held_by_sequences": 0,
                        "held_by_exact_cache": 2, "unaccounted": 0}}
    assert lt.check_blocks(ok) == []
    leak = json.loads(json.dumps(ok))
    leak["kv_blocks"]["unaccounted"] = 1
    assert "leak" in lt.check_blocks(leak)[0]
    busy = json.loads(json.dumps(ok))
    busy["kv_blocks"]["held_by_sequences"] = 2
    assert lt.check_blocks(busy)
    old = {"kv_blocks": {"total": 10, "used": 1, "free": 6, "cached": 3}}  # no holder accounting
    assert "leak" in lt.check_blocks(old)[0]
    sums = {"kv_blocks": {"total": 10, "used": 0, "free": 6, "cached": 3}}
    assert "!= total" in lt.check_blocks(sums)[0]


def test_server_down_and_usage_errors(capsys):
    assert lt.main(["--base-url", "http://127.0.0.1:9", "--requests", "1"]) == 1
    for bad in (["--requests", "0"], ["--disconnect-fraction", "2"], ["--max-rss-growth-mb", "5"],
                ["--base-url", "https://x"]):
        with pytest.raises(SystemExit) as e:
            lt.parse_args(bad)
        assert e.value.code == 2


@pytest.mark.parametrize("stub", [StubConfig(ttft=0.05, itl=0.02, tokens=16)], indirect=True)
def test_deadline_stops_sending_and_fails(stub, capsys, tmp_path):
    rc, s, text = run(stub, capsys, tmp_path, "--disconnect-fraction", "0", "--deadline", "0.3",
                      "--concurrency", "2", "--requests", "60")
    assert rc == 1 and s["outcomes"].get("not_sent", 0) > 10 and s["outcomes"].get("ok", 0) >= 2
    assert "not sent" in s["checks"]["complete"] and "RESULT FAIL" in text
