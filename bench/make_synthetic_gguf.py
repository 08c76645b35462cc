#!/usr/bin/env python3
"""Writes a qwen2 GGUF of a flagship's shapes with random Q8_0 weights, for the scale benchmark
(bench/scale_bench.sh): the metadata and the real tokenizer come from a vocab-only GGUF
(models/DeepSeek-R1-Distill-Qwen-7B.vocab.gguf, which has Qwen2.5-7B's shapes), the weights are
random. Shapes and speed only: random weights never give quality or acceptance numbers.

  make_synthetic_gguf.py OUT.gguf [--shape qwen2.5-7b|70b] [--layers N] [--seed S]

--shape 70b keeps the qwen2 graph and tokenizer but takes Llama-3.1-70B's widths (d 8192, 64/8
heads, d_ff 28672, 80 layers). --layers N writes only the first N layers (a slice: every layer
has the same shapes, so per-layer rates carry over). Tensors are streamed to the file one at a
time, so memory stays at the largest tensor.
"""
import argparse
import sys
import time

import numpy as np
import gguf

SHAPES = {
    # name: (layers, d_model, heads, kv_heads, d_ff)
    "qwen2.5-7b": (28, 3584, 28, 4, 18944),
    "70b": (80, 8192, 64, 8, 28672),
}
Q8_0_BLOCK = 32
Q8_0_BYTES = 34


def q8_0_bytes(rows: int, cols: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """Random Q8_0 blocks whose values have roughly the standard deviation `std`."""
    blocks = rows * cols // Q8_0_BLOCK
    out = np.empty((blocks, Q8_0_BYTES), dtype=np.uint8)
    # Uniform codes in [-127, 127] have standard deviation 73.3; scale them to `std`.
    scale = np.float16(std / 73.3)
    out[:, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    out[:, 2:] = rng.integers(-127, 128, size=(blocks, Q8_0_BLOCK), dtype=np.int8).view(np.uint8)
    return out.reshape(rows, cols // Q8_0_BLOCK * Q8_0_BYTES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--vocab", default="models/DeepSeek-R1-Distill-Qwen-7B.vocab.gguf")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    parser.add_argument("--layers", type=int, default=0, help="first N layers only (0: all)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    layers, d, heads, kv_heads, d_ff = SHAPES[args.shape]
    if args.layers:
        if not 0 < args.layers <= layers:
            sys.exit(f"--layers must be in 1..{layers}")
        layers = args.layers
    head_dim = d // heads
    reader = gguf.GGUFReader(args.vocab)
    if reader.fields["general.architecture"].contents() != "qwen2":
        sys.exit(f"{args.vocab}: expected a qwen2 vocab GGUF")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())

    writer = gguf.GGUFWriter(args.out, "qwen2")
    overrides = {
        "qwen2.block_count": layers,
        "qwen2.embedding_length": d,
        "qwen2.feed_forward_length": d_ff,
        "qwen2.attention.head_count": heads,
        "qwen2.attention.head_count_kv": kv_heads,
        "general.name": f"synthetic {args.shape} ({layers} layers, random Q8_0)",
    }
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = overrides.get(name, field.contents())
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(name, value, field.types[0], sub_type)
    if "general.name" not in reader.fields:
        writer.add_string("general.name", overrides["general.name"])

    # (name, rows, cols, kind): kind q8 = a Q8_0 matrix, norm = f32 ones, bias = small f32.
    tensors = [("token_embd.weight", vocab, d, "q8")]
    for i in range(layers):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", 1, d, "norm"),
            (p + "attn_q.weight", heads * head_dim, d, "q8"),
            (p + "attn_q.bias", 1, heads * head_dim, "bias"),
            (p + "attn_k.weight", kv_heads * head_dim, d, "q8"),
            (p + "attn_k.bias", 1, kv_heads * head_dim, "bias"),
            (p + "attn_v.weight", kv_heads * head_dim, d, "q8"),
            (p + "attn_v.bias", 1, kv_heads * head_dim, "bias"),
            (p + "attn_output.weight", d, heads * head_dim, "q8"),
            (p + "ffn_norm.weight", 1, d, "norm"),
            (p + "ffn_gate.weight", d_ff, d, "q8"),
            (p + "ffn_up.weight", d_ff, d, "q8"),
            (p + "ffn_down.weight", d, d_ff, "q8"),
        ]
    tensors += [("output_norm.weight", 1, d, "norm"), ("output.weight", vocab, d, "q8")]

    for name, rows, cols, kind in tensors:
        if kind == "q8":
            nbytes = rows * cols // Q8_0_BLOCK * Q8_0_BYTES
            writer.add_tensor_info(name, [rows, cols // Q8_0_BLOCK * Q8_0_BYTES], np.uint8, nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            shape = [cols] if rows == 1 else [rows, cols]
            writer.add_tensor_info(name, shape, np.float32, rows * cols * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    rng = np.random.default_rng(args.seed)
    total = sum(rows * cols for _, rows, cols, _ in tensors)
    done, start, reported = 0, time.time(), 0
    for name, rows, cols, kind in tensors:
        if kind == "q8":
            # 1/sqrt(d) keeps the residual stream from growing layer by layer.
            data = q8_0_bytes(rows, cols, rng, 1.0 / np.sqrt(cols))
        elif kind == "norm":
            data = np.ones(cols, dtype=np.float32)
        else:
            data = rng.normal(0.0, 0.02, cols).astype(np.float32)
        writer.write_tensor_data(data)
        done += rows * cols
        line = (f"[make_synthetic_gguf] {100 * done / total:5.1f}%  {name:<28} "
                f"{time.time() - start:6.1f} s")
        if sys.stderr.isatty():
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif int(20 * done / total) > reported:  # a line every 5% in logs
            reported = int(20 * done / total)
            print(line, file=sys.stderr, flush=True)
    writer.close()
    print(f"\n[make_synthetic_gguf] {args.out}: {total / 1e9:.2f} B parameters, "
          f"{layers} layers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
