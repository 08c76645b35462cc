#!/usr/bin/env python3
"""Writes tests/fixtures/quant/q8_0_quantize.bin: Q8_0 quantization fixtures from gguf-py.

The oracle is gguf-py's numpy port of ggml's quantize_row_q8_0_ref
(gguf.quants.quantize(..., GGMLQuantizationType.Q8_0)), not our C++ code.
tests/quant_split_q8_0_test.cc checks QuantizeQ8_0Row (common/quant/split_format.h) against it
byte for byte.

Rerun (from the repository root):

    PYTHON=$(scripts/oracle-env.sh)   # or any python with the pins below on its path
    $PYTHON tests/oracle/gen_q8_0_fixtures.py

Pinned versions used to produce the committed file (see tests/oracle/requirements.txt):
gguf==0.19.0, numpy==2.4.6. The script refuses other versions unless --any-version is given.
Output is deterministic (fixed seed), so rerunning with the pins reproduces the file exactly.

Cases (all finite inputs; blocks whose 1/d overflows f32 are left out because ggml's own
behaviour there is undefined: roundf(inf) converted to int8):
  * Gaussian rows at several magnitudes, skewed data with outliers, log-uniform magnitudes
    per block (1e-6 .. 1e4), so d covers fp16 subnormals through large normals;
  * exact rounding ties (x * id = k + 0.5, positive and negative: roundf rounds away from 0);
  * all-zero, constant, single-spike and alternating-sign blocks, negative zeros;
  * a block whose d overflows fp16 (stored as inf), and one whose d is an fp16 subnormal.

File layout (integers little-endian uint32):
  magic        8 bytes, b"BSQ8QFX1"
  case_count
  case_count times:
    name_length, name (UTF-8)
    block_count
    input      block_count * 32 float32 values
    expected   block_count * 34 bytes (block_q8_0: fp16 d, 32 int8 codes)
"""

import argparse
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_PATH = os.path.join(REPO_ROOT, "tests", "fixtures", "quant", "q8_0_quantize.bin")
MAGIC = b"BSQ8QFX1"
SEED = 20251130
PINNED = {"gguf": "0.19.0", "numpy": "2.4.6"}
QK = 32


def check_versions(allow_any):
    found = {"gguf": getattr(gguf, "__version__", None), "numpy": np.__version__}
    if found["gguf"] is None:
        from importlib.metadata import version
        found["gguf"] = version("gguf")
    if found != PINNED and not allow_any:
        sys.exit(f"versions {found} differ from the pins {PINNED}; pass --any-version to override")


def cases(rng):
    out = []

    def add(name, values):
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, QK)
        out.append((name, values))

    for scale in (1e-3, 1.0, 100.0):
        add(f"gaussian_x{scale:g}", rng.standard_normal(64 * QK) * scale)
    skewed = rng.exponential(2.0, size=32 * QK) + 5.0
    skewed[rng.integers(0, skewed.size, size=16)] *= 50.0
    add("skewed_outliers", skewed)
    magnitudes = np.exp(rng.uniform(np.log(1e-6), np.log(1e4), size=(64, 1)))
    add("log_uniform_block_magnitudes", rng.standard_normal((64, QK)) * magnitudes)

    # Ties: amax = 127 gives d = 1 and id = 1 exactly, so x * id = x; half-integers are ties.
    ties = np.zeros((4, QK), dtype=np.float32)
    ties[:, 0] = 127.0
    ties[0, 1:] = np.arange(1, QK) - 15.5
    ties[1, 1:] = -(np.arange(1, QK) - 15.5)
    ties[2, 1:] = 0.5
    ties[3, 0] = -127.0
    ties[3, 1:] = -0.5
    add("exact_ties", ties)
    # amax = 63.5 gives d = 0.5 and id = 2: values k/2 + 1/4 are ties too.
    ties_half = np.full((2, QK), 0.25, dtype=np.float32) + np.arange(QK, dtype=np.float32) / 2
    ties_half[:, 0] = 63.5
    ties_half[1] *= -1
    add("exact_ties_scaled", ties_half)

    special = np.zeros((8, QK), dtype=np.float32)
    special[1, :] = 3.25                                   # constant
    special[2, 17] = -2.0                                  # single negative spike
    special[3, :] = np.where(np.arange(QK) % 2 == 0, 1.0, -1.0) * 0.7  # alternating
    special[4, :] = -0.0                                   # negative zeros
    special[5, :] = rng.standard_normal(QK) * 1e7 / 3      # d overflows fp16 -> inf
    special[5, 0] = 1e7
    special[6, :] = rng.standard_normal(QK) * 1e-6         # d is an fp16 subnormal
    special[7, :] = rng.standard_normal(QK)
    special[7, 9] = 1e-30                                  # tiny next to normal values
    add("special_blocks", special)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--any-version", action="store_true")
    args = parser.parse_args()
    check_versions(args.any_version)
    rng = np.random.default_rng(SEED)
    blob = bytearray(MAGIC)
    all_cases = cases(rng)
    blob += struct.pack("<I", len(all_cases))
    for name, values in all_cases:
        with np.errstate(over="ignore"):  # the fp16 overflow case warns on purpose
            quantized = gguf.quants.quantize(values, T.Q8_0)
        quantized = np.ascontiguousarray(quantized, dtype=np.uint8).reshape(-1)
        assert quantized.size == values.shape[0] * 34, name
        encoded = name.encode("utf-8")
        blob += struct.pack("<I", len(encoded)) + encoded
        blob += struct.pack("<I", values.shape[0])
        blob += values.astype("<f4").tobytes()
        blob += quantized.tobytes()
    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    with open(OUT_PATH, "wb") as f:
        f.write(blob)
    print(f"{os.path.relpath(OUT_PATH, REPO_ROOT)}: {len(all_cases)} cases, {len(blob)} bytes")


if __name__ == "__main__":
    main()
