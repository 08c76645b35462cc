#include "common/ops/activation.h"

#include <array>
#include <cmath>

#include "common/util/fp16.h"

namespace bitsplit::ops {
namespace {

// GeluTanh at every fp16 value, rounded to fp16 (ggml's ggml_table_gelu_f16).
const std::array<float, 65536>& GeluTable() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>();
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const float x = Fp16ToFp32(static_cast<uint16_t>(bits));
      (*t)[bits] = Fp16ToFp32(Fp32ToFp16(GeluTanh(x)));
    }
    return t;
  }();
  return *table;
}

}  // namespace

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefficient = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoefficient * x * x)));
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  const std::array<float, 65536>& table = GeluTable();
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    float gelu;
    if (g <= -10.0f) {
      gelu = 0.0f;
    } else if (g >= 10.0f) {
      gelu = g;
    } else {
      gelu = table[Fp32ToFp16(g)];
    }
    out[i] = gelu * up[i];
  }
}

}  // namespace bitsplit::ops
