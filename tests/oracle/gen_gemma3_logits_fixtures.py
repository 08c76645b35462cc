#!/usr/bin/env python3
"""Generates the llama.cpp logits fixture of gemma-3-270m for tests/model_oracle_logits_test.cc.

The oracle is llama.cpp running an F32 copy of gemma-3-270m-q4_k_m.gguf (every tensor dequantized
with the `gguf` package, metadata unchanged; gen_logits_fixtures.make_f32_copy) with an f32 KV
cache. The prompts (tests/oracle/gemma3_logit_prompts.json) are raw text and chat turns in
gemma's <start_of_turn> format (this pretrained GGUF has no chat template; llama.cpp's own
"gemma" template renders them), short and long: the long ones run past 600 and 1,200 tokens, so
the 512-token sliding window of the local layers is crossed. Every sequence starts with BOS, as
the GGUF's add_bos_token asks.

Per prompt the fixture stores the tokens, llama.cpp's 48-token greedy continuation and, at every
position, the top-K logits, the log-sum-exp and TAIL_SAMPLES token ids drawn from the
distribution outside the top-K (see gen_logits_fixtures.py for the KL estimate they give).

Two oracles, two fixtures:
    $(scripts/oracle-env.sh) tests/oracle/gen_gemma3_logits_fixtures.py
        llama.cpp as released: its CPU GELU looks the value up at the input rounded to fp16
        -> tests/fixtures/oracle/gemma3_f32_logits.json (not committed: what that table changes
        is measured once in docs/design.md §10)
    $(scripts/oracle-env.sh --exact-gelu) tests/oracle/gen_gemma3_logits_fixtures.py --exact-gelu
        the same llama.cpp built with GGML_GELU_FP16 undefined: the f32 GELU formula, as its CUDA
        and Metal backends compute it -> tests/fixtures/oracle/gemma3_f32_exact_gelu_logits.json,
        the fixture of tests/model_oracle_logits_test.cc
"""
import ctypes
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_logits_fixtures import CACHE, ROOT, make_f32_copy, run  # noqa: E402

MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
F32_COPY = CACHE / "oracle" / "gemma-3-270m.F32.gguf"
TOP_K = 64
TAIL_SAMPLES = 32
CONTINUATION = 48


def render_gemma_chat(llm: Llama, messages) -> str:
    """llama.cpp's built-in "gemma" chat template (the GGUF has none), generation prompt on."""
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(messages), True, buf, size)
    assert 0 < n <= size, n
    return buf.raw[:n].decode("utf-8")


def main() -> int:
    exact_gelu = "--exact-gelu" in sys.argv[1:]
    make_f32_copy(MODEL, F32_COPY)
    prompts = json.loads((ROOT / "tests/oracle/gemma3_logit_prompts.json").read_text())
    llm = Llama(model_path=str(F32_COPY), n_ctx=2048, n_batch=512, n_threads=2, logits_all=True,
                verbose=False, type_k=0, type_v=0, flash_attn=False)  # type 0 = GGML_TYPE_F32
    cases, tails = [], []
    for prompt in prompts:
        if prompt["kind"] == "chat":
            text = render_gemma_chat(llm, prompt["messages"])
        else:
            text = prompt["text"]
        tokens = [llm.token_bos()] + llm.tokenize(text.encode("utf-8"), add_bos=False,
                                                  special=True)
        continuation, records = run(llm, tokens, TOP_K, TAIL_SAMPLES, steps=CONTINUATION,
                                        seed=20261201)
        tails += [r["tail_mass"] for r in records]
        cases.append({"name": prompt["name"], "kind": prompt["kind"], "text": text,
                      "tokens": [int(t) for t in tokens], "continuation": continuation,
                      "logits": records})
        print(f"{prompt['name']}: {len(tokens)} prompt tokens, continuation "
              f"{llm.detokenize(continuation).decode(errors='replace')!r}")
    tails = np.array(tails)
    print(f"positions {len(tails)}; mass outside top-{TOP_K}: mean {tails.mean():.2e}, "
          f"max {tails.max():.2e}")
    name = "gemma3_f32_exact_gelu_logits.json" if exact_gelu else "gemma3_f32_logits.json"
    out = ROOT / "tests/fixtures/oracle" / name
    out.write_text(json.dumps({
        "model": MODEL.name, "llama_cpp_python": "0.3.36", "kv_cache": "f32", "n_threads": 2,
        "oracle": "llama.cpp on an F32 copy (gguf-py dequantized)" +
                  (", built with GGML_GELU_FP16 undefined (f32 GELU formula)" if exact_gelu
                   else ", as released (fp16 GELU lookup table)"),
        "top_k": TOP_K,
        "tail_samples": TAIL_SAMPLES, "cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
