#pragma once
// The gated feed-forward activations: SiLU(gate) * up (llama, qwen) and GELU(gate) * up (gemma).
#include <cstdint>

namespace bitsplit::ops {

// out[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)); out may alias gate or up.
// Elementwise, so any split of [0, n) over threads gives the same bits.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// The tanh-approximated GELU, 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x²))), in f32.
float GeluTanh(float x);

// out[i] = gelu(gate[i]) * up[i] as llama.cpp's CPU backend computes it (ggml_vec_geglu_f32 with
// GGML_GELU_FP16, its default): gelu(x) is 0 for x <= -10 and x for x >= 10; in between it is
// looked up for x rounded to fp16, i.e. fp16(GeluTanh(fp16(x))). Matching that rounding keeps the
// logits within f32 rounding of the oracle; the exact GeluTanh differs from it by up to ~1e-3
// relative. out may alias gate or up. Elementwise, so batch- and thread-invariant.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

}  // namespace bitsplit::ops
