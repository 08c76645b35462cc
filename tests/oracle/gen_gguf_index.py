#!/usr/bin/env python3
"""Generates the GGUF index fixtures for tests/io_gguf_reader_test.cc.

The independent oracle is the `gguf` Python package (the reader maintained in llama.cpp's
gguf-py): for each real model it records the header (version, counts, alignment, data section
offset), every metadata entry (key, type; the value of scalars; element type, count and the
first/last elements of arrays), a selection of model/tokenizer values under their exact keys,
and for every tensor its name, type, dims (ggml order), absolute data offset and byte size.
The C++ reader must reproduce all of it exactly.

Outputs: tests/fixtures/gguf/smollm2_index.json, tests/fixtures/gguf/gemma3_index.json.

Rerun (needs the oracle environment, see scripts/oracle-env.sh; pinned versions in
tests/oracle/requirements.txt: gguf 0.19.0, numpy 2.4.6), from the repository root:
    $(scripts/oracle-env.sh) tests/oracle/gen_gguf_index.py
or, with gguf 0.19.0 and numpy 2.4.6 installed under some directory DIR:
    PYTHONPATH=DIR python3 tests/oracle/gen_gguf_index.py
The models must be in models/ (scripts/setup.sh --models).
"""
import hashlib
import importlib.metadata
import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "gguf"
MODELS = [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2_index.json"),
    ("gemma-3-270m-q4_k_m.gguf", "gemma3_index.json"),
]
PINNED = {"gguf": "0.19.0", "numpy": "2.4.6"}
ARRAY_EDGE = 8  # how many leading and trailing elements of each array the index keeps

# Per-architecture keys whose values the index lists explicitly (when the file has them).
SELECTED_ARCH_KEYS = [
    "block_count",
    "embedding_length",
    "context_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "rope.freq_base",
    "attention.layer_norm_rms_epsilon",
]
SELECTED_KEYS = [
    "general.architecture",
    "general.alignment",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
]


def json_number(value):
    """JSON cannot hold inf/nan; spell them as strings the C++ test understands."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def scalar(field, index):
    """One element of a field as a plain Python value (exact: float32 widens to float64)."""
    value = field.contents(index)
    if isinstance(value, (np.generic,)):
        value = value.item()
    return json_number(value)


def describe_field(field):
    entry = {"key": field.name, "type": field.types[0].name}
    if field.types[0] != gguf.GGUFValueType.ARRAY:
        entry["value"] = scalar(field, 0) if field.types[0] != gguf.GGUFValueType.STRING else (
            field.contents())
        return entry
    if len(field.types) > 2:
        raise SystemExit(f"{field.name}: nested arrays are not indexed")
    count = len(field.data)
    entry["element_type"] = field.types[1].name if len(field.types) > 1 else "UNKNOWN"
    entry["count"] = count
    head = range(min(count, ARRAY_EDGE))
    tail = range(max(count - ARRAY_EDGE, 0), count)
    entry["head"] = [scalar(field, i) for i in head]
    entry["tail"] = [scalar(field, i) for i in tail]
    return entry


def build_index(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    data = path.read_bytes()
    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    by_key = {f.name: f for f in fields}
    arch = by_key["general.architecture"].contents()

    selected = {}
    for key in SELECTED_KEYS + [f"{arch}.{k}" for k in SELECTED_ARCH_KEYS]:
        if key in by_key:
            selected[key] = describe_field(by_key[key])["value"]

    def array_summary(key):
        if key not in by_key:
            return None
        entry = describe_field(by_key[key])
        return {"count": entry["count"], "first": entry["head"], "last": entry["tail"]}

    tensors = []
    for t in reader.tensors:
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "type_id": int(t.tensor_type),
            "dims": [int(d) for d in t.shape],  # gguf keeps the file's ggml order here
            "n_elements": int(t.n_elements),
            "offset": int(t.data_offset),  # absolute, from the start of the file
            "n_bytes": int(t.n_bytes),
        })

    return {
        "generator": {
            "script": "tests/oracle/gen_gguf_index.py",
            "gguf": importlib.metadata.version("gguf"),
            "numpy": np.__version__,
        },
        "file": path.name,
        "file_size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "version": int(reader.fields["GGUF.version"].contents()),
        "kv_count": int(reader.fields["GGUF.kv_count"].contents()),
        "tensor_count": int(reader.fields["GGUF.tensor_count"].contents()),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "selected": selected,
        "tokens": array_summary("tokenizer.ggml.tokens"),
        "merges": array_summary("tokenizer.ggml.merges"),
        "metadata": [describe_field(f) for f in fields],
        "tensors": tensors,
    }


def main() -> None:
    found = {"gguf": importlib.metadata.version("gguf"), "numpy": np.__version__}
    if found != PINNED:
        print(f"warning: pinned {PINNED}, found {found}", file=sys.stderr)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for model_file, index_file in MODELS:
        index = build_index(ROOT / "models" / model_file)
        out = OUT_DIR / index_file
        out.write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}: {index['kv_count']} keys, "
              f"{index['tensor_count']} tensors")


if __name__ == "__main__":
    main()
