#pragma once
// Rotary position embedding in llama.cpp's two pairings: "normal" (LLAMA_ROPE_TYPE_NORM, the llama
// architecture) rotates adjacent pairs (x[2i], x[2i+1]) of each head — GGUF llama files store
// Q/K weights permuted for exactly this pairing (the converter undoes the HF half-split); "neox"
// (LLAMA_ROPE_TYPE_NEOX: gemma3, qwen2, qwen3) rotates (x[i], x[i + rotary_dims / 2]).
#include <cstdint>

namespace bitsplit::ops {

// Which dimensions of a head turn together.
enum class RopeStyle {
  kAdjacentPairs,  // LLAMA_ROPE_TYPE_NORM: (x[2i], x[2i+1])
  kHalves,         // LLAMA_ROPE_TYPE_NEOX: (x[i], x[i + rotary_dims/2])
};

struct RopeConfig {
  int64_t head_dim = 0;
  int64_t rotary_dims = 0;  // leading dims of each head that rotate (even, <= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;              // linear position scaling (1 / scaling factor)
  const float* freq_factors = nullptr;  // optional [rotary_dims / 2] divisors (llama 3 style)
  RopeStyle style = RopeStyle::kAdjacentPairs;
  // YaRN (rope.scaling.type "yarn", llama.cpp's rope_yarn): with ext_factor > 0, pair i turns by
  // a blend of the interpolated angle (freq_scale * theta_i) and the extrapolated one (theta_i),
  // the extrapolated share ext_factor * ramp(i) falling from 1 to 0 between the correction dims
  // of yarn_original_context (beta_fast and beta_slow rotations), and cos and sin are multiplied
  // by attn_factor * (1 + 0.1 ln(1 / freq_scale)). Without YaRN they are multiplied by
  // attn_factor alone.
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  int64_t yarn_original_context = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
};

// YaRN's correction dims [low, high] of `config` (ggml_rope_yarn_corr_dims): pairs below low keep
// the extrapolated angle, pairs above high the interpolated one.
void YarnCorrectionDims(const RopeConfig& config, float dims[2]);

// The cos and sin that ApplyRope rotates pair i < rotary_dims / 2 by at `position` (YaRN's blend
// and magnitude included): the one computation the CPU and the CUDA backend's tables share.
void RopeCosSin(const RopeConfig& config, int32_t position, float* cos_out, float* sin_out);

// x is [num_tokens, num_heads, head_dim]; token t is rotated for positions[t]. Pair i turns by
//   theta_i = freq_scale * position * base^(-2i / rotary_dims) / freq_factors[i],
// with base^(-2i/d) formed as llama.cpp does (repeated multiplication in f32), so angles match
// the reference implementation bit for bit. Dims >= rotary_dims are left unchanged.
void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, const int32_t* positions,
               const RopeConfig& config);

}  // namespace bitsplit::ops
