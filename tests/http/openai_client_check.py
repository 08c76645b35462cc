#!/usr/bin/env python3
"""The coordinator's HTTP API through the official `openai` client, and its /metrics through
prometheus_client's text-format parser (tests/http/requirements.txt, scripts/test-venv.sh).

Run by tests/e2e_http_test.cc against a running stack; exits non-zero with the failed check's
message. Every check is against the API's contract or a second request, not a recorded answer:
streaming equals non-streaming for the same greedy request, a stop string cuts the text at its
first occurrence, one seed gives one text, logprobs describe the tokens, errors come as the
client's typed exceptions, and the metrics move by exactly what the responses report.

    python openai_client_check.py --base-url http://127.0.0.1:PORT/v1 --model NAME
"""
import argparse
import json
import math
import sys
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def extension(obj):
    return (obj.model_extra or {}).get("bitsplit", {})


def scrape(metrics_url, api_key):
    request = urllib.request.Request(metrics_url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        check(response.headers.get("Content-Type", "").startswith("text/plain"),
              f"/metrics content type {response.headers.get('Content-Type')}")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat_non_streaming_and_streaming(client, model):
    full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24,
                                          temperature=0)
    choice = full.choices[0]
    check(full.object == "chat.completion", f"object {full.object}")
    check(choice.message.role == "assistant", "role")
    check(isinstance(choice.message.content, str) and choice.message.content, "empty content")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    check(full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens,
          "usage total")
    check(0 < full.usage.completion_tokens <= 24, f"completion tokens {full.usage.completion_tokens}")
    check(full.system_fingerprint.startswith("bitsplit-"), "system_fingerprint")
    ids = extension(full).get("token_ids")
    check(ids is not None and len(ids) == full.usage.completion_tokens, "bitsplit.token_ids")
    check("speculation" in extension(full), "bitsplit.speculation")

    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, finish, usage, roles, streamed_ids = "", None, None, 0, []
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        if chunk.usage is not None:
            check(chunk.choices == [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        roles += delta.role == "assistant"
        text += delta.content or ""
        streamed_ids += extension(chunk).get("token_ids", [])
        if chunk.choices[0].finish_reason is not None:
            finish = chunk.choices[0].finish_reason
            check("speculation" in extension(chunk), "the last chunk carries the stats")
    check(roles == 1, f"{roles} chunks named the role")
    check(text == choice.message.content, f"streamed {text!r} != {choice.message.content!r}")
    check(streamed_ids == ids, "streamed token ids differ")
    check(finish == choice.finish_reason, f"finish {finish} != {choice.finish_reason}")
    check(usage is not None and usage.completion_tokens == full.usage.completion_tokens and
          usage.prompt_tokens == full.usage.prompt_tokens, f"streamed usage {usage}")
    return choice.message.content


def completions(client, model):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0)
    check(full.object == "text_completion", f"object {full.object}")
    text = full.choices[0].text
    check(text, "empty completion")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=16, temperature=0, stream=True) if c.choices)
    check(streamed == text, f"streamed completion {streamed!r} != {text!r}")
    # The prompt as token ids gives the same answer as the prompt as text.
    ids_prompt = extension(client.completions.create(
        model=model, prompt=PROMPT, max_tokens=1, temperature=0))
    check("token_ids" in ids_prompt, "token ids extension")
    logprobs = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                         logprobs=2).choices[0].logprobs
    check(len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) ==
          len(logprobs.text_offset) == 8, "completions logprobs lengths")
    check(all(len(top) <= 2 for top in logprobs.top_logprobs), "at most 2 alternatives")
    check(logprobs.text_offset == sorted(logprobs.text_offset), "offsets increase")


def stop_and_seed(client, model, greedy_text):
    # A stop string from the middle of the greedy answer: the answer ends right before its first
    # occurrence.
    start = max(1, len(greedy_text) // 3)
    stop = greedy_text[start:start + 3]
    check(len(stop) == 3, f"the greedy answer {greedy_text!r} is too short for a stop string")
    cut = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24,
                                         temperature=0, stop=[stop, "\x00never"])
    expected = greedy_text[:greedy_text.find(stop)]
    check(cut.choices[0].message.content == expected,
          f"stop {stop!r}: {cut.choices[0].message.content!r} != {expected!r}")
    check(cut.choices[0].finish_reason == "stop", f"finish {cut.choices[0].finish_reason}")

    def sampled(seed):
        return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24,
                                              temperature=0.9, seed=seed).choices[0].message.content
    first = sampled(7)
    check(sampled(7) == first, "the same seed gave another text")
    check(any(sampled(seed) != first for seed in (8, 9, 10)), "three other seeds gave the same text")


def logprobs(client, model):
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12,
                                              temperature=0, logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    check(len(content) == response.usage.completion_tokens, "one logprob entry per token")
    for entry in content:
        check(entry.logprob <= 0 and math.isfinite(entry.logprob), f"logprob {entry.logprob}")
        check(len(entry.top_logprobs) == 3, "three alternatives")
        values = [alt.logprob for alt in entry.top_logprobs]
        check(values == sorted(values, reverse=True), "alternatives sorted")
        # Greedy: the chosen token is the most probable one.
        check(entry.token == entry.top_logprobs[0].token and
              abs(entry.logprob - values[0]) < 1e-6, f"greedy chose {entry.token!r}")
        check(bytes(entry.bytes).decode(errors="replace") == entry.token or
              "\ufffd" in entry.token, "bytes and token agree")
    check("".join(e.token for e in content) == response.choices[0].message.content,
          "the tokens spell the content")


def structured_output(client, model):
    """json_schema through the official client: the content is a document of the schema."""
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
        "population_millions": {"type": "integer"}},
        "required": ["city", "population_millions"], "additionalProperties": False}
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a French city as JSON."}],
        max_tokens=40, temperature=0, response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "strict": True, "schema": schema}})
    choice = response.choices[0]
    check(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason}")
    document = json.loads(choice.message.content)
    check(list(document) == ["city", "population_millions"], f"keys of {document}")
    check(document["city"] in ("Paris", "Lyon", "Nice"), f"city of {document}")
    check(isinstance(document["population_millions"], int), f"population of {document}")


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]}},
            "required": ["city"], "additionalProperties": False}}},
]


def forced_tool_calls(client, model):
    """tool_choice "required" and a named function through the official client, on a template
    with a tool-call syntax: the answer is a call in OpenAI's shape, streamed the same, and the
    call and its result go back into the next turn."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=64,
        temperature=0)
    choice = response.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
    calls = choice.message.tool_calls
    check(calls is not None and len(calls) == 1, f"tool_calls {calls}")
    call = calls[0]
    check(call.type == "function" and call.id.startswith("call_"), f"call {call}")
    check(call.function.name in ("get_weather", "get_time"), f"name {call.function.name}")
    arguments = json.loads(call.function.arguments)
    check(arguments["city"] in ("Paris", "Lyon", "Nice"), f"arguments {arguments}")
    check(not choice.message.content, f"content {choice.message.content!r}")

    # Streamed: the same call, its header first and then its arguments.
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=64,
        temperature=0, stream=True)
    name, streamed_arguments, finish = None, "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for piece in delta.tool_calls or []:
            check(piece.index == 0, f"index {piece.index}")
            if piece.function.name:
                name = piece.function.name
            streamed_arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    check(name == call.function.name, f"streamed name {name}")
    check(json.loads(streamed_arguments) == arguments, f"streamed arguments {streamed_arguments}")
    check(finish == "tool_calls", f"streamed finish_reason {finish}")

    # A named function is the one called.
    named = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=64, temperature=0.8, seed=3,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False)
    named_calls = named.choices[0].message.tool_calls
    check(named_calls and named_calls[0].function.name == "get_time", f"named {named_calls}")
    check(list(json.loads(named_calls[0].function.arguments)) == ["city"],
          f"named arguments {named_calls[0].function.arguments}")

    # The call and its result go back through the template; "none" answers in text.
    follow_up = client.chat.completions.create(
        model=model, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0,
        messages=messages + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}])
    check(follow_up.choices[0].message.tool_calls is None, "no calls with tool_choice none")
    check(follow_up.choices[0].message.content, "an answer in text")

    # A function that is not among the tools is refused by name.
    try:
        client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=8,
            tool_choice={"type": "function", "function": {"name": "book_flight"}})
        check(False, "an unknown function was accepted")
    except openai.BadRequestError as error:
        check("book_flight" in str(error), f"error {error}")


def errors(client, model):
    cases = [
        (openai.BadRequestError, dict(n=2), "n"),
        (openai.BadRequestError, dict(tools=[{"type": "function", "function": {"name": "f"}}]),
         "tool"),
        (openai.BadRequestError,
         dict(response_format={"type": "json_schema", "json_schema": {
             "name": "x", "schema": {"type": "string", "format": "email"}}}),
         "format"),
        (openai.BadRequestError, dict(temperature=-1), "temperature"),
        (openai.BadRequestError, dict(max_tokens=10 ** 9), "max_tokens"),
        (openai.BadRequestError, dict(top_p=0), "top_p"),
        (openai.NotFoundError, dict(model="no-such-model"), "no-such-model"),
    ]
    for error_type, overrides, needle in cases:
        arguments = dict(model=model, messages=MESSAGES, max_tokens=4)
        arguments.update(overrides)
        try:
            client.chat.completions.create(**arguments)
        except error_type as error:
            check(needle in str(error), f"{overrides}: {error} does not name {needle!r}")
            body = error.body if isinstance(error.body, dict) else {}
            check(body.get("type") in ("invalid_request_error", "not_found_error"),
                  f"{overrides}: error type {body}")
            continue
        raise AssertionError(f"{overrides}: no {error_type.__name__}")
    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as error:
        check("messages" in str(error), str(error))


def metrics_move_by_what_was_served(client, model, metrics_url, api_key):
    before = scrape(metrics_url, api_key)
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=20, temperature=0,
        extra_body={"bitsplit": {"speculation": {"mode": "tree", "nodes": 8, "expansions": 2,
                                                 "max_depth": 4}}})
    after = scrape(metrics_url, api_key)
    usage = response.usage
    stats = extension(response)["speculation"]

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)
    outcome = {"stop": "eos", "length": "length"}[response.choices[0].finish_reason]
    check(moved("bitsplit:requests_total", api="http", outcome=outcome) == 1, "requests_total")
    check(moved("bitsplit:prompt_tokens_total") == usage.prompt_tokens, "prompt_tokens_total")
    check(moved("bitsplit:generation_tokens_total") == usage.completion_tokens,
          "generation_tokens_total")
    check(moved("bitsplit:time_to_first_token_seconds_count") == 1, "ttft count")
    check(moved("bitsplit:inter_token_latency_seconds_count") == usage.completion_tokens - 1,
          "inter-token latency count")
    check(moved("bitsplit:e2e_request_latency_seconds_count") == 1, "request latency count")
    steps = stats["verify_steps"]
    yielded = round(stats["mean_accepted_per_verify"] * steps)
    check(moved("bitsplit:verify_steps_total") == steps, "verify_steps_total")
    check(moved("bitsplit:spec_decode_num_drafts_total") == steps, "spec_decode_num_drafts")
    check(moved("bitsplit:spec_decode_num_draft_tokens_total") == 8 * steps,
          "spec_decode_num_draft_tokens")
    check(moved("bitsplit:spec_decode_num_accepted_tokens_total") == yielded - steps,
          "spec_decode_num_accepted_tokens")
    # acceptance_by_depth[0]: of the steps whose tree reached depth 1 (all of them here), the
    # fraction that accepted a token there.
    check(moved("bitsplit:spec_decode_num_accepted_tokens_per_pos_total", position="0") ==
          round(stats["acceptance_by_depth"][0] * steps), "accepted at position 0")
    check(value(after, "bitsplit:drafter_up") == 1, "drafter_up")
    check(value(after, "bitsplit:residual_up") == 1, "residual_up")
    check(moved("bitsplit:residual_requests_total") > 0, "residual requests moved")
    check(moved("bitsplit:residual_read_bytes_total") > 0, "residual bytes moved")
    check(value(after, "bitsplit:num_requests_running") == 0, "nothing running")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--tool-calls", action="store_true",
                        help="only the forced tool-call checks (a server whose chat template "
                             "has a tool-call syntax)")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key or "unused",
                           max_retries=0, timeout=300)
    if args.tool_calls:
        forced_tool_calls(client, args.model)
        print("ok: forced tool calls", flush=True)
        return 0
    metrics_url = args.base_url.rsplit("/v1", 1)[0] + "/metrics"
    models = client.models.list().data
    check([m.id for m in models] == [args.model], f"models {[m.id for m in models]}")
    greedy = chat_non_streaming_and_streaming(client, args.model)
    print("ok: chat, streaming and not", flush=True)
    for name, run in [
        ("completions", lambda: completions(client, args.model)),
        ("stop and seed", lambda: stop_and_seed(client, args.model, greedy)),
        ("logprobs", lambda: logprobs(client, args.model)),
        ("structured output", lambda: structured_output(client, args.model)),
        ("errors", lambda: errors(client, args.model)),
        ("metrics", lambda: metrics_move_by_what_was_served(client, args.model, metrics_url,
                                                            args.api_key)),
    ]:
        run()
        print(f"ok: {name}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as failure:
        print(f"FAILED: {failure}", flush=True)
        sys.exit(1)
