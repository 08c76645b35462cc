#!/usr/bin/env python3
"""Generates the llama.cpp tokenizer fixtures for tests/text_tokenizer_test.cc and
tests/text_tokenize_command_test.cc, one per vocabulary:

  smollm2              SmolLM2-135M-Instruct (byte-level BPE, pre "smollm")
  gemma3               gemma-3-270m (SentencePiece, 262144 tokens, add_space_prefix false)
  gemma3_space_prefix  the same vocabulary with tokenizer.ggml.add_space_prefix set to true
                       (a metadata-only copy patched here; the C++ test patches the same byte)
  qwen2                DeepSeek-R1-Distill-Qwen-7B (byte-level BPE, pre "deepseek-r1-qwen"),
                       from the metadata-only GGUF scripts/setup.sh derives
  qwen2_gpt4o          the same vocabulary with tokenizer.ggml.pre "gpt-4o" (gpt-oss's and
                       Llama 4's pre-tokenizer; no vocabulary of theirs is available here, and
                       the pre-tokenizer's word splits are what differs), a metadata-only copy
                       rewritten here and by the C++ test alike
  gemma4               llama.cpp's Gemma 4 vocabulary (tokenizer model "gemma4"), the
                       ggml-vocab-gemma-4.gguf scripts/setup.sh takes from the pinned sdist

For every string of tests/oracle/tokenizer_strings.json, llama.cpp (through llama-cpp-python,
vocab only) tokenizes the text with parse_special off and on, without BOS/EOS (ids_*) and with
them (ids_*_added: llama_tokenize's add_special); every id list is turned back into bytes with
llama_token_to_piece (decoded_*: control tokens hidden and rendered) and with llama_detokenize
(detokenized_*: remove_special off; detokenized_*_added: remove_special on). The fixture also
records BOS/EOS/EOT ids, add_bos/add_eos, which ids llama.cpp treats as end-of-generation and as
control, and the attribute of every token that is not plain normal.

Chats: for SmolLM2 the GGUF's own chat template rendered with jinja2 (as Hugging Face does); for
gemma3 (its GGUF has no template) llama.cpp's built-in "gemma" template through
llama_chat_apply_template. Both prompts are tokenized with parse_special on.

Rerun (needs the oracle environment, see scripts/oracle-env.sh; pinned versions in
tests/oracle/requirements.txt: llama-cpp-python 0.3.36, gguf 0.19.0, jinja2 3.1.6; the models
from scripts/setup.sh --models):
    $(scripts/oracle-env.sh) tests/oracle/gen_tokenizer_fixtures.py [VOCAB ...]
Writes tests/fixtures/tokenizer/<vocab>_tokens.json.
"""
import ctypes
import hashlib
import json
import struct
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import gguf
import jinja2
import jinja2.sandbox
import llama_cpp
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
STRINGS = ROOT / "tests" / "oracle" / "tokenizer_strings.json"
OUT_DIR = ROOT / "tests" / "fixtures" / "tokenizer"

SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma-3-270m-q4_k_m.gguf"
QWEN2 = MODELS / "DeepSeek-R1-Distill-Qwen-7B.vocab.gguf"
GEMMA4 = MODELS / "ggml-vocab-gemma-4.gguf"

SPACE_PREFIX_KEY = b"tokenizer.ggml.add_space_prefix"
GGUF_TYPE_BOOL = 7


def metadata_end(path: Path) -> int:
    """Offset just past the last metadata entry (where the tensor infos begin)."""
    reader = gguf.GGUFReader(path)
    end = 0
    for field in reader.fields.values():
        last = field.parts[-1]
        end = max(end, int(last.ctypes.data - reader.data.ctypes.data) + last.nbytes)
    return end


def metadata_only(source: Path, key: bytes):
    """`source`'s metadata as a tensor-less GGUF image, and the offset of `key`'s value type."""
    image = bytearray(source.read_bytes()[:metadata_end(source)])
    image[8:16] = struct.pack("<Q", 0)
    needle = struct.pack("<Q", len(key)) + key
    at = image.find(needle)
    assert at > 0 and image.find(needle, at + 1) < 0, f"{key!r} not found exactly once"
    return image, at + len(needle)


def space_prefix_variant(source: Path, target: Path) -> None:
    """A metadata-only copy of `source` (tensor count 0) with add_space_prefix set to true."""
    image, type_at = metadata_only(source, SPACE_PREFIX_KEY)
    assert struct.unpack_from("<I", image, type_at)[0] == GGUF_TYPE_BOOL
    assert image[type_at + 4] == 0, "expected add_space_prefix = false in the source"
    image[type_at + 4] = 1
    target.write_bytes(bytes(image))


PRE_KEY = b"tokenizer.ggml.pre"
GGUF_TYPE_STRING = 8


def pre_tokenizer_variant(source: Path, target: Path, pre: str) -> None:
    """A metadata-only copy of `source` (tensor count 0) with tokenizer.ggml.pre = `pre`."""
    image, type_at = metadata_only(source, PRE_KEY)
    assert struct.unpack_from("<I", image, type_at)[0] == GGUF_TYPE_STRING
    length = struct.unpack_from("<Q", image, type_at + 4)[0]
    value_at = type_at + 12
    new_value = pre.encode()
    image[type_at + 4:value_at + length] = struct.pack("<Q", len(new_value)) + new_value
    target.write_bytes(bytes(image))


def tokenize(vocab, data: bytes, add_special: bool, parse_special: bool):
    capacity = 2 * len(data) + 16
    tokens = (llama_cpp.llama_token * capacity)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, capacity, add_special,
                                 parse_special)
    assert n >= 0, n
    return list(tokens[:n])


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


def llama_detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 256 * len(ids) + 16  # far above the longest piece
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special,
                                   unparse_special)
    assert n >= 0, n
    return buf.raw[:n]


def as_text(data: bytes) -> str:
    return data.decode("utf-8")  # every corpus string is valid UTF-8, so its pieces are too


def llama_chat_template(template_name: str, messages, add_generation_prompt: bool) -> str:
    chat = (llama_cpp.llama_chat_message * max(1, len(messages)))()
    keep = []
    for i, message in enumerate(messages):
        role = message["role"].encode("utf-8")
        content = message["content"].encode("utf-8")
        keep += [role, content]
        chat[i].role = role
        chat[i].content = content
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template_name.encode(), chat, len(messages),
                                                add_generation_prompt, buf, size)
        assert n >= 0, n
        if n <= size:
            return buf.raw[:n].decode("utf-8")
        size = n


def jinja_chats(model: Path, conversations):
    reader = gguf.GGUFReader(model)
    source = reader.fields["tokenizer.chat_template"].contents()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)
    prompts = [template.render(messages=c["messages"],
                               add_generation_prompt=c["add_generation_prompt"])
               for c in conversations]
    return source, prompts


# Words whose splits the GPT-4o pre-tokenizer decides by case (a run of non-lowercase letters
# then lowercase ones), digit groups, "/" after punctuation and contractions: added to the
# corpus for qwen2_gpt4o, where the shared corpus rarely crosses those boundaries.
GPT4O_STRINGS = [
    "HelloWorld", "camelCaseIdentifier", "XMLHttpRequest", "iPhone", "HTTPServer2024",
    "parseJSONResponse", "McDonald's", "DON'T Stop", "O'Neil'S", "they'RE here", "snake_case_Name",
    "ÉcoleNormale", "ΑθήναΕλλάδα", "ΣΊΣΥΦΟΣ σοφός", "Привет МирДругой", "İstanbulİzmir",
    "ǅungla ǈubljana", "ﬁnancial ﬂow", "e\u0301cole Cafe\u0301Noir", "नमस्तेदुनिया",
    "straße STRASSE Straße", "ABCdefGHIjkl", "aBcDeF", "1234567890", "12,345.678",
    "v2.0.1-rc3", "path/to/file.txt", "a/b//c///", "?!/\r\n", "...//\n\n", "}/\r\n\t",
    "x = fooBar(bazQux)", "<div class=\"MainPanel\">", "ID: A1B2C3 value=0xDEADbeef",
    "日本語のテキストABCdef", "한국어Text", "emoji😀Word😀WORD", "  leadingSpacesCamelCase",
]


def fixture_for(name: str, model: Path, corpus, chats: str):
    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    cases = []
    for entry in corpus["strings"]:
        text = entry["text"]
        data = text.encode("utf-8")
        case = {"category": entry["category"], "text": text}
        for mode, special in (("plain", False), ("special", True)):
            ids = tokenize(vocab, data, False, special)
            case[f"ids_{mode}"] = ids
            case[f"decoded_{mode}_hidden"] = as_text(pieces_to_bytes(vocab, ids, False))
            case[f"decoded_{mode}_rendered"] = as_text(pieces_to_bytes(vocab, ids, True))
            case[f"detokenized_{mode}_hidden"] = as_text(
                llama_detokenize(vocab, ids, False, False))
            case[f"detokenized_{mode}_rendered"] = as_text(
                llama_detokenize(vocab, ids, False, True))
            added = tokenize(vocab, data, True, special)
            case[f"ids_{mode}_added"] = added
            case[f"detokenized_{mode}_added"] = as_text(
                llama_detokenize(vocab, added, True, special))
        cases.append(case)

    chat_template = None
    rendered = []
    conversations = corpus["conversations"]
    if chats == "jinja":
        chat_template, prompts = jinja_chats(model, conversations)
    elif chats == "gemma":
        prompts = [llama_chat_template("gemma", c["messages"], c["add_generation_prompt"])
                   for c in conversations]
    else:
        prompts = []
    for conversation, prompt in zip(conversations, prompts):
        ids = tokenize(vocab, prompt.encode("utf-8"), False, True)
        rendered.append({**conversation, "prompt": prompt, "ids": ids})

    attrs = {}
    for i in range(n_vocab):
        attr = llama_cpp.llama_vocab_get_attr(vocab, i)
        if attr != llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:
            attrs[str(i)] = attr
    fixture = {
        "generator": "tests/oracle/gen_tokenizer_fixtures.py",
        "oracle": f"llama-cpp-python {version('llama_cpp_python')} (llama.cpp built from "
                  f"source), gguf {version('gguf')}, jinja2 {version('jinja2')}",
        "vocabulary": name,
        "model": model.name,
        "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
        "vocab_size": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "eot_id": llama_cpp.llama_vocab_eot(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)],
        "attrs": attrs,
        "chat_format": chats,
        "chat_template": chat_template,
        "cases": cases,
        "chats": rendered,
    }
    out = OUT_DIR / f"{name}_tokens.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(cases)} strings, {len(rendered)} conversations, "
          f"EOG ids {fixture['eog_ids']}")


def main():
    corpus = json.loads(STRINGS.read_text(encoding="utf-8"))
    wanted = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        variant = Path(tmp) / "gemma-3-270m.space-prefix.vocab.gguf"

        def make_variant():
            space_prefix_variant(GEMMA3, variant)
            return variant

        gpt4o = Path(tmp) / "qwen2.gpt-4o.vocab.gguf"

        def make_gpt4o_variant():
            pre_tokenizer_variant(QWEN2, gpt4o, "gpt-4o")
            return gpt4o

        vocabularies = [
            ("smollm2", lambda: SMOLLM2, "jinja"),
            ("gemma3", lambda: GEMMA3, "gemma"),
            ("gemma3_space_prefix", make_variant, None),
            ("qwen2", lambda: QWEN2, None),
            ("qwen2_gpt4o", make_gpt4o_variant, None, GPT4O_STRINGS),
            ("gemma4", lambda: GEMMA4, None),
        ]
        for name, model, chats, *extra in vocabularies:
            if wanted and name not in wanted:
                continue
            strings = corpus["strings"] + [{"category": "cased_words", "text": text}
                                           for text in (extra[0] if extra else [])]
            fixture_for(name, model(), {**corpus, "strings": strings}, chats)


if __name__ == "__main__":
    main()
