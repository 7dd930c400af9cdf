"""The engine step profile (issue 29): /metrics' anna_engine_* families and --engine-profile's log
lines must account for every step the engine ran, agree with the older counters (steps, batch
tokens, prompt tokens, generated tokens), and the phases must add up to the step time.
"""
import concurrent.futures as cf
import json
import os
import re
import sys
import time
import urllib.request

import pytest

from conftest import ROOT, start_server

sys.path.insert(0, os.path.join(ROOT, "bench"))
import load_test  # noqa: E402

PHASES = ("idle", "sched", "admit", "assemble", "forward", "sample", "detok", "publish", "wake", "finish", "stats", "step")
KINDS = ("decode", "mixed", "prefill")


def metrics(srv):
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        return load_test.prom(r.read())


def complete(srv, prompt, n_tokens, stream):
    body = {"model": "qwen3", "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    req = urllib.request.Request(srv.url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read().decode()
    if not stream:
        return json.loads(data)["choices"][0]["text"]
    text = ""
    for ln in data.splitlines():
        if ln.startswith("data: ") and ln != "data: [DONE]":
            ch = json.loads(ln[6:])["choices"]
            if ch:
                text += ch[0].get("text", "")
    return text


@pytest.fixture(scope="module")
def prof_srv(fixture_model):
    s = start_server(fixture_model, "--parallel", "8", "--ctx-size", "512", "--engine-profile", "1",
                     "--log-format", "json")
    yield s
    s.stop()


def test_engine_metrics_account_for_every_step(prof_srv):
    m0 = metrics(prof_srv)
    prompts = [[(17 * i + 3 * j) % 900 + 50 for j in range(40 + 13 * i)] for i in range(12)]
    with cf.ThreadPoolExecutor(12) as ex:
        outs = list(ex.map(lambda ip: complete(prof_srv, ip[1], 24, ip[0] % 2 == 0), enumerate(prompts)))
    assert all(isinstance(o, str) for o in outs)
    time.sleep(0.3)  # the engine's last step records after the last choice ended
    m = metrics(prof_srv)
    d = {k: m.get(k, 0.0) - m0.get(k, 0.0) for k in m}

    steps = sum(d[f'anna_engine_steps_total{{kind="{k}"}}'] for k in KINDS)
    assert steps == d["anna_decode_steps_total"] > 0
    # 12 prompts of 40+ tokens into 8 slots: some steps prefill alone, some mix, most decode only
    assert d['anna_engine_steps_total{kind="decode"}'] > 0 and d['anna_engine_steps_total{kind="prefill"}'] > 0
    # every phase and both row histograms observed once per step
    for p in PHASES:
        assert d[f'anna_engine_step_seconds_count{{phase="{p}"}}'] == steps, p
    for k in ("decode", "prefill"):
        assert d[f'anna_engine_step_rows_count{{kind="{k}"}}'] == steps
    assert sum(d[f'anna_engine_forward_seconds_count{{kind="{k}"}}'] for k in KINDS) == steps
    # rows agree with the older counters: prompt rows are the prompt tokens, all rows the batch tokens
    pre = d['anna_engine_step_rows_sum{kind="prefill"}']
    dec = d['anna_engine_step_rows_sum{kind="decode"}']
    assert pre == d["anna_prompt_tokens_total"] == sum(len(p) for p in prompts)
    assert pre + dec == d["anna_batch_tokens_total"]
    # each choice's first token comes from its last prompt row, the rest from decode rows
    assert dec == d["anna_completion_tokens_total"] - len(prompts) == len(prompts) * 23
    # one model call per step without speculative windows; no CUDA graphs on the CPU
    assert d["anna_engine_forward_calls_total"] == steps
    assert d["anna_engine_graph_steps_total"] == 0
    # greedy rows without min_tokens or logprobs: every one drawn from the candidates
    assert d["anna_engine_full_rows_total"] == 0
    # the non-idle phases add up to the step; the model call is most of a step on the CPU
    parts = sum(d[f'anna_engine_step_seconds_sum{{phase="{p}"}}'] for p in PHASES if p not in ("idle", "step"))
    total = d['anna_engine_step_seconds_sum{phase="step"}']
    assert total > 0 and abs(parts - total) <= 1e-6 * steps + 1e-9, (parts, total)
    assert d['anna_engine_step_seconds_sum{phase="forward"}'] > 0.3 * total
    fwd = sum(d[f'anna_engine_forward_seconds_sum{{kind="{k}"}}'] for k in KINDS)
    assert abs(fwd - d['anna_engine_step_seconds_sum{phase="forward"}']) < 1e-5  # sums printed to 1 us
    # cumulative buckets end at the count
    assert d['anna_engine_step_seconds_bucket{phase="step",le="+Inf"}'] == steps


def test_engine_profile_log_lines(prof_srv):
    # a line comes at the end of the first step after each second (--engine-profile 1): keep stepping
    deadline = time.time() + 20
    recs = []
    while time.time() < deadline and not recs:
        with cf.ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda i: complete(prof_srv, [100 + i] * 30, 48, True), range(4)))
        for ln in prof_srv.log().splitlines():
            if '"engine_profile_s"' in ln:
                recs.append(json.loads(ln[ln.index("{"):]))
    assert recs, prof_srv.log()[-2000:]
    r = max(recs, key=lambda x: x["tokens"])
    assert r["steps"] > 0 and r["tokens"] > 0 and r["forward_calls"] >= r["steps"] - 1
    assert r["steps_decode"] + r["steps_mixed"] + r["steps_prefill"] == r["steps"]
    assert set(r["ms_per_step"]) == set(PHASES)
    assert re.search(r"engine profile [0-9.]+ s: \d+ steps", r["msg"])
