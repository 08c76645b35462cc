#!/usr/bin/env python3
"""Generates the llama.cpp logits fixtures for tests/model_oracle_logits_test.cc.

The strict oracle is llama.cpp running an F32 copy of SmolLM2-135M-Instruct: every tensor of
the Q4_1 file is dequantized with the `gguf` package and written back with its GGUF writer, and
llama.cpp evaluates it with an f32 KV cache, so both engines compute in f32 and differ by
rounding only. The same token sequences are also run through llama.cpp on the original Q4_1
file (which quantizes activations to Q8_1), for information.

For each prompt of tests/oracle/logit_prompts.json (chat prompts rendered with the GGUF's own
chat template through jinja2), the fixture stores the prompt tokens (llama.cpp tokenization),
llama.cpp's 48-token greedy continuation, and at every evaluated position the top-K logits
and the log-sum-exp of the full distribution. A 135M model's distributions have heavy tails
(the top-128 tokens hold ~94% of the mass on average, and covering 99.99% takes ~13,000 tokens),
so each position also stores TAIL_SAMPLES token ids drawn (with replacement, fixed seed) from
the oracle distribution restricted to the tokens outside the top-K. With them the test gets an
unbiased estimate of the full KL: sum over the top-K of p_i*(log p_i - log q_i) plus
p_tail * mean over the samples of (log p_s - log q_s).

Rerun (needs the oracle environment, see scripts/oracle-env.sh; pinned versions in
tests/oracle/requirements.txt: llama-cpp-python 0.3.36, gguf 0.19.0, numpy 2.4.6):
    $(scripts/oracle-env.sh) tests/oracle/gen_logits_fixtures.py
"""
import json
import os
import sys
from pathlib import Path

import gguf
import jinja2
import numpy as np
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("BITSPLIT_CACHE", Path.home() / ".cache" / "bitsplit"))
F32_COPY = CACHE / "oracle" / "SmolLM2-135M-Instruct.F32.gguf"
TOP_K = 128
TAIL_SAMPLES = 64
INFO_TOP_K = 64  # the Q4_1 comparison is for information only
CONTINUATION = 48


def make_f32_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst) + ".tmp", arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.ALL_F32)
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape(tuple(int(d) for d in reversed(tensor.shape)))
        writer.add_tensor(tensor.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(dst) + ".tmp", dst)


def render_chat(template: str, messages, bos: str, eos: str) -> str:
    env = jinja2.Environment(loader=jinja2.BaseLoader())
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def top_k_record(logits: np.ndarray, k: int, tail_samples: int, rng) -> dict:
    logits = logits.astype(np.float64)
    order = np.argsort(-logits, kind="stable")
    top = order[:k]
    peak = logits.max()
    lse = float(peak + np.log(np.exp(logits - peak).sum()))
    record = {"ids": [int(i) for i in top],
              "values": [float(np.float32(logits[i])) for i in top],
              "logsumexp": lse}
    if tail_samples:
        tail = order[k:]
        tail_p = np.exp(logits[tail] - lse)
        record["tail_mass"] = float(tail_p.sum())
        picks = rng.choice(tail, size=tail_samples, replace=True, p=tail_p / tail_p.sum())
        record["tail_ids"] = [int(i) for i in picks]
        record["tail_values"] = [float(np.float32(logits[i])) for i in picks]
    return record


def run(llm: Llama, tokens, k, tail_samples, continuation=None, steps=None, seed=20261129):
    """Evaluates tokens; greedy-extends `steps` tokens (default CONTINUATION), or replays
    `continuation`; returns (continuation, records of every evaluated position)."""
    steps = CONTINUATION if steps is None else steps
    llm.reset()
    llm.eval(tokens)
    generated = []
    for step in range(steps):
        last = llm.scores[llm.n_tokens - 1]
        next_id = int(np.argmax(last)) if continuation is None else continuation[step]
        generated.append(next_id)
        if step + 1 < steps:
            llm.eval([next_id])
    n = len(tokens) + steps - 1
    rng = np.random.default_rng(seed)
    records = [top_k_record(llm.scores[p], k, tail_samples, rng) for p in range(n)]
    return generated, records


def main() -> int:
    make_f32_copy(MODEL, F32_COPY)
    prompts = json.loads((ROOT / "tests/oracle/logit_prompts.json").read_text())
    reader = gguf.GGUFReader(MODEL)
    template = reader.fields["tokenizer.chat_template"].contents()
    common = dict(n_ctx=1024, n_batch=512, n_threads=2, logits_all=True, verbose=False,
                  type_k=0, type_v=0, flash_attn=False)  # type 0 = GGML_TYPE_F32
    oracle = Llama(model_path=str(F32_COPY), **common)
    quantized = Llama(model_path=str(MODEL), **common)
    bos = oracle.detokenize([oracle.token_bos()]).decode()
    eos = oracle.detokenize([oracle.token_eos()]).decode()
    f32_cases, q41_cases, tails = [], [], []
    for prompt in prompts:
        if prompt["kind"] == "chat":
            text = render_chat(template, prompt["messages"], bos, eos)
        else:
            text = prompt["text"]
        tokens = oracle.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        continuation, records = run(oracle, tokens, TOP_K, TAIL_SAMPLES)
        _, q41_records = run(quantized, tokens, INFO_TOP_K, 0, continuation)
        for r in records:
            tails.append(r["tail_mass"])
        case = {"name": prompt["name"], "kind": prompt["kind"], "text": text,
                "tokens": [int(t) for t in tokens], "continuation": continuation}
        f32_cases.append(dict(case, logits=records))
        q41_cases.append(dict(case, logits=q41_records))
        print(f"{prompt['name']}: {len(tokens)} prompt tokens, "
              f"continuation {oracle.detokenize(continuation).decode(errors='replace')!r}")
    tails = np.array(tails)
    print(f"positions {len(tails)}; probability mass outside top-{TOP_K}: "
          f"mean {tails.mean():.2e}, max {tails.max():.2e}")
    out = ROOT / "tests/fixtures/oracle"
    out.mkdir(parents=True, exist_ok=True)
    header = {"model": MODEL.name, "llama_cpp_python": "0.3.36", "kv_cache": "f32",
              "n_threads": 2}
    (out / "smollm2_f32_logits.json").write_text(json.dumps(
        dict(header, oracle="llama.cpp on an F32 copy (gguf-py dequantized)", top_k=TOP_K,
             tail_samples=TAIL_SAMPLES, cases=f32_cases)))
    (out / "smollm2_q4_1_logits.json").write_text(json.dumps(
        dict(header, oracle="llama.cpp on the original Q4_1 file", top_k=INFO_TOP_K,
             tail_samples=0, cases=q41_cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
