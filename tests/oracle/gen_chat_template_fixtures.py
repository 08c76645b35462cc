#!/usr/bin/env python3
"""Renders chat templates with jinja2 (as Hugging Face does) for the project's chats.

Two templates: Gemma 4's (models/templates/google-gemma-4-31B-it.jinja of the pinned llama.cpp
tree, llama-cpp-python 0.3.36's vendor/llama.cpp) and the gemma family's default that bitsplit
compiles in for GGUFs without a template (common/text/templates/gemma.jinja, Gemma 3's published
template). Each renders every conversation of tests/oracle/tokenizer_strings.json and a few that
exercise its rules (a system turn, model turns in a row, thinking in a model turn, padding
whitespace); a conversation the template refuses (raise_exception) is recorded with jinja2's
message instead of a prompt (raise_exception as transformers defines it). bos_token is "<bos>".
tests/text_chat_template_test.cc renders the same chats with text::ChatTemplate and compares.

Rerun (any Python with jinja2; the tree is the unpacked pinned sdist):
    python3 tests/oracle/gen_chat_template_fixtures.py LLAMA_CPP_PYTHON_SDIST/vendor/llama.cpp
"""
import json
import sys
from importlib.metadata import version
from pathlib import Path

import jinja2
import jinja2.sandbox

ROOT = Path(__file__).resolve().parents[2]
BOS = "<bos>"
EXTRA = [
    {"messages": [{"role": "system", "content": "  Be brief. \n"},
                  {"role": "user", "content": "\tHi there  "},
                  {"role": "assistant", "content": " Hello!\n"},
                  {"role": "user", "content": "Bye"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Count."},
                  {"role": "assistant", "content": "One."},
                  {"role": "assistant", "content": "Two."}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Think."},
                  {"role": "assistant",
                   "content": "<|channel>thought\nhmm<channel|>The answer<|channel>x<channel|> is 4."}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "a"},
                  {"role": "system", "content": "Later rule."},
                  {"role": "user", "content": "b"}],
     "add_generation_prompt": True},
    # Python's str.strip (jinja's trim) removes Unicode white space too.
    {"messages": [{"role": "user", "content": "\u3000\u00a0wide\u2009\n\u2028"}],
     "add_generation_prompt": True},
]


def render_cases(source, conversations):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):  # as transformers defines it
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    cases = []
    for c in conversations:
        case = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"]}
        try:
            case["prompt"] = template.render(messages=c["messages"],
                                             add_generation_prompt=c["add_generation_prompt"],
                                             bos_token=BOS)
        except jinja2.exceptions.TemplateError as error:
            case["error"] = str(error)
        cases.append(case)
    return cases


def main() -> int:
    tree = Path(sys.argv[1])
    conversations = json.loads((ROOT / "tests/oracle/tokenizer_strings.json")
                               .read_text())["conversations"] + EXTRA
    templates = {
        "gemma4": ("models/templates/google-gemma-4-31B-it.jinja",
                   "llama-cpp-python 0.3.36 (vendor/llama.cpp)", tree),
        "gemma_default": ("common/text/templates/gemma.jinja", "bitsplit", ROOT),
    }
    for name, (relative, origin, base) in templates.items():
        source = (base / relative).read_text()
        cases = render_cases(source, conversations)
        out = ROOT / f"tests/fixtures/chat/{name}_template.json"
        out.write_text(json.dumps({
            "template": relative, "source": origin, "jinja2": version("jinja2"),
            "bos_token": BOS, "chat_template": source, "cases": cases},
            indent=1, ensure_ascii=False) + "\n")
        errors = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} chats ({errors} refused) -> {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
