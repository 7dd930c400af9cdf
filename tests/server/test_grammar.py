"""GBNF `grammar` request field (issue 30 item 1): replies follow the grammar, checked by matchers
written here independently of the server's (Python `re` for regular grammars, small
recursive-descent checkers for the recursive ones, `json.loads` for the JSON grammar) —
streamed and not, chat and completions (`extra_body={"grammar": ...}` as the openai client sends
it; vLLM's `guided_grammar` too). Bad grammars are a 400 naming the line and column; a grammar
with response_format json_schema / json_object or a forced tool call is a 400.

The random-weight fixture model writes arbitrary text, so only the mask keeps it on the grammar;
the grammars here give it a way to finish (bounded or cheap-to-close repetition), and a reply cut
by max_tokens ("length") must still be a prefix of a sentence. A few grammars also run on the
default model when it is present.
"""
import json
import os
import re

import openai
import pytest

from conftest import DEFAULT_MODEL, start_server

MSG = [{"role": "user", "content": "Answer."}]


# ---- independent checkers ----

def paren_ok(s, prefix=False):
    """Balanced parentheses (possibly empty), nothing else."""
    d = 0
    for ch in s:
        if ch not in "()":
            return False
        d += 1 if ch == "(" else -1
        if d < 0:
            return False
    return prefix or d == 0


class Arith:
    """expr ::= term (ws ('+'|'-') ws term)*; term ::= factor (ws ('*'|'/') ws factor)*;
    factor ::= 1 to 3 digits | '(' ws expr ws ')'; ws ::= one optional space -- recursive
    descent."""

    def __init__(self, s):
        self.s, self.i = s, 0

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def sp(self):
        if self.peek() == " ":
            self.i += 1

    def ops(self, ops, item):
        item()
        while True:
            save = self.i
            self.sp()
            if self.peek() and self.peek() in ops:
                self.i += 1
                self.sp()
                item()
            else:
                self.i = save
                return

    def expr(self):
        self.ops("+-", self.term)

    def term(self):
        self.ops("*/", self.factor)

    def factor(self):
        n = 0
        while n < 3 and self.peek() in "0123456789" and self.peek():
            self.i, n = self.i + 1, n + 1
        if n:
            return
        if self.peek() != "(":
            raise ValueError("unexpected %r at %d" % (self.peek(), self.i))
        self.i += 1
        self.sp()
        self.expr()
        self.sp()
        if self.peek() != ")":
            raise ValueError("expected ) at %d" % self.i)
        self.i += 1


def arith_ok(s):
    p = Arith(s)
    try:
        p.expr()
    except ValueError:
        return False
    return p.i == len(s)


def arith_prefix_ok(s):
    """A prefix of some sentence: it can be completed by closing with digits and parens."""
    for tail in ("", "0", ")", "0)"):
        for k in range(0, 64):
            if arith_ok(s + tail + ")" * k) or arith_ok(s + "0" + ")" * k):
                return True
    return False


JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''

# (grammar, regex for the whole reply) -- regular grammars
REGULAR = [
    ('root ::= "yes" | "no"', r"yes|no"),
    ('root ::= [A-Z]{3} "-" [0-9]{2,4}', r"[A-Z]{3}-[0-9]{2,4}"),
    ('root ::= "name: " [a-z]{1,8} "\\n" "age: " [1-9] [0-9]?', r"name: [a-z]{1,8}\nage: [1-9][0-9]?"),
    ('root ::= [\\u00e0-\\u00ff]{1,4} "!"', r"[\u00e0-\u00ff]{1,4}!"),
    ('root ::= ("ab" | "c")+ "."', r"(ab|c)+\."),
    ('# a comment\nroot ::= word (" " word){0,3}\nword ::= [a-z]{2,5}\n', r"[a-z]{2,5}( [a-z]{2,5}){0,3}"),
    ('root ::= "x"? [^a-z\\n]{2}', r"x?[^a-z\n]{2}"),
    ('root ::= "\\x41" "\\u00e9" [\\t ]', "A\u00e9[\t ]"),
]

PARENS = 'root ::= "(" p ")"\np ::= ("(" p ")")*\n'
ARITH = ('root ::= expr\nexpr ::= term (ws ("+" | "-") ws term)*\nterm ::= factor (ws ("*" | "/") ws factor)*\n'
         'factor ::= [0-9]{1,3} | "(" ws expr ws ")"\nws ::= " "?\n')


def chat(client, grammar, stream=False, seed=0, max_tokens=200, key="grammar", **kw):
    args = dict(model="qwen3", messages=MSG, max_tokens=max_tokens, temperature=1.0, seed=seed,
                extra_body={key: grammar}, **kw)
    if not stream:
        c = client.chat.completions.create(**args).choices[0]
        return c.message.content or "", c.finish_reason
    text, finish = "", None
    for ch in client.chat.completions.create(stream=True, **args):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("i", range(len(REGULAR)))
def test_regular_grammar(client, i):
    g, rx = REGULAR[i]
    for seed, stream in ((0, False), (1, False), (2, True)):
        text, finish = chat(client, g, stream=stream, seed=seed)
        assert finish == "stop", (finish, text)
        assert re.fullmatch(rx, text), (g, text)


def test_unconstrained_reply_breaks_the_grammar(client):
    # The checkers can fail: without the field the fixture's text is not a sentence.
    text, _ = chat(client, None, seed=0, max_tokens=30)
    assert not re.fullmatch(REGULAR[1][1], text)
    assert not arith_ok(text) and not paren_ok(text)


def test_recursive_balanced_parens(client):
    stops = 0
    for seed in range(6):
        text, finish = chat(client, PARENS, stream=seed % 2 == 1, seed=seed, max_tokens=120)
        assert finish in ("stop", "length")
        assert text.startswith("(") and paren_ok(text, prefix=finish == "length"), (finish, text)
        stops += finish == "stop"
    assert stops >= 1


def test_recursive_arithmetic(client):
    stops = 0
    for seed in range(6):
        text, finish = chat(client, ARITH, stream=seed % 2 == 1, seed=seed, max_tokens=120)
        assert finish in ("stop", "length")
        if finish == "stop":
            assert arith_ok(text), text
            stops += 1
        else:
            assert arith_prefix_ok(text), text
    assert stops >= 1


def test_json_grammar(client):
    for seed in range(3):
        text, finish = chat(client, JSON_GBNF, stream=seed == 2, seed=seed, max_tokens=300)
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert finish == "length" and text.startswith("{"), (finish, text)


def test_completions_and_guided_grammar(client):
    g, rx = REGULAR[1]
    r = client.completions.create(model="qwen3", prompt="Code:", max_tokens=50, temperature=1.0, seed=4,
                                  extra_body={"grammar": g})
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(rx, r.choices[0].text), r.choices[0]
    out = client.completions.create(model="qwen3", prompt="Code:", max_tokens=50, temperature=1.0, seed=5,
                                    stream=True, extra_body={"guided_grammar": g})
    text = "".join(c.choices[0].text for c in out if c.choices)
    assert re.fullmatch(rx, text), text
    text, finish = chat(client, g, key="guided_grammar", seed=6)
    assert finish == "stop" and re.fullmatch(rx, text)


def test_n_choices_and_batch_all_follow(client):
    g, rx = REGULAR[2]
    r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=60, temperature=1.0, seed=9, n=4,
                                       extra_body={"grammar": g})
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop" and re.fullmatch(rx, c.message.content), c.message.content


@pytest.mark.parametrize("grammar,needle", [
    ('root ::= foo\n', "line 1, column 10: undefined rule 'foo'"),
    ('rot ::= "x"\n', "no 'root' rule"),
    ('root ::= "x"\nroot ::= "y"\n', "line 2, column 1: rule 'root' is defined twice"),
    ('root ::= "abc\n', "unterminated string literal"),
    ('root ::= [z-a]\n', "character range out of order"),
    ('root ::= ("a"\n', "unclosed '('"),
    ('root ::= x\nx ::= x "a" | "b"\n', "left recursion through rule 'x'"),
    ('root ::= "a"{1001}\n', "repetition count above 1000"),
])
def test_bad_grammar_is_400_naming_the_place(client, grammar, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        chat(client, grammar, max_tokens=5)
    assert needle in str(ei.value), str(ei.value)
    assert "grammar" in str(ei.value)


def test_grammar_conflicts_and_types_are_400(client):
    rf = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}
    for kw, needle in [(dict(response_format=rf), "response_format"),
                       (dict(response_format={"type": "json_object"}), "response_format"),
                       (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                             tool_choice={"type": "function", "function": {"name": "f"}}), "tool")]:
        with pytest.raises(openai.BadRequestError) as ei:
            chat(client, 'root ::= "a"', max_tokens=5, **kw)
        assert needle in str(ei.value), str(ei.value)
    for bad in (5, ["root ::= \"a\""], {"root": "a"}):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(client, bad, max_tokens=5)
        assert "must be a string" in str(ei.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=5,
                                       extra_body={"grammar": 'root ::= "a"', "guided_grammar": 'root ::= "a"'})
    # a null grammar is no grammar
    r = client.chat.completions.create(model="qwen3", messages=MSG, max_tokens=3, extra_body={"grammar": None})
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def real_client():
    if not os.path.exists(DEFAULT_MODEL):
        pytest.skip("default model not downloaded (scripts/setup.sh fetches it)")
    s = start_server(DEFAULT_MODEL, "--parallel", "2", "--ctx-size", "2048")
    yield s.client()
    s.stop()


def test_real_model(real_client):
    cases = [
        ("Is the sky blue on a clear day? Answer yes or no.", 'root ::= "yes" | "no"',
         lambda t: t in ("yes", "no")),
        ("Write an arithmetic expression that equals 12.", ARITH, arith_ok),
        ("Give a JSON object describing a cat with name and age.", JSON_GBNF,
         lambda t: isinstance(json.loads(t), dict)),
    ]
    for prompt, g, ok in cases:
        for stream in (False, True):
            args = dict(model=real_client.models.list().data[0].id, messages=[{"role": "user", "content": prompt}], max_tokens=120,
                        temperature=0, extra_body={"grammar": g})
            if stream:
                text, finish = "", None
                for ch in real_client.chat.completions.create(stream=True, **args):
                    if ch.choices:
                        text += ch.choices[0].delta.content or ""
                        finish = ch.choices[0].finish_reason or finish
            else:
                c = real_client.chat.completions.create(**args).choices[0]
                text, finish = c.message.content, c.finish_reason
            assert finish == "stop" and ok(text), (prompt, finish, text)
