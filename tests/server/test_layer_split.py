"""anna-serve with --layer-split (issue 31): the placement in the log and /healthz, the same
greedy answer as an unsplit server, and a bad split refused at start naming what is wrong.
With ANNA_SERVE_ARGS="--device cuda" the stages share cuda:0 (one device named once)."""
import subprocess

from conftest import Server, server_bin


def answer(srv):
    r = srv.client().chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "count to five"}],
                                             max_tokens=24, temperature=0)
    return r.choices[0].message.content


def test_placement_and_same_answer(fixture_model):
    split = Server(fixture_model, "--parallel", "2", "--ctx-size", "256", "--device", "cpu,cpu", "--layer-split", "1,2")
    try:
        h = split.health()
        pl = h["placement"]
        assert [(s["layer_begin"], s["layer_end"]) for s in pl] == [(0, 1), (1, 3)], pl
        assert all(s["weight_bytes"] > 0 and s["kv_bytes"] > 0 for s in pl), pl
        assert "stage 0:" in split.log() and "stage 1:" in split.log(), split.log()[-2000:]
        got = answer(split)
    finally:
        split.stop()
    whole = Server(fixture_model, "--parallel", "2", "--ctx-size", "256")
    try:
        h = whole.health()
        assert len(h["placement"]) == 1 and h["placement"][0]["layer_end"] == 3, h["placement"]
        # the one stage holds what the two held
        assert h["placement"][0]["weight_bytes"] == sum(s["weight_bytes"] for s in pl)
        assert h["placement"][0]["kv_bytes"] == sum(s["kv_bytes"] for s in pl)
        want = answer(whole)
    finally:
        whole.stop()
    assert got == want


def test_bad_split_refused(fixture_model):
    p = subprocess.run([server_bin(), "--model-dir", fixture_model, "--port", "0", "--device", "cpu,cpu",
                        "--layer-split", "2,2"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "the stages hold 4 layers; the model has 3" in p.stderr + p.stdout, p.stderr[-2000:]
