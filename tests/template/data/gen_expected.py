#!/usr/bin/env python3
"""Regenerates unit_cases.json and model_cases.json with jinja2 exactly as transformers renders
chat templates (transformers.utils.chat_template_utils._compile_jinja_template: sandboxed env,
trim_blocks, lstrip_blocks, loopcontrols, generation tag, its tojson/raise_exception/strftime_now).

usage: python3 gen_expected.py   (needs: pip install transformers jinja2)
"""
import json, os, sys
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))

def render(src, vars):
    try:
        return {"expected": _compile_jinja_template(src).render(**vars)}
    except Exception as e:  # noqa
        return {"error": f"{type(e).__name__}: {e}"}

V = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo \"world\"\n"},
                 {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHi!"}],
    "d": {"b": 1, "a": [1, 2.5, None, True], "s": "x'y", "e": {}}, "l": [3, 1, 2], "s": "  Hello World  ",
    "u": "héllo wörld ☃ 😀", "n": 7, "f": 2.5, "t": True, "z": None, "e": "",
    "items": [{"name": "b", "v": 2, "on": True}, {"name": "a", "v": 1, "on": False}, {"name": "c", "v": 3}],
    "bos_token": "<s>", "eos_token": "</s>",
}

UNIT = [
    # printing
    "{{ 1 }}|{{ 1.0 }}|{{ 1.5e-7 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ 10 / 4 }}|{{ 3.0 * 2 }}|{{ 1e16 }}|{{ -0.0 }}",
    "{{ none }}|{{ true }}|{{ false }}|{{ z }}|{{ undefined_var }}|{{ t }}",
    "{{ d }}|{{ l }}|{{ (1, 'a') }}|{{ (1,) }}|{{ () }}|{{ [] }}|{{ {} }}",
    "{{ ['it\\'s', \"q\\\"d\", 'both\\'\"', '\\n\\t\\x01', 'é'] }}",
    "{{ d | string }}|{{ l | string }}|{{ 5 | string }}|{{ none | string }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -n }} {{ +n }} {{ -f }} {{ n - -1 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }}",
    "{{ 1 == 1.0 }} {{ '1' == 1 }} {{ [1,2] == [1,2] }} {{ d == d }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }}",
    "{{ 'a' in 'cab' }} {{ 'x' not in 'cab' }} {{ 1 in l }} {{ 'a' in d }} {{ 'b' in d }} {{ 5 not in l }}",
    "{{ true and 'x' }} {{ false or 'y' }} {{ none or 0 }} {{ not e }} {{ not not n }} {{ e and 1 }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if z else 'no' }} [{{ 'x' if z }}] {{ 1 if z else 2 if t else 3 }}",
    # strings
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'abc'.split('x') }}",
    "{{ s.startswith('  H') }} {{ s.endswith('d  ') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'aXbX'.replace('X', 'y') }} {{ 'aXbX'.replace('X', 'y', 1) }}",
    "{{ u | length }} {{ u[0] }} {{ u[-1] }} {{ u[1:4] }} {{ u[::-1] }} {{ u[::2] }} {{ u | upper }} {{ u.title() }}",
    "{{ 'hello world'.capitalize() }} {{ 'HELLO'|capitalize }} {{ 'hello wORLD'|title }} {{ 'a-b c_d'|title }}",
    "{{ '{}-{}'.format(1, 'a') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '%s=%d'|format('a', 3) }}",
    "{{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('bc') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '-'.join(['a','b']) }}",
    "{{ 'x' | trim }}|{{ s | trim }}|{{ '..a..' | trim('.') }}|{{ s | wordcount }}|{{ 'ab' | reverse }}|{{ 'a<b>&\"\\'' | e }}",
    "{{ 'abc' | first }} {{ 'abc' | last }} {{ 'abc' | list }} {{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}",
    "{{ 'x\\ty' }}|{{ '\\u00e9\\U0001F600' }}|{{ 'a' 'b' }}|{{ \"it's\" }}",
    # lists / dicts
    "{{ l | sort }} {{ l | sort(reverse=true) }} {{ l | reverse | list }} {{ l | first }} {{ l | last }} {{ l | length }} {{ l | sum }} {{ l | min }} {{ l | max }}",
    "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[5] }}|{{ l[1:2:1] }} {{ l[-100:100] }}",
    "{{ d.b }} {{ d['b'] }} {{ d.missing }}|{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.a[1] }} {{ d.e }}",
    "{{ d | items | list }} {{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d | length }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{{ {'b':1,'a':2} | dictsort }}",
    "{{ items | map(attribute='name') | list }} {{ items | map(attribute='v') | sum }} {{ items | map(attribute='zz', default='-') | list }}",
    "{{ items | selectattr('on') | map(attribute='name') | join(',') }} {{ items | rejectattr('on') | map(attribute='name') | list }}",
    "{{ items | selectattr('name', 'equalto', 'a') | list | length }} {{ items | selectattr('on', 'defined') | list | length }} {{ items | rejectattr('on', 'undefined') | list | length }}",
    "{{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3,4] | reject('even') | list }} {{ [0,1,'',none,'a'] | select | list }} {{ [1,2,2,1,3] | unique | list }}",
    "{{ items | sort(attribute='name') | map(attribute='v') | list }} {{ ['b','A','c'] | sort }} {{ ['b','A','c'] | sort(case_sensitive=true) }}",
    "{{ ['a','b'] | join }} {{ [1,2] | join(', ') }} {{ items | join('|', attribute='name') }} {{ [1,'a'] | map('string') | list }} {{ ['a','b'] | map('upper') | list }}",
    "{{ l | tojson }} {{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'é\\n\\x01\"' | tojson }} {{ 1.0 | tojson }} {{ none | tojson }} {{ [] | tojson(indent=2) }} {{ {} | tojson(indent=4) }}",
    "{{ items | tojson(indent=4) }}",
    "{{ {'b': 2, 'a': {'y': 1, 'x': [1, {}]}} | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }}",
    "{{ 3 | round }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.675 | round(2) }} {{ 3.7 | round(method='floor') }} {{ 3.2 | round(0, 'ceil') }}",
    "{{ '3' | int }} {{ 'x' | int }} {{ '1.5' | float }} {{ 3.9 | int }} {{ -3 | abs }} {{ -2.5 | abs }} {{ 'x' | int(7) }} {{ true | int }}",
    "{{ undefined_var | default('dflt') }} {{ none | default('x') }} {{ '' | default('z', true) }} {{ n | d(1) }} {{ undefined_var | length }}",
    "{{ (items | first).name }} {{ items[1]['name'] }} {{ items[0].zz is defined }} {{ items | length }}",
    # tests
    "{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ z is none }} {{ z is not none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ s is iterable }} {{ l is sequence }}",
    "{{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }} {{ t is true }} {{ false is false }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}",
    "{{ n is equalto 7 }} {{ n is eq(7) }} {{ 'a' is eq 'b' }} {{ n is gt 3 }} {{ n is lt(3) }} {{ n is ge 7 }} {{ 2 is in [1,2] }} {{ s is lower }} {{ 'abc' is lower }}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}|{% if zz %}a{% elif e %}b{% endif %}|",
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }},{% endfor %}",
    "{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}{% for x in zz %}no{% endfor %}",
    "{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }},{% endfor %}",
    "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}|{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
    "{% for a in [1,2] %}{% for b in [3,4] %}{{ a }}{{ b }}{{ loop.index }}{% if b == 3 %}{% continue %}{% endif %};{% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set x = 1 %}{% for i in l %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}",
    "{% set ns = namespace(total=0, names=[]) %}{% for i in items %}{% set ns.total = ns.total + i.v %}{% endfor %}{{ ns.total }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{% set p, q = c %}{{ p }}{{ q }}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]{% set up | upper %}shout{% endset %}{{ up }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet() }}",
    "{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
    "{% macro outer() %}{{ n }}{% set n = 1 %}{{ n }}{% endmacro %}{{ outer() }}{{ n }}",
    "{% filter upper %}abc {{ s }}{% endfilter %}",
    "a {# comment #} b {#- trimmed -#} c\n{# own line #}\nd",
    "{% raw %}{{ not rendered }}{% endraw %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    # whitespace control
    "a\n  {% if true %}\n    x\n  {% endif %}\nb",
    "a  {%- if true -%}  x  {%- endif -%}  b {{- ' c ' -}} d",
    "  {%+ if true %}x{% endif %}\n{{ 'v' }}\n  {{ 'w' }}\n",
    "{% for i in l %}\n  {{ i }}\n{% endfor %}\n",
    "line1\n    {% set q = 1 %}\nline2\n\t{# c #}\nline3  {% if true %}x{% endif %}",
    "{%- for m in messages %}\n{{- m.role }}: {{ m.content | trim }}\n{% endfor -%}\nEND\n\n",
    "x\r\ny\r\n",
    # errors
    "{{ raise_exception('custom failure') }}",
    "{{ 1 + 'a' }}",
    "{{ 1 / 0 }}",
    "{{ zz | tojson }}",
    "{% for x in none %}{% endfor %}",
    # misc globals
    "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ dict(d).b }} {{ strftime_now('') }}|{{ bos_token }}{{ eos_token }}",
    "{% set lst = [] %}{% for i in range(3) %}{% set lst = lst + [i] %}{% endfor %}{{ lst }}",
    "{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ [[1, 2], [3]][0][1] }}{{ d['a'][0] }}{{ messages[-1]['role'] }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ (messages | last).content.split('</think>')[-1].lstrip('\\n') }}",
    "{{ messages[0].content if messages[0].role == 'system' else '' }}{% if messages[1].content is string %}S{% endif %}",
    "{{ '%s-%s' % ('a', 1) }} {{ '%d%%' % 5 }} {{ '%.3f|%5s|%-4d|' % (3.14159, 'ab', 7) }} {{ 'x=%r' % 'q' }}",
    "{{ 'é☃😀\\n' | tojson(ensure_ascii=true) }} {{ {'k': 'ü'} | tojson(ensure_ascii=true, indent=1) }}",
    "{{- bos_token }}{%- for message in messages %}{{- '<|' + message['role'] + '|>\\n' + message['content'] | trim + eos_token }}{%- endfor %}",
]

def main():
    unit = []
    for i, src in enumerate(UNIT):
        unit.append({"name": f"unit{i:03d}", "template": src, "vars": V, **render(src, V)})
    json.dump(unit, open(os.path.join(HERE, "unit_cases.json"), "w"), ensure_ascii=False, indent=1)
    print(f"unit_cases.json: {len(unit)} cases, {sum('error' in c for c in unit)} errors")
    model_cases()

def alias_reasoning(msgs):
    # transformers' _alias_reasoning_fields: templates see both names
    out = []
    for m in msgs:
        r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out

def model_cases():
    """Every template in templates/ over every conversation x add_generation_prompt x kwargs
    variant. The template variables are stored once per variant (vars_sets) and referenced."""
    convs = json.load(open(os.path.join(HERE, "conversations.json")))
    tdir = os.path.join(HERE, "templates")
    vars_sets, cases = {}, []
    for fn in sorted(os.listdir(tdir)):
        if not fn.endswith(".jinja"):
            continue
        src = open(os.path.join(tdir, fn)).read()
        for conv in convs:
            for agp in (False, True):
                for kw in conv.get("kwargs_variants", [{}]):
                    vid = f"{conv['name']}/agp={int(agp)}/{json.dumps(kw, sort_keys=True)}"
                    # what transformers passes: tools/documents None when absent, special tokens,
                    # a fixed date_string so Llama templates do not read the clock
                    vars = {"messages": alias_reasoning(conv["messages"]), "tools": conv.get("tools"),
                            "documents": None, "add_generation_prompt": agp,
                            "bos_token": "<s>", "eos_token": "</s>", "date_string": "26 Jul 2024", **kw}
                    vars_sets[vid] = vars
                    r = render(src, vars)
                    cases.append({"name": f"{fn[:-6]}/{vid}", "template": "@templates/" + fn, "vars_id": vid, **r})
    json.dump({"vars_sets": vars_sets, "cases": cases}, open(os.path.join(HERE, "model_cases.json"), "w"),
              ensure_ascii=False, indent=0)
    print(f"model_cases.json: {len(cases)} cases, {sum('error' in c for c in cases)} errors")

def sweep(src_dir, out_path):
    """All templates of a folder over the conversations, template paths absolute, for
    `test_template FIXTURES OUT.json`. Cases jinja2 itself fails on are marked pyerror."""
    convs = json.load(open(os.path.join(HERE, "conversations.json")))
    cases = []
    for fn in sorted(os.listdir(src_dir)):
        if not fn.endswith(".jinja"):
            continue
        src = open(os.path.join(src_dir, fn)).read()
        for conv in convs:
            for agp in (False, True):
                for kw in conv.get("kwargs_variants", [{}]):
                    vars = {"messages": alias_reasoning(conv["messages"]), "tools": conv.get("tools"),
                            "documents": None, "add_generation_prompt": agp, "bos_token": "<s>",
                            "eos_token": "</s>", "date_string": "26 Jul 2024", **kw}
                    r = render(src, vars)
                    if "error" in r:
                        r = {"pyerror": r["error"]}
                    cases.append({"name": f"{fn}/{conv['name']}/{agp}/{kw}",
                                  "template": "@" + os.path.join(os.path.abspath(src_dir), fn), "vars": vars, **r})
    json.dump(cases, open(out_path, "w"), ensure_ascii=False)
    print(f"{out_path}: {len(cases)} cases, {sum('pyerror' in c for c in cases)} fail in jinja2 too")

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--sweep":
        sweep(sys.argv[2], sys.argv[3])
    else:
        main()
