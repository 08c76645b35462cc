#!/usr/bin/env python3
"""Generates tests/fixtures/gguf/ggml_types.json for tests/io_gguf_reader_test.cc.

The independent oracle is the `gguf` Python package (llama.cpp's gguf-py): every ggml type id
it defines (GGMLQuantizationType), with its name and its block geometry from GGML_QUANT_SIZES
(elements per block, bytes per block), which gguf-py keeps in step with ggml's type traits.
The C++ table (common/io/ggml_type.cc) must hold exactly these ids with these values.

Rerun (needs the oracle environment, see scripts/oracle-env.sh; pinned versions in
tests/oracle/requirements.txt: gguf 0.19.0, numpy 2.4.6), from the repository root:
    $(scripts/oracle-env.sh) tests/oracle/gen_ggml_types.py
or, with gguf 0.19.0 and numpy 2.4.6 installed under some directory DIR:
    PYTHONPATH=DIR python3 tests/oracle/gen_ggml_types.py
"""
import importlib.metadata
import json
import sys
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "gguf" / "ggml_types.json"
PINNED = {"gguf": "0.19.0"}


def main() -> None:
    found = {"gguf": importlib.metadata.version("gguf")}
    if found != PINNED:
        print(f"warning: pinned {PINNED}, found {found}", file=sys.stderr)
    types = []
    for t in sorted(GGMLQuantizationType, key=int):
        block_elements, block_bytes = GGML_QUANT_SIZES[t]
        types.append({
            "id": int(t),
            "name": t.name,
            "block_elements": block_elements,
            "block_bytes": block_bytes,
        })
    fixture = {
        "generator": {"script": "tests/oracle/gen_ggml_types.py", **found},
        "types": types,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(types)} types")


if __name__ == "__main__":
    main()
