"""anna-serve with --tensor-parallel 2 (issue 31): the same greedy answers as an unsplit server,
several requests batched together, and a split the model cannot take refused at start naming
the heads. With ANNA_SERVE_ARGS="--device cuda" both shards share cuda:0."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

from conftest import Server, server_bin

PROMPTS = ["count to five", "name three colours", "what is 2+2?", "say hello"]


def answers(srv):
    def one(p):
        r = srv.client().chat.completions.create(model="qwen3", messages=[{"role": "user", "content": p}],
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


def test_bad_split_refused(fixture_model):
    p = subprocess.run([server_bin(), "--model-dir", fixture_model, "--port", "0", "--tensor-parallel", "3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "4 attention heads do not divide by 3" in p.stderr + p.stdout, p.stderr[-2000:]
