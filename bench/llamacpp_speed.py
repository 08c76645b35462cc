#!/usr/bin/env python3
"""llama.cpp's side of bench/compare_llamacpp.sh: prefill and decode tokens/s through
llama-cpp-python on the same model, thread count and token ids as bench/engine_speed.

Decode is greedy: each step evaluates the previous token and takes the argmax of the logits
llama.cpp computed for it (llama_get_logits_ith; with logits_all=False `Llama.scores` is never
filled, and logits_all=True would make the prefill compute the head for every prompt token).
Before timing, the greedy tokens are checked against llama.cpp's own greedy completion
(create_completion with temperature 0) of the same prompt; a mismatch exits with an error.

Prints one JSON line: {"engine": "llama.cpp", "prefill_tokens_per_s": .., "decode_tokens_per_s": ..}
"""
import argparse
import json
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def last_logits(llm: Llama) -> np.ndarray:
    """The logits of the last token of the last eval (the one eval asks llama.cpp for)."""
    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),))


def greedy(llm: Llama, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    """Prefills `prompt`, then decodes `n` tokens greedily; returns them and both times (s)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    token = int(np.argmax(last_logits(llm)))
    prefill = time.perf_counter() - start
    tokens = [token]
    start = time.perf_counter()
    for _ in range(n - 1):
        llm.eval([token])
        token = int(np.argmax(last_logits(llm)))
        tokens.append(token)
    return tokens, prefill, time.perf_counter() - start


def check_against_completion(llm: Llama, prompt: list[int], n: int) -> None:
    """Exits unless greedy() gives llama.cpp's own temperature-0 completion of `prompt`."""
    tokens, _, _ = greedy(llm, prompt, n)
    llm.reset()
    completion = llm.create_completion(prompt, max_tokens=n, temperature=0.0,
                                       repeat_penalty=1.0)
    text = completion["choices"][0]["text"]
    stopped_early = completion["choices"][0]["finish_reason"] == "stop"
    # create_completion stops at the end-of-generation token without printing it.
    expected = tokens
    for i, token in enumerate(tokens):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            expected = tokens[:i]
            break
    ours = llm.detokenize(expected, prev_tokens=prompt).decode("utf-8", errors="ignore")
    if ours != text or stopped_early != (len(expected) < len(tokens)):
        sys.exit(f"llamacpp_speed: greedy decode {tokens} ({ours!r}) differs from llama.cpp's "
                 f"temperature-0 completion {text!r} (finish_reason "
                 f"{completion['choices'][0]['finish_reason']})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    llm = Llama(model_path=args.model, n_ctx=1024, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    # Same synthetic token ids as bench/engine_speed_bench.cc: (i * 7919 + 13) % 32000 + 100.
    prompt = [(i * 7919 + 13) % 32000 + 100 for i in range(args.prompt_tokens)]
    check_against_completion(llm, prompt, 16)
    best_prefill, best_decode = float("inf"), float("inf")
    for _ in range(args.repeats):
        # The first decoded token comes with the prefill; the timed decode steps are the others.
        _, prefill, decode = greedy(llm, prompt, args.decode_tokens + 1)
        best_prefill, best_decode = min(best_prefill, prefill), min(best_decode, decode)
    print(json.dumps({"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
                      "prefill_tokens_per_s": args.prompt_tokens / best_prefill,
                      "decode_tokens_per_s": args.decode_tokens / best_decode}))


if __name__ == "__main__":
    main()
