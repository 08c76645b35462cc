#include "common/model/split_backend.h"

#include <algorithm>
#include <cstring>

#include "common/quant/hadamard.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {

void RotateRows(const HadamardRotation& rotation, float* x, int64_t rows, int64_t cols) {
  if (!rotation.enabled()) return;
  quant::HadamardRotateRows(x, rows, cols, rotation.block, rotation.seed);
}

GroupRowRanges::GroupRowRanges(std::span<const quant::MatrixView> matrices)
    : count(matrices.size()) {
  BITSPLIT_CHECK(!matrices.empty() && matrices.size() <= kMaxMatricesPerGroup);
  for (size_t i = 0; i < count; ++i) start[i + 1] = start[i] + matrices[i].rows;
}

void MatMulGroupRows(std::span<const quant::MatrixView> matrices, const GroupRowRanges& ranges,
                     const quant::QuantizedActivations& x, int64_t begin, int64_t end,
                     std::span<float* const> outputs, bool accumulate) {
  BITSPLIT_CHECK(matrices.size() == ranges.count && outputs.size() == ranges.count);
  for (size_t i = 0; i < ranges.count && begin < end; ++i) {
    const int64_t first = std::max(begin, ranges.start[i]);
    const int64_t last = std::min(end, ranges.start[i + 1]);
    if (first >= last) continue;
    quant::MatMulRows(matrices[i], x, first - ranges.start[i], last - ranges.start[i], outputs[i],
                      accumulate);
  }
}

void SplitMatMulGroup(std::span<const quant::MatrixView> matrices,
                      const quant::QuantizedActivations& x, std::span<float* const> outputs,
                      bool accumulate, ThreadPool& pool) {
  BITSPLIT_CHECK(matrices.size() == outputs.size() && !matrices.empty());
  if (matrices.size() == 1) {
    quant::MatMul(matrices[0], x, outputs[0], accumulate, pool);
    return;
  }
  const GroupRowRanges ranges(matrices);
  pool.ParallelForGrained(ranges.total(), quant::kMatMulRowGrain,
                          [&](int64_t begin, int64_t end, int /*worker*/) {
                            MatMulGroupRows(matrices, ranges, x, begin, end, outputs, accumulate);
                          });
}

absl::Status InProcessResidual::Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                                           std::span<float* const> outputs, ThreadPool& pool) {
  SplitMatMulGroup(residual_.group(id), x, outputs, /*accumulate=*/true, pool);
  return absl::OkStatus();
}

absl::Status SplitLinearBackend::Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                                       std::span<float* const> outputs, ThreadPool& pool) {
  const std::span<const quant::MatrixView> matrices = base_.group(id);
  BITSPLIT_CHECK(!matrices.empty() && outputs.size() == matrices.size());
  const int64_t cols = matrices[0].cols;
  const float* input = x;
  if (rotation_.enabled()) {
    rotated_.resize(static_cast<size_t>(num_tokens * cols));
    std::memcpy(rotated_.data(), x, rotated_.size() * sizeof(float));
    RotateRows(rotation_, rotated_.data(), num_tokens, cols);
    input = rotated_.data();
  }
  quant::QuantizeActivations(input, num_tokens, cols, &activations_);
  if (residual_ != nullptr) BITSPLIT_RETURN_IF_ERROR(residual_->Submit(id, activations_));
  SplitMatMulGroup(matrices, activations_, outputs, /*accumulate=*/false, pool);
  if (residual_ != nullptr) {
    BITSPLIT_RETURN_IF_ERROR(residual_->Accumulate(id, activations_, outputs, pool));
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
