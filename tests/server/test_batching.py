"""Continuous batching: greedy outputs of concurrent requests equal the same requests run
one at a time, also with prompts split into small prefill chunks that share steps with
other sequences' decodes, on a classic transformer and on the hybrid Qwen3.5 (GDN)."""
import concurrent.futures as cf
import os
import urllib.request

import pytest

from conftest import FIXTURES, start_server

PROMPTS = ["The quick brown fox", "In the beginning", "Numbers: 1 2 3 4 5 6 7 8 9 10 11 12",
           "def fibonacci(n):", "Paris is the capital of", "A long prompt " * 12, "x", "Once upon a time there was"]


def run(client, prompts, concurrent, max_tokens=32):
    def one(i):
        p = prompts[i]
        if i % 2:
            r = client.completions.create(model=client._m, prompt=p, max_tokens=max_tokens, temperature=0,
                                          extra_body={"ignore_eos": True})
            return r.choices[0].text
        r = client.chat.completions.create(model=client._m, messages=[{"role": "user", "content": p}],
                                           max_tokens=max_tokens, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        return "".join(c.choices[0].delta.content or "" for c in r if c.choices)
    if not concurrent:
        return [one(i) for i in range(len(prompts))]
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(one, range(len(prompts))))


CHUNKED = ("--scheduler-max-prefill-tokens", "7", "--scheduler-profile", "throughput",
           "--scheduler-max-batch-size", "8")
# A decode budget (cached tokens per step) that fits only one or two sequences: the rotation
# must still serve all of them.
TIGHT_DECODE = ("--scheduler-max-decode-tokens", "60", "--scheduler-max-batch-size", "8")
# Steps that mix decodes and prompt chunks run them as two model calls (decode rows first).
SPLIT = CHUNKED + ("--split-prefill-decode",)


@pytest.mark.parametrize("model,flags", [("qwen3", CHUNKED), ("qwen3_5", CHUNKED), ("qwen3", TIGHT_DECODE),
                                         ("qwen3_5", SPLIT), ("qwen3", SPLIT + ("--host-sampling",))],
                         ids=["qwen3-chunked", "qwen3_5-chunked", "qwen3-decode-budget", "qwen3_5-split",
                              "qwen3-split-full-rows"])
def test_batched_equals_alone(model, flags):
    alone_srv = start_server(os.path.join(FIXTURES, model), "--parallel", "1", "--ctx-size", "512")
    batch_srv = start_server(os.path.join(FIXTURES, model), "--parallel", "8", "--ctx-size", "512", *flags)
    try:
        a, b = alone_srv.client(), batch_srv.client()
        a._m = b._m = model
        alone = run(a, PROMPTS, concurrent=False)
        batched = run(b, PROMPTS, concurrent=True)
        assert batched == alone
        h = batch_srv.wait_idle()
        assert h["service"]["mean_batch_seqs"] > 1.2, h["service"]  # steps really were shared
        assert h["memory"]["kv_tokens_used"] == 0
        if "--split-prefill-decode" in flags:  # some steps really were split in two calls
            with urllib.request.urlopen(batch_srv.url + "/metrics", timeout=30) as r:
                m = dict(ln.rsplit(" ", 1) for ln in r.read().decode().splitlines() if ln and ln[0] != "#")
            assert float(m["anna_engine_forward_calls_total"]) > float(m["anna_decode_steps_total"]), m
    finally:
        alone_srv.stop()
        batch_srv.stop()


def test_queue_wait_fairness():
    """With one running slot allowed, a waiter older than --scheduler-max-queue-wait-ms is
    admitted beside a long decode instead of waiting for it to end."""
    import threading
    import time
    for knob, fast in (("0", False), ("50", True)):
        s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--scheduler-max-batch-size", "1",
                         "--scheduler-max-queue-wait-ms", knob, "--debug-step-delay-ms", "20")
        try:
            c = s.client()
            long_run = threading.Thread(target=lambda: c.chat.completions.create(
                model="qwen3", messages=[{"role": "user", "content": "x"}], max_tokens=60,
                extra_body={"ignore_eos": True}))
            long_run.start()
            while s.health()["scheduler"]["running"] < 1:
                time.sleep(0.01)
            t0 = time.time()
            c.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "y"}], max_tokens=2,
                                      extra_body={"ignore_eos": True})
            took = time.time() - t0
            long_run.join()
            assert (took < 0.6) == fast, (knob, took)
        finally:
            s.stop()
