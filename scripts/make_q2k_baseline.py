#!/usr/bin/env python3
"""Writes llama.cpp's own Q2_K quantization of a GGUF model: the Q2_K baseline row of
`bitsplit eval` (docs/quality.md).

    $(scripts/oracle-env.sh) scripts/make_q2k_baseline.py [--model IN.gguf] [--out OUT.gguf]

Runs llama_cpp.llama_model_quantize (llama-cpp-python, built from source by
scripts/oracle-env.sh) with ftype LLAMA_FTYPE_MOSTLY_Q2_K and no importance matrix. The input
is the ORIGINAL shipped file (for SmolLM2 the Q4_1 GGUF, whose token embedding is Q8_0), so
llama.cpp requantizes already-quantized weights: allow_requantize must be on. Q2_K is a mix:
llama.cpp keeps some tensors at other types (the script prints the tensor type census of the
output so the caller sees exactly what was produced). Default output:
~/.cache/bitsplit/eval/<model stem>.llama-q2_k.gguf (outside the checkout, not committed).
"""
import argparse
import collections
import hashlib
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import llama_cpp  # the oracle venv only
    import gguf

    src = pathlib.Path(args.model).resolve()
    if args.out is None:
        cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        stem = src.name[: -len(".gguf")] if src.name.endswith(".gguf") else src.name
        out = cache / "bitsplit" / "eval" / f"{stem}.llama-q2_k.gguf"
    else:
        out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K
    params.allow_requantize = True  # the source is already Q4_1 / Q8_0
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        sys.exit(f"llama_model_quantize failed with {rc}")
    os.replace(tmp, out)

    reader = gguf.GGUFReader(str(out))
    census = collections.Counter(t.tensor_type.name for t in reader.tensors)
    per_name = collections.defaultdict(collections.Counter)
    for t in reader.tensors:
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name
        per_name[kind][t.tensor_type.name] += 1
    print(f"llama-cpp-python {llama_cpp.__version__}: {src.name} -> {out}")
    print(f"sha256 {sha256(out)}, {out.stat().st_size} bytes")
    print("tensor types:", dict(census))
    for kind in sorted(per_name):
        print(f"  {kind}: {dict(per_name[kind])}")


if __name__ == "__main__":
    main()
