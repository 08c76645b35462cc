#!/usr/bin/env python3
"""Generates the llama.cpp logits fixtures of small random-weight qwen2, qwen3, qwen3moe, gemma4
and gpt-oss models.

No small trained Qwen or Gemma 4 model is available here, so these fixtures prove the arithmetic
of the families' forward passes (q/k/v biases; QK-norm; NEOX RoPE; GQA; tied head; qwen3moe's
softmax routing to the top-k of 16 experts with renormalized weights; gemma4's mixed
sliding/global layers with their own head widths and KV head counts, a global layer whose values
are its keys, the weightless value norm, proportional RoPE through rope_freqs, layer output
scales and the final logit soft-cap), not the quality of any model: the weights are random.

Each model is written with the `gguf` package's writer: the architecture's metadata, the real
qwen2 tokenizer metadata (every tokenizer.* key of models/DeepSeek-R1-Distill-Qwen-7B.vocab.gguf,
so llama.cpp loads a real 152,064-token vocabulary), and F32 tensors whose values follow a
counter-based rule that the C++ test reproduces without Python (tests/testing/synthetic_weights.h):

    seed  = FNV-1a-64(architecture + "/" + tensor name)   (the record's seed_name where it has one)
    k_i   = (splitmix64(seed + i) >> 40) - 2^23                      (an integer in [-2^23, 2^23))
    w_i   = float32(offset) + float32(k_i) * float32(scale * 2^-23)  (float32 arithmetic)

i counts elements in storage order (ggml's: the contiguous dimension first). gpt-oss's experts
are MXFP4, as the released GGUFs store them: their bytes follow the same kind of rule
(synthetic_mxfp4), and llama.cpp runs their exact F32 dequantization (as the quantized real
models' fixtures run an F32 copy: llama.cpp's MXFP4 matmul would quantize the activations to
Q8_0, a different function), while the C++ side reads the MXFP4 bytes. The fixture stores
the recipe (metadata, tensor names, shapes, scale, offset) and the sha256 of each tensor's bytes,
so the C++ side proves it rebuilt exactly the tensors llama.cpp ran before comparing logits.

llama.cpp runs each model with an f32 KV cache on token ids from the real tokenizer (several
texts of tests/oracle/logit_prompts.json, BOS first as the GGUF asks). Per prompt: the tokens,
llama.cpp's 16-token greedy continuation, and at every position the top-K logits, the
log-sum-exp and TAIL_SAMPLES tail samples (gen_logits_fixtures.top_k_record).

Rerun (needs the oracle environment, see scripts/oracle-env.sh); architectures may be named to
regenerate only their fixtures. gemma4 runs GELU, so its oracle is the exact-GELU build (as for
gemma3, docs/design.md):
    $(scripts/oracle-env.sh) tests/oracle/gen_synthetic_logits_fixtures.py qwen2 qwen3 qwen3moe gpt-oss
    $(scripts/oracle-env.sh --exact-gelu) tests/oracle/gen_synthetic_logits_fixtures.py gemma4
"""
import hashlib
import json
import sys
from pathlib import Path

import gguf
import numpy as np
from llama_cpp import Llama

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_logits_fixtures import CACHE, ROOT, run  # noqa: E402

VOCAB = ROOT / "models" / "DeepSeek-R1-Distill-Qwen-7B.vocab.gguf"
TOP_K = 64
TAIL_SAMPLES = 32
CONTINUATION = 16
PROMPTS = ["plain_long_apache", "plain_long_mpl", "chat_explain", "chat_system_code",
           "plain_short_capital"]

D_MODEL, D_FF, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 4, 2, 64
MODELS = {
    "qwen2": {"layers": 2, "bias": True, "qk_norm": False, "rope_base": 1e6},
    "qwen3": {"layers": 3, "bias": False, "qk_norm": True, "rope_base": 1e6},
    # Every layer a mixture of 16 experts of width 128, 4 used per token (Qwen3-30B-A3B: 128
    # experts of 768, 8 used).
    "qwen3moe": {"layers": 3, "bias": False, "qk_norm": True, "rope_base": 1e6,
                 "experts": 16, "experts_used": 4, "d_ff_expert": 128},
    # Gemma 4 31B's layer kinds at small size: local layers (window 32, RoPE base 1e4) of 4 heads
    # over 2 KV heads of 64; global layers (RoPE base 1e6) of 4 heads over 1 KV head of 128 with
    # proportional RoPE (a quarter of the pairs rotate); layer 2 has no attn_v (its values are
    # its keys), layer 4 has one.
    "gemma4": {"layers": 5, "bias": False, "qk_norm": True, "rope_base": 1e6,
               "local": [True, True, False, True, False], "window": 32,
               "head_dim_local": 64, "kv_heads_local": 2, "head_dim_global": 128,
               "kv_heads_global": 1, "no_v": [2], "rope_base_local": 1e4,
               "rotary_fraction_global": 0.25, "softcap": 30.0},
    # Gemma 4 26B-A4B's layers at small size: the dense FFN (width 256) beside 16 experts of
    # width 64 with 4 used; gate and up of the experts fused in one tensor as the converter
    # writes them; the router on the scaled RMS-normed hidden state; per-expert output scales.
    "gemma4moe": {"arch": "gemma4", "layers": 3, "bias": False, "qk_norm": True,
                  "rope_base": 1e6, "local": [True, False, True], "window": 32,
                  "head_dim_local": 64, "kv_heads_local": 2, "head_dim_global": 128,
                  "kv_heads_global": 1, "no_v": [1], "rope_base_local": 1e4,
                  "rotary_fraction_global": 0.25, "softcap": 30.0, "d_ff": 256,
                  "experts": 16, "experts_used": 4, "d_ff_expert": 64},
    # gpt-oss-20b's layer at small size: local (window 32) and global layers alternating from a
    # local layer 0, 4 heads over 2 KV heads of 64 with q/k/v/o biases and attention sinks,
    # YaRN RoPE (factor 32 over a 4096-token original context, base 150000) on every layer,
    # 16 experts of width 128 in MXFP4 with 4 used, their router and matrices biased.
    "gpt-oss": {"layers": 4, "window": 32, "rope_base": 150000.0, "yarn_factor": 32.0,
                "yarn_original_context": 4096, "experts": 16, "experts_used": 4,
                "d_ff_expert": 128},
}


def architecture(model: str) -> str:
    """general.architecture of a model of MODELS (its key unless it names another)."""
    return MODELS[model].get("arch", model)

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def synthetic_values(arch: str, name: str, count: int, scale: float, offset: float) -> np.ndarray:
    seed = np.uint64(fnv1a64(f"{arch}/{name}"))
    with np.errstate(over="ignore"):
        counters = seed + np.arange(count, dtype=np.uint64)
    k = (splitmix64(counters) >> np.uint64(40)).astype(np.int64) - (1 << 23)
    values = k.astype(np.float32) * np.float32(scale * 2.0 ** -23)
    if offset != 0.0:
        values = np.float32(offset) + values
    return values.astype(np.float32)


MXFP4_BLOCK = 32
MXFP4_BLOCK_BYTES = 17


def synthetic_mxfp4(arch: str, name: str, count: int) -> np.ndarray:
    """The MXFP4 bytes of a `count`-element tensor: per block b an E8M0 scale of 121 or 122
    (2^-7 or 2^-6 times the doubled E2M1 codes: a spread like a uniform draw of width 0.2) from
    splitmix64(seed + b), and code bytes j from splitmix64(seed + blocks + 16 b + j) >> 56."""
    blocks = count // MXFP4_BLOCK
    seed = np.uint64(fnv1a64(f"{arch}/{name}"))
    with np.errstate(over="ignore"):
        scale_counters = seed + np.arange(blocks, dtype=np.uint64)
        code_counters = seed + np.uint64(blocks) + np.arange(blocks * 16, dtype=np.uint64)
    scales = (np.uint64(121) + (splitmix64(scale_counters) >> np.uint64(63))).astype(np.uint8)
    codes = (splitmix64(code_counters) >> np.uint64(56)).astype(np.uint8).reshape(blocks, 16)
    return np.concatenate([scales.reshape(blocks, 1), codes], axis=1).reshape(-1)


def gpt_oss_tensor_specs(model: str, vocab: int):
    """(name, dims, scale, offset[, format]) of the gpt-oss model: its experts MXFP4."""
    cfg = MODELS[model]
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    e, w = cfg["experts"], cfg["d_ff_expert"]
    norm = (1.0 / 4, 1.0)
    specs = [("token_embd.weight", [D_MODEL, vocab], 0.5, 0.0),
             ("output_norm.weight", [D_MODEL], *norm),
             # gpt-oss requires its own output matrix; it holds the embedding's values (a tied
             # head), which makes the random model's next token depend strongly on its input,
             # as the tied qwen and gemma models do, so that a draft can agree with it.
             ("output.weight", [D_MODEL, vocab], 0.5, 0.0, "token_embd.weight")]
    for layer in range(cfg["layers"]):
        b = f"blk.{layer}."
        specs += [(b + "attn_norm.weight", [D_MODEL], *norm),
                  (b + "attn_q.weight", [D_MODEL, q_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_q.bias", [q_dim], 0.5, 0.0),
                  (b + "attn_k.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_k.bias", [kv_dim], 0.5, 0.0),
                  (b + "attn_v.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_v.bias", [kv_dim], 0.5, 0.0),
                  (b + "attn_output.weight", [q_dim, D_MODEL], (3 / q_dim) ** 0.5, 0.0),
                  (b + "attn_output.bias", [D_MODEL], 0.25, 0.0),
                  # Sinks around the scores' scale, so that they take a real share.
                  (b + "attn_sinks.weight", [HEADS], 2.0, 0.0),
                  (b + "post_attention_norm.weight", [D_MODEL], *norm),
                  (b + "ffn_gate_inp.weight", [D_MODEL, e], (3 / D_MODEL) ** 0.5 * 2, 0.0),
                  (b + "ffn_gate_inp.bias", [e], 0.5, 0.0),
                  (b + "ffn_gate_exps.weight", [D_MODEL, w, e], None, "MXFP4"),
                  (b + "ffn_gate_exps.bias", [w, e], 0.5, 0.0),
                  (b + "ffn_up_exps.weight", [D_MODEL, w, e], None, "MXFP4"),
                  (b + "ffn_up_exps.bias", [w, e], 0.5, 0.0),
                  (b + "ffn_down_exps.weight", [w, D_MODEL, e], None, "MXFP4"),
                  (b + "ffn_down_exps.bias", [D_MODEL, e], 0.25, 0.0)]
    return specs


def gpt_oss_metadata(model: str):
    cfg = MODELS[model]
    arch = architecture(model)
    return [("general.architecture", "STRING", arch),
            (f"{arch}.block_count", "UINT32", cfg["layers"]),
            (f"{arch}.context_length", "UINT32",
             int(cfg["yarn_original_context"] * cfg["yarn_factor"])),
            (f"{arch}.embedding_length", "UINT32", D_MODEL),
            (f"{arch}.feed_forward_length", "UINT32", cfg["d_ff_expert"]),
            (f"{arch}.attention.head_count", "UINT32", HEADS),
            (f"{arch}.attention.head_count_kv", "UINT32", KV_HEADS),
            (f"{arch}.attention.key_length", "UINT32", HEAD_DIM),
            (f"{arch}.attention.value_length", "UINT32", HEAD_DIM),
            (f"{arch}.rope.freq_base", "FLOAT32", cfg["rope_base"]),
            (f"{arch}.rope.scaling.type", "STRING", "yarn"),
            (f"{arch}.rope.scaling.factor", "FLOAT32", cfg["yarn_factor"]),
            (f"{arch}.rope.scaling.original_context_length", "UINT32",
             cfg["yarn_original_context"]),
            (f"{arch}.attention.sliding_window", "UINT32", cfg["window"]),
            (f"{arch}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5),
            (f"{arch}.expert_count", "UINT32", cfg["experts"]),
            (f"{arch}.expert_used_count", "UINT32", cfg["experts_used"]),
            (f"{arch}.expert_feed_forward_length", "UINT32", cfg["d_ff_expert"])]


def gemma4_rope_factors(cfg):
    """The converter's rope_freqs of a global layer: 1 for the rotating pairs, 1e30 (no turn)
    for the rest (convert_hf_to_gguf's Gemma4Model.generate_extra_tensors)."""
    pairs = cfg["head_dim_global"] // 2
    rotating = int(cfg["head_dim_global"] * cfg["rotary_fraction_global"] / 2)
    return [1.0] * rotating + [1e30] * (pairs - rotating)


def gemma4_tensor_specs(model: str, vocab: int):
    cfg = MODELS[model]
    d_ff = cfg.get("d_ff", D_FF)
    norm = (1.0 / 4, 1.0)
    specs = [("token_embd.weight", [D_MODEL, vocab], 0.5, 0.0),
             ("output_norm.weight", [D_MODEL], *norm),
             ("rope_freqs.weight", [cfg["head_dim_global"] // 2], None, gemma4_rope_factors(cfg))]
    for layer in range(cfg["layers"]):
        b = f"blk.{layer}."
        local = cfg["local"][layer]
        head_dim = cfg["head_dim_local"] if local else cfg["head_dim_global"]
        kv_dim = head_dim * (cfg["kv_heads_local"] if local else cfg["kv_heads_global"])
        q_dim = HEADS * head_dim
        specs += [(b + "attn_norm.weight", [D_MODEL], *norm),
                  (b + "attn_q.weight", [D_MODEL, q_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_k.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0)]
        if layer not in cfg["no_v"]:
            specs += [(b + "attn_v.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0)]
        specs += [(b + "attn_output.weight", [q_dim, D_MODEL], (3 / q_dim) ** 0.5, 0.0),
                  (b + "attn_q_norm.weight", [head_dim], *norm),
                  (b + "attn_k_norm.weight", [head_dim], *norm),
                  (b + "post_attention_norm.weight", [D_MODEL], *norm),
                  (b + "ffn_norm.weight", [D_MODEL], *norm),
                  (b + "ffn_gate.weight", [D_MODEL, d_ff], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "ffn_up.weight", [D_MODEL, d_ff], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "ffn_down.weight", [d_ff, D_MODEL], (3 / d_ff) ** 0.5, 0.0),
                  (b + "post_ffw_norm.weight", [D_MODEL], *norm),
                  (b + "layer_output_scale.weight", [1], 0.5, 1.0)]
        if "experts" in cfg:
            e, w = cfg["experts"], cfg["d_ff_expert"]
            # The router reads RMSNorm(h) / sqrt(d) * scale: weights of scale sqrt(3 d) / sqrt(d)
            # give its logits unit variance, so the top-k choice is rarely a near-tie.
            specs += [(b + "ffn_gate_inp.weight", [D_MODEL, e], 3 ** 0.5, 0.0),
                      (b + "ffn_gate_inp.scale", [D_MODEL], *norm),
                      (b + "ffn_gate_up_exps.weight", [D_MODEL, 2 * w, e],
                       (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_down_exps.weight", [w, D_MODEL, e], (3 / w) ** 0.5, 0.0),
                      (b + "ffn_down_exps.scale", [e], *norm),
                      (b + "pre_ffw_norm_2.weight", [D_MODEL], *norm),
                      (b + "post_ffw_norm_1.weight", [D_MODEL], *norm),
                      (b + "post_ffw_norm_2.weight", [D_MODEL], *norm)]
    return specs


def tensor_specs(arch: str, vocab: int):
    """(name, ggml dims, scale, offset) per tensor; dims[0] is the contiguous dimension. A
    tensor of set values has scale None and the values in place of the offset."""
    if architecture(arch) == "gemma4":
        return gemma4_tensor_specs(arch, vocab)
    if architecture(arch) == "gpt-oss":
        return gpt_oss_tensor_specs(arch, vocab)
    cfg = MODELS[arch]
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    norm = (1.0 / 4, 1.0)  # weights in [0.75, 1.25)
    specs = [("token_embd.weight", [D_MODEL, vocab], 0.5, 0.0),
             ("output_norm.weight", [D_MODEL], *norm)]
    for layer in range(cfg["layers"]):
        b = f"blk.{layer}."
        specs += [(b + "attn_norm.weight", [D_MODEL], *norm),
                  (b + "attn_q.weight", [D_MODEL, q_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_k.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_v.weight", [D_MODEL, kv_dim], (3 / D_MODEL) ** 0.5, 0.0),
                  (b + "attn_output.weight", [q_dim, D_MODEL], (3 / q_dim) ** 0.5, 0.0),
                  (b + "ffn_norm.weight", [D_MODEL], *norm)]
        if "experts" in cfg:
            e, w = cfg["experts"], cfg["d_ff_expert"]
            specs += [(b + "ffn_gate_inp.weight", [D_MODEL, e], (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_gate_exps.weight", [D_MODEL, w, e], (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_up_exps.weight", [D_MODEL, w, e], (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_down_exps.weight", [w, D_MODEL, e], (3 / w) ** 0.5, 0.0)]
        else:
            specs += [(b + "ffn_gate.weight", [D_MODEL, D_FF], (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_up.weight", [D_MODEL, D_FF], (3 / D_MODEL) ** 0.5, 0.0),
                      (b + "ffn_down.weight", [D_FF, D_MODEL], (3 / D_FF) ** 0.5, 0.0)]
        if cfg["bias"]:
            specs += [(b + "attn_q.bias", [q_dim], 0.5, 0.0),
                      (b + "attn_k.bias", [kv_dim], 0.5, 0.0),
                      (b + "attn_v.bias", [kv_dim], 0.5, 0.0)]
        if cfg["qk_norm"]:
            specs += [(b + "attn_q_norm.weight", [HEAD_DIM], *norm),
                      (b + "attn_k_norm.weight", [HEAD_DIM], *norm)]
    return specs


def gemma4_metadata(model: str):
    cfg = MODELS[model]
    arch = architecture(model)
    kv_heads = [cfg["kv_heads_local"] if local else cfg["kv_heads_global"]
                for local in cfg["local"]]
    return [("general.architecture", "STRING", arch),
            (f"{arch}.block_count", "UINT32", cfg["layers"]),
            (f"{arch}.context_length", "UINT32", 4096),
            (f"{arch}.embedding_length", "UINT32", D_MODEL),
            (f"{arch}.feed_forward_length", "UINT32", cfg.get("d_ff", D_FF)),
            (f"{arch}.attention.head_count", "UINT32", HEADS),
            (f"{arch}.attention.head_count_kv", "ARRAY_UINT32", kv_heads),
            (f"{arch}.attention.key_length", "UINT32", cfg["head_dim_global"]),
            (f"{arch}.attention.value_length", "UINT32", cfg["head_dim_global"]),
            (f"{arch}.attention.key_length_swa", "UINT32", cfg["head_dim_local"]),
            (f"{arch}.attention.value_length_swa", "UINT32", cfg["head_dim_local"]),
            (f"{arch}.rope.dimension_count", "UINT32", cfg["head_dim_global"]),
            (f"{arch}.rope.dimension_count_swa", "UINT32", cfg["head_dim_local"]),
            (f"{arch}.rope.freq_base", "FLOAT32", cfg["rope_base"]),
            (f"{arch}.rope.freq_base_swa", "FLOAT32", cfg["rope_base_local"]),
            (f"{arch}.attention.sliding_window", "UINT32", cfg["window"]),
            (f"{arch}.attention.sliding_window_pattern", "ARRAY_BOOL", cfg["local"]),
            (f"{arch}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6),
            (f"{arch}.final_logit_softcapping", "FLOAT32", cfg["softcap"]),
            (f"{arch}.embedding_length_per_layer_input", "UINT32", 0),
            (f"{arch}.attention.shared_kv_layers", "UINT32", 0)] + (
        [(f"{arch}.expert_count", "UINT32", cfg["experts"]),
         (f"{arch}.expert_used_count", "UINT32", cfg["experts_used"]),
         (f"{arch}.expert_feed_forward_length", "UINT32", cfg["d_ff_expert"])]
        if "experts" in cfg else [])


GGUF_TYPES = {"ARRAY_UINT32": (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32),
              "ARRAY_BOOL": (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL)}


def arch_metadata(arch: str):
    """(key, gguf value type name, value): what the C++ test writes too."""
    if architecture(arch) == "gemma4":
        return gemma4_metadata(arch)
    if architecture(arch) == "gpt-oss":
        return gpt_oss_metadata(arch)
    cfg = MODELS[arch]
    md = [("general.architecture", "STRING", arch),
          (f"{arch}.block_count", "UINT32", cfg["layers"]),
          (f"{arch}.context_length", "UINT32", 4096),
          (f"{arch}.embedding_length", "UINT32", D_MODEL),
          (f"{arch}.feed_forward_length", "UINT32", D_FF),
          (f"{arch}.attention.head_count", "UINT32", HEADS),
          (f"{arch}.attention.head_count_kv", "UINT32", KV_HEADS),
          (f"{arch}.rope.freq_base", "FLOAT32", cfg["rope_base"]),
          (f"{arch}.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6)]
    if cfg["qk_norm"]:
        md += [(f"{arch}.attention.key_length", "UINT32", HEAD_DIM),
               (f"{arch}.attention.value_length", "UINT32", HEAD_DIM)]
    if "experts" in cfg:
        md += [(f"{arch}.expert_count", "UINT32", cfg["experts"]),
               (f"{arch}.expert_used_count", "UINT32", cfg["experts_used"]),
               (f"{arch}.expert_feed_forward_length", "UINT32", cfg["d_ff_expert"])]
    return md


def write_model(arch: str, path: Path):
    reader = gguf.GGUFReader(str(VOCAB))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(str(path), architecture(arch))  # writes general.architecture
    for key, vtype, value in arch_metadata(arch)[1:]:
        if vtype in GGUF_TYPES:
            outer, sub = GGUF_TYPES[vtype]
            writer.add_key_value(key, value, outer, sub_type=sub)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType[vtype])
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    records = []
    for name, dims, scale, offset, *seed_name in tensor_specs(arch, vocab):
        if scale is None and offset == "MXFP4":  # synthetic MXFP4 bytes
            values = synthetic_mxfp4(architecture(arch), name, int(np.prod(dims)))
            record = {"name": name, "dims": dims, "format": "MXFP4"}
            byte_shape = list(reversed(dims[1:])) + [dims[0] // MXFP4_BLOCK * MXFP4_BLOCK_BYTES]
            # llama.cpp gets the F32 copy: its MXFP4 matmul quantizes the activations to Q8_0,
            # another function; the C++ side runs the MXFP4 bytes, dequantized exactly to f32.
            exact = gguf.quants.dequantize(values.reshape(byte_shape),
                                           gguf.GGMLQuantizationType.MXFP4)
            writer.add_tensor(name, exact.astype(np.float32).reshape(list(reversed(dims))))
            record["sha256"] = hashlib.sha256(values.tobytes()).hexdigest()
            records.append(record)
            continue
        if scale is None:  # set values
            values = np.array(offset, dtype=np.float32)
            record = {"name": name, "dims": dims, "values": [float(v) for v in values]}
        else:
            # A tensor may take another's values (seed_name: the name its seed is made from).
            values = synthetic_values(architecture(arch), (seed_name or [name])[0],
                                      int(np.prod(dims)), scale, offset)
            record = {"name": name, "dims": dims, "scale": scale, "offset": offset}
            if seed_name:
                record["seed_name"] = seed_name[0]
        writer.add_tensor(name, values.reshape(list(reversed(dims))))
        record["sha256"] = hashlib.sha256(values.tobytes()).hexdigest()
        records.append(record)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocab, records


def prompt_text(prompt) -> str:
    if prompt["kind"] == "chat":
        return "\n".join(m["content"] for m in prompt["messages"])
    return prompt["text"]


def main() -> int:
    prompts = {p["name"]: p for p in json.loads((ROOT / "tests/oracle/logit_prompts.json")
                                                .read_text())}
    archs = sys.argv[1:] or list(MODELS)
    for arch in archs:
        path = CACHE / "oracle" / f"{arch}-synthetic.F32.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        vocab, tensors = write_model(arch, path)
        llm = Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=2, logits_all=True,
                    verbose=False, type_k=0, type_v=0, flash_attn=False)
        cases, tails = [], []
        for name in PROMPTS:
            text = prompt_text(prompts[name])
            tokens = [llm.token_bos()] + llm.tokenize(text.encode("utf-8"), add_bos=False,
                                                      special=False)
            tokens = tokens[:400]
            continuation, records = run(llm, tokens, TOP_K, TAIL_SAMPLES, steps=CONTINUATION,
                                        seed=20261201)
            tails += [r["tail_mass"] for r in records]
            cases.append({"name": name, "tokens": [int(t) for t in tokens],
                          "continuation": continuation, "logits": records})
            print(f"{arch} {name}: {len(tokens)} prompt tokens")
        tails = np.array(tails)
        print(f"{arch}: positions {len(tails)}; mass outside top-{TOP_K}: mean {tails.mean():.2e}, "
              f"max {tails.max():.2e}")
        metadata = [{"key": k, "type": t, "value": v} for k, t, v in arch_metadata(arch)]
        out = ROOT / f"tests/fixtures/oracle/{arch}_synthetic_logits.json"
        out.write_text(json.dumps({
            "model": f"{arch} random weights (see tests/oracle/gen_synthetic_logits_fixtures.py)",
            "tokenizer": VOCAB.name, "vocab_size": vocab, "llama_cpp_python": "0.3.36",
            "kv_cache": "f32", "n_threads": 2, "top_k": TOP_K, "tail_samples": TAIL_SAMPLES,
            "metadata": metadata, "tensors": tensors, "cases": cases}))
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
