#include "common/model/split_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/model/remote_residual.h"
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

ExpertViews ExpertSlicesOf(std::span<const quant::MatrixView> tall, int64_t num_experts,
                           int32_t expert) {
  BITSPLIT_CHECK(num_experts > 0 && expert >= 0 && expert < num_experts &&
                 tall.size() <= kMaxMatricesPerGroup);
  ExpertViews views;
  views.count = tall.size();
  for (size_t i = 0; i < tall.size(); ++i) {
    views.matrices[i] = tall[i];
    views.matrices[i].rows = tall[i].rows / num_experts;
    views.matrices[i].data = tall[i].data + expert * views.matrices[i].rows * tall[i].row_stride;
  }
  return views;
}

void SliceActivations(const QuantizedActivations& x, int64_t first, int64_t count,
                      QuantizedActivations* out) {
  CopyActivations(count, x.cols, x.block_stride, x.row_codes(first), x.row_scales(first),
                  x.row_sums(first), out);
}

void SplitMatMulExperts(std::span<const quant::MatrixView> tall, int64_t num_experts,
                        std::span<const ExpertRows> segments, const QuantizedActivations& x,
                        std::span<float* const> outputs, bool accumulate,
                        QuantizedActivations* scratch, ThreadPool& pool) {
  const size_t count = outputs.size();
  for (const ExpertRows& segment : segments) {
    const ExpertViews matrices = ExpertSlicesOf(tall, num_experts, segment.expert);
    BITSPLIT_CHECK(matrices.count == count);
    SliceActivations(x, segment.first_row, segment.count, scratch);
    std::array<float*, kMaxMatricesPerGroup> rows{};
    for (size_t i = 0; i < count; ++i) {
      rows[i] = outputs[i] + segment.first_row * matrices.matrices[i].rows;
    }
    SplitMatMulGroup(std::span(matrices.matrices.data(), count), *scratch,
                     std::span<float* const>(rows.data(), count), accumulate, pool);
  }
}

void CopyActivations(int64_t rows, int64_t cols, int64_t block_stride, const void* codes,
                     const void* scales, const void* sums, QuantizedActivations* x) {
  x->rows = rows;
  x->cols = cols;
  x->block_stride = block_stride;
  x->codes.resize(static_cast<size_t>(rows * cols));
  x->scales.resize(static_cast<size_t>(rows * block_stride));
  x->sums.resize(static_cast<size_t>(rows * block_stride));
  std::memcpy(x->codes.data(), codes, x->codes.size());
  std::memcpy(x->scales.data(), scales, x->scales.size() * sizeof(float));
  std::memcpy(x->sums.data(), sums, x->sums.size() * sizeof(float));
}

const char* SplitKernelIsaName() { return quant::MatMulIsaName(quant::ActiveMatMulIsa()); }

void SplitMatMulGroup(std::span<const quant::MatrixView> matrices,
                      const quant::QuantizedActivations& x, std::span<float* const> outputs,
                      bool accumulate, ThreadPool& pool) {
  BITSPLIT_CHECK(matrices.size() == outputs.size() && !matrices.empty());
  const GroupRowRanges ranges(matrices);
  if (ranges.total() * matrices[0].cols <= kSmallGroupWeights) {
    MatMulGroupRows(matrices, ranges, x, 0, ranges.total(), outputs, accumulate);
    return;
  }
  if (matrices.size() == 1) {
    quant::MatMul(matrices[0], x, outputs[0], accumulate, pool);
    return;
  }
  pool.ParallelForGrained(ranges.total(), quant::kMatMulRowGrain,
                          [&](int64_t begin, int64_t end, int /*worker*/) {
                            MatMulGroupRows(matrices, ranges, x, begin, end, outputs, accumulate);
                          });
}

void SplitMatMulGroupPacked(std::span<const quant::MatrixView> matrices,
                            const quant::QuantizedActivations& x, float* y, ThreadPool& pool) {
  BITSPLIT_CHECK(!matrices.empty() && matrices.size() <= kMaxMatricesPerGroup);
  float* outputs[kMaxMatricesPerGroup] = {};
  float* next = y;
  for (size_t i = 0; i < matrices.size(); ++i) {
    outputs[i] = next;
    next += x.rows * matrices[i].rows;
  }
  SplitMatMulGroup(matrices, x, std::span<float* const>(outputs, matrices.size()),
                   /*accumulate=*/false, pool);
}

absl::Status InProcessResidual::Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                                           std::span<float* const> outputs, ThreadPool& pool) {
  SplitMatMulGroup(residual_.group(id), x, outputs, /*accumulate=*/true, pool);
  return absl::OkStatus();
}

absl::Status InProcessResidual::AccumulateExperts(int32_t layer, LinearGroup group,
                                                  std::span<const ExpertRows> segments,
                                                  const quant::QuantizedActivations& x,
                                                  std::span<float* const> outputs,
                                                  ThreadPool& pool) {
  const ModelConfig& config = residual_.config();
  const size_t count = ExpertOutputDims(config, group).size();
  BITSPLIT_CHECK(config.has_experts() && outputs.size() == count);
  BITSPLIT_RETURN_IF_ERROR(ValidateExpertSegments(layer, config.num_experts, x.rows, segments));
  SplitMatMulExperts(residual_.group({layer, group}), config.num_experts, segments, x, outputs,
                     /*accumulate=*/true, &segment_, pool);
  return absl::OkStatus();
}

absl::StatusOr<const ResidualStaging*> InProcessResidual::Staging(int64_t max_rows) {
  if (max_rows < 1) return absl::InvalidArgumentError("staging needs at least one row");
  if (staging_memory_ != nullptr && staging_.max_rows >= max_rows) return &staging_;
  const ResidualShapes shapes = ResidualShapes::FromConfig(residual_.config());
  const int64_t max_cols = shapes.max_cols(), max_outputs = shapes.max_outputs();
  constexpr size_t kPage = 4096;
  const auto page_round = [&](uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; };
  const uint64_t block_stride = static_cast<uint64_t>(quant::ActivationBlockStride(max_cols));
  const uint64_t rows = static_cast<uint64_t>(max_rows);
  const uint64_t code_bytes = page_round(rows * static_cast<uint64_t>(max_cols));
  const uint64_t scale_bytes = page_round(rows * block_stride * sizeof(float));
  const uint64_t output_bytes =
      page_round(rows * static_cast<uint64_t>(max_outputs) * sizeof(float));
  const uint64_t total = code_bytes + 2 * scale_bytes + output_bytes;
  std::byte* memory = static_cast<std::byte*>(std::aligned_alloc(kPage, total));
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", total, " bytes of residual staging memory"));
  }
  staging_memory_.reset(memory);
  staging_.codes = reinterpret_cast<int8_t*>(memory);
  staging_.scales = reinterpret_cast<float*>(memory + code_bytes);
  staging_.sums = reinterpret_cast<float*>(memory + code_bytes + scale_bytes);
  staging_.outputs = reinterpret_cast<const float*>(memory + code_bytes + 2 * scale_bytes);
  staging_.max_rows = max_rows;
  staging_.region = std::span<std::byte>(memory, total);
  submitted_.reset();
  return &staging_;
}

absl::Status InProcessResidual::SubmitStaged(LinearGroupId id, int64_t rows, int64_t cols) {
  const std::span<const quant::MatrixView> matrices = residual_.group(id);
  if (staging_memory_ == nullptr || rows < 1 || rows > staging_.max_rows || matrices.empty() ||
      cols != matrices[0].cols) {
    return absl::InvalidArgumentError(absl::StrCat("staged activations [", rows, " x ", cols,
                                                   "] do not fit group ", LinearGroupIdString(id),
                                                   " (staging for ", staging_.max_rows, " rows)"));
  }
  CopyActivations(rows, cols, quant::ActivationBlockStride(cols), staging_.codes, staging_.scales,
                  staging_.sums, &staged_x_);
  submitted_ = id;
  return absl::OkStatus();
}

absl::Status InProcessResidual::WaitStaged(LinearGroupId id, ThreadPool& pool) {
  if (!submitted_.has_value() || !(*submitted_ == id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", LinearGroupIdString(id), " was not submitted"));
  }
  submitted_.reset();
  SplitMatMulGroupPacked(residual_.group(id), staged_x_, const_cast<float*>(staging_.outputs),
                         pool);
  return absl::OkStatus();
}

void SplitLinearBackend::QuantizeInput(const float* x, int64_t rows, int64_t cols) {
  const float* input = x;
  if (rotation_.enabled()) {
    rotated_.resize(static_cast<size_t>(rows * cols));
    std::memcpy(rotated_.data(), x, rotated_.size() * sizeof(float));
    RotateRows(rotation_, rotated_.data(), rows, cols);
    input = rotated_.data();
  }
  quant::QuantizeActivations(input, rows, cols, &activations_);
}

absl::Status SplitLinearBackend::Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                                       std::span<float* const> outputs, ThreadPool& pool) {
  const std::span<const quant::MatrixView> matrices = base_.group(id);
  BITSPLIT_CHECK(!matrices.empty() && outputs.size() == matrices.size());
  QuantizeInput(x, num_tokens, matrices[0].cols);
  if (residual_ != nullptr) BITSPLIT_RETURN_IF_ERROR(residual_->Submit(id, activations_));
  SplitMatMulGroup(matrices, activations_, outputs, /*accumulate=*/false, pool);
  if (residual_ != nullptr) {
    BITSPLIT_RETURN_IF_ERROR(residual_->Accumulate(id, activations_, outputs, pool));
  }
  return absl::OkStatus();
}

absl::Status SplitLinearBackend::ApplyExperts(int32_t layer, LinearGroup group, const float* x,
                                              int64_t num_rows,
                                              std::span<const ExpertRows> segments,
                                              std::span<float* const> outputs, ThreadPool& pool) {
  const ModelConfig& config = base_.config();
  BITSPLIT_CHECK(config.has_experts() && layer >= 0 && layer < config.num_layers);
  const size_t count = ExpertOutputDims(config, group).size();
  BITSPLIT_CHECK(outputs.size() == count);
  BITSPLIT_RETURN_IF_ERROR(ValidateExpertSegments(layer, config.num_experts, num_rows, segments));
  QuantizeInput(x, num_rows, ExpertInputDim(config, group));
  SplitMatMulExperts(base_.group({layer, group}), config.num_experts, segments, activations_,
                     outputs, /*accumulate=*/false, &segment_, pool);
  if (residual_ == nullptr) return absl::OkStatus();
  return residual_->AccumulateExperts(layer, group, segments, activations_, outputs, pool);
}

}  // namespace bitsplit::model
