#pragma once
// The gated feed-forward activations: SiLU(gate) * up (llama, qwen), GELU(gate) * up (gemma) and
// gpt-oss's clamped SwiGLU.
#include <cstdint>

namespace bitsplit::ops {

// out[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)); out may alias gate or up.
// Elementwise, so any split of [0, n) over threads gives the same bits.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// The tanh-approximated GELU, 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x²))), in f32.
float GeluTanh(float x);

// out[i] = GeluTanh(gate[i]) * up[i], the formula in f32 as llama.cpp's GPU backends and its CPU
// backend without GGML_GELU_FP16 compute it. (llama.cpp's CPU default looks GELU up at the input
// rounded to fp16, an error of up to ~1e-3 relative that we do not copy: docs/quality.md.)
// out may alias gate or up. Elementwise, so batch- and thread-invariant.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702 and limit 7 in its MoE graph):
// x = min(gate, limit), y = clamp(up, -limit, limit), out = x / (1 + exp(-alpha x)) * (y + 1),
// each step in f32 as ggml's CPU kernel writes it. out may alias gate or up. Elementwise.
inline constexpr float kSwigluOaiAlpha = 1.702f;
inline constexpr float kSwigluOaiLimit = 7.0f;
void SwigluOaiMul(const float* gate, const float* up, int64_t n, float* out,
                  float alpha = kSwigluOaiAlpha, float limit = kSwigluOaiLimit);

}  // namespace bitsplit::ops
