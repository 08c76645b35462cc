// Stand-ins for the int8-activation kernels of common/quant/split_matmul.cc, which clang 14 does
// not compile (its `#pragma GCC target` blocks). The speculation objects that request validation
// links name them on paths validation never takes; reaching one traps, i.e. a fuzz finding.
#include "common/quant/split_matmul.h"

namespace bitsplit::quant {

void QuantizeActivations(const float*, int64_t, int64_t, QuantizedActivations*) {
  __builtin_trap();
}
absl::StatusOr<MatrixView> MakeMatrixView(SplitFormat, int, int64_t, int64_t, const uint8_t*,
                                          size_t, size_t) {
  __builtin_trap();
}
void MatMul(const MatrixView&, const QuantizedActivations&, float*, bool, ThreadPool&) {
  __builtin_trap();
}
void MatMulRows(const MatrixView&, const QuantizedActivations&, int64_t, int64_t, float*, bool) {
  __builtin_trap();
}
MatMulIsa ActiveMatMulIsa() { __builtin_trap(); }
const char* MatMulIsaName(MatMulIsa) { __builtin_trap(); }

}  // namespace bitsplit::quant
