"""anna-serve with --tensor-parallel 2 (issue 31): the same greedy answers as an unsplit server,
several requests batched together, and a split the model cannot take refused at start naming
the heads. With ANNA_SERVE_ARGS="--device cuda" both shards share cuda:0."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from conftest import FIXTURES, Server, server_bin

PROMPTS = ["count to five", "name three colours", "what is 2+2?", "say hello"]


def answers(srv, model="qwen3"):
    def one(p):
        r = srv.client().chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                                 max_tokens=24, temperature=0)
        return r.choices[0].message.content
    with ThreadPoolExecutor(len(PROMPTS)) as ex:  # concurrent: decoded in shared batches
        return list(ex.map(one, PROMPTS))


def test_same_answers(fixture_model):
    tp = Server(fixture_model, "--parallel", "4", "--ctx-size", "256", "--tensor-parallel", "2")
    try:
        got = answers(tp)
    finally:
        tp.stop()
    whole = Server(fixture_model, "--parallel", "4", "--ctx-size", "256")
    try:
        want = answers(whole)
    finally:
        whole.stop()
    assert got == want
    assert all(got), got


SYSTEM = ("You are a careful assistant. Answer briefly, check every number twice, never invent facts, and say so "
          "when you do not know. Keep each answer to one short paragraph of plain text.")


def test_hybrid_moe_prefix_reuse():
    """GDN + MoE with a shared expert: a shared system prompt reused from the prefix pool (KV
    blocks and recurrent snapshots of every shard alike), the same answers as unsplit."""
    model = os.path.join(FIXTURES, "qwen3_5_moe_text")

    def ask_all(srv):
        def one(p):
            r = srv.client().chat.completions.create(
                model="qwen3_5_moe_text", max_tokens=12, temperature=0,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}])
            return r.choices[0].message.content
        first = one(PROMPTS[0])  # registers the system prompt's blocks
        with ThreadPoolExecutor(len(PROMPTS)) as ex:
            return [first] + list(ex.map(one, PROMPTS))

    res = []
    for extra in (["--tensor-parallel", "2"], []):
        s = Server(model, "--parallel", "4", "--ctx-size", "512", "--prompt-cache-block", "16", *extra)
        try:
            res.append(ask_all(s))
            pc = s.wait_idle()["prefix_cache"]
            assert pc["hit_blocks"] > 0 and pc["snapshots"] > 0, pc
        finally:
            s.stop()
    assert res[0] == res[1]
    assert res[0][0] == res[0][1]


def test_bad_split_refused(fixture_model):
    p = subprocess.run([server_bin(), "--model-dir", fixture_model, "--port", "0", "--tensor-parallel", "3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "4 attention heads do not divide by 3" in p.stderr + p.stdout, p.stderr[-2000:]
