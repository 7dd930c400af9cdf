"""POST /v1/responses and the stored-response routes, driven by the official openai client.

The tiny qwen3 fixture has random weights, so replies that must have a shape (reasoning, a
tool call, an end of turn) are forced with the server's --debug-hooks ("anna_debug_output":
the text is emitted instead of sampled, as the chat tests do); sampled replies check the
parts that do not depend on the text (usage, incomplete status, the schema mask)."""
import json
import os
import threading
import urllib.error
import urllib.request

import jsonschema
import openai
import pytest

from conftest import FIXTURES, start_server

MODEL = "qwen3"


@pytest.fixture(scope="module")
def rsrv():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "4", "--ctx-size", "1024", "--debug-hooks",
                     "--reasoning-format", "deepseek", "--responses-store-max", "64")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def c(rsrv):
    return rsrv.client()


def forced(text):
    return {"anna_debug_output": text}


def raw(srv, method, path, body=None):
    req = urllib.request.Request(srv.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_plain_text_and_usage(c):
    r = c.responses.create(model=MODEL, input="Hello there", max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    # random weights never end a turn: cut by max_output_tokens
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.output[-1].type == "message" and r.output[-1].status == "incomplete"
    assert r.max_output_tokens == 6 and r.store is True and r.tools == [] and r.truncation == "disabled"
    f = c.responses.create(model=MODEL, input="Hello there", extra_body=forced("Hi, how can I help?"))
    assert f.status == "completed" and f.incomplete_details is None
    assert f.output_text == "Hi, how can I help?"
    assert [o.type for o in f.output] == ["message"]
    assert f.output[0].role == "assistant" and f.output[0].content[0].type == "output_text"


def test_items_input_and_instructions(c):
    r = c.responses.create(model=MODEL, instructions="Answer in French.", extra_body=forced("Oui."),
                           input=[{"role": "developer", "content": "Be short."},
                                  {"type": "message", "role": "user",
                                   "content": [{"type": "input_text", "text": "Hello"},
                                               {"type": "input_text", "text": " again"}]}])
    assert r.output_text == "Oui." and r.instructions == "Answer in French."
    items = c.responses.input_items.list(r.id, order="asc").data
    assert [i.role for i in items] == ["developer", "user"]
    desc = c.responses.input_items.list(r.id).data  # default order: newest first
    assert [i.id for i in desc] == [i.id for i in reversed(items)]
    assert len(c.responses.input_items.list(r.id, limit=1).data) == 1


def test_reasoning_item_and_tokens(c):
    r = c.responses.create(model=MODEL, input="Think first", extra_body=forced("<think>Let me see: 2+2=4.</think>It is 4."))
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Let me see: 2+2=4."
    assert r.output_text == "It is 4."
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens


def test_stream_event_order_and_fields(c):
    text = "<think>hmm</think>Hello world, streamed."
    events = list(c.responses.create(model=MODEL, input="Stream", stream=True, extra_body=forced(text)))
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(seq))), seq
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    # reasoning item, then the message item with its content part
    i_r = types.index("response.reasoning_text.delta")
    i_m = types.index("response.content_part.added")
    assert types.index("response.output_item.added") < i_r < types.index("response.reasoning_text.done") < i_m
    order = [t for t in types if t in ("response.content_part.added", "response.output_text.delta",
                                       "response.output_text.done", "response.content_part.done")]
    assert order[0] == "response.content_part.added" and order[-2:] == ["response.output_text.done",
                                                                      "response.content_part.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert deltas == done.text == "Hello world, streamed."
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "hmm"
    msg_items = [e for e in events if e.type == "response.output_item.done" and e.item.type == "message"]
    assert msg_items and msg_items[0].output_index == 1 and msg_items[0].item.id == done.item_id
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "Hello world, streamed."
    assert final.usage.output_tokens > 0
    # the streamed response is stored like a plain one
    assert c.responses.retrieve(final.id).output_text == "Hello world, streamed."


def test_stream_incomplete(c):
    events = list(c.responses.create(model=MODEL, input="x", stream=True, max_output_tokens=3, temperature=0))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tools_round_trip(c):
    r = c.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS, extra_body=forced(CALL + "<|im_end|>"))
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and [o.type for o in r.output] == ["function_call"]
    fc = calls[0]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    assert fc.call_id.startswith("call_") and fc.status == "completed"
    assert r.tools[0].name == "get_weather"
    r2 = c.responses.create(model=MODEL, previous_response_id=r.id, tools=TOOLS,
                            input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}],
                            extra_body=forced("It is sunny in Paris."))
    assert r2.output_text == "It is sunny in Paris." and r2.previous_response_id == r.id
    # the whole previous turn (prompt + call + its end of turn) came from the prefix cache
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens + r.usage.output_tokens - 1, r2.usage
    items = c.responses.input_items.list(r2.id).data
    assert items[0].type == "function_call_output" and items[0].call_id == fc.call_id
    # the same conversation sent as items instead of previous_response_id: same prompt length
    r3 = c.responses.create(model=MODEL, tools=TOOLS, extra_body=forced("ok"), input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": fc.call_id, "name": "get_weather", "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}])
    assert abs(r3.usage.input_tokens - r2.usage.input_tokens) <= 3, (r3.usage, r2.usage)


def test_tool_call_streamed(c):
    events = list(c.responses.create(model=MODEL, input="Weather?", tools=TOOLS, stream=True, extra_body=forced(CALL)))
    types = [e.type for e in events]
    a = types.index("response.output_item.added")
    assert events[a].item.type == "function_call" and events[a].item.arguments == ""
    assert a < types.index("response.function_call_arguments.delta") < types.index(
        "response.function_call_arguments.done") < types.index("response.output_item.done")
    done = events[types.index("response.function_call_arguments.done")]
    assert json.loads(done.arguments) == {"city": "Paris"}
    assert types[-1] == "response.completed"


def test_tool_choice_forces_a_call(c):
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
              "additionalProperties": False}
    tools = [{**TOOLS[0], "parameters": params}]
    r = c.responses.create(model=MODEL, input="Weather?", tools=tools, max_output_tokens=400, temperature=1.0,
                           tool_choice={"type": "function", "name": "get_weather"}, extra_body={"seed": 1})
    fc = [o for o in r.output if o.type == "function_call"]
    assert fc and fc[0].name == "get_weather", r.output
    jsonschema.validate(json.loads(fc[0].arguments), params)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_format(c, stream):
    fmt = {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}}
    if stream:
        events = list(c.responses.create(model=MODEL, input="A thing", text=fmt, max_output_tokens=300,
                                         temperature=1.0, stream=True, extra_body={"seed": 5}))
        r = events[-1].response
    else:
        r = c.responses.create(model=MODEL, input="A thing", text=fmt, max_output_tokens=300, temperature=1.0,
                               extra_body={"seed": 5})
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema"


def test_json_object_format(c):
    done = 0
    for seed in range(4):  # random weights: an unbounded object may run out of tokens
        r = c.responses.create(model=MODEL, input="json", text={"format": {"type": "json_object"}},
                               max_output_tokens=600, temperature=1.0, extra_body={"seed": seed})
        if r.status == "completed":
            assert isinstance(json.loads(r.output_text), dict), r.output_text
            done += 1
    assert done >= 1


def test_chain_hits_prefix_cache(c):
    """A 4-turn chain: each turn starts with the previous prompt + reply ids, so every turn's
    cached_tokens covers the whole previous turn."""
    prev, ids = None, []
    for turn in range(4):
        r = c.responses.create(model=MODEL, input=f"Question number {turn}?", instructions="Be brief.",
                               previous_response_id=prev, extra_body=forced(f"Answer {turn}.<|im_end|>"))
        assert r.status == "completed" and r.output_text == f"Answer {turn}."
        if prev:
            p = c.responses.retrieve(prev)
            assert r.usage.input_tokens > p.usage.input_tokens + p.usage.output_tokens
            assert r.usage.input_tokens_details.cached_tokens >= p.usage.input_tokens + p.usage.output_tokens - 1, \
                (turn, r.usage, p.usage)
        prev = r.id
        ids.append(r.id)
    # instructions are not carried over by previous_response_id
    r = c.responses.create(model=MODEL, input="last", previous_response_id=prev, extra_body=forced("ok"))
    assert r.instructions is None and r.output_text == "ok"


def test_chain_after_a_cut_reply(c):
    """A reply cut by max_output_tokens has no end of turn: the chain re-renders it (still cached)."""
    r1 = c.responses.create(model=MODEL, input="Tell me more", max_output_tokens=4, temperature=0)
    assert r1.status == "incomplete"
    r2 = c.responses.create(model=MODEL, input="Go on", previous_response_id=r1.id, max_output_tokens=2, temperature=0)
    assert r2.usage.input_tokens > r1.usage.input_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 1


def test_404s(rsrv, c):
    for call in (lambda: c.responses.retrieve("resp_nope"), lambda: c.responses.delete("resp_nope"),
                 lambda: c.responses.input_items.list("resp_nope")):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError) as ei:
        c.responses.create(model=MODEL, input="x", previous_response_id="resp_missing", max_output_tokens=1)
    assert "resp_missing" in str(ei.value)
    r = c.responses.create(model=MODEL, input="x", max_output_tokens=1, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    kept = c.responses.create(model=MODEL, input="x", max_output_tokens=1)
    assert c.responses.retrieve(kept.id).id == kept.id
    st, body = raw(rsrv, "DELETE", "/v1/responses/" + kept.id)
    assert st == 200 and body == {"id": kept.id, "object": "response.deleted", "deleted": True}
    assert raw(rsrv, "GET", "/v1/responses/" + kept.id)[0] == 404
    assert raw(rsrv, "PUT", "/v1/responses/" + kept.id)[0] == 405


@pytest.mark.parametrize("field,value,needle", [
    ("background", True, "background"),
    ("truncation", "auto", "truncation"),
    ("include", ["reasoning.encrypted_content"], "reasoning.encrypted_content"),
    ("tools", [{"type": "web_search"}], "web_search"),
    ("conversation", "conv_1", "conversation"),
    ("top_logprobs", 3, "top_logprobs"),
    ("frobnicate", 1, "frobnicate"),
    ("text", {"verbosity": "low"}, "verbosity"),
    ("reasoning", {"effort": "huge"}, "effort"),
    ("input", [{"type": "web_search_call", "id": "ws_1"}], "web_search_call"),
    ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}],
     "text only"),
    ("input", [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input_file"),
])
def test_unsupported_fields_are_400(c, field, value, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=MODEL, input="x", max_output_tokens=1, extra_body={field: value})
    assert needle in str(ei.value), str(ei.value)


def test_documented_no_ops_are_accepted(c):
    r = c.responses.create(model=MODEL, input="x", max_output_tokens=1, parallel_tool_calls=False, user="u1",
                           safety_identifier="s", prompt_cache_key="k", service_tier="auto", truncation="disabled",
                           metadata={"k": "v"}, reasoning={"effort": "low", "summary": "auto"}, include=[],
                           stream_options=None)
    assert r.metadata == {"k": "v"} and r.parallel_tool_calls is False


def test_store_lru_eviction():
    s = start_server(os.path.join(FIXTURES, "qwen3"), "--parallel", "2", "--ctx-size", "512",
                     "--responses-store-max", "2")
    try:
        c = s.client()
        a, b = (c.responses.create(model=MODEL, input=t, max_output_tokens=1) for t in ("a", "b"))
        c.responses.retrieve(a.id)  # a is now the most recently used: b goes first
        d = c.responses.create(model=MODEL, input="d", max_output_tokens=1)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(b.id)
        assert c.responses.retrieve(a.id).id == a.id and c.responses.retrieve(d.id).id == d.id
    finally:
        s.stop()


def test_concurrent_chains(c):
    """Chains on several connections at once (the store is shared)."""
    errs = []

    def chain(k):
        try:
            prev = None
            for t in range(3):
                r = c.responses.create(model=MODEL, input=f"c{k} t{t}", previous_response_id=prev,
                                       extra_body=forced(f"r{k}{t}<|im_end|>"))
                assert r.output_text == f"r{k}{t}"
                prev = r.id
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)

    th = [threading.Thread(target=chain, args=(k,)) for k in range(4)]
    [t.start() for t in th]
    [t.join() for t in th]
    assert not errs, errs


def test_chain_keeps_reasoning_tokens(c):
    """The Qwen3 template drops an older turn's <think> text when it renders the conversation
    again; the chain starts from the stored ids instead, so the previous turn, reasoning and
    all, is still a prefix-cache hit (a re-render would miss from the <think> block on)."""
    r1 = c.responses.create(model=MODEL, input="Why?", extra_body=forced(
        "<think>Because the sky scatters blue light more than red light.</think>Rayleigh.<|im_end|>"))
    assert [o.type for o in r1.output] == ["reasoning", "message"]
    r2 = c.responses.create(model=MODEL, input="And at sunset?", previous_response_id=r1.id,
                            extra_body=forced("Longer path.<|im_end|>"))
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens + r1.usage.output_tokens - 1, \
        (r1.usage, r2.usage)
    # the same turns sent as items re-render without the old reasoning: fewer prompt tokens
    r3 = c.responses.create(model=MODEL, extra_body=forced("x"), input=[
        {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Rayleigh."},
        {"role": "user", "content": "And at sunset?"}])
    assert r3.usage.input_tokens < r2.usage.input_tokens


@pytest.mark.parametrize("item,needle", [
    ({"role": "user"}, "content"),
    ({"type": "function_call_output", "call_id": "c1"}, "output"),
    ({"type": "function_call", "name": "f"}, "call_id"),
    ({"role": "robot", "content": "x"}, "role"),
    ("not an item", "object"),
])
def test_malformed_items_are_400(c, item, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=MODEL, input=[item], max_output_tokens=1)
    assert needle in str(ei.value), str(ei.value)


def test_two_assistant_messages_stay_two_turns(c):
    r = c.responses.create(model=MODEL, extra_body=forced("ok"), input=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "first"},
        {"role": "assistant", "content": "second"}, {"role": "user", "content": "b"}])
    one = c.responses.create(model=MODEL, extra_body=forced("ok"), input=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "first"}, {"role": "user", "content": "b"}])
    assert r.usage.input_tokens > one.usage.input_tokens + 2
