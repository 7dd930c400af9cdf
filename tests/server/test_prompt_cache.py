"""Prompt cache: a finished sequence keeps its KV, and the next prompt that shares a prefix
(same system prompt, or the next turn of the conversation) starts after it. Greedy outputs
must equal a server without the cache; on the hybrid Qwen3.5 the reuse stops at recurrent-
state checkpoints (--prompt-cache-block) or at the cached sequence's end."""
import os

import pytest

from conftest import FIXTURES, start_server

SYSTEM = ("You are a careful assistant. Answer briefly, cite sources when you can, and never invent facts. "
          "Prefer short sentences. Use metric units. " * 2)


def convo(client, model):
    outs = []

    def ask(msgs):
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
        outs.append(r.choices[0].message.content)
        return r.choices[0].message.content

    sys = {"role": "system", "content": SYSTEM}
    a1 = ask([sys, {"role": "user", "content": "What is the boiling point of water?"}])
    ask([sys, {"role": "user", "content": "How tall is Mont Blanc?"}])
    ask([sys, {"role": "user", "content": "What is the boiling point of water?"},
         {"role": "assistant", "content": a1}, {"role": "user", "content": "And at altitude?"}])
    ask([sys, {"role": "user", "content": "What is the boiling point of water?"}])  # exact repeat
    return outs


@pytest.mark.parametrize("model", ["qwen3", "qwen3_5"])
def test_prompt_cache_reuse_is_exact(model):
    cached = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512",
                          "--prompt-cache-block", "16")
    plain = start_server(os.path.join(FIXTURES, model), "--parallel", "2", "--ctx-size", "512",
                         "--no-prompt-cache")
    try:
        a, b = cached.client(), plain.client()
        assert convo(a, model) == convo(b, model)
        h = cached.wait_idle()
        pc = h["prompt_cache"]
        assert pc["enabled"] and pc["hits"] >= 3 and pc["reused_tokens"] > 60, pc
        assert 0 < pc["hit_rate"] < 1
        assert h["memory"]["kv_tokens_cached"] > 0 and h["memory"]["kv_tokens_used"] == 0
        hp = plain.wait_idle()
        assert hp["prompt_cache"]["reused_tokens"] == 0 and hp["memory"]["kv_tokens_cached"] == 0
    finally:
        cached.stop()
        plain.stop()
