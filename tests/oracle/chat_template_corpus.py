#!/usr/bin/env python3
"""Renders every chat template of the pinned llama.cpp tree with jinja2 over fixed conversations.

The oracle of the C++ Jinja engine (common/text/jinja.h, tests/text_jinja_test.cc): the 70
templates of vendor/llama.cpp/models/templates/*.jinja in the llama-cpp-python 0.3.36 sdist (the
pin of tests/oracle/requirements.txt) are rendered the way Hugging Face transformers renders a
chat template (transformers.utils.chat_template_utils._compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a `{% generation %}` tag that renders its body, a `tojson` filter that is
json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys), and
the globals raise_exception (raises TemplateError with the message) and strftime_now. strftime_now
formats a fixed date (STRFTIME_NOW_DATE) instead of the clock so that the fixture is reproducible;
the C++ side is given the same date.

PROBES, small templates that pin one rule each, are rendered the same way with PROBE_CONTEXT and
recorded beside the templates.

Each (template, conversation, add_generation_prompt) case names its conversation and records
add_generation_prompt, and either the rendered string or the exception (its type and message);
the context passed to the template is that conversation's messages (and tools, where it has
them), add_generation_prompt, and the fixture's bos_token and eos_token. A template that
does not compile records one compile error for the template.

Regenerate (system python3 has jinja2 3.1.6; the sdist is fetched by pip, hash-checked):
    python3 tests/oracle/chat_template_corpus.py
or with an already downloaded copy of the sdist (its sha256 is checked against the pin):
    python3 tests/oracle/chat_template_corpus.py --sdist PATH/llama_cpp_python-0.3.36.tar.gz
It writes tests/fixtures/chat_templates/corpus.json.
"""
import argparse
import datetime
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "tests/oracle/requirements.txt"
OUTPUT = ROOT / "tests/fixtures/chat_templates/corpus.json"
TEMPLATE_DIR = "vendor/llama.cpp/models/templates/"
STRFTIME_NOW_DATE = "2026-01-15"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city (°C).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time.",
        "parameters": {"type": "object", "properties": {}},
    },
}
TOOL_CALL = {
    "id": "call_0001",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
}

CONVERSATIONS = {
    "system_user": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello! How are you?"},
        ],
    },
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "2 + 2 = 4."},
            {"role": "user", "content": "And times 3, café?"},
        ],
    },
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one."},
        ],
    },
    "tools": {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What is the weather in Zürich?"},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    },
    "tool_calls": {
        "messages": [
            {"role": "user", "content": "What is the weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_0001", "name": "get_weather",
             "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"},
            {"role": "assistant", "content": "It is 21 °C and sunny in Zürich."},
            {"role": "user", "content": "Thanks!"},
        ],
        "tools": [WEATHER_TOOL],
    },
    # OpenAI's shape: tool-call arguments as a JSON string, content None beside tool calls, two
    # calls in one turn, and two tool results in a row.
    "tool_calls_json_arguments": {
        "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18 °C, cloudy"},
            {"role": "tool", "tool_call_id": "call_b", "content": "14:05"},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    },
    # Content as a list of typed parts, as multimodal APIs send text.
    "content_parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                         {"type": "text", "text": "a red square."}]},
        ],
    },
    # White space and characters that strip/trim and escaping treat specially.
    "awkward_text": {
        "messages": [
            {"role": "system", "content": "  Be terse.\n\n"},
            {"role": "user", "content": "\tQuote \"this\" & <that>\u3000\n"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nOK: 'done'  "},
            {"role": "user", "content": "Again \U0001F600"},
        ],
    },
}


# Small templates that pin one rule each, rendered with PROBE_CONTEXT: the corners of jinja2's and
# Python's semantics that real templates may reach and the conversations above do not.
PROBE_CONTEXT = {
    "messages": [{"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": None, "tool_calls": []}],
    "n": 3, "x": 2.5, "big": 10**16, "s": "  Héllo wörld \u2028", "empty": "", "items": [3, 1, 2],
    "d": {"b": 1, "a": {"c": [1, 2]}}, "t": True, "nothing": None,
}
PROBES = [
    # Scoping: a set in a loop body is local to the loop, seen by later iterations.
    "{% for i in [1, 2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% set y = 0 %}{% for i in [1, 2] %}{{ y }}{% set y = i %}{% endfor %}{{ y }}",
    "{% macro m() %}{% set z = 1 %}{{ z }}{% endmacro %}{{ m() }}[{{ z }}]",
    "{% set ns = namespace(a=[]) %}{% for i in items %}{% set ns.a = ns.a + [i] %}{% endfor %}{{ ns.a }}",
    "{% macro f(k) %}{% if k > 0 %}{{ k }}{{ f(k - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
    "{% for i in items %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.revindex }};{% endfor %}",
    "{% for i in items %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}{% for k, v in d.items() %}{{ v }}{% endfor %}",
    # Values as str() and repr() show them.
    "{{ x }} {{ big }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 10 / 5 }} {{ 2 ** -1 }} {{ -0.0 }}",
    "{{ [s] }} {{ {'k': nothing} }} {{ [t, 1.0, \"it's\", 'a\\\\b'] }} {{ ('a', 1) | list }}",
    "{{ n * 'ab' }} {{ items * 2 }} {{ n - x }} {{ n // 2 }} {{ -n % 2 }} {{ x // 1 }} {{ 7.5 % 2 }}",
    "{{ items[::-1] }} {{ items[5:] }} {{ items[-2:] }} {{ s[1:4] }} {{ 'abcdef'[::2] }}",
    "{{ d.a.c[1] }} {{ d['a']['c'] | length }} {{ d.b.c }}|{{ messages[0].role }}",
    "{{ nothing }} {{ nothing is none }} {{ nothing | string }} {{ nothing | default('x') }}",
    "{{ n > 2 and 'yes' or 'no' }} {{ not t }} {{ 1 if nothing else 2 }} {{ 'a' ~ 1 ~ 2.0 }}",
    "{{ 'H' in s }} {{ 'z' not in d }} {{ 1 in items }} {{ [1] in [[1]] }}",
    # Strings.
    "{% set u = 'àéîõü ÿ ÀÉÎÕÜ Āā Ĺĺ Łł Ÿ Źź ſ ı İ ΑΒΓ αβγ άέΏ ς ЀЁАБВ абв ѐё ß ŉ x2y' %}"
    "{{ u.upper() }}|{{ u.lower() }}|{{ u.title() }}|{{ u | capitalize }}|{{ u | title }}|"
    "{{ u | upper }}|{{ u | lower }}",
    "{{ 'hello world2abc (x) [y] <z> {w}' | title }}|{{ 'hello world2abc'.title() }}",
    "[{{ s.strip() }}] [{{ s | trim }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] {{ s.split() }}",
    "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ 'mIXed' | capitalize }} {{ 'a-b c' | title }}",
    "{{ 'a,b'.split(',', 1) }} {{ 'a b  c'.split(' ') }} {{ 'x'.join(['1', '2']) }}",
    "{{ '{} is {}'.format('a', 2) }} {{ '{0}-{1}-{0}'.format('p', 'q') }} {{ '{{x}}'.format() }}",
    "{{ 'line1\nline2\r\nline3' | indent(2) }}|{{ 'a\n\nb' | indent(2, blank=true) }}",
    "{{ 'abcabc' | replace('b', 'B', 1) }} {{ 'aaa'.count('a') }} {{ 'hello'.find('l') }}",
    "{{ s | length }} {{ s | wordcount }} {{ 'é' | upper }} {{ s | list | length }}",
    "{{ \"<tag> & 'q'\" | e }} {{ ('<b>' | safe) + '&' }}",
    # Filters.
    "{{ items | sort }} {{ items | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ items | max }}",
    "{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') | map(attribute='n') | list }}",
    "{{ d | dictsort(reverse=true) }} {{ {'B': 1, 'a': 2} | dictsort(true) }}",
    "{{ items | join }} {{ items | join(', ') }} {{ [{'a': 1}, {'a': 2}] | join('/', attribute='a') }}",
    "{{ items | first }} {{ items | last }} {{ [] | first }} {{ 'xyz' | first }} {{ items | sum }}",
    "{{ ['a', 'A', 'b'] | unique | list }} {{ [1, 2, 1] | unique | list }} {{ items | reverse | list }}",
    "{{ [1, 0, none, 'x'] | select | list }} {{ [1, 2, 3] | reject('odd') | list }}",
    "{{ messages | selectattr('content') | list | length }} {{ messages | map(attribute='role') | join(',') }}",
    "{{ messages | selectattr('tool_calls', 'defined') | list | length }} {{ messages | rejectattr('content', 'none') | list | length }}",
    "{{ '3' | int }} {{ '3.7' | int }} {{ 3.7 | int }} {{ 'x' | int(5) }} {{ '2.5' | float }} {{ -2 | abs }}",
    "{{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }}",
    "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ [] | tojson }} {{ 'é\u2028' | tojson }}",
    "{{ {'a': 1.0, 'b': -0.5, 'c': 1e-7} | tojson }} {{ nothing | tojson }} {{ t | tojson }}",
    "{{ d | items | list }} {{ d.keys() | list }} {{ d.get('zz', 'dflt') }} {{ d.get('b') }}",
    "{{ 'abc' | list }} {{ d | list }} {{ d | length }} {{ '' | default('e', true) }}",
    # Tests.
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 3 }} {{ x is number }} {{ t is number }}",
    "{{ items is sequence }} {{ d is sequence }} {{ s is iterable }} {{ n is iterable }} {{ d is mapping }}",
    "{{ t is true }} {{ 1 is true }} {{ nothing is false }} {{ n is integer }} {{ t is integer }}",
    "{{ 'a' is lower }} {{ 'A' is upper }} {{ n is gt 2 }} {{ n is lt 2 }} {{ n is ne 3 }}",
    # White space control.
    "a\n{% if t %}\n  b\n{% endif %}\nc\n",
    "a\n  {%- if t -%}\n  b\n  {%- endif %}\n  c",
    "{% for i in items -%}\n  {{ i }}\n{%- endfor %}",
    "x {#- comment -#} y\n  {# own line #}\nz",
    "{%- set a = 1 -%}\n\n{{ a }}\n\n{%- set b = 2 %}\n{{ b }}",
    "  {{- 'left' }}\n  {{ 'keep' -}}\n\n   end",
    "{% raw %}  {{ x }}\n{% endraw %}\n{{ 'after' }}",
    "{% if t %}A{% elif n %}B{% else %}C{% endif %}{% if not t %}A{% elif n == 3 %}B{% endif %}",
    # Literals, undefined values and conversions templates lean on.
    "{{ '\\x41\\u00e9\\t|' }}{{ \"a\\\\b\" }}{{ 'it\\'s' }}",
    "{{ 5 // 2.0 }} {{ 2 ** 0.5 }} {{ 0.1 * 3 }} {{ 1e300 * 1e10 }} {{ 'a' < 'B' }} {{ 3 * 0.5 }}",
    "{{ none == none }} {{ undefined_var == none }} {{ undefined_var | length }} "
    "{{ undefined_var | list }}{% for q in undefined_var %}x{% endfor %}{% if undefined_var %}y{% endif %}",
    "[{{ 'abc'[10] }}][{{ items[10] }}][{{ d['missing'] }}][{{ 3 if false }}][{{ 'a' * 0 }}]",
    "{{ true and none }} {{ '' or [] }} {{ 0 or 0.0 }} {{ [] | join(',') }} {{ 10 | string + 'x' }}",
    "{% set a = [1, 2] %}{% set b = a + [3] %}{{ a }}{{ b }} {{ dict(a=1, b=[2]) | tojson }} "
    "{{ namespace(a=1).a }}",
    "{% set v = undefined_var | default('dflt') %}{{ v }} {{ '  x  ' | trim('x ') }}|"
    "{{ 'Hello' | replace('l', '') }}",
    "{% for m in messages if m.role == 'assistant' %}{{ loop.index }}/{{ loop.length }}"
    "{{ loop.last }}{% else %}none{% endfor %}"
    "{% for m in messages if m.role == 'system' %}x{% else %}none{% endfor %}",
    "{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }} {{ ns is mapping }}",
    "{{ messages | length }} {{ messages[-1]['role'] }} {{ messages[0].content.strip() }} "
    "{{ messages[1].content is none }} {{ messages[1].tool_calls | length }}",
    "{%- macro show(m) -%}\n  <{{ m.role }}>\n{%- endmacro -%}\n{% for m in messages %}"
    "{{ show(m) }}\n{% endfor %}",
    "{{ [{'type': 'text', 'text': 'a'}, {'type': 'image'}, {'type': 'text', 'text': 'b'}] | "
    "selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') }}",
    "{{ range(3) | list }} {{ range(3) | length }} {{ range(5, 0, -2) | list }}",
    "{{ d | tojson(indent=4) }}|{{ [1, [2, []], {}] | tojson(indent='\\t') }}",
    "{{ 'a' ~ none ~ true ~ 1.50 ~ [1] }} {{ 1 == '1' }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }}",
    "{% if not (t is defined and n > 5) %}ok{% endif %}{% if n is defined and not x is none %}!{% endif %}",
    # printf-style formatting: the % operator and the format filter.
    "{{ '%s|%5s|%-5s|%.2s' % ('abc', 'ab', 'ab', 'xyz') }}",
    "{{ '%d %i %05d %+d %x %o %%' % (42, 7.9, 3, 5, 255, 8) }}",
    "{{ '%.2f %f %e %g %.3g %10.1f' % (3.14159, 1.5, 12345.678, 0.0001, 2.5, -2.25) }}",
    "{{ '%s' % none }} {{ '%s' % [1, 'a'] }} {{ '%r' % 'x' }} {{ '%s and %s' | format('a', 2) }}",
    "{{ '%s' % (1,) }} {{ 'x%sy' % 'z' }} {{ '%5s|' % 'é' }}",
    "{{ '%d' % 'x' }}",
    "{{ '%s %s' % ('a',) }}",
    "{{ '%s' % ('a', 'b') }}",
    # Errors.
    "{{ raise_exception('custom failure') }}",
    "{{ undefined_var.attr is defined }}",
    "{{ d['missing']['x'] }}",
    "{{ undefined_name.attr }}",
    "{{ items + 'x' }}",
    "{{ d.b.strip() }}",
    "{% for a, b in items %}{% endfor %}",
    "{{ n | length }}",
    "{{ items.append(4) }}",
    "{{ 1 / 0 }}",
]


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: `{% generation %}` renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
            lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.strptime(STRFTIME_NOW_DATE, "%Y-%m-%d").strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def pinned_requirement():
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("llama_cpp_python=="):
            match = re.search(r"--hash=sha256:([0-9a-f]{64})", line)
            return line, match.group(1)
    sys.exit(f"no llama_cpp_python line in {REQUIREMENTS}")


def sdist_path(given, workdir):
    line, sha256 = pinned_requirement()
    if given is None:
        requirement = Path(workdir) / "requirement.txt"
        requirement.write_text(line + "\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--no-binary=:all:", "--require-hashes", "-d", workdir, "-r",
                        str(requirement)], check=True)
        given = next(Path(workdir).glob("llama_cpp_python-*.tar.gz"))
    digest = hashlib.sha256(Path(given).read_bytes()).hexdigest()
    if digest != sha256:
        sys.exit(f"{given}: sha256 {digest}, the pin says {sha256}")
    return Path(given)


def read_templates(sdist):
    templates = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if (member.isfile() and len(parts) == 2 and parts[1].startswith(TEMPLATE_DIR)
                    and parts[1].endswith(".jinja") and "/" not in parts[1][len(TEMPLATE_DIR):]):
                templates[parts[1][len(TEMPLATE_DIR):]] = tar.extractfile(member).read()
    return dict(sorted(templates.items()))


def render_cases(env, source):
    try:
        template = env.from_string(source)
    except Exception as error:  # a compile error refuses the whole template
        return {"compile_error": f"{type(error).__name__}: {error}"}
    cases = []
    for name, conversation in CONVERSATIONS.items():
        for add_generation_prompt in (False, True):
            context = {"messages": conversation["messages"],
                       "add_generation_prompt": add_generation_prompt,
                       "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}
            if "tools" in conversation:
                context["tools"] = conversation["tools"]
            case = {"conversation": name, "add_generation_prompt": add_generation_prompt}
            try:
                case["output"] = template.render(**context)
            except Exception as error:
                case["error_type"] = type(error).__name__
                case["error"] = str(error)
            cases.append(case)
    return {"cases": cases}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sdist", help="an already downloaded llama_cpp_python-0.3.36.tar.gz")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        sdist = sdist_path(args.sdist, workdir)
        templates = read_templates(sdist)
    env = make_environment()
    entries = []
    for file_name, raw in templates.items():
        source = raw.decode("utf-8")
        entry = {"file": file_name, "sha256": hashlib.sha256(raw).hexdigest(), "source": source}
        entry.update(render_cases(env, source))
        entries.append(entry)
    probes = []
    for source in PROBES:
        probe = {"source": source}
        try:
            probe["output"] = env.from_string(source).render(**PROBE_CONTEXT)
        except Exception as error:
            probe["error_type"] = type(error).__name__
            probe["error"] = str(error)
        probes.append(probe)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "generator": "tests/oracle/chat_template_corpus.py",
        "templates_from": f"llama-cpp-python 0.3.36 sdist, {TEMPLATE_DIR}",
        "jinja2": version("jinja2"),
        "strftime_now_date": STRFTIME_NOW_DATE,
        "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
        "conversations": CONVERSATIONS,
        "templates": entries,
        "probe_context": PROBE_CONTEXT,
        "probes": probes,
    }, indent=1, ensure_ascii=False) + "\n")
    rendered = sum(1 for e in entries for c in e.get("cases", []) if "output" in c)
    failed = sum(1 for e in entries for c in e.get("cases", []) if "error" in c)
    refused = sum(1 for e in entries if "compile_error" in e)
    print(f"{len(entries)} templates ({refused} do not compile), {rendered} cases rendered, "
          f"{failed} raised; {len(probes)} probes -> {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
