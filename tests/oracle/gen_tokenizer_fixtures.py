#!/usr/bin/env python3
"""Generates the llama.cpp tokenizer fixture for tests/text_tokenizer_test.cc.

For every string of tests/oracle/tokenizer_strings.json, llama.cpp (through llama-cpp-python,
vocab only) tokenizes the text with parse_special off and on (never adding BOS), and every id
list is turned back into bytes with llama_token_to_piece, with control tokens hidden and
rendered. For every conversation, the GGUF's own chat template is rendered with jinja2 (as
Hugging Face does) and the prompt is tokenized with parse_special on. The fixture also records
which ids llama.cpp treats as end-of-generation and its BOS/EOS ids.

Rerun (needs the oracle environment, see scripts/oracle-env.sh; pinned versions in
tests/oracle/requirements.txt: llama-cpp-python 0.3.36, gguf 0.19.0, jinja2 3.1.6):
    $(scripts/oracle-env.sh) tests/oracle/gen_tokenizer_fixtures.py
Writes tests/fixtures/tokenizer/smollm2_tokens.json.
"""
import ctypes
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import gguf
import jinja2
import jinja2.sandbox
import llama_cpp
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
STRINGS = ROOT / "tests" / "oracle" / "tokenizer_strings.json"
OUT = ROOT / "tests" / "fixtures" / "tokenizer" / "smollm2_tokens.json"


def pieces_to_bytes(vocab, ids, special):
    """Concatenation of llama_token_to_piece (llama-cpp-python's detokenize strips a leading
    space after BOS, which is not llama.cpp's behaviour, so it is not used here)."""
    out = b""
    buf = ctypes.create_string_buffer(1024)
    for token in ids:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        assert 0 <= n <= len(buf), n
        out += buf.raw[:n]
    return out


def llama_detokenize(vocab, ids, unparse_special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 256 * len(ids) + 16  # far above the longest piece
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    assert n >= 0, n
    return buf.raw[:n]


def as_text(data: bytes) -> str:
    return data.decode("utf-8")  # every corpus string is valid UTF-8, so its pieces are too


def main():
    corpus = json.loads(STRINGS.read_text(encoding="utf-8"))
    llm = Llama(model_path=str(MODEL), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    cases = []
    for entry in corpus["strings"]:
        text = entry["text"]
        case = {"category": entry["category"], "text": text}
        for mode, special in (("plain", False), ("special", True)):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            hidden = pieces_to_bytes(vocab, ids, False)
            rendered = pieces_to_bytes(vocab, ids, True)
            # SmolLM2's pre-tokenizer has clean_spaces off, so llama_detokenize is the same
            # plain concatenation; check it so the fixture documents llama.cpp's Decode.
            assert llama_detokenize(vocab, ids, True) == rendered, text
            assert llama_detokenize(vocab, ids, False) == hidden, text
            case[f"ids_{mode}"] = ids
            case[f"decoded_{mode}_hidden"] = as_text(hidden)
            case[f"decoded_{mode}_rendered"] = as_text(rendered)
        cases.append(case)

    reader = gguf.GGUFReader(MODEL)
    template_source = reader.fields["tokenizer.chat_template"].contents()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(template_source)
    chats = []
    for conversation in corpus["conversations"]:
        prompt = template.render(messages=conversation["messages"],
                                 add_generation_prompt=conversation["add_generation_prompt"])
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        chats.append({**conversation, "prompt": prompt, "ids": ids})

    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    control = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)]
    fixture = {
        "generator": "tests/oracle/gen_tokenizer_fixtures.py",
        "oracle": f"llama-cpp-python {version('llama_cpp_python')} (llama.cpp built from "
                  f"source), gguf {version('gguf')}, jinja2 {version('jinja2')}",
        "model": MODEL.name,
        "model_sha256": hashlib.sha256(MODEL.read_bytes()).hexdigest(),
        "vocab_size": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "eot_id": llama_cpp.llama_vocab_eot(vocab),
        "eog_ids": eog,
        "control_ids": control,
        "chat_template": template_source,
        "cases": cases,
        "chats": chats,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} strings, {len(chats)} conversations, EOG ids {eog}")


if __name__ == "__main__":
    main()
