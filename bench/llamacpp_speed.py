#!/usr/bin/env python3
"""llama.cpp's side of bench/compare_llamacpp.sh: prefill and decode tokens/s through
llama-cpp-python on the same model, thread count and token ids as bench/engine_speed.

Prints one JSON line: {"engine": "llama.cpp", "prefill_tokens_per_s": .., "decode_tokens_per_s": ..}
"""
import argparse
import json
import time

from llama_cpp import Llama


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
    # Same synthetic token ids as bench/engine_speed.cc: (i * 7919 + 13) % 32000 + 100.
    prompt = [(i * 7919 + 13) % 32000 + 100 for i in range(args.prompt_tokens)]
    best_prefill, best_decode = float("inf"), float("inf")
    for _ in range(args.repeats):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - start
        token = prompt[-1]
        start = time.perf_counter()
        for _ in range(args.decode_tokens):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        decode = time.perf_counter() - start
        best_prefill, best_decode = min(best_prefill, prefill), min(best_decode, decode)
    print(json.dumps({"engine": "llama.cpp (llama-cpp-python 0.3.36)",
                      "prefill_tokens_per_s": args.prompt_tokens / best_prefill,
                      "decode_tokens_per_s": args.decode_tokens / best_decode}))


if __name__ == "__main__":
    main()
