#!/usr/bin/env python3
"""Renders real chat templates with jinja2 (as Hugging Face does) for the project's chats.

Gemma 4's template (models/templates/google-gemma-4-31B-it.jinja of the pinned llama.cpp tree,
llama-cpp-python 0.3.36's vendor/llama.cpp) renders every conversation of
tests/oracle/tokenizer_strings.json that has a message and a few that exercise its rules (a system turn, model turns
in a row, thinking in a model turn, padding whitespace). bos_token is empty: bitsplit's tokenizer
adds BOS itself. tests/text_chat_template_test.cc renders the same chats with
text::ChatTemplate and compares.

Rerun (the oracle environment has jinja2; the tree is the unpacked pinned sdist):
    $(scripts/oracle-env.sh) tests/oracle/gen_chat_template_fixtures.py \\
        LLAMA_CPP_PYTHON_SDIST/vendor/llama.cpp
"""
import json
import sys
from importlib.metadata import version
from pathlib import Path

import jinja2
import jinja2.sandbox

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = {"gemma4": "models/templates/google-gemma-4-31B-it.jinja"}
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


def main() -> int:
    tree = Path(sys.argv[1])
    # The template reads messages[0]: an empty conversation is an error there, so none is kept.
    conversations = [c for c in json.loads((ROOT / "tests/oracle/tokenizer_strings.json")
                                           .read_text())["conversations"] if c["messages"]] + EXTRA
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for name, relative in TEMPLATES.items():
        source = (tree / relative).read_text()
        template = env.from_string(source)
        cases = [{"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                  "prompt": template.render(messages=c["messages"],
                                            add_generation_prompt=c["add_generation_prompt"],
                                            bos_token="")}
                 for c in conversations]
        out = ROOT / f"tests/fixtures/chat/{name}_template.json"
        out.write_text(json.dumps({
            "template": relative, "source": "llama-cpp-python 0.3.36 (vendor/llama.cpp)",
            "jinja2": version("jinja2"), "bos_token": "", "chat_template": source,
            "cases": cases}, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(cases)} chats -> {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
