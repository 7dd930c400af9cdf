"""Tests for bench/http_bench.py against tests/bench/stub_server.py.

Run: python3 -m pytest -q tests/bench
Timing assertions use generous bounds: the machine is shared and slow.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, "bench", "http_bench.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, HERE)

import http_bench as hb  # noqa: E402
from stub_server import StubConfig, StubServer  # noqa: E402


@pytest.fixture
def stub(request):
    cfg = getattr(request, "param", None) or StubConfig()
    s = StubServer(cfg)
    s.start()
    yield s
    s.stop()


def run_bench(args, capsys):
    rc = hb.main(args)
    out = capsys.readouterr().out
    return rc, out


def run_json(stub, capsys, *extra):
    rc, out = run_bench(["--base-url", stub.base_url, "--json", "--warmup", "0", "--salt", "none", *extra],
                        capsys)
    return rc, json.loads(out)


# ---------------------------------------------------------------- pure functions

def test_percentile_matches_linear_interpolation():
    v = [1.0, 2.0, 3.0, 4.0]
    assert hb.percentile(v, 50) == pytest.approx(2.5)
    assert hb.percentile(v, 0) == 1.0 and hb.percentile(v, 100) == 4.0
    assert hb.percentile(v, 90) == pytest.approx(3.7)
    assert hb.percentile([5.0], 99) == 5.0
    s = hb.summarize([])
    assert s["n"] == 0 and s["p50"] is None
    s = hb.summarize([0.001, 0.003])
    assert s["mean"] == pytest.approx(2.0) and s["max"] == pytest.approx(3.0)


def test_poisson_arrivals_mean_gap_and_all_at_once():
    rng = random.Random(1)
    arr = hb.poisson_arrivals(4001, 20.0, rng)
    assert arr[0] == 0.0 and all(b >= a for a, b in zip(arr, arr[1:]))
    assert arr[-1] / 4000 == pytest.approx(1 / 20.0, rel=0.1)
    assert hb.poisson_arrivals(3, float("inf"), rng) == [0.0, 0.0, 0.0]
    # Same seed, same schedule: two servers see the same arrival pattern.
    assert hb.poisson_arrivals(10, 3.0, random.Random(7)) == hb.poisson_arrivals(10, 3.0, random.Random(7))


def test_scenarios_build_expected_shapes():
    p = hb.build_prompts("concurrent-short", 20, 2400, 2400, None)
    assert len(p) == 20 and all(x.kind == "short" for x in p)
    p = hb.build_prompts("single-long", 2, 3000, 2400, None)
    assert p[0].text == p[1].text and len(p[0].text) >= 3000
    p = hb.build_prompts("mixed", 8, 2400, 2400, None)
    assert [x.kind for x in p].count("long") == 2
    p = hb.build_prompts("repeated-system", 5, 2400, 3000, None)
    systems = {x.messages[0]["content"] for x in p}
    users = {x.messages[1]["content"] for x in p}
    assert len(systems) == 1 and len(next(iter(systems))) >= 3000 and len(users) == 5
    assert all(x.text.startswith(next(iter(systems))) for x in p)  # shared prefix on /v1/completions too


def test_prompt_file_formats(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('"plain"\n{"prompt": "p2"}\n\n{"system": "S", "user": "U"}\n'
                 '{"messages": [{"role": "user", "content": "M"}]}\n')
    p = hb.load_prompt_file(str(f))
    assert [x.text for x in p] == ["plain", "p2", "S\n\nU", "M"]
    assert p[2].messages[0] == {"role": "system", "content": "S"}
    t = tmp_path / "p.txt"
    t.write_text("one\n\ntwo\n")
    assert [x.text for x in hb.load_prompt_file(str(t))] == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError):
        hb.load_prompt_file(str(bad))
    bad.write_text('{"messages": [{"role": "user", "content": 3}]}\n')
    with pytest.raises(ValueError):
        hb.load_prompt_file(str(bad))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError):
        hb.load_prompt_file(str(bad))


# ---------------------------------------------------------------- against the stub

def test_stream_with_usage_timings(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "6", "--concurrency", "3", "--max-tokens", "16",
                     "--seed", "5", "--top-k", "1")
    assert rc == 0
    assert s["counts"] == {"requests": 6, "successful": 6, "failed": 0, "cancelled": 0,
                           "not_started": 0, "empty_outputs": 0, "finish_length": 0, "reconnects": 0}
    assert s["token_count_source"] == "usage"
    assert s["output_tokens"] == 6 * 8 and s["input_tokens"] > 0
    assert s["model"] == "stub-model"  # taken from GET /v1/models
    assert s["ttft_ms"]["n"] == 6 and s["ttft_ms"]["min"] >= 19.0
    assert s["itl_ms"]["n"] == 6 * 7 and s["itl_ms"]["p50"] >= 4.0
    assert s["tpot_ms"]["n"] == 6 and 4.0 <= s["tpot_ms"]["p50"] < 100.0
    assert s["e2e_ms"]["min"] >= 20.0 + 7 * 5.0 - 1.0
    assert s["output_tok_per_s"] == pytest.approx(48 / s["wall_s"])
    assert s["total_tok_per_s"] == pytest.approx((48 + s["input_tokens"]) / s["wall_s"])
    req = stub.state.requests[0]
    assert req["stream"] is True and req["stream_options"] == {"include_usage": True}
    assert req["seed"] == 5 and req["top_k"] == 1 and req["max_tokens"] == 16 and req["temperature"] == 0.0


@pytest.mark.parametrize("stub", [StubConfig(usage=False, tokens=5)], indirect=True)
def test_stream_without_usage_counts_chunks(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "3", "--concurrency", "3")
    assert rc == 0
    assert s["token_count_source"] == "chunks"
    assert s["output_tokens"] == 15  # the role-only first chunk is not a token
    assert s["input_tokens"] is None and s["total_tok_per_s"] is None


@pytest.mark.parametrize("stub", [StubConfig(tokens_per_chunk=4, tokens=8)], indirect=True)
def test_multi_token_chunks_use_usage_for_tpot(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "2")
    assert rc == 0 and s["output_tokens"] == 16
    assert s["itl_ms"]["n"] == 2  # one gap per request: two chunks of four tokens
    assert s["tpot_ms"]["n"] == 2


def test_ignore_eos_and_length_finish(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "2", "--max-tokens", "12", "--ignore-eos")
    assert rc == 0 and s["output_tokens"] == 24 and s["counts"]["finish_length"] == 2
    assert stub.state.requests[0]["ignore_eos"] is True


def test_no_stream(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "3", "--no-stream")
    assert rc == 0 and s["counts"]["successful"] == 3
    assert s["ttft_ms"]["n"] == 0 and s["itl_ms"]["n"] == 0 and s["tpot_ms"]["n"] == 0
    assert s["e2e_ms"]["n"] == 3 and s["output_tokens"] == 24
    assert "stream" not in stub.state.requests[0]


def test_completions_route(stub, capsys):
    rc, s = run_json(stub, capsys, "--route", "completions", "--scenario", "repeated-system",
                     "--requests", "2")
    assert rc == 0 and s["output_tokens"] == 16 and s["ttft_ms"]["n"] == 2
    assert isinstance(stub.state.requests[0]["prompt"], str)
    assert "messages" not in stub.state.requests[0]


@pytest.mark.parametrize("stub", [StubConfig(fail_every=3)], indirect=True)
def test_failures_are_counted_not_fatal(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "9", "--concurrency", "2")
    assert rc == 1
    assert s["counts"]["failed"] == 3 and s["counts"]["successful"] == 6
    assert s["errors"][0]["count"] == 3 and s["errors"][0]["message"].startswith("HTTP 500")
    assert len(stub.state.requests) == 9  # --max-retries 0: no hidden retries
    assert s["e2e_ms"]["n"] == 6  # failures stay out of latency figures


@pytest.mark.parametrize("stub", [StubConfig(stall_s=2.0)], indirect=True)
def test_timeout_is_a_failure(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "2", "--timeout", "0.3")
    assert rc == 1 and s["counts"]["failed"] == 2
    assert s["errors"][0]["message"] == "timeout"


def test_server_down(capsys):
    rc, s = run_bench(["--base-url", "http://127.0.0.1:9", "--model", "m", "--json", "--warmup", "0",
                       "--requests", "2", "--timeout", "2"], capsys)
    d = json.loads(s)
    assert rc == 1 and d["counts"]["failed"] == 2
    assert d["errors"][0]["message"].startswith("connection error")


def test_rate_limited_run_takes_time(stub, capsys):
    t = time.perf_counter()
    rc, s = run_json(stub, capsys, "--requests", "6", "--request-rate", "20", "--seed", "3")
    assert rc == 0 and s["config"]["request_rate"] == 20.0
    arr = hb.poisson_arrivals(6, 20.0, random.Random(3))
    assert time.perf_counter() - t >= arr[-1]


def test_custom_scenario_and_usage_errors(stub, capsys, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["a b c", {"user": "d", "system": "e f"}]))
    rc, s = run_json(stub, capsys, "--scenario", "custom", "--prompt-file", str(f), "--requests", "4")
    assert rc == 0 and s["counts"]["successful"] == 4
    # Requests run concurrently, so the stub may receive them in any order: the custom
    # prompts alternate, so two of the four carry the system message.
    firsts = [r["messages"][0] for r in stub.state.requests]
    assert firsts.count({"role": "system", "content": "e f"}) == 2
    with pytest.raises(SystemExit) as e:
        hb.main(["--scenario", "custom"])
    assert e.value.code == 2
    rc, _ = run_bench(["--base-url", stub.base_url, "--scenario", "custom", "--prompt-file",
                       str(tmp_path / "missing.json")], capsys)
    assert rc == 2


def test_side_by_side_and_compare(capsys, tmp_path):
    a, b = StubServer(StubConfig(itl=0.002)), StubServer(StubConfig(itl=0.02))
    a.start()
    b.start()
    try:
        out = tmp_path / "both.json"
        rc, text = run_bench(["--base-url", a.base_url, "--base-url", b.base_url, "--label", "peer",
                              "--label", "anna", "--requests", "3", "--warmup", "1", "--output", str(out)],
                             capsys)
    finally:
        a.stop()
        b.stop()
    assert rc == 0
    assert "| figure | peer | anna | anna/peer |" in text
    assert len(a.state.requests) == 4  # warm-up + 3
    saved = json.loads(out.read_text())
    assert [x["label"] for x in saved] == ["peer", "anna"]
    assert saved[1]["itl_ms"]["p50"] > saved[0]["itl_ms"]["p50"]
    p1, p2 = tmp_path / "peer.json", tmp_path / "anna.json"
    p1.write_text(json.dumps(saved[0]))
    p2.write_text(json.dumps(saved[1]))
    rc, text = run_bench(["--compare", str(p1), str(p2)], capsys)
    assert rc == 0 and "anna/peer" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| ITL p50 ms"))
    assert float(row.split("|")[-2]) > 1.5
    (tmp_path / "junk.json").write_text("{}")
    rc, _ = run_bench(["--compare", str(tmp_path / "junk.json")], capsys)
    assert rc == 2


@pytest.mark.parametrize("stub", [StubConfig(itl=0.2, tokens=50)], indirect=True)
def test_ctrl_c_prints_partial_results(stub):
    # 4 quick-ish requests finish? No: each takes ~10 s; interrupt after ~1.5 s
    # so that some are in flight and some have not started (concurrency 2).
    proc = subprocess.Popen([sys.executable, BENCH, "--base-url", stub.base_url, "--requests", "6",
                             "--concurrency", "2", "--warmup", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while len(stub.state.requests) < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    s = json.loads(out)
    assert s["interrupted"] is True
    assert s["counts"]["cancelled"] == 6 and s["counts"]["not_started"] == 4
    assert "partial results" in err


@pytest.mark.parametrize("stub", [StubConfig(drop_call=2)], indirect=True)
def test_dropped_connection_before_response_is_retried_once(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "3", "--concurrency", "1")
    assert rc == 0 and s["counts"]["successful"] == 3 and s["counts"]["reconnects"] == 1
    assert len(stub.state.requests) == 4


def test_salt_warmup_and_extra_body(stub, capsys):
    rc, s = run_bench(["--base-url", stub.base_url, "--json", "--warmup", "2", "--requests", "3",
                       "--scenario", "repeated-system", "--salt", "abc", "--extra-body", '{"cache_prompt": false}'],
                      capsys)
    assert rc == 0
    reqs = stub.state.requests
    assert len(reqs) == 5
    warm, timed = reqs[:2], reqs[2:]
    policy = hb.system_policy(2400)
    assert all(policy not in m["content"] for r in warm for m in r["messages"])
    assert all(r["messages"][0]["content"] == "[run abc] " + policy for r in timed)
    assert all(r["cache_prompt"] is False for r in reqs)
    assert json.loads(s)["config"]["salt"] == "abc"
    with pytest.raises(SystemExit):
        hb.main(["--extra-body", "[1]"])


def test_rounds_alternate_servers_and_report_medians(capsys):
    a, b = StubServer(StubConfig(itl=0.001)), StubServer(StubConfig(itl=0.01))
    a.start()
    b.start()
    try:
        rc, text = run_bench(["--base-url", a.base_url, "--base-url", b.base_url, "--label", "peer",
                              "--label", "anna", "--requests", "2", "--warmup", "1", "--rounds", "3",
                              "--salt", "s"], capsys)
    finally:
        a.stop()
        b.stop()
    assert rc == 0
    assert "| figure | peer (median of 3) | anna (median of 3) | anna/peer |" in text
    assert len(a.state.requests) == 9 and len(b.state.requests) == 9
    firsts = [r["messages"][0]["content"] for r in a.state.requests if "warm-up" not in r["messages"][0]["content"]]
    assert {f.split("]")[0] for f in firsts} == {"[run s-r1", "[run s-r2", "[run s-r3"}
    assert firsts == [r["messages"][0]["content"] for r in b.state.requests
                      if "warm-up" not in r["messages"][0]["content"]]
    assert "(round 2/3)" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| successful requests"))
    assert row.split("|")[2].strip() == "2"


def test_median_helper():
    assert hb._median([3, None, 1, 2]) == 2
    assert hb._median([1.0, 4.0]) == 2.5
    assert hb._median([None]) is None


@pytest.mark.parametrize("stub", [StubConfig(cut_after=3), StubConfig(garbage_sse=True)], indirect=True)
def test_broken_streams_are_failures(stub, capsys):
    rc, s = run_json(stub, capsys, "--requests", "2", "--concurrency", "2")
    assert rc == 1 and s["counts"]["failed"] == 2 and s["counts"]["successful"] == 0
    assert s["ttft_ms"]["n"] == 0 and s["output_tok_per_s"] is None
    assert s["errors"] and s["errors"][0]["count"] == 2


# ---------------------------------------------------------------- random scenario, sweeps

def test_random_lengths_follow_vllm_range_ratio():
    rng = random.Random(3)
    v = hb.random_lengths(2000, 1024, 0.75, rng)
    assert min(v) >= 256 and max(v) <= 1792 and min(v) < 300 and max(v) > 1750
    assert abs(sum(v) / len(v) - 1024) < 40
    assert hb.random_lengths(5, 100, 0.0, rng) == [100] * 5
    assert all(1 <= x <= 2 for x in hb.random_lengths(50, 1, 0.5, rng))


def test_random_scenario_sends_token_ids_and_fixed_lengths(stub, capsys):
    rc, s = run_json(stub, capsys, "--scenario", "random", "--requests", "6", "--input-len", "40",
                     "--output-len", "10", "--range-ratio", "0.5", "--token-range", "7:50", "--seed", "5")
    assert rc == 0 and s["counts"]["successful"] == 6
    reqs = stub.state.requests
    want_out = 0
    for r in reqs:
        ids = r["prompt"]
        assert isinstance(ids, list) and 20 <= len(ids) <= 60 and all(7 <= t < 50 for t in ids)
        assert 5 <= r["max_tokens"] <= 15 and r["min_tokens"] == r["max_tokens"] and r["ignore_eos"] is True
        want_out += r["max_tokens"]
    # the stub makes max_tokens tokens under ignore_eos: output lengths are exactly the drawn ones
    assert s["output_tokens"] == want_out and s["counts"]["finish_length"] == 6
    assert s["config"]["route"] == "completions" and s["config"]["range_ratio"] == 0.5
    # same seed, same requests (servers compared see identical prompts)
    a = hb.random_prompts(6, 40, 10, 0.5, (7, 50), 5)
    assert sorted(len(p.token_ids) for p in a) == sorted(len(r["prompt"]) for r in reqs)


def test_random_scenario_without_fixed_output_and_min_tokens(stub, capsys):
    rc, s = run_json(stub, capsys, "--scenario", "random", "--requests", "2", "--input-len", "8",
                     "--output-len", "4", "--no-fixed-output", "--min-tokens", "3")
    assert rc == 0
    for r in stub.state.requests:
        assert "ignore_eos" not in r and r["min_tokens"] == 3 and r["max_tokens"] == 4


def test_salt_changes_random_prompts_within_range():
    ps = hb.random_prompts(3, 30, 5, 0.0, (10, 20), 1)
    a, b = hb.apply_salt(ps, "x1"), hb.apply_salt(ps, "x2")
    assert [p.token_ids[4:] for p in a] == [p.token_ids[4:] for p in ps]
    assert [p.token_ids[:4] for p in a] != [p.token_ids[:4] for p in b]
    assert all(10 <= t < 20 for p in a + b for t in p.token_ids)


def test_random_scenario_usage_errors(capsys):
    for bad in (["--route", "chat"], ["--range-ratio", "1"], ["--token-range", "5"], ["--token-range", "9:3"],
                ["--input-len", "0"]):
        with pytest.raises(SystemExit) as e:
            hb.parse_args(["--scenario", "random", *bad])
        assert e.value.code == 2, bad
    for bad in (["--concurrency", "1,x"], ["--concurrency", "0"], ["--output-partial"], ["--min-tokens", "-1"]):
        with pytest.raises(SystemExit) as e:
            hb.parse_args(bad)
        assert e.value.code == 2, bad


def test_concurrency_sweep_table_and_partial_output(stub, capsys, tmp_path):
    out = tmp_path / "sweep.json"
    rc, text = run_bench(["--base-url", stub.base_url, "--warmup", "0", "--requests", "4", "--concurrency", "1,2",
                          "--output", str(out), "--output-partial"], capsys)
    assert rc == 0
    rows = [ln for ln in text.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert len(rows) == 2 and "output tok/s" in text and "ITL p99 ms" in text
    d = json.loads(out.read_text())
    assert [s["config"]["concurrency"] for s in d] == [1, 2]
    # each level has its own salt: the second cannot hit the first one's prompt cache
    assert d[0]["config"]["salt"] != d[1]["config"]["salt"]
    assert all(s["counts"]["successful"] == 4 for s in d)
    rc = hb.main(["--compare", str(out)])
    assert rc == 0 and "| 2 |" in capsys.readouterr().out
