"""Same request, same output (issue 30): "the same seed at temperature 1 gave different text on
repeated runs; at temperature 0 a streamed and a non-streamed run of the same request gave
different text".

With the prefix and prompt caches on (the defaults), a repeated request reuses cached KV
blocks of the earlier one, and concurrent requests change how prompts are split into prefill
chunks and batched with others. Neither may change the tokens: the same seed at temperature 1,
five times, and the same greedy request streamed and not, while other requests are in flight,
give identical text. Run on the default model (quantized GGUF) and on the qwen3_5 fixture
(hybrid Gated DeltaNet: recurrent state snapshots are reused with the prefix)."""
import os
import threading

import pytest

from conftest import DEFAULT_MODEL, FIXTURES, start_server

PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Give the keeper a name, describe the weather, and end with a twist.")

MODELS = [
    pytest.param((DEFAULT_MODEL, 48), id="default-model"),
    pytest.param((os.path.join(FIXTURES, "qwen3_5"), 64), id="qwen3_5-fixture"),
]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    path, n = request.param
    if not os.path.exists(path):
        pytest.skip("model not found: %s" % path)
    s = start_server(path, "--parallel", "4", "--ctx-size", "1024", "--seed", "0", timeout=120)
    yield s, n
    s.stop()


def name(s):
    return s.client().models.list().data[0].id


def chat(s, stream=False, **kw):
    c = s.client()
    msgs = [{"role": "user", "content": kw.pop("prompt", PROMPT)}]
    if not stream:
        r = c.chat.completions.create(model=name(s), messages=msgs, **kw)
        return r.choices[0].message.content
    out = []
    for ch in c.chat.completions.create(model=name(s), messages=msgs, stream=True, **kw):
        if ch.choices and ch.choices[0].delta.content:
            out.append(ch.choices[0].delta.content)
    return "".join(out)


def background(s, n_tokens, stop):
    """Other traffic: different prompts of several lengths, some sharing the test's prefix."""
    def run(i):
        k = 0
        while not stop.is_set():
            p = (PROMPT[: 20 + 37 * ((i + k) % 4)] + " variant %d" % k) if i % 2 else "Count to %d." % (k + 3)
            try:
                chat(s, prompt=p, max_tokens=n_tokens // 2, temperature=0.7, seed=k)
            except Exception:
                pass
            k += 1
    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in ts:
        t.start()
    return ts


def test_same_seed_temperature_1_five_runs(model):
    s, n = model
    outs = [chat(s, max_tokens=n, temperature=1.0, seed=1234) for _ in range(5)]
    assert all(o == outs[0] for o in outs), "\n---\n".join(outs)
    # The seed matters at all (a test that cannot fail otherwise).
    other = chat(s, max_tokens=n, temperature=1.0, seed=99)
    assert other != outs[0]


# Known gap (reported): on a quantized GGUF model on the CPU, a decode row batched with another
# request's prompt chunk takes the tiled int8 GEMM (32+ rows in the call), alone it takes the
# per-row dot path; the two sum in different orders, so with traffic the tokens can differ.
TRAFFIC_XFAIL = "quantized CPU matmul path depends on the batch's row count (decode rows next to prefill rows)"


def traffic_xfail(request, s):
    if s.cmd[s.cmd.index("--model") + 1:][:1] == [DEFAULT_MODEL] if "--model" in s.cmd else False:
        request.applymarker(pytest.mark.xfail(reason=TRAFFIC_XFAIL, strict=False))


def test_same_seed_with_traffic(model, request):
    s, n = model
    traffic_xfail(request, s)
    alone = chat(s, max_tokens=n, temperature=1.0, seed=7)
    stop = threading.Event()
    ts = background(s, n, stop)
    try:
        busy = [chat(s, max_tokens=n, temperature=1.0, seed=7, stream=i % 2 == 1) for i in range(3)]
    finally:
        stop.set()
        for t in ts:
            t.join(timeout=120)
    for b in busy:
        assert b == alone, "alone:\n%s\n---busy:\n%s" % (alone, b)


def test_stream_vs_nonstream_greedy_with_traffic(model, request):
    s, n = model
    traffic_xfail(request, s)
    stop = threading.Event()
    ts = background(s, n, stop)
    try:
        a = chat(s, max_tokens=n, temperature=0)
        b = chat(s, max_tokens=n, temperature=0, stream=True)
        c = chat(s, max_tokens=n, temperature=0, stream=True)
    finally:
        stop.set()
        for t in ts:
            t.join(timeout=120)
    d = chat(s, max_tokens=n, temperature=0)
    assert a == b == c == d, "\n---\n".join([a, b, c, d])
