// CudaModel::TimeBaseMatMuls: the base matmuls of one forward alone, timed with CUDA events
// (for bench/cuda_drafter_bench.cc).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_status.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {

using model::LinearGroup;
using model::LinearGroupId;

absl::StatusOr<CudaModel::MatMulPassTiming> CudaModel::TimeBaseMatMuls(int64_t rows,
                                                                       int repetitions) {
  if (rows < 1 || rows > options_.max_batch_rows || repetitions < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rows %d must be in [1, %d] and repetitions %d positive", rows,
                        options_.max_batch_rows, repetitions));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  int64_t widest = 0;
  for (const Group& group : groups_) widest = std::max(widest, group.cols);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_.codes, 0, rows * widest, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(d_.act_scales, 0, rows * block_stride_max_ * sizeof(float), stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(d_.act_sums, 0, rows * block_stride_max_ * sizeof(float), stream_));
  MatMulPassTiming timing;
  // Each pass: a group's matrices (for an expert group, one routed expert's slices: a token's
  // k experts are k passes) and their outputs, with the input width.
  std::vector<std::pair<kernels::GroupMatMul, int64_t>> passes;
  for (const LinearGroupId id : model::AllLinearGroups(config_)) {
    std::vector<float*> outputs;
    switch (id.group) {
      case LinearGroup::kQkv:
        outputs = {d_.q, d_.k_new, d_.v_new};
        break;
      case LinearGroup::kGateUp:
        outputs = {d_.gate, d_.up};
        break;
      case LinearGroup::kExpertGateUp:
        outputs = {d_.expert_gate_up, d_.expert_gate_up + rows * config_.d_ff_expert};
        break;
      case LinearGroup::kExpertDown:
        outputs = {d_.expert_output};
        break;
      case LinearGroup::kOutputHead:
        outputs = {d_.logits};
        break;
      default:
        outputs = {d_.projected};
        break;
    }
    const Group& group = GroupOf(id);
    const bool experts = model::IsExpertGroup(id.group);
    for (int64_t e = 0; e < (experts ? config_.num_experts_used : 1); ++e) {
      kernels::GroupMatMul matmul = experts ? ExpertSlices(group, e) : group.matmul;
      for (int i = 0; i < matmul.count; ++i) {
        const kernels::DeviceMatrix& matrix = matmul.matrices[i];
        matmul.outputs[i] = outputs[static_cast<size_t>(i)];
        timing.weight_bytes += static_cast<uint64_t>(matrix.rows * matrix.row_stride);
      }
      passes.emplace_back(matmul, group.cols);
    }
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  cudaError_t error = cudaEventRecord(start, stream_);
  for (int rep = 0; rep < repetitions && error == cudaSuccess; ++rep) {
    for (const auto& [matmul, cols] : passes) {
      const kernels::DeviceActivations x{
          d_.codes, d_.act_scales, d_.act_sums, rows, cols, quant::ActivationBlockStride(cols)};
      error = kernels::SplitMatMul(matmul, x, false, stream_);
      if (error != cudaSuccess) break;
    }
  }
  if (error == cudaSuccess) error = cudaEventRecord(stop, stream_);
  if (error == cudaSuccess) error = cudaEventSynchronize(stop);
  float ms = 0.0f;
  if (error == cudaSuccess) error = cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  BITSPLIT_CUDA_RETURN_IF_ERROR(error);
  timing.ms = ms / repetitions;
  return timing;
}

}  // namespace bitsplit::cuda
