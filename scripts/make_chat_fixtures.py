#!/usr/bin/env python3
"""Goldens for linnet-tp's chat templates: Jinja2 renders each real template on a set
of conversations, with transformers' conventions (transformers/utils/
chat_template_utils.py, _cached_compile_jinja_template and render_jinja_template):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[jinja2.ext.loopcontrols])
  filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  globals: raise_exception, strftime_now, namespace, dict
  variables: the tokenizer's special tokens, messages, tools (None when absent),
             documents=None, add_generation_prompt, then extra keyword arguments.

Writes tests/data/chat_templates/<name>.jinja (a copy of the template) and <name>.jsonl:
one {"name", "variables", "text"} (or "error": the exception's message, and "error_kind":
"raise_exception" or "undefined") per case.
When transformers is importable its own render_jinja_template is run as a cross-check.

Needs only jinja2 (Debian python3-jinja2, or the venv of scripts/requirements-fixtures.txt):
  python3 scripts/make_chat_fixtures.py [--shared ../shared]
"""
import argparse
import json
import os
import shutil
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "chat_templates")

TEMPLATES = {
    # name: (file in shared/templates, special tokens from the model's tokenizer_config.json)
    "llama-3.1-8b-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen3": {"eos_token": "<|im_end|>"},  # bos_token is null in Qwen3's config
    "phi-3-mini-4k-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
}


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — résumé «quotes» \"double\" and \\ backslash",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": []},
    },
}


def common_cases():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    return [
        ("one user turn", {"messages": [u("Hello!")], "add_generation_prompt": True}),
        ("one user turn, no generation prompt", {"messages": [u("Hello!")]}),
        ("system and user", {"messages": [s("You are a helpful assistant."), u("What is 2+2?")],
                             "add_generation_prompt": True}),
        ("multi-turn with system", {"messages": [s("Be brief."), u("Hi"), a("Hello! How can I help?"),
                                                 u("Tell me a joke.")], "add_generation_prompt": True}),
        ("multi-turn ending with the assistant", {"messages": [u("Hi"), a("Hello."), u("Bye"), a("Goodbye!")]}),
        ("unicode and whitespace", {"messages": [s("  Réponds en français.  \n"), u("  Ça va?\n\n中文 🙂 \t"),
                                                 a(" Très bien !\n"), u("\nEncore\n")],
                                    "add_generation_prompt": True}),
        ("quotes, backslashes and braces", {"messages": [u("Say \"hi\" and 'bye' \\n {{ not_a_var }} {% raw %}")],
                                            "add_generation_prompt": True}),
        ("three rounds", {"messages": [u("1"), a("one"), u("2"), a("two"), u("3"), a("three"), u("4")],
                          "add_generation_prompt": True}),
        ("empty system message", {"messages": [s(""), u("Hi")], "add_generation_prompt": True}),
        ("empty user message", {"messages": [u("")], "add_generation_prompt": False}),
        ("two user messages in a row", {"messages": [u("First."), u("Second.")], "add_generation_prompt": True}),
    ]


def llama_cases():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_current_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}}]}
    return [
        ("date_string given", {"messages": [u("What day is it?")], "add_generation_prompt": True,
                               "date_string": "01 Jan 2025"}),
        ("tools in the user message", {"messages": [{"role": "system", "content": "Use tools."},
                                                    u("Weather in Paris?")],
                                       "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True}),
        ("tools in the system message", {"messages": [u("Weather in Paris?")], "tools": [WEATHER_TOOL],
                                         "tools_in_user_message": False, "add_generation_prompt": True,
                                         "date_string": "12 Mar 2025"}),
        ("tool call and ipython result", {"messages": [u("Weather in Paris?"), call,
                                                       {"role": "ipython", "content": "{\"temp\": 21}"}],
                                          "tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("tool result as a mapping", {"messages": [u("Weather?"), call,
                                                   {"role": "tool", "content": {"temp": 21.5, "ok": True,
                                                                                "list": [1, None, "é"]}}],
                                      "tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("builtin tools", {"messages": [u("Search for cats"), {"role": "assistant", "tool_calls": [{
            "function": {"name": "brave_search", "arguments": {"query": "cats", "n": "3"}}}]}],
            "builtin_tools": ["brave_search", "code_interpreter"], "add_generation_prompt": False}),
        ("two tool calls raise", {"messages": [u("x"), {"role": "assistant", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}]}),
        ("tools without a user message raise", {"messages": [], "tools": [WEATHER_TOOL]}),
    ]


def qwen3_cases():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    return [
        ("enable_thinking false", {"messages": [u("Hi")], "add_generation_prompt": True, "enable_thinking": False}),
        ("enable_thinking true", {"messages": [u("Hi")], "add_generation_prompt": True, "enable_thinking": True}),
        ("think content in the last turn", {"messages": [u("2+2?"), a("<think>\nSimple sum.\n</think>\n\n4")]}),
        ("think content in earlier turns", {"messages": [u("2+2?"), a("<think>\nadd\n</think>\n\n4"), u("3+3?"),
                                                         a("<think>add again</think>6"), u("thanks")],
                                            "add_generation_prompt": True, "enable_thinking": False}),
        ("reasoning_content field", {"messages": [u("Q"), {"role": "assistant", "content": "A",
                                                           "reasoning_content": "\nbecause\n"}]}),
        ("tools with system", {"messages": [{"role": "system", "content": "You are Qwen."}, u("Weather?")],
                               "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True}),
        ("tool calls and responses", {"messages": [
            u("Weather in Paris and Rome?"),
            {"role": "assistant", "content": "<think>\nTwo calls.\n</think>\n\nLet me check.", "tool_calls": [
                {"type": "function", "function": {"name": "get_current_weather",
                                                  "arguments": {"location": "Paris"}}},
                {"type": "function", "function": {"name": "get_current_weather",
                                                  "arguments": "{\"location\": \"Rome\"}"}}]},
            {"role": "tool", "content": "{\"temp\": 20}"},
            {"role": "tool", "content": "{\"temp\": 25}"},
            a("Paris 20, Rome 25."),
            u("<tool_response>fake</tool_response>")],
            "tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("tool call without content", {"messages": [u("Weather?"), {"role": "assistant", "content": "",
                                                                     "tool_calls": [{"name": "search",
                                                                                     "arguments": {"query": "x"}}]},
                                                    {"role": "tool", "content": "ok"}],
                                       "tools": [SEARCH_TOOL], "add_generation_prompt": True,
                                       "enable_thinking": True}),
    ]


def phi3_cases():
    return [("system message is dropped by phi-3", {"messages": [{"role": "system", "content": "Sys"},
                                                                {"role": "user", "content": "U"}],
                                                   "add_generation_prompt": True})]


SPECIFIC = {
    "llama-3.1-8b-instruct": llama_cases,
    "qwen3": qwen3_cases,
    "phi-3-mini-4k-instruct": phi3_cases,
    "phi-3.5-mini-instruct": phi3_cases,
}


# Small templates for the interpreter's corners (whitespace control, scoping, Python
# value semantics, filters, tests); rendered by the same environment.
SNIPPETS = [
    ("  {% if true %}\n  yes\n  {% endif %}\nafter", {}),
    ("a  {%- if true -%}  b  {%- endif %}  c\n", {}),
    ("{%+ if true %}x{% endif +%}\ny{# c #}\n  {# c2 #}\nz", {}),
    ("{{ 'a' }}\n{{- ' b' -}}\n  c", {}),
    ("line1\r\nline2\rline3\n\n", {}),
    ("{% for i in range(3) %}{% if i == 1 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}{{ x }}", {"x": 1}),
    ("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% for k, v in d | items %}{{ loop.index }}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}",
     {"d": {"b": 1, "a": [1, "x"]}}),
    ("{% for x in xs if x > 1 %}{{ loop.index0 }}:{{ x }}/{{ loop.length }}{% else %}none{% endfor %}",
     {"xs": [1, 2, 3]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
     "{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-2] }} {{ s[::-1] }} {{ s[1:3] }} {{ xs[10] }}.",
     {"xs": [1, 2, 3], "s": "héllo"}),
    ("{{ [1, 2.5, 'a', none, true, {'k': [1]}] }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 3 / 2 }} {{ 7 // 2 }}"
     " {{ -7 % 3 }} {{ 2 ** 10 }} {{ 100.0 }}", {}),
    ("{{ '  x  ' | trim }}|{{ 'xxaxx'.strip('x') }}|{{ ' a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|"
     "{{ 'a\nb'.lstrip('\n') }}|{{ 'abc'.upper() }}|{{ 'aXbX'.replace('X', '-') }}", {}),
    ("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é\"\n' | tojson }}|{{ [] | tojson(indent=4) }}",
     {"x": {"b": [1, {"c": None}], "a": "é", "f": 1.5, "t": True, "e": {}}}),
    ("{{ x is defined }}{{ y is defined }}{{ none is none }}{{ 's' is string }}{{ 1 is string }}{{ d is mapping }}"
     "{{ 's' is iterable }}{{ 3 is number }}{{ false is false }}{{ 0 is false }}{{ 4 is divisibleby 2 }}",
     {"x": 1, "d": {}}),
    ("{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 < 2 < 3 }}{{ not 1 == 1 }}"
     "{{ 1 and 'x' }}{{ 0 or 'y' }}", {"d": {"k": 1}}),
    ("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 'ab' * 2 }}|{{ undefined_var }}|", {}),
    ("{{ xs | length }} {{ 'héllo' | length }} {{ xs | join(', ') }} {{ xs | first }} {{ xs | last }}"
     " {{ xs | reject('equalto', 2) | list }} {{ xs | select('odd') | list }} {{ y | default('dflt') }}",
     {"xs": [1, 2, 3]}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "x", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }}"
     " {{ greet(name='C', punct='.') }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block {{ a }}{% endset %}[{{ t }}]", {}),
    ("{{ d.get('a') }} {{ d.get('z', 'dz') }} {{ d['a'] }} {{ d.a }} {{ d.keys() | list }} {{ d.missing }}.",
     {"d": {"a": 1, "b": 2}}),
    ("{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} {{ 'x' if false }}.", {"x": [0], "y": []}),
    ("{{ \"a\" 'b' }} {{ 'it\\'s' }} {{ \"tab\\there\" }} {{ '\\u00e9' }}", {}),
    ("{{ raise_exception('custom failure') }}", {}),
    ("{{ 'x' + 1 }}", {}),
    ("{{ undefined_var.attr }}", {}),
]


def variables_for(special, request):
    """The variables transformers' render_jinja_template passes (tools None when absent)."""
    v = dict(special)
    v["messages"] = request["messages"]
    v["tools"] = request.get("tools")
    v["documents"] = None
    v["add_generation_prompt"] = request.get("add_generation_prompt", False)
    for k, x in request.items():
        if k not in v:
            v[k] = x
    return v


def cross_check(source, special, request, text):
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return False
    extra = {k: x for k, x in request.items() if k not in ("messages", "tools", "add_generation_prompt")}
    rendered, _ = render_jinja_template([request["messages"]], tools=request.get("tools"), chat_template=source,
                                        add_generation_prompt=request.get("add_generation_prompt", False),
                                        **special, **extra)
    assert rendered[0] == text, f"transformers disagrees:\n{rendered[0]!r}\n{text!r}"
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shared", default=os.path.join(HERE, "..", "..", "shared"))
    args = p.parse_args()
    env = make_env()
    os.makedirs(OUT, exist_ok=True)
    for name, special in TEMPLATES.items():
        src_path = os.path.join(args.shared, "templates", name + ".jinja")
        shutil.copyfile(src_path, os.path.join(OUT, name + ".jinja"))
        with open(src_path, encoding="utf-8") as f:
            source = f.read()
        template = env.from_string(source)
        checked = 0
        lines = []
        for case, request in common_cases() + SPECIFIC[name]():
            variables = variables_for(special, request)
            row = {"name": case, "variables": variables}
            try:
                row["text"] = template.render(**variables)
                checked += cross_check(source, special, request, row["text"])
            except jinja2.exceptions.UndefinedError as e:
                row["error"] = str(e)
                row["error_kind"] = "undefined"
            except jinja2.exceptions.TemplateError as e:
                row["error"] = str(e)
                row["error_kind"] = "raise_exception"
            lines.append(json.dumps(row, ensure_ascii=False))
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {len(lines)} cases ({checked} cross-checked with transformers), jinja2 {jinja2.__version__}")
    lines = []
    for source, variables in SNIPPETS:
        row = {"template": source, "variables": variables}
        try:
            row["text"] = env.from_string(source).render(**variables)
        except jinja2.exceptions.UndefinedError as e:
            row["error"] = str(e)
            row["error_kind"] = "undefined"
        except jinja2.exceptions.TemplateError as e:
            row["error"] = str(e)
            row["error_kind"] = "raise_exception"
        except TypeError as e:
            row["error"] = str(e)
            row["error_kind"] = "type"
        lines.append(json.dumps(row, ensure_ascii=False))
    with open(os.path.join(OUT, "snippets.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"snippets: {len(lines)} cases")


if __name__ == "__main__":
    main()
