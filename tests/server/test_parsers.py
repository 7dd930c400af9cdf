"""Per-family tool-call and reasoning parsers through the server (issue 30 item 2): the family
is picked from the chat template (qwen3 fixture: Hermes JSON calls; qwen3_5 fixture: the
Qwen3.5 XML calls, qwen3_coder) or forced with --tool-parser / --reasoning-parser; streamed
calls come as OpenAI deltas (index, id, name, then argument pieces whose concatenation is the
non-streamed arguments); no markup reaches content. The model's text is forced with
--debug-hooks (anna_debug_output), so the parser, not the random fixture weights, is tested."""
import json
import os

import pytest

from conftest import FIXTURES, start_server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}}}}}]
XML = ("<think>\nplan it\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n"
       "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n"
       "</tool_call>")
G4 = ("<|channel>thought\nplan it<channel|>Checking.<|tool_call>call:get_weather{city:<|\"|>42<|\"|>,days:3,"
      "metric:true}<tool_call|>")
WANT = {"city": "42", "days": 3, "metric": True}


def run(s, forced, stream):
    c = s.client()
    kw = dict(model=c.models.list().data[0].id, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
              max_tokens=300, extra_body={"anna_debug_output": forced})
    if not stream:
        m = c.chat.completions.create(**kw).choices[0].message
        return m.content, getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content"), \
            [(t.id, t.function.name, t.function.arguments) for t in m.tool_calls or []], None
    content, reasoning, calls, deltas = "", "", {}, []
    for ch in c.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for t in d.tool_calls or []:
            deltas.append(t)
            e = calls.setdefault(t.index, [None, "", ""])
            if t.id:
                e[0] = t.id
            if t.function and t.function.name:
                e[1] += t.function.name
            if t.function and t.function.arguments:
                e[2] += t.function.arguments
    return content, reasoning, [tuple(calls[k]) for k in sorted(calls)], deltas


@pytest.fixture(scope="module")
def q35():
    s = start_server(os.path.join(FIXTURES, "qwen3_5"), "--parallel", "2", "--ctx-size", "512", "--debug-hooks",
                     "--reasoning-format", "deepseek", "--tool-parser", "qwen3_coder")
    yield s
    s.stop()


def test_flags_resolve(q35):
    # the fixture's shrunk template has Hermes markup; the flag picks the family, the reasoning
    # split comes from --reasoning-format deepseek with the template's <think> family
    assert "tool parser qwen3_coder, reasoning parser qwen3" in q35.log()


def test_auto_from_template():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "1", "--ctx-size", "256")
    try:
        assert "tool parser hermes, reasoning parser none" in s.log()
    finally:
        s.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_coder_calls(q35, stream):
    content, reasoning, calls, deltas = run(q35, XML, stream)
    assert content.strip() == "Checking."
    assert "<" not in content and "<" not in (reasoning or "")
    assert reasoning.strip() == "plan it"
    assert len(calls) == 1 and calls[0][1] == "get_weather"
    assert json.loads(calls[0][2]) == WANT  # typed by the schema: "42" stays a string, days an integer
    if stream:
        # name first (with id, empty arguments), then one piece per parameter and the closing brace
        assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
        assert len(deltas) >= 3 and all(d.index == 0 for d in deltas)


def test_stream_equals_nonstream(q35):
    a = run(q35, XML, False)
    b = run(q35, XML, True)
    assert a[2][0][1:] == b[2][0][1:] and a[0].strip() == b[0].strip()


def test_gemma4_forced():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--ctx-size", "512", "--debug-hooks",
                     "--tool-parser", "gemma4", "--reasoning-parser", "gemma4")
    try:
        assert "tool parser gemma4, reasoning parser gemma4" in s.log()
        for stream in (False, True):
            content, reasoning, calls, _ = run(s, G4, stream)
            assert content == "Checking." and reasoning == "plan it"
            assert [c[1] for c in calls] == ["get_weather"] and json.loads(calls[0][2]) == WANT
    finally:
        s.stop()


def test_tool_parser_none_keeps_text():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--ctx-size", "512", "--debug-hooks",
                     "--tool-parser", "none")
    try:
        forced = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
        content, _, calls, _ = run(s, forced, False)
        assert calls == [] and content == forced
    finally:
        s.stop()


def test_bad_parser_flag_is_an_error():
    import subprocess
    from conftest import server_bin
    r = subprocess.run([server_bin(), "--model-dir", os.path.join(FIXTURES, "qwen3"), "--tool-parser", "bogus"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--tool-parser expects" in r.stderr
