#pragma once
// The gated feed-forward activation of llama: SiLU(gate) * up.
#include <cstdint>

namespace bitsplit::ops {

// out[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)); out may alias gate or up.
// Elementwise, so any split of [0, n) over threads gives the same bits.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

}  // namespace bitsplit::ops
