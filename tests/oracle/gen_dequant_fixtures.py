#!/usr/bin/env python3
"""Writes tests/fixtures/quant/*.bin: dequantization fixtures from an independent oracle.

The oracle is gguf-py's numpy port of ggml's dequantize_row_* (gguf.quants.dequantize), not
our C++ code. tests/quant_dequantize_test.cc checks common/quant/dequantize.cc against these
files bit for bit.

Rerun (from the repository root, with the models in models/ as scripts/setup.sh puts them):

    PYTHON=$(scripts/oracle-env.sh)   # or any python with the pins below on its path
    $PYTHON tests/oracle/gen_dequant_fixtures.py

Pinned versions used to produce the committed files (see tests/oracle/requirements.txt):
gguf==0.19.0, numpy==2.4.6, Python 3.11. The script refuses to run with other gguf/numpy
versions unless --any-version is given. Output is deterministic (fixed seed, fixed tensor
choice), so rerunning with the pins reproduces the committed files byte for byte.

Contents, one file per ggml type (<type name in lower case>.bin):
  * REAL blocks (types present in the two test models): for up to three tensors of the type
    (first, middle and last of that type in file order), the first 4 and last 4 blocks
    (F32: the first and last 64 elements). Model files are checked against their sha256.
  * SYNTHETIC blocks for every type: gguf.quants.quantize of random data where gguf supports
    quantizing the type (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4); random bytes with
    controlled fp16 scale fields (typical, zero, negative, fp16 max, subnormal, inf/NaN);
    extreme codes (all bits clear / set / patterned); an all-zero block. F16 and BF16 also get
    all 65536 bit patterns; MXFP4 (no model here has it) gets every one of its 256 E8M0 scale
    bytes over random codes.

File layout (all integers little-endian uint32):
  magic            8 bytes, b"BSDQFIX1"
  type_id          ggml type id (GGMLQuantizationType)
  block_elements   elements per block (1 for F32/F16/BF16)
  block_bytes      bytes per block
  case_count
  case_count times:
    name_length, name (UTF-8, e.g. "real:gemma-3-270m-q4_k_m.gguf:blk.0.ffn_down.weight:first4")
    block_count
    raw blocks       block_count * block_bytes bytes, exactly as in a GGUF tensor
    expected         block_count * block_elements float32 values (little-endian IEEE bits)
"""

import argparse
import hashlib
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(REPO_ROOT, "tests", "fixtures", "quant")
MAGIC = b"BSDQFIX1"
SEED = 20251129

PINNED = {"gguf": "0.19.0", "numpy": "2.4.6"}

MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf":
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "gemma-3-270m-q4_k_m.gguf":
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]

# gguf.quants.quantize implements these; the K-quants get random codes instead.
QUANTIZABLE = {T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1}

# Byte offsets of the fp16 scale fields inside one block (see common/quant/ggml_blocks.h).
# "d" fields are multiplicative scales, "m" fields offsets/mins.
SCALE_FIELDS = {
    T.Q4_0: {"d": [0], "m": []},
    T.Q4_1: {"d": [0], "m": [2]},
    T.Q5_0: {"d": [0], "m": []},
    T.Q5_1: {"d": [0], "m": [2]},
    T.Q8_0: {"d": [0], "m": []},
    T.Q2_K: {"d": [80], "m": [82]},
    T.Q3_K: {"d": [108], "m": []},
    T.Q4_K: {"d": [0], "m": [2]},
    T.Q5_K: {"d": [0], "m": [2]},
    T.Q6_K: {"d": [208], "m": []},
}

# Edge-case fp16 bit patterns for scale fields.
SPECIAL_HALVES = [
    0x0000,  # +0: a zero scale
    0x8000,  # -0
    0x3C00,  # 1.0
    0xBC00,  # -1.0: negative scale
    0x7BFF,  # 65504, fp16 max
    0xFBFF,  # -65504
    0x0001,  # smallest subnormal, 2^-24
    0x03FF,  # largest subnormal
    0x8001,  # negative subnormal
    0x0400,  # smallest normal, 2^-14
    0x2E66,  # ~0.1
    0x1A00,  # ~0.0029, a typical K-quant super-block scale
]
NONFINITE_HALVES = [0x7C00, 0xFC00, 0x7E00]  # +inf, -inf, NaN

CODE_PATTERNS = [0x00, 0xFF, 0x55, 0xAA, 0x0F, 0xF0, 0x80, 0x7F]


def check_versions(allow_any):
    found = {"gguf": getattr(gguf, "__version__", None), "numpy": np.__version__}
    if found["gguf"] is None:
        from importlib.metadata import version
        found["gguf"] = version("gguf")
    if found != PINNED and not allow_any:
        sys.exit(f"versions {found} differ from the pins {PINNED}; pass --any-version to override")


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dequantize(raw, qtype):
    """The oracle: gguf-py's numpy dequantization of raw block bytes."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    # Non-finite scale cases make inf * 0 = NaN on purpose.
    with np.errstate(invalid="ignore", over="ignore"):
        if qtype == T.F32:
            out = raw.view(np.float32)
        elif qtype == T.F16:
            out = gguf.quants.dequantize(raw.view(np.float16), qtype)
        else:
            out = gguf.quants.dequantize(raw, qtype)
    return np.ascontiguousarray(out, dtype=np.float32).reshape(-1)


def random_typical_halves(rng, count, signed):
    """fp16 bit patterns of plausible scale magnitudes (about 1e-4 .. 1)."""
    magnitude = np.exp(rng.uniform(np.log(1e-4), np.log(1.0), size=count))
    if signed:
        magnitude *= rng.choice([-1.0, 1.0], size=count)
    return magnitude.astype(np.float16).view(np.uint16)


def set_half(blocks, offset, values):
    values = np.broadcast_to(np.asarray(values, dtype=np.uint16), (blocks.shape[0],))
    blocks[:, offset:offset + 2] = values.astype("<u2").view(np.uint8).reshape(-1, 2)


def set_scales(blocks, qtype, d_values, m_values):
    for offset in SCALE_FIELDS[qtype]["d"]:
        set_half(blocks, offset, d_values)
    for offset in SCALE_FIELDS[qtype]["m"]:
        set_half(blocks, offset, m_values)


def code_mask(qtype, block_bytes):
    """True for the bytes of a block that are not fp16 scale fields."""
    mask = np.ones(block_bytes, dtype=bool)
    for offset in SCALE_FIELDS[qtype]["d"] + SCALE_FIELDS[qtype]["m"]:
        mask[offset:offset + 2] = False
    return mask


def synthetic_cases(qtype, rng):
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    cases = []

    if qtype == T.F32:
        values = np.concatenate([
            rng.standard_normal(256).astype(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38,
                      3.4028235e38, -3.4028235e38], dtype=np.float32),
        ])
        cases.append(("synthetic:random_and_special", values.view(np.uint8)))
        return cases

    if qtype == T.MXFP4:
        return mxfp4_cases(rng)

    if qtype in (T.F16, T.BF16):
        cases.append(("synthetic:all_bit_patterns",
                      np.arange(65536, dtype=np.uint32).astype("<u2").view(np.uint8)))
        for scale in (1e-3, 1.0, 1e3):
            data = (rng.standard_normal(256) * scale).astype(np.float32)
            raw = gguf.quants.quantize(data, qtype)
            cases.append((f"synthetic:gguf_quantize_normal_x{scale:g}",
                          np.ascontiguousarray(raw).view(np.uint8).reshape(-1)))
        return cases

    if qtype in QUANTIZABLE:
        for scale in (1e-3, 1.0, 100.0):
            data = (rng.standard_normal(16 * block_elements) * scale).astype(np.float32)
            raw = gguf.quants.quantize(data.reshape(16, block_elements), qtype)
            cases.append((f"synthetic:gguf_quantize_normal_x{scale:g}", raw.reshape(-1)))
        # Skewed data (all positive, with outliers) exercises Q4_1/Q5_1 mins far from zero.
        data = rng.exponential(2.0, size=16 * block_elements).astype(np.float32) + 5.0
        data[rng.integers(0, data.size, size=8)] *= 50.0
        raw = gguf.quants.quantize(data.reshape(16, block_elements), qtype)
        cases.append(("synthetic:gguf_quantize_skewed_outliers", raw.reshape(-1)))
        # Constant blocks: zero range, so Q4_1/Q5_1 get d == 0 and everything rides on m.
        data = np.repeat(rng.standard_normal(4).astype(np.float32), block_elements)
        raw = gguf.quants.quantize(data.reshape(4, block_elements), qtype)
        cases.append(("synthetic:gguf_quantize_constant_blocks", raw.reshape(-1)))

    has_min = bool(SCALE_FIELDS[qtype]["m"])

    # Random codes with typical scales.
    count = 32
    blocks = rng.integers(0, 256, size=(count, block_bytes), dtype=np.uint8)
    set_scales(blocks, qtype, random_typical_halves(rng, count, signed=False),
               random_typical_halves(rng, count, signed=True))
    cases.append(("synthetic:random_codes_typical_scales", blocks.reshape(-1)))

    # Random codes with each special scale value, in every scale field, alone and combined.
    rows = []
    for special in SPECIAL_HALVES:
        block = rng.integers(0, 256, size=(1, block_bytes), dtype=np.uint8)
        set_scales(block, qtype, special, special)
        rows.append(block)
        if has_min:
            typical = random_typical_halves(rng, 2, signed=True)
            block = rng.integers(0, 256, size=(1, block_bytes), dtype=np.uint8)
            set_scales(block, qtype, special, typical[0])
            rows.append(block)
            block = rng.integers(0, 256, size=(1, block_bytes), dtype=np.uint8)
            set_scales(block, qtype, int(typical[1]) & 0x7FFF, special)  # positive d
            rows.append(block)
    cases.append(("synthetic:special_scales", np.concatenate(rows).reshape(-1)))

    # Extreme and patterned codes with a normal scale and with fp16-max scales.
    mask = code_mask(qtype, block_bytes)
    rows = []
    for pattern in CODE_PATTERNS:
        for d, m in ((0x2E66, 0xAE66), (0x7BFF, 0xFBFF)):
            block = np.full((1, block_bytes), pattern, dtype=np.uint8)
            block[:, ~mask] = 0
            set_scales(block, qtype, d, m)
            rows.append(block)
    cases.append(("synthetic:extreme_codes", np.concatenate(rows).reshape(-1)))

    cases.append(("synthetic:all_zero_block", np.zeros(block_bytes, dtype=np.uint8)))

    # Non-finite scales: ggml propagates them (inf * 0 = NaN); the test treats NaN == NaN.
    rows = []
    for special in NONFINITE_HALVES:
        block = rng.integers(0, 256, size=(1, block_bytes), dtype=np.uint8)
        set_scales(block, qtype, special, 0x2E66)
        rows.append(block)
        if has_min:
            block = rng.integers(0, 256, size=(1, block_bytes), dtype=np.uint8)
            set_scales(block, qtype, 0x2E66, special)
            rows.append(block)
    cases.append(("synthetic:nonfinite_scales", np.concatenate(rows).reshape(-1)))
    return cases


def mxfp4_cases(rng):
    """MXFP4 (gpt-oss's experts): one E8M0 scale byte, then 16 bytes of E2M1 code pairs."""
    block_elements, block_bytes = GGML_QUANT_SIZES[T.MXFP4]
    cases = []
    for scale in (1e-3, 1.0, 100.0):
        data = (rng.standard_normal(16 * block_elements) * scale).astype(np.float32)
        raw = gguf.quants.quantize(data.reshape(16, block_elements), T.MXFP4)
        cases.append((f"synthetic:gguf_quantize_normal_x{scale:g}", raw.reshape(-1)))
    # Every scale exponent, the two denormal ones (0, 1) and 255 (NaN in OCP MX, a power of two
    # in ggml) included, each over random codes.
    blocks = rng.integers(0, 256, size=(256, block_bytes), dtype=np.uint8)
    blocks[:, 0] = np.arange(256, dtype=np.uint8)
    cases.append(("synthetic:every_scale_exponent", blocks.reshape(-1)))
    rows = []
    for pattern in CODE_PATTERNS:
        for exponent in (0, 1, 2, 127, 254, 255):
            block = np.full((1, block_bytes), pattern, dtype=np.uint8)
            block[:, 0] = exponent
            rows.append(block)
    cases.append(("synthetic:extreme_codes", np.concatenate(rows).reshape(-1)))
    cases.append(("synthetic:all_zero_block", np.zeros(block_bytes, dtype=np.uint8)))
    return cases


def real_cases(qtype, readers):
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    # F32 "blocks" are single elements; take 64 of them instead of 4.
    edge_blocks = 64 if qtype == T.F32 else 4
    cases = []
    for model_name, reader in readers:
        tensors = [t for t in reader.tensors if t.tensor_type == qtype]
        if not tensors:
            continue
        picks = sorted({0, len(tensors) // 2, len(tensors) - 1})
        for index in picks:
            tensor = tensors[index]
            raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
            block_count = raw.size // block_bytes
            assert block_count * block_elements == tensor.n_elements, tensor.name
            take = min(edge_blocks, block_count)
            first = raw[:take * block_bytes]
            last = raw[(block_count - take) * block_bytes:]
            cases.append((f"real:{model_name}:{tensor.name}:first{take}", first))
            cases.append((f"real:{model_name}:{tensor.name}:last{take}", last))
    return cases


def write_fixture(qtype, cases):
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    out = bytearray(MAGIC)
    out += struct.pack("<4I", int(qtype), block_elements, block_bytes, len(cases))
    for name, raw in cases:
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        assert raw.size % block_bytes == 0, name
        block_count = raw.size // block_bytes
        expected = dequantize(raw.copy(), qtype)
        assert expected.size == block_count * block_elements, name
        encoded = name.encode("utf-8")
        out += struct.pack("<I", len(encoded)) + encoded
        out += struct.pack("<I", block_count)
        out += raw.tobytes()
        out += expected.astype("<f4").tobytes()
    path = os.path.join(OUT_DIR, f"{qtype.name.lower()}.bin")
    with open(path, "wb") as f:
        f.write(out)
    return path, len(out), len(cases)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=os.environ.get(
        "BITSPLIT_MODELS_DIR", os.path.join(REPO_ROOT, "models")))
    parser.add_argument("--any-version", action="store_true",
                        help="run even if gguf/numpy differ from the pinned versions")
    args = parser.parse_args()
    check_versions(args.any_version)

    readers = []
    for name, expected_sha in MODELS.items():
        path = os.path.join(args.models_dir, name)
        actual_sha = sha256_of(path)
        if actual_sha != expected_sha:
            sys.exit(f"{path}: sha256 {actual_sha}, expected {expected_sha}")
        readers.append((name, gguf.GGUFReader(path)))

    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for qtype in TYPES:
        # One generator per type, so adding a type does not change the others' fixtures.
        rng = np.random.default_rng([SEED, int(qtype)])
        cases = real_cases(qtype, readers) + synthetic_cases(qtype, rng)
        path, size, count = write_fixture(qtype, cases)
        total += size
        print(f"{os.path.relpath(path, REPO_ROOT)}: {count} cases, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
