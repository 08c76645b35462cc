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
};

// x is [num_tokens, num_heads, head_dim]; token t is rotated for positions[t]. Pair i turns by
//   theta_i = freq_scale * position * base^(-2i / rotary_dims) / freq_factors[i],
// with base^(-2i/d) formed as llama.cpp does (repeated multiplication in f32), so angles match
// the reference implementation bit for bit. Dims >= rotary_dims are left unchanged.
void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, const int32_t* positions,
               const RopeConfig& config);

}  // namespace bitsplit::ops
