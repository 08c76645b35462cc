// CudaModel's choices from the last forward's logits: the logits to the host, the target's
// token per row (greedy or sampled) and the draft's top-k children, computed on the device.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_status.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {

absl::Status CudaModel::CheckLogitRows(int64_t first_row, int64_t rows) const {
  if (last_logit_rows_ == 0) return absl::FailedPreconditionError("no forward has run");
  if (first_row < 0 || rows < 1 || first_row + rows > last_logit_rows_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logit rows [%d, %d) are outside the last forward's %d", first_row,
                        first_row + rows, last_logit_rows_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::CopyLogits(std::span<float> logits) {
  if (last_logit_rows_ == 0) return absl::FailedPreconditionError("no forward has run");
  return CopyLogits(0, last_logit_rows_, logits);
}

absl::Status CudaModel::CopyLogits(int64_t first_row, int64_t rows, std::span<float> logits) {
  BITSPLIT_RETURN_IF_ERROR(CheckLogitRows(first_row, rows));
  const int64_t count = rows * config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) < count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits buffer holds %d floats; the rows asked have %d", logits.size(), count));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(logits.data(), d_.logits + first_row * config_.vocab_size,
                      count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaModel::ChooseTargets(const model::SamplingParams& sampling,
                                                              std::span<const int64_t> positions) {
  if (last_logit_rows_ == 0) return absl::FailedPreconditionError("no forward has run");
  if (static_cast<int64_t>(positions.size()) != last_logit_rows_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d positions for the %d logit rows of the last forward", positions.size(),
                        last_logit_rows_));
  }
  return ChooseTargets(sampling, positions, 0);
}

absl::StatusOr<std::vector<int32_t>> CudaModel::ChooseTargets(const model::SamplingParams& sampling,
                                                              std::span<const int64_t> positions,
                                                              int64_t first_row) {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  const int64_t rows = static_cast<int64_t>(positions.size());
  BITSPLIT_RETURN_IF_ERROR(CheckLogitRows(first_row, rows));
  const float* logits = d_.logits + first_row * config_.vocab_size;
  if (sampling.temperature == 0.0f) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::ArgMaxRows(logits, rows, config_.vocab_size, d_.choices, stream_));
  } else {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.choice_positions, positions.data(),
                                                  rows * sizeof(int64_t), cudaMemcpyHostToDevice,
                                                  stream_));
    kernels::SamplingArgs args;
    args.logits = logits;
    args.rows = rows;
    args.vocab = config_.vocab_size;
    args.positions = d_.choice_positions;
    args.temperature = sampling.temperature;
    args.top_k = sampling.top_k;
    args.top_p = sampling.top_p;
    args.seed = sampling.seed;
    args.weights = d_.sampling;
    args.choices = d_.choices;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SampleRows(args, stream_));
  }
  std::vector<int32_t> choices(static_cast<size_t>(rows));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(choices.data(), d_.choices, rows * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return choices;
}

absl::StatusOr<RowTopK> CudaModel::TopK(int32_t k) {
  if (last_logit_rows_ == 0) return absl::FailedPreconditionError("no forward has run");
  return TopK(k, 0, last_logit_rows_);
}

absl::StatusOr<RowTopK> CudaModel::TopK(int32_t k, int64_t first_row, int64_t rows) {
  BITSPLIT_RETURN_IF_ERROR(CheckLogitRows(first_row, rows));
  if (k < 1 || k > 64 || k > config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("top-k needs 1 <= k <= 64, got ", k));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::TopKRows(d_.logits + first_row * config_.vocab_size, rows,
                                                  config_.vocab_size, k, d_.top_ids, d_.top_logits,
                                                  d_.log_normalizers, stream_));
  RowTopK top;
  top.k = k;
  top.ids.resize(static_cast<size_t>(rows * k));
  top.logits.resize(static_cast<size_t>(rows * k));
  top.log_normalizers.resize(static_cast<size_t>(rows));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.ids.data(), d_.top_ids,
                                                top.ids.size() * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.logits.data(), d_.top_logits,
                                                top.logits.size() * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.log_normalizers.data(), d_.log_normalizers,
                                                top.log_normalizers.size() * sizeof(double),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return top;
}

}  // namespace bitsplit::cuda
