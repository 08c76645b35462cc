#!/usr/bin/env python3
"""Time to first token of each turn of one conversation, with and without the prefix cache.

    bench/prefix_cache_turns.py HTTP_ADDRESS [TURNS=6] [ANSWER_TOKENS=128]

Drives the coordinator's /v1/chat/completions (streaming, greedy) through a conversation whose
system message is reference material (the code and prose prompts of bench/prompts/prompts.jsonl,
about 800 tokens) and whose user turns are its questions; each turn's request holds the whole
conversation so far, the model's own answers included. Every turn is sent twice, side by side:
first with the cache (`cache_prompt` true: the drafter may reuse the previous turn's session),
then without (`cache_prompt` false: the whole prompt is prefilled). Time to first token is
measured at the client, from sending the request to the first chunk with text. The two answers
must be equal (the reuse is exact); the script exits 1 if one differs.
Prints a Markdown table: turn, prompt tokens, cached tokens, TTFT with and without, ratio.
Python standard library only.
"""
import http.client
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def material_and_questions():
    prompts = [json.loads(line) for line in (ROOT / "bench/prompts/prompts.jsonl").open()]
    material = "\n\n".join(p["prompt"] for p in prompts
                           if p["id"].startswith(("code-", "prose-")))
    questions = [p["prompt"] for p in prompts if p["id"].startswith(("question-", "howto-"))]
    system = ("You are a careful assistant. Answer the user's questions; the following reference "
              "material may help.\n\n" + material)
    return system, questions


def served_model(address):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("GET", "/v1/models")
    models = json.loads(connection.getresponse().read())
    connection.close()
    return models["data"][0]["id"]


def stream_chat(address, model, messages, max_tokens, cache_prompt):
    """(first-text seconds, answer text, usage) of one streamed greedy chat completion."""
    host, port = address.rsplit(":", 1)
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True},
                       "cache_prompt": cache_prompt})
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}: {response.read().decode()}")
    first_text = None
    text = []
    usage = None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                if first_text is None:
                    first_text = time.perf_counter() - start
                text.append(piece)
    connection.close()
    return first_text, "".join(text), usage


def main():
    address = sys.argv[1]
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    answer_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    model = served_model(address)
    system, questions = material_and_questions()
    messages = [{"role": "system", "content": system}]
    rows = []
    mismatches = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": questions[turn]})
        cached_s, answer, usage = stream_chat(address, model, messages, answer_tokens, True)
        plain_s, plain_answer, plain_usage = stream_chat(address, model, messages, answer_tokens, False)
        if answer != plain_answer:
            mismatches += 1
            print(f"turn {turn + 1}: the answers differ", file=sys.stderr)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        rows.append((turn + 1, usage["prompt_tokens"], cached,
                     plain_usage["prompt_tokens_details"]["cached_tokens"], cached_s, plain_s))
        print(f"turn {turn + 1}: {usage['prompt_tokens']} prompt tokens, {cached} cached, "
              f"TTFT {cached_s:.3f} s with, {plain_s:.3f} s without", file=sys.stderr)
        messages.append({"role": "assistant", "content": answer})
    print("| turn | prompt tokens | cached | TTFT with cache (s) | TTFT without (s) | ratio |")
    print("|---|---|---|---|---|---|")
    for turn, prompt, cached, plain_cached, with_s, without_s in rows:
        assert plain_cached == 0, "a request with cache_prompt false reported cached tokens"
        print(f"| {turn} | {prompt} | {cached} | {with_s:.3f} | {without_s:.3f} | "
              f"{without_s / with_s:.1f}x |")
    print(f"answers differing with and without the cache: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
