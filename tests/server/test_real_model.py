"""A few short cases on the default real model (qwen2.5-coder-0.5b-instruct, GGUF). These
must not skip: without the model file they fail and say how to fetch it. Kept short: the
model decodes at about 10 tok/s on 2 cores."""
import concurrent.futures as cf
import json
import os

import pytest

from conftest import DEFAULT_MODEL, start_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def real():
    assert os.path.exists(DEFAULT_MODEL), (
        f"default model missing at {DEFAULT_MODEL}: run scripts/fetch_default_model.sh")
    s = start_server(DEFAULT_MODEL, "--ctx-size", "1024", "--parallel", "2", "--model-name", "qwen-coder")
    yield s
    s.stop()


def ask(c, content, **kw):
    return c.chat.completions.create(model="qwen-coder", temperature=0,
                                     messages=[{"role": "user", "content": content}], **kw)


def test_real_chat_and_stream(real):
    c = real.client()
    r = ask(c, "What is 2+2? Reply with just the number.", max_tokens=5)
    assert r.choices[0].message.content.strip() == "4" and r.choices[0].finish_reason == "stop"
    chunks = list(ask(c, "What is 2+2? Reply with just the number.", max_tokens=5, stream=True,
                      stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_real_batched_equals_alone(real):
    c = real.client()
    qs = ["Name a color.", "Write the word hello in French."]
    alone = [ask(c, q, max_tokens=6).choices[0].message.content for q in qs]
    with cf.ThreadPoolExecutor(2) as ex:
        both = list(ex.map(lambda q: ask(c, q, max_tokens=6).choices[0].message.content, qs))
    assert both == alone
    assert real.wait_idle()["memory"]["kv_tokens_used"] == 0


def test_real_tool_call(real):
    c = real.client()
    r = ask(c, "What is the weather in Paris right now?", max_tokens=30, tools=TOOLS)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (tc,) = ch.message.tool_calls
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments)["city"].startswith("Paris")


def test_real_json_mode(real):
    c = real.client()
    r = ask(c, "Give a JSON object with keys name and age for Bob, aged 30.", max_tokens=24,
            response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) == {"name": "Bob", "age": 30}


def test_real_forced_tool_choice(real):
    c = real.client()
    r = ask(c, "Say hello.", max_tokens=30, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (tc,) = ch.message.tool_calls
    assert tc.function.name == "get_weather" and isinstance(json.loads(tc.function.arguments), dict)
