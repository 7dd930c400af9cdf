"""Enforced structured output (issue 30 item 1): response_format json_schema and forced tool
calls, checked with the `jsonschema` PyPI validator.

A random-weight fixture model writes arbitrary text: the hardest case for enforcement, since
nothing but the mask keeps it on the schema. Its strings rarely close by themselves, so the
schemas here bound every string (maxLength, enum, pattern, format) and array; the mask caps
numbers and whitespace. Every reply must then end by itself ("stop") and validate — streamed
and not. A few schemas also run on the default model when it is present. Bad schemas are a
400 naming the keyword.
"""
import json
import os

import jsonschema
import openai
import pytest

from conftest import DEFAULT_MODEL, start_server

MSG = [{"role": "user", "content": "Reply with JSON."}]

S = {"type": "string", "maxLength": 6}
I = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}


def obj(props, required=None, **kw):
    d = {"type": "object", "properties": props, "required": list(props) if required is None else required,
         "additionalProperties": False}
    d.update(kw)
    return d


SCHEMAS = [
    # scalars and objects of scalars
    obj({"a": S}),
    obj({"a": I}),
    obj({"a": N}),
    obj({"a": B}),
    obj({"a": {"type": "null"}}),
    obj({"name": S, "age": I, "ok": B}),
    obj({"name": S, "age": I}, required=["age"]),
    obj({"x": N, "y": N, "z": N}, required=[]),
    obj({"a": {"type": "string", "minLength": 3, "maxLength": 5}}),
    obj({"a": {"type": "string", "maxLength": 0}}),
    obj({}),
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "string", "maxLength": 10},
    # nested objects
    obj({"user": obj({"id": I, "name": S})}),
    obj({"a": obj({"b": obj({"c": obj({"d": I})})})}),
    obj({"p": obj({"x": N, "y": N}), "q": obj({"x": N, "y": N}, required=["x"])}),
    obj({"meta": obj({"tags": {"type": "array", "items": S, "maxItems": 2}})}),
    # arrays with bounds
    obj({"xs": {"type": "array", "items": I, "maxItems": 3}}),
    obj({"xs": {"type": "array", "items": I, "minItems": 2, "maxItems": 4}}),
    obj({"xs": {"type": "array", "items": S, "minItems": 1, "maxItems": 1}}),
    obj({"xs": {"type": "array", "items": B, "maxItems": 0}}),
    obj({"m": {"type": "array", "items": {"type": "array", "items": N, "maxItems": 2}, "maxItems": 2}}),
    obj({"people": {"type": "array", "items": obj({"n": S, "a": I}), "minItems": 1, "maxItems": 3}}),
    {"type": "array", "items": I, "minItems": 1, "maxItems": 5},
    # enums and const
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"level": {"type": "string", "enum": ["low", "mid", "high"]}, "n": {"enum": [1, 2, 3, 12]}}),
    obj({"v": {"enum": ["x", 1, True, None, [1, 2], {"k": "v"}]}}),
    obj({"kind": {"const": "point"}, "x": I}),
    obj({"e": {"enum": ["caf\u00e9", "na\u00efve", "\u65e5\u672c"]}}),
    {"enum": ["yes", "no"]},
    # anyOf and nullable
    obj({"v": {"anyOf": [I, S]}}),
    obj({"v": {"anyOf": [{"type": "null"}, obj({"a": I})]}}),
    obj({"v": {"type": ["string", "null"], "maxLength": 4}}),
    obj({"v": {"type": ["integer", "boolean", "null"]}}),
    obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "r": N}),
                             obj({"kind": {"const": "rect"}, "w": N, "h": N})]}}),
    obj({"v": {"anyOf": [obj({"a": I}), obj({"a": S, "b": B})]}}),
    {"anyOf": [obj({"ok": B}), obj({"error": S})]},
    # $ref / $defs / definitions, recursion
    {"$defs": {"pt": obj({"x": I, "y": I})}, **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}})},
    {"definitions": {"c": {"enum": ["a", "b"]}}, **obj({"c": {"$ref": "#/definitions/c"}})},
    {"$defs": {"node": obj({"v": I, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                           required=["v", "kids"])},
     "$ref": "#/$defs/node"},
    {"$defs": {"s": S, "pair": obj({"k": {"$ref": "#/$defs/s"}, "v": {"$ref": "#/$defs/s"}})},
     **obj({"pairs": {"type": "array", "items": {"$ref": "#/$defs/pair"}, "maxItems": 2}})},
    # patterns
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    obj({"hex": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"}}),
    obj({"v": {"type": "string", "pattern": "^(yes|no|maybe)$"}}),
    obj({"id": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,7}$"}}),
    obj({"s": {"type": "string", "pattern": "^\\d+(\\.\\d{1,2})?$", "maxLength": 8}}),
    obj({"w": {"type": "string", "pattern": "ab", "maxLength": 6}}),
    obj({"phone": {"type": "string", "pattern": "^\\+?[0-9]{2,3}[ -]?[0-9]{3,4}$"}}),
    # string formats
    obj({"d": {"type": "string", "format": "date"}}),
    obj({"t": {"type": "string", "format": "date-time"}}),
    obj({"t": {"type": "string", "format": "time"}}),
    obj({"u": {"type": "string", "format": "uuid"}}),
    obj({"e": {"type": "string", "format": "email"}}),
    obj({"ip": {"type": "string", "format": "ipv4"}}),
    # a realistic mix
    obj({"title": {"type": "string", "maxLength": 12}, "year": I, "rating": N,
         "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "sci-fi"]}, "minItems": 1, "maxItems": 3},
         "director": obj({"name": S, "born": {"type": "string", "format": "date"}}),
         "sequel": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]}},
        required=["title", "year", "genres", "director", "sequel"]),
]

# The 2020-12 checkers (a bare FormatChecker() holds draft 3's "time"); date-time needs
# rfc3339-validator, which jsonschema uses when it is installed.
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
for _f in ("date", "date-time", "time", "uuid", "email", "ipv4"):
    assert not FORMATS.conforms("not valid", _f), "format %s is not checked: install scripts/requirements-test.txt" % _f


def check(schema, text):
    jsonschema.Draft202012Validator(schema, format_checker=FORMATS).validate(json.loads(text))


def rf(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": strict}}


def test_at_least_50_schemas():
    assert len(SCHEMAS) >= 50
    for s in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(s)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_schema_enforced(client, i):
    schema = SCHEMAS[i]
    for seed in range(2):
        r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=600, temperature=1.0, seed=seed,
                                           response_format=rf(schema, strict=seed == 0))
        c = r.choices[0]
        assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
        check(schema, c.message.content)
    chunks = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=600, temperature=1.0, seed=7,
                                            stream=True, response_format=rf(schema))
    text, finish = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    assert finish == "stop", (finish, text)
    check(schema, text)


def test_n_choices_all_valid(client):
    schema = SCHEMAS[-1]
    r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=600, temperature=1.0, seed=3, n=4,
                                       response_format=rf(schema))
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop"
        check(schema, c.message.content)


@pytest.mark.parametrize("schema,needle", [
    ({"type": "integer", "minimum": 1}, "'minimum'"),
    ({"oneOf": [{"type": "integer"}]}, "'oneOf'"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "hostname"}}}, "hostname"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}, "#/$defs/nope"),
    ({"type": "string", "pattern": "(?<=a)b"}, "lookaround"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "'patternProperties'"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}, "additionalProperties"),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "'prefixItems'"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "nonsense"}, "nonsense"),
])
def test_bad_schema_is_400_naming_the_keyword(client, schema, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=5, response_format=rf(schema))
    assert needle in str(ei.value), str(ei.value)


def test_bad_json_schema_fields_are_400(client):
    for js, needle in [({"name": "x", "schema": {}, "strict": "yes"}, "strict"),
                       ({"name": "x", "schema": {}, "bogus": 1}, "bogus")]:
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=5,
                                           response_format={"type": "json_schema", "json_schema": js})
        assert needle in str(ei.value)


TOOL_PARAMS = obj({"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                   "days": {"type": "integer"},
                   "unit": {"anyOf": [{"type": "null"}, {"enum": ["C", "F"]}]}})


def test_forced_tool_arguments_follow_the_parameters(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_PARAMS}},
             {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(6):
        r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=400, temperature=1.0, seed=seed,
                                           tools=tools, tool_choice=forced)
        c = r.choices[0]
        assert c.message.tool_calls, (c.finish_reason, c.message.content)
        call = c.message.tool_calls[0]
        assert call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert isinstance(args, dict)
        check(TOOL_PARAMS, call.function.arguments)


def test_forced_tool_arguments_streamed(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_PARAMS}}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        args, names = {}, {}
        for ch in client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=400, temperature=1.0,
                                                 seed=seed, tools=tools, tool_choice=forced, stream=True):
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                if tc.function and tc.function.name:
                    names[tc.index] = tc.function.name
                if tc.function and tc.function.arguments:
                    args[tc.index] = args.get(tc.index, "") + tc.function.arguments
        assert names.get(0) == "get_weather", (names, args)
        check(TOOL_PARAMS, args[0])


def test_forced_tool_with_unsupported_parameters_is_400(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": obj({"n": {"type": "integer", "maximum": 3}})}}]
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=5, tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "f"}})
    assert "'maximum'" in str(ei.value)


@pytest.fixture(scope="module")
def real_client():
    if not os.path.exists(DEFAULT_MODEL):
        pytest.skip("default model not downloaded (scripts/setup.sh fetches it)")
    s = start_server(DEFAULT_MODEL, "--parallel", "2", "--ctx-size", "2048")
    yield s.client()
    s.stop()


REAL = [
    (obj({"name": {"type": "string", "maxLength": 40}, "age": I, "languages": {"type": "array", "items": S,
                                                                             "maxItems": 4}}),
     "Describe a fictional programmer as JSON with name, age and languages."),
    (obj({"city": {"enum": ["Paris", "Berlin", "Rome"]}, "population_millions": N,
          "founded": {"type": "string", "format": "date"}}),
     "Give facts about the capital of France as JSON."),
    (obj({"answer": {"type": "integer"}, "steps": {"type": "array", "items": {"type": "string", "maxLength": 60},
                                                   "minItems": 1, "maxItems": 3}}),
     "What is 17 + 25? Answer as JSON with steps."),
]


@pytest.mark.parametrize("i", range(len(REAL)))
def test_default_model(real_client, i):
    schema, prompt = REAL[i]
    for stream in (False, True):
        kw = dict(model=real_client.models.list().data[0].id, messages=[{"role": "user", "content": prompt}], max_tokens=300, temperature=0,
                  response_format=rf(schema))
        if stream:
            text = "".join(ch.choices[0].delta.content or "" for ch in real_client.chat.completions.create(stream=True, **kw)
                           if ch.choices)
        else:
            text = real_client.chat.completions.create(**kw).choices[0].message.content
        check(schema, text)
