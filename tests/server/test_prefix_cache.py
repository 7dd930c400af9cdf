"""Prefix block pool and exact prompt cache counters on /healthz (and the metrics log).

Two prompts that share a long system prompt: the second reuses the first one's blocks (and,
on the hybrid Qwen3.5, a GDN state snapshot), so /healthz counts block and token hits; the
greedy output equals a server without caching. The exact prompt cache answers an identical
prompt without prefill, and the prompts it keeps do not register prefix blocks (nothing is
resident twice). ANNA_TUNING=prefix_kv_share=0 turns the prefix pool off."""
import os
import urllib.request

import pytest

from conftest import FIXTURES, start_server

SYSTEM = ("You are a careful assistant. Answer briefly, cite sources when you can, and never invent facts. "
          "Prefer short sentences. Use metric units. " * 3)


def ask(client, model, question):
    r = client.chat.completions.create(
        model=model, max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return r.choices[0].message.content


@pytest.mark.parametrize("model", ["qwen3", "qwen3_5"])
def test_prefix_hits_on_healthz(model):
    srv = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512",
                       "--prompt-cache-block", "16", "--metrics-log-interval-seconds", "1")
    plain = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512",
                         "--no-prompt-cache")
    try:
        c, p = srv.client(), plain.client()
        assert ask(c, model, "What is the boiling point of water?") == ask(p, model, "What is the boiling point of water?")
        h0 = srv.wait_idle()["prefix_cache"]
        assert h0["enabled"] and h0["hit_blocks"] == 0 and h0["miss_blocks"] > 0, h0
        assert h0["cached_blocks"] > 0, h0  # the finished prompt's blocks stay in the pool
        assert ask(c, model, "How tall is Mont Blanc?") == ask(p, model, "How tall is Mont Blanc?")
        h = srv.wait_idle()
        pc = h["prefix_cache"]
        assert pc["hit_blocks"] > 0 and pc["hit_tokens"] >= 16 * pc["hit_blocks"] // 2, pc
        assert 0 < pc["block_hit_rate"] < 1 and 0 < pc["token_hit_rate"] < 1, pc
        assert pc["block_len"] == 16 and pc["blocks"] > 0, pc
        if model == "qwen3_5":
            assert pc["snapshots"] > 0, pc
        assert h["memory"]["kv_pool_bytes"] > 0
        assert h["prompt_cache"]["reused_tokens"] == pc["hit_tokens"]
        hp = plain.wait_idle()
        assert not hp["prefix_cache"]["enabled"] and hp["prefix_cache"]["hit_blocks"] == 0
    finally:
        srv.stop()
        plain.stop()
    assert "prefix_block_hits=" in srv.log()


def test_exact_prompt_cache():
    model = "qwen3_5"
    srv = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512",
                       "--prompt-cache-size", "2", "--prompt-cache-block", "16")
    try:
        c = srv.client()
        a1 = ask(c, model, "What is the boiling point of water?")
        h = srv.wait_idle()
        # an exact-cache prompt is kept whole in the exact cache, not registered in the pool
        assert h["exact_prompt_cache"]["entries"] == 1 and h["prefix_cache"]["cached_blocks"] == 0, h
        a2 = ask(c, model, "What is the boiling point of water?")
        h = srv.wait_idle()
        assert a1 == a2
        ex = h["exact_prompt_cache"]
        assert ex["hits"] == 1 and ex["lookups"] == 2, ex
        assert h["prompt_cache"]["hits"] >= 1
    finally:
        srv.stop()


def test_prefix_share_env_off(monkeypatch):
    monkeypatch.setenv("ANNA_TUNING", "prefix_kv_share=0")
    model = "qwen3"
    srv = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512")
    try:
        c = srv.client()
        ask(c, model, "What is the boiling point of water?")
        ask(c, model, "How tall is Mont Blanc?")
        pc = srv.wait_idle()["prefix_cache"]
        assert pc["hit_blocks"] == 0 and pc["cached_blocks"] == 0, pc
    finally:
        srv.stop()


def test_kv_blocks_preemption():
    """A KV pool too small for the running set (--kv-blocks) preempts sequences, recomputes them
    later and gives the same greedy text as the default pool; /healthz and /metrics count the
    preemptions. The same server also takes --host-sampling, --tuning and --verbose (the
    resolved switches are printed once at start)."""
    model = os.path.join(FIXTURES, "qwen3")
    shape = ("--parallel", "3", "--ctx-size", "256", "--batch-size", "64", "--kv-block-len", "16")
    small = start_server(model, *shape, "--kv-blocks", "9", "--host-sampling", "--tuning", "prefix_kv_share=1",
                         "--verbose")
    ref = start_server(model, *shape)
    prompts = [[100 + (j * 37 + k * 11) % 800 for j in range(20 + 7 * k)] for k in range(3)]

    def run(s):
        r = s.client().completions.create(model="qwen3", prompt=prompts, max_tokens=60, temperature=0,
                                          extra_body={"ignore_eos": True})
        return [(c.text, c.finish_reason) for c in sorted(r.choices, key=lambda c: c.index)]

    try:
        assert run(small) == run(ref)
        h, hr = small.wait_idle(), ref.wait_idle()
        assert h["kv_blocks"]["total"] == 9 and h["kv_blocks"]["block_len"] == 16, h["kv_blocks"]
        assert h["scheduler"]["preemptions"] > 0 and hr["scheduler"]["preemptions"] == 0
        text = urllib.request.urlopen(small.url + "/metrics", timeout=30).read().decode()
        assert "anna_preemptions_total %d\n" % h["scheduler"]["preemptions"] in text
    finally:
        log = small.stop()
        ref.stop()
    assert log.count("[anna-serve] tuning:") == 1 and "\nprefix_kv_share=1\n" in log, log[:2000]


@pytest.mark.parametrize("quant,want", [("auto", "f32"), ("q8", "q8"), ("turboquant", "turboquant4")])
def test_kv_cache_type_on_healthz(quant, want):
    """/healthz memory.kv_cache_type names the cache format, "auto" resolved: on the CPU, which
    reports no memory budget, auto is f32 (include/anna/anna.h)."""
    srv = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "1", "--ctx-size", "256",
                       "--kv-cache-quantization", quant)
    try:
        assert srv.wait_idle()["memory"]["kv_cache_type"] == want
    finally:
        srv.stop()
