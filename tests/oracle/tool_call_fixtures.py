#!/usr/bin/env python3
"""Model outputs with tool calls, rendered by the real chat templates, for text::ParseToolCalls.

A model writes a tool call in the syntax its chat template writes tool calls into the history,
so the oracle renders an assistant message that has `tool_calls` with each template and cuts the
assistant's part out of the rendering: that text is what the model generates, and the message's
tool calls (and the content the template kept) are what parsing it must give back. The templates
are vendor/llama.cpp/models/templates/*.jinja of the llama-cpp-python 0.3.36 sdist, located and
hash-checked as tests/oracle/chat_template_corpus.py does (its helpers are reused), rendered with
its jinja2 environment (transformers' settings).

The cut: render [user] and [user, assistant]; the second starts with the first; of the rest,
drop the template's assistant header and everything from its end-of-turn marker on (both listed
per template family below and checked to be there). Reasoning is not this parser's business: an
empty <think></think> block that a template writes before the answer is dropped from the output.

gpt-oss's harmony template is cut the same way, with its own rules (HARMONY_CASES): the
assistant turn starts after the generation prompt <|start|>assistant and ends before <|return|>
or <|call|>; what the template writes into the analysis channel (`thinking`, or the content
beside a call) is the expected reasoning.

Each fixture records the template, the format the parser is given, the model output, and the
expected reasoning (harmony only), content and calls; the tools the parser is given (Qwen3-Coder types parameter values by
their schemas) are the file's "tools" unless the fixture has its own. An expected id is recorded
only where the output carries the id (Mistral); elsewhere the parser generates one. Expected
arguments are JSON objects, compared as values.

Regenerate (system python3 has jinja2 3.1.6; the sdist is fetched by pip, hash-checked):
    python3 tests/oracle/tool_call_fixtures.py
or with an already downloaded copy of the sdist (its sha256 is checked against the pin):
    python3 tests/oracle/tool_call_fixtures.py --sdist PATH/llama_cpp_python-0.3.36.tar.gz
It writes tests/fixtures/tool_calls/rendered.json; tests/fixtures/tool_calls/edge_cases.json is
written by hand.
"""
import argparse
import hashlib
import json
import re
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chat_template_corpus as corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests/fixtures/tool_calls/rendered.json"

CHATML = ("<|im_start|>assistant\n", "<|im_end|>")
LLAMA3 = ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")
GRANITE = ("<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>")
MISTRAL = ("", corpus.EOS_TOKEN)

# template file -> (format, assistant header, end-of-turn marker)
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3_json",) + LLAMA3,
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3_json",) + LLAMA3,
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("llama3_json",) + LLAMA3,
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("hermes",) + CHATML,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes",) + CHATML,
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes",) + CHATML,
    "Qwen-Qwen3-0.6B.jinja": ("hermes",) + CHATML,
    "Qwen-QwQ-32B.jinja": ("hermes",) + CHATML,
    "MiMo-VL.jinja": ("hermes",) + CHATML,
    "Bielik-11B-v3.0-Instruct.jinja": ("hermes",) + CHATML,
    "ibm-granite-granite-4.0.jinja": ("hermes",) + GRANITE,
    "ibm-granite-granite-4.1.jinja": ("hermes",) + GRANITE,
    "Reka-Edge.jinja": ("hermes", "assistant: ", "<sep>"),
    "Qwen3-Coder.jinja": ("qwen3_coder_xml",) + CHATML,
    "Qwen3.5-4B.jinja": ("qwen3_coder_xml",) + CHATML,
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("qwen3_coder_xml",) + CHATML,
    "StepFun3.5-Flash.jinja": ("qwen3_coder_xml",) + CHATML,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral_json_array",) + MISTRAL,
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral_name_args",) + MISTRAL,
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral_name_args",) + MISTRAL,
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("mistral_name_args",) + MISTRAL,
    # The tool results follow in the same model turn; with none yet the template ends the call
    # with <|tool_response>, the token the model stops at.
    "google-gemma-4-31B-it.jinja": ("gemma4", "<|turn>model\n", "<|tool_response>"),
    "google-gemma-4-31B-it-interleaved.jinja": ("gemma4", "<|turn>model\n", "<turn|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "note": {"type": "string"},
                "days": {"type": "integer"},
                "threshold": {"type": "number"},
                "metric": {"type": "boolean"},
                "station": {"type": ["integer", "null"]},
                "options": {"type": "object"},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Get the current time.",
                 "parameters": {"type": "object", "properties": {}}},
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Search the web.",
                 "parameters": {"type": "object",
                                "properties": {"query": {"type": "string"},
                                               "limit": {"type": "integer"}}}},
}
TOOLS = [WEATHER_TOOL, TIME_TOOL, SEARCH_TOOL]
# The tools only shape the system prompt, never the assistant's turn that is cut out; rendered
# with the corpus's plain ones, since the Hermes templates' schema printer recurses without end
# on the list-valued "type" above.
RENDER_TOOLS = [corpus.WEATHER_TOOL, corpus.TIME_TOOL]

RICH_ARGUMENTS = {
    "city": "Zürich", "note": "say \"hi\" \\ then\nleave\t😀 <b> {x: [1]}", "days": 3,
    "threshold": -2.5, "metric": True, "station": None,
    "options": {"nested": {"deep": [1, 2.25, {"k": "v"}]}, "empty": {}, "list": []},
    "fields": ["temp", "wind"]}
# Mistral's templates refuse ids other than 9 alphanumerics; the others ignore ids.
RICH_CALL = {"id": "a1B2c3D4e", "type": "function",
             "function": {"name": "get_weather", "arguments": RICH_ARGUMENTS}}
EMPTY_ARGS_CALL = {"id": "f5G6h7I8j", "type": "function",
                   "function": {"name": "get_time", "arguments": {}}}
SEARCH_CALL = {"id": "k9L0m1N2o", "type": "function",
               "function": {"name": "search", "arguments": {"query": "tool calls, ‘quoted’",
                                                            "limit": 10}}}

CASES = [
    ("one_call", "", [RICH_CALL]),
    ("empty_arguments", "", [EMPTY_ARGS_CALL]),
    ("two_calls", "", [SEARCH_CALL, EMPTY_ARGS_CALL]),
    ("text_then_call", "Let me check that for you.", [SEARCH_CALL]),
    ("text_then_two_calls", "Checking both.", [RICH_CALL, SEARCH_CALL]),
]

HARMONY_TEMPLATE = "openai-gpt-oss-120b.jinja"
# (case, assistant message, expected reasoning, expected content, expected calls): the template
# renders one call per message and the content beside a call into the analysis channel.
HARMONY_CASES = [
    ("reasoning_then_answer",
     {"role": "assistant", "thinking": "The user asks about weather.\nNo tool needed; say so.",
      "content": "I can't see live weather, but Zürich is mild in May. 😀"},
     "The user asks about weather.\nNo tool needed; say so.",
     "I can't see live weather, but Zürich is mild in May. 😀", []),
    ("answer_only", {"role": "assistant", "content": "Sunny, 21 °C.\n\n- wind: low"}, "",
     "Sunny, 21 °C.\n\n- wind: low", []),
    ("reasoning_then_call",
     {"role": "assistant", "content": "", "thinking": "Need the weather tool.",
      "tool_calls": [RICH_CALL]},
     "Need the weather tool.", "", [RICH_CALL]),
    ("call_only", {"role": "assistant", "content": "", "tool_calls": [SEARCH_CALL]}, "", "",
     [SEARCH_CALL]),
    ("empty_arguments", {"role": "assistant", "content": "", "tool_calls": [EMPTY_ARGS_CALL]}, "",
     "", [EMPTY_ARGS_CALL]),
    ("text_beside_call",
     {"role": "assistant", "content": "Let me check that for you.", "tool_calls": [SEARCH_CALL]},
     "Let me check that for you.", "", [SEARCH_CALL]),
]


def harmony_fixtures(template, raw):
    fixtures = []
    user = [{"role": "user", "content": "Weather in Zürich, and the time?"}]
    context = {"tools": RENDER_TOOLS, "bos_token": corpus.BOS_TOKEN,
               "eos_token": corpus.EOS_TOKEN}
    before = template.render(messages=user, add_generation_prompt=True, **context)
    if not before.endswith("<|start|>assistant"):
        sys.exit(f"{HARMONY_TEMPLATE}: the generation prompt is not <|start|>assistant")
    for case_name, message, reasoning, content, calls in HARMONY_CASES:
        full = template.render(messages=user + [message], add_generation_prompt=False, **context)
        if not full.startswith(before):
            sys.exit(f"{HARMONY_TEMPLATE} {case_name}: the assistant turn does not extend the "
                     "generation prompt")
        turn = full[len(before):]
        end = "<|call|>" if calls else "<|return|>"
        if not turn.endswith(end):
            sys.exit(f"{HARMONY_TEMPLATE} {case_name}: the turn {turn!r} does not end with {end}")
        fixtures.append({
            "name": f"{HARMONY_TEMPLATE.removesuffix('.jinja')}/{case_name}",
            "template": HARMONY_TEMPLATE,
            "template_sha256": hashlib.sha256(raw).hexdigest(),
            "format": "harmony",
            "output": turn[:-len(end)],
            "reasoning": reasoning,
            "content": content,
            "tool_calls": [{"name": call["function"]["name"],
                            "arguments": call["function"]["arguments"]} for call in calls],
        })
    return fixtures


EMPTY_THINK = re.compile(r"^<think>\s*</think>\s*")


def render(template, messages):
    return template.render(messages=messages, tools=RENDER_TOOLS, add_generation_prompt=False,
                           bos_token=corpus.BOS_TOKEN, eos_token=corpus.EOS_TOKEN)


def model_output(template, file_name, header, end, content, calls):
    user = [{"role": "user", "content": "Weather in Zürich, and the time?"}]
    assistant = {"role": "assistant", "content": content, "tool_calls": calls}
    before = render(template, user)
    full = render(template, user + [assistant])
    if not full.startswith(before):
        sys.exit(f"{file_name}: the rendering with the assistant turn does not extend the one "
                 "without")
    turn = full[len(before):]
    if not turn.startswith(header):
        sys.exit(f"{file_name}: the assistant turn {turn[:60]!r} does not start with {header!r}")
    cut = turn.rfind(end)
    if cut < 0:
        sys.exit(f"{file_name}: no end-of-turn marker {end!r} in {turn!r}")
    return EMPTY_THINK.sub("", turn[len(header):cut])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sdist", help="an already downloaded llama_cpp_python-0.3.36.tar.gz")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        sdist = corpus.sdist_path(args.sdist, workdir)
        templates = corpus.read_templates(sdist)
    env = corpus.make_environment()
    fixtures = []
    skipped = []
    for file_name, (format_name, header, end) in TEMPLATES.items():
        raw = templates[file_name]
        template = env.from_string(raw.decode("utf-8"))
        for case_name, content, calls in CASES:
            try:
                output = model_output(template, file_name, header, end, content, calls)
            except Exception as error:  # the template refuses this message (one call at most)
                skipped.append(f"{file_name} {case_name}: {type(error).__name__}: {error}")
                continue
            expected_calls = []
            for call in calls:
                expected = {"name": call["function"]["name"],
                            "arguments": call["function"]["arguments"]}
                if call["id"] in output:
                    expected["id"] = call["id"]
                expected_calls.append(expected)
            fixtures.append({
                "name": f"{file_name.removesuffix('.jinja')}/{case_name}",
                "template": file_name,
                "template_sha256": hashlib.sha256(raw).hexdigest(),
                "format": format_name,
                "output": output,
                # Some templates drop an assistant's text beside tool calls.
                "content": content if content and content in output else "",
                "tool_calls": expected_calls,
            })
    # Llama 3.1's built-in tools: <|python_tag|>name.call(key="value"), ended by <|eom_id|>.
    for file_name in ("meta-llama-Llama-3.1-8B-Instruct.jinja",
                      "meta-llama-Llama-3.3-70B-Instruct.jinja"):
        raw = templates[file_name]
        template = env.from_string(raw.decode("utf-8"))
        call = {"id": "x", "type": "function",
                "function": {"name": "brave_search",
                             "arguments": {"query": "weather in Zürich, today"}}}
        messages = [{"role": "user", "content": "Search it."}]
        context = {"tools": RENDER_TOOLS, "builtin_tools": ["brave_search", "wolfram_alpha"],
                   "add_generation_prompt": False, "bos_token": corpus.BOS_TOKEN,
                   "eos_token": corpus.EOS_TOKEN}
        before = template.render(messages=messages, **context)
        full = template.render(
            messages=messages + [{"role": "assistant", "content": "", "tool_calls": [call]}],
            **context)
        turn = full[len(before):]
        header, end = LLAMA3[0], "<|eom_id|>"
        if not full.startswith(before) or not turn.startswith(header) or end not in turn:
            sys.exit(f"{file_name}: unexpected built-in tool rendering {turn!r}")
        fixtures.append({
            "name": f"{file_name.removesuffix('.jinja')}/builtin_tool",
            "template": file_name,
            "template_sha256": hashlib.sha256(raw).hexdigest(),
            "format": "llama3_json",
            "tools": None,
            "output": turn[len(header):turn.rfind(end)],
            "content": "",
            "tool_calls": [{"name": "brave_search", "arguments": call["function"]["arguments"]}],
        })
    raw = templates[HARMONY_TEMPLATE]
    fixtures += harmony_fixtures(env.from_string(raw.decode("utf-8")), raw)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "generator": "tests/oracle/tool_call_fixtures.py",
        "templates_from": f"llama-cpp-python 0.3.36 sdist, {corpus.TEMPLATE_DIR}",
        "jinja2": version("jinja2"),
        "skipped": skipped,
        "tools": TOOLS,
        "fixtures": fixtures,
    }, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(fixtures)} fixtures from {len(TEMPLATES) + 1} templates ({len(skipped)} cases the "
          f"templates refuse) -> {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
