// CudaModel's forward: batch checks, the linear groups (base on the device, residual on the
// host), one layer after another on stream_, and draft forwards through captured CUDA graphs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_status.h"
#include "common/model/expert_routing.h"
#include "common/ops/activation.h"
#include "common/quant/hadamard.h"
#include "common/util/elapsed.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {

using Clock = std::chrono::steady_clock;
using model::LinearGroup;
using model::LinearGroupId;

namespace {

kernels::GatedActivation GatedActivationOf(model::FfnActivation activation) {
  switch (activation) {
    case model::FfnActivation::kGeluTanh:
      return kernels::GatedActivation::kGeluTanh;
    case model::FfnActivation::kSwigluOai:
      return kernels::GatedActivation::kSwigluOai;
    case model::FfnActivation::kSilu:
      break;
  }
  return kernels::GatedActivation::kSilu;
}

}  // namespace

const CudaModel::Group& CudaModel::GroupOf(LinearGroupId id) const {
  return groups_[static_cast<size_t>(model::LinearGroupIndex(config_, id))];
}

absl::Status CudaModel::ValidateBatch(const model::Batch& batch, const DeviceKvCache& cache) const {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateBatch(batch, config_.vocab_size, cache.pending_length()));
  const int64_t n = batch.size();
  if (n > options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a batch of %d tokens exceeds this drafter's largest forward of %d tokens",
                        n, options_.max_batch_rows));
  }
  const int64_t width = batch.mask_width();
  if (width > 2 * options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a batch mask %d wide exceeds this drafter's limit of %d", width,
                        2 * options_.max_batch_rows));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (batch.positions[i] >= options_.context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch row %d has position %d outside [0, %d)", i, batch.positions[i], options_.context));
    }
  }
  if (batch.num_logit_rows() > options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d logit rows exceed this drafter's limit of %d", batch.num_logit_rows(),
                        options_.max_batch_rows));
  }
  if (cache.model_ != this) {
    return absl::InvalidArgumentError("the KV cache belongs to another model");
  }
  if (width > cache.capacity() - cache.committed_length()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache full: %d committed + %d new tokens exceed the capacity of %d",
                        cache.committed_length(), width, cache.capacity()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaModel::QuantizeForGroup(const float* x, int64_t rows, int64_t cols,
                                                 bool verify, bool staging, cudaEvent_t copied) {
  BITSPLIT_CHECK(rows <= plan_.scratch.linear_rows && cols <= plan_.scratch.linear_cols);
  const float* input = x;
  if (quantization_.rotation.enabled()) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.rotated, x, rows * cols * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::HadamardRotate(
        d_.rotated, rows, cols, quantization_.rotation.block, hadamard_masks_,
        quant::HadamardScale(quantization_.rotation.block), stream_));
    input = d_.rotated;
  }
  const int64_t block_stride = quant::ActivationBlockStride(cols);
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::QuantizeActivations(
      input, rows, cols, d_.codes, d_.act_scales, d_.act_sums, block_stride, stream_));
  if (!verify) return false;
  // The activations go to the host first, so the residual can start while the base runs:
  // straight into the residual source's staging memory when it has some for this many rows
  // (else through the copy path, whose source refuses what it cannot hold).
  BITSPLIT_RETURN_IF_ERROR(EnsureResidualStaging());
  const bool staged = staging && staging_ != nullptr && rows <= staging_->max_rows;
  int8_t* codes = staged ? staging_->codes : host_codes_;
  float* scales = staged ? staging_->scales : host_scales_;
  float* sums = staged ? staging_->sums : host_sums_;
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(codes, d_.codes, rows * cols, cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      scales, d_.act_scales, rows * block_stride * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      sums, d_.act_sums, rows * block_stride * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied, stream_));
  return staged;
}

absl::Status CudaModel::Linear(LinearGroupId id, const float* x, int64_t rows,
                               std::span<float* const> outputs, bool verify) {
  const Group& group = GroupOf(id);
  const int64_t cols = group.cols;
  const int64_t block_stride = quant::ActivationBlockStride(cols);
  const kernels::DeviceActivations activations{d_.codes, d_.act_scales, d_.act_sums,
                                               rows,     cols,          block_stride};
  const size_t event_base = 3 * static_cast<size_t>(model::LinearGroupIndex(config_, id));
  BITSPLIT_ASSIGN_OR_RETURN(
      const bool staged,
      QuantizeForGroup(x, rows, cols, verify, /*staging=*/true, events_[event_base]));
  kernels::GroupMatMul matmul = group.matmul;
  for (int i = 0; i < matmul.count; ++i) matmul.outputs[i] = outputs[static_cast<size_t>(i)];
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SplitMatMul(matmul, activations, false, stream_));
  ++timings_.groups;
  if (!verify) return absl::OkStatus();
  const std::span<const int64_t> widths(group.output_rows, static_cast<size_t>(matmul.count));
  return AddResidual(event_base, rows, widths, outputs, [&]() -> absl::StatusOr<const float*> {
    if (staged) {
      // y = x · Rᵀ lands in the staging memory; the next group's activation copy, queued after
      // this group's output copy on the stream, is what the host waits for before the source
      // writes there again.
      BITSPLIT_RETURN_IF_ERROR(residual_->SubmitStaged(id, rows, cols));
      BITSPLIT_RETURN_IF_ERROR(residual_->WaitStaged(id, *pool_));
      return staging_->outputs;
    }
    float* host_outputs[kernels::kMaxGroupMatrices] = {};
    const quant::QuantizedActivations& x = HostResidualCall(rows, cols, widths, host_outputs);
    BITSPLIT_RETURN_IF_ERROR(residual_->Submit(id, x));
    BITSPLIT_RETURN_IF_ERROR(
        residual_->Accumulate(id, x, std::span<float* const>(host_outputs, widths.size()), *pool_));
    return host_residual_;
  });
}

const quant::QuantizedActivations& CudaModel::HostResidualCall(int64_t rows, int64_t cols,
                                                               std::span<const int64_t> widths,
                                                               float** host_outputs) {
  const int64_t block_stride = quant::ActivationBlockStride(cols);
  quant::QuantizedActivations& h = host_activations_;
  h.rows = rows;
  h.cols = cols;
  h.block_stride = block_stride;
  h.codes.assign(host_codes_, host_codes_ + rows * cols);
  h.scales.assign(host_scales_, host_scales_ + rows * block_stride);
  h.sums.assign(host_sums_, host_sums_ + rows * block_stride);
  int64_t offset = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    host_outputs[i] = host_residual_ + rows * offset;
    offset += widths[i];
  }
  std::fill_n(host_residual_, rows * offset, 0.0f);
  return h;
}

absl::Status CudaModel::AddResidual(size_t event_base, int64_t rows,
                                    std::span<const int64_t> widths,
                                    std::span<float* const> outputs,
                                    absl::FunctionRef<absl::StatusOr<const float*>()> compute) {
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[event_base + 1], stream_));
  const Clock::time_point wait_start = Clock::now();
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[event_base]));
  const Clock::time_point residual_start = Clock::now();
  timings_.wait_gpu_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(residual_start - wait_start).count();
  BITSPLIT_ASSIGN_OR_RETURN(const float* residual_output, compute());
  timings_.residual_ns += NanosSince(residual_start);
  int64_t total_width = 0;
  for (const int64_t width : widths) total_width += width;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[event_base + 2], stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.residual_output, residual_output,
                                                rows * total_width * sizeof(float),
                                                cudaMemcpyHostToDevice, stream_));
  int64_t offset = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddInPlace(
        outputs[i], d_.residual_output + rows * offset, rows * widths[i], stream_));
    offset += widths[i];
  }
  return absl::OkStatus();
}

kernels::GroupMatMul CudaModel::ExpertSlices(const Group& group, int64_t expert) const {
  kernels::GroupMatMul matmul = group.matmul;
  for (int i = 0; i < matmul.count; ++i) {
    kernels::DeviceMatrix& slice = matmul.matrices[i];
    slice.rows /= config_.num_experts;
    slice.data += expert * slice.rows * slice.row_stride;
  }
  return matmul;
}

absl::Status CudaModel::ExpertsLinear(int32_t layer, LinearGroup group, const float* x,
                                      int64_t rows, std::span<const model::ExpertRows> segments,
                                      std::span<float* const> outputs, bool verify) {
  const LinearGroupId id{layer, group};
  const Group& tall = GroupOf(id);
  const int64_t cols = tall.cols;
  const int64_t block_stride = quant::ActivationBlockStride(cols);
  const int64_t experts = config_.num_experts;
  BITSPLIT_CHECK(static_cast<int>(outputs.size()) == tall.matmul.count);
  const size_t event_base = 3 * static_cast<size_t>(model::LinearGroupIndex(config_, id));
  // The source's staging memory holds one dense group's layout, not a segment table: the
  // experts' activations go through the copy path.
  BITSPLIT_RETURN_IF_ERROR(
      QuantizeForGroup(x, rows, cols, verify, /*staging=*/false, events_[event_base]).status());
  int64_t widths[kernels::kMaxGroupMatrices] = {};
  for (int i = 0; i < tall.matmul.count; ++i) widths[i] = tall.output_rows[i] / experts;
  for (const model::ExpertRows& segment : segments) {
    kernels::GroupMatMul matmul = ExpertSlices(tall, segment.expert);
    for (int i = 0; i < matmul.count; ++i) {
      matmul.outputs[i] = outputs[static_cast<size_t>(i)] + segment.first_row * widths[i];
    }
    const kernels::DeviceActivations activations{d_.codes + segment.first_row * cols,
                                                 d_.act_scales + segment.first_row * block_stride,
                                                 d_.act_sums + segment.first_row * block_stride,
                                                 segment.count,
                                                 cols,
                                                 block_stride};
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SplitMatMul(matmul, activations, false, stream_));
  }
  ++timings_.groups;
  if (!verify) return absl::OkStatus();
  const std::span<const int64_t> output_widths(widths, static_cast<size_t>(tall.matmul.count));
  return AddResidual(event_base, rows, output_widths, outputs,
                     [&]() -> absl::StatusOr<const float*> {
                       float* host_outputs[kernels::kMaxGroupMatrices] = {};
                       const quant::QuantizedActivations& h =
                           HostResidualCall(rows, cols, output_widths, host_outputs);
                       BITSPLIT_RETURN_IF_ERROR(residual_->AccumulateExperts(
                           layer, group, segments, h,
                           std::span<float* const>(host_outputs, output_widths.size()), *pool_));
                       return host_residual_;
                     });
}

absl::Status CudaModel::ExpertsBlock(int32_t layer, const float* input, const float* router_input,
                                     float* out, const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const model::LayerNorms& vectors = layer_vectors_[static_cast<size_t>(layer)];
  const int64_t n = pass.rows;
  const int64_t k = c.num_experts_used;
  const int64_t routed = n * k;
  const int64_t width = c.d_ff_expert;
  // Routing on the host, by the CPU forward's rules, from logits the device computed.
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      kernels::RouterLogits(router_input, n, routers_[static_cast<size_t>(layer)], c.num_experts,
                            c.d_model, d_.router_logits, stream_));
  if (vectors.router_bias != nullptr) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::AddRowVector(d_.router_logits, vectors.router_bias, n, c.num_experts, stream_));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_router_logits_, d_.router_logits,
                                                n * c.num_experts * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
  const Clock::time_point wait_start = Clock::now();
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  timings_.wait_gpu_ns += NanosSince(wait_start);
  const std::span<int32_t> expert_of(host_expert_of_, static_cast<size_t>(routed));
  model::RouteRows(c, host_router_logits_, n, expert_of,
                   std::span<float>(host_expert_weights_, static_cast<size_t>(routed)));
  const model::ExpertGrouping grouping = model::GroupByExpert(expert_of, c.num_experts, k);
  std::copy(grouping.slot_of.begin(), grouping.slot_of.end(), host_slot_of_);
  std::copy(grouping.source_row.begin(), grouping.source_row.end(), host_source_row_);
  for (const auto& [device, host] : {std::pair<void*, const void*>{d_.expert_of, host_expert_of_},
                                     {d_.expert_weights, host_expert_weights_},
                                     {d_.slot_of, host_slot_of_},
                                     {d_.source_row, host_source_row_}}) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, host, routed * 4, cudaMemcpyHostToDevice, stream_));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      kernels::GatherRows(input, d_.source_row, routed, c.d_model, d_.expert_input, stream_));
  // gate|up: one fused matrix (each row the expert's gate outputs, then its up outputs), or two.
  float* const gate = d_.expert_gate_up;
  float* const up = c.fused_expert_gate_up ? gate + width : gate + routed * width;
  const int64_t stride = c.fused_expert_gate_up ? 2 * width : width;
  std::vector<float*> gate_up = {gate};
  if (!c.fused_expert_gate_up) gate_up.push_back(up);
  BITSPLIT_RETURN_IF_ERROR(ExpertsLinear(layer, LinearGroup::kExpertGateUp, d_.expert_input, routed,
                                         grouping.segments, gate_up, pass.verify));
  // Each grouped row plus its expert's bias row (gpt-oss; CheckImplemented: gate and up apart).
  const auto add_expert_bias = [&](float* rows, const float* bias, int64_t n_cols) -> absl::Status {
    for (const model::ExpertRows& segment : grouping.segments) {
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddRowVector(
          rows + static_cast<int64_t>(segment.first_row) * n_cols,
          bias + static_cast<int64_t>(segment.expert) * n_cols, segment.count, n_cols, stream_));
    }
    return absl::OkStatus();
  };
  if (c.expert_biases) {
    BITSPLIT_RETURN_IF_ERROR(add_expert_bias(gate, vectors.expert_gate_bias, width));
    BITSPLIT_RETURN_IF_ERROR(add_expert_bias(up, vectors.expert_up_bias, width));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::GatedActivationRows(
      gate, up, routed, width, stride, GatedActivationOf(c.ffn_activation), ops::kSwigluOaiAlpha,
      ops::kSwigluOaiLimit, d_.expert_activation, stream_));
  float* const down[] = {d_.expert_output};
  BITSPLIT_RETURN_IF_ERROR(ExpertsLinear(layer, LinearGroup::kExpertDown, d_.expert_activation,
                                         routed, grouping.segments, down, pass.verify));
  if (c.expert_biases) {
    BITSPLIT_RETURN_IF_ERROR(
        add_expert_bias(d_.expert_output, vectors.expert_down_bias, c.d_model));
  }
  const kernels::WeightedExpertSumArgs sum{.expert_out = d_.expert_output,
                                           .slot_of = d_.slot_of,
                                           .expert_of = d_.expert_of,
                                           .weights = d_.expert_weights,
                                           .expert_scales = vectors.expert_output_scale,
                                           .rows = n,
                                           .k = k,
                                           .n = c.d_model,
                                           .out = out};
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::WeightedExpertSum(sum, stream_));
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(const model::Batch& batch, DeviceKvCache& cache,
                                model::ForwardMode mode) {
  const DeviceSequence sequence{&batch, &cache};
  return ForwardSequences({&sequence, 1}, mode);
}

absl::Status CudaModel::ForwardSequences(std::span<const DeviceSequence> sequences,
                                         model::ForwardMode mode) {
  absl::Status status = ForwardImpl(sequences, mode);
  if (!status.ok() && stream_ != nullptr) {
    // Let whatever was queued finish before the caller reuses the staging buffers or the cache.
    cudaStreamSynchronize(stream_);
    last_logit_rows_ = 0;
  }
  return status;
}

absl::Status CudaModel::ForwardImpl(std::span<const DeviceSequence> sequences,
                                    model::ForwardMode mode) {
  if (mode == model::ForwardMode::kReference) {
    return absl::FailedPreconditionError(
        "the CUDA backend runs split models in draft or verify mode only");
  }
  const bool verify = mode == model::ForwardMode::kVerify;
  if (verify && residual_ == nullptr) {
    return absl::FailedPreconditionError("verify mode needs a residual source (none attached)");
  }
  if (sequences.empty()) return absl::InvalidArgumentError("a forward needs a sequence");
  int64_t n = 0, logit_rows = 0;
  bool selects_rows = false;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const DeviceSequence& sequence = sequences[s];
    BITSPLIT_RETURN_IF_ERROR(ValidateBatch(*sequence.batch, *sequence.cache));
    for (size_t other = 0; other < s; ++other) {
      if (sequences[other].cache == sequence.cache) {
        return absl::InvalidArgumentError("two sequences of one forward share a KV cache");
      }
    }
    n += sequence.batch->size();
    logit_rows += sequence.batch->num_logit_rows();
    selects_rows = selects_rows || !sequence.batch->logit_rows.empty();
  }
  if (n > options_.max_batch_rows || logit_rows > options_.max_batch_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d sequences of %d tokens (%d logit rows) exceed this drafter's largest forward of %d",
        sequences.size(), n, logit_rows, options_.max_batch_rows));
  }
  const Clock::time_point start = Clock::now();
  timings_ = ForwardTimings{};

  // The batches, through pinned staging at fixed offsets (StepStagingOffset): the device reads
  // each sequence's prefix length and first slot from d_.step, so one captured graph serves
  // every step of a shape. The previous forward's copies out of it have completed (a forward
  // ends with a stream sync).
  const int64_t t_max = options_.max_batch_rows;
  uint8_t* staging = host_batch_;
  std::vector<SequenceSlice> slices;
  slices.reserve(sequences.size());
  int64_t row = 0, logit_row = 0, mask_offset = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const model::Batch& batch = *sequences[s].batch;
    DeviceKvCache& cache = *sequences[s].cache;
    const int64_t rows = batch.size();
    const int64_t width = batch.mask_width();
    const int64_t prefix_length = cache.committed_length();
    const int64_t first_slot = prefix_length + batch.pending_prefix;
    BITSPLIT_RETURN_IF_ERROR(cache.BeginPending(batch.pending_prefix + rows));
    std::memcpy(staging + 4 * row, batch.tokens.data(), rows * sizeof(int32_t));
    std::memcpy(staging + 4 * t_max + 4 * row, batch.positions.data(), rows * sizeof(int32_t));
    int32_t* selected = reinterpret_cast<int32_t*>(staging + 8 * t_max) + logit_row;
    if (batch.logit_rows.empty()) {
      for (int64_t r = 0; r < rows; ++r) selected[r] = static_cast<int32_t>(row + r);
    } else {
      for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
        selected[r] = static_cast<int32_t>(row + batch.logit_rows[r]);
      }
    }
    std::memcpy(staging + 12 * t_max + mask_offset, batch.attention_mask.data(), rows * width);
    const int64_t step[2] = {prefix_length, first_slot};
    std::memcpy(staging + StepStagingOffset() + 2 * s * sizeof(int64_t), step, sizeof(step));
    slices.push_back({.cache = &cache,
                      .first_row = row,
                      .rows = rows,
                      .mask_width = width,
                      .mask_offset = mask_offset});
    row += rows;
    logit_row += batch.num_logit_rows();
    mask_offset += rows * width;
  }
  const ForwardShape shape{n, slices.size() == 1 ? slices[0].mask_width : mask_offset, logit_rows,
                           selects_rows, slices.size() == 1 ? slices[0].cache->keys(0) : nullptr};
  // A mixture-of-experts layer routes on the host between kernels: no graph can hold that.
  if (!verify && embedding_on_device_ && cuda_graphs_ && slices.size() == 1 &&
      !config_.has_experts()) {
    BITSPLIT_RETURN_IF_ERROR(LaunchDraftGraph(shape, slices[0]));
  } else {
    BITSPLIT_RETURN_IF_ERROR(EnqueueForward(shape, slices, verify));
  }

  const Clock::time_point sync_start = Clock::now();
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  timings_.wait_gpu_ns += NanosSince(sync_start);
  if (verify) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      float ms = 0.0f;
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&ms, events_[3 * g + 1], events_[3 * g + 2]));
      timings_.gpu_idle_residual_ns += static_cast<int64_t>(std::max(0.0f, ms) * 1e6f);
    }
  }
  last_logit_rows_ = logit_rows;
  timings_.total_ns = NanosSince(start);
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueForward(const ForwardShape& shape,
                                       std::span<const SequenceSlice> slices, bool verify) {
  const ForwardPass pass{.rows = shape.rows,
                         .logit_rows = shape.logit_rows,
                         .selects_rows = shape.selects_rows,
                         .slices = slices,
                         .verify = verify};
  BITSPLIT_RETURN_IF_ERROR(UploadBatch(pass));
  BITSPLIT_RETURN_IF_ERROR(EmbedTokens(pass));
  BITSPLIT_RETURN_IF_ERROR(PrepareSlidingWindow(pass));
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    BITSPLIT_RETURN_IF_ERROR(AttentionBlock(layer, pass));
    BITSPLIT_RETURN_IF_ERROR(FeedForwardBlock(layer, pass));
  }
  return OutputHead(pass);
}

absl::Status CudaModel::UploadBatch(const ForwardPass& pass) {
  const int64_t t_max = options_.max_batch_rows;
  const SequenceSlice& last = pass.slices.back();
  const int64_t mask_bytes = last.mask_offset + last.rows * last.mask_width;
  const uint8_t* staging = host_batch_;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.tokens, staging, pass.rows * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.positions, staging + 4 * t_max,
                                                pass.rows * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                stream_));
  if (pass.selects_rows) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.logit_rows, staging + 8 * t_max,
                                                  pass.logit_rows * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream_));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_.mask, staging + 12 * t_max, mask_bytes, cudaMemcpyHostToDevice, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.step, staging + StepStagingOffset(),
                                                2 * pass.slices.size() * sizeof(int64_t),
                                                cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaModel::EmbedTokens(const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const int64_t n = pass.rows;
  if (embedding_on_device_) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::EmbeddingGather(
        embedding_, embedding_type_, embedding_row_bytes_, c.d_model, d_.tokens, n, d_.x, stream_));
  } else {
    const int32_t* tokens = reinterpret_cast<const int32_t*>(host_batch_);
    for (int64_t t = 0; t < n; ++t) {
      ops::DequantizeWeightRow(host_embedding_.token_embd, tokens[t],
                               host_embedding_rows_ + t * c.d_model);
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.x, host_embedding_rows_,
                                                  n * c.d_model * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream_));
  }
  if (c.embedding_scale != 1.0f) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::ScaleInPlace(d_.x, n * c.d_model, c.embedding_scale, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::PrepareSlidingWindow(const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  if (c.sliding_window <= 0) return absl::OkStatus();  // the caches keep no positions then
  // The batch's positions go with its keys, and every row's window is listed once: the local
  // layers all have the same window over the same slots.
  for (size_t s = 0; s < pass.slices.size(); ++s) {
    const SequenceSlice& slice = pass.slices[s];
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::StorePositions(d_.positions + slice.first_row,
                                                          slice.rows, slice.cache->positions(),
                                                          FirstSlotOnDevice(s), stream_));
    kernels::VisibleSlotsArgs visible;
    visible.mask = d_.mask + slice.mask_offset;
    visible.rows = slice.rows;
    visible.prefix_length_on_device = PrefixLengthOnDevice(s);
    visible.mask_width = slice.mask_width;
    visible.window = c.sliding_window;
    visible.query_positions = d_.positions + slice.first_row;
    visible.slot_positions = slice.cache->positions();
    visible.slots = d_.visible_slots + slice.first_row * options_.context;
    visible.counts = d_.visible_counts + slice.first_row;
    visible.slot_stride = options_.context;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::VisibleSlots(visible, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::AttentionBlock(int32_t layer, const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const model::LayerNorms& vectors = layer_vectors_[static_cast<size_t>(layer)];
  const int64_t n = pass.rows;
  const int64_t head_dim = c.HeadDim(layer);
  const int64_t kv_heads = c.NumKvHeads(layer);
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model, vectors.attn_norm,
                                                 c.rms_norm_eps, d_.normed, stream_));
  float* const qkv[] = {d_.q, d_.k_new, d_.v_new};
  BITSPLIT_RETURN_IF_ERROR(Linear({layer, LinearGroup::kQkv}, d_.normed, n, qkv, pass.verify));
  if (c.ValueIsKey(layer)) {  // v is k's projection, before k's norm and RoPE
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        d_.v_new, d_.k_new, n * c.KvDim(layer) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  if (c.qkv_bias) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::AddRowVector(d_.q, vectors.q_bias, n, c.QDim(layer), stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::AddRowVector(d_.k_new, vectors.k_bias, n, c.KvDim(layer), stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::AddRowVector(d_.v_new, vectors.v_bias, n, c.KvDim(layer), stream_));
  }
  if (c.qk_norm) {  // each head normalized on its own, in place
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.q, nullptr, n * c.num_heads, head_dim,
                                                   vectors.attn_q_norm, c.rms_norm_eps, d_.q,
                                                   stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.k_new, nullptr, n * kv_heads, head_dim,
                                                   vectors.attn_k_norm, c.rms_norm_eps, d_.k_new,
                                                   stream_));
  }
  if (c.value_norm) {  // weightless, per head
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.v_new, nullptr, n * kv_heads, head_dim,
                                                   nullptr, c.rms_norm_eps, d_.v_new, stream_));
  }
  const bool local = c.IsLocalLayer(layer);
  const bool halves = c.rope_style == model::RopeStyle::kHalves;
  const float* rope_cos = local ? rope_local_cos_ : rope_cos_;
  const float* rope_sin = local ? rope_local_sin_ : rope_sin_;
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(d_.q, n, c.num_heads, head_dim,
                                                   c.RopeDims(layer), d_.positions, rope_cos,
                                                   rope_sin, halves, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(d_.k_new, n, kv_heads, head_dim,
                                                   c.RopeDims(layer), d_.positions, rope_cos,
                                                   rope_sin, halves, stream_));
  BITSPLIT_RETURN_IF_ERROR(StoreKvAndAttend(layer, pass));
  float* const projected[] = {d_.projected};
  BITSPLIT_RETURN_IF_ERROR(
      Linear({layer, LinearGroup::kAttnOutput}, d_.attention, n, projected, pass.verify));
  if (c.attn_output_bias) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::AddRowVector(d_.projected, vectors.o_bias, n, c.d_model, stream_));
  }
  return AddToHiddenState(vectors.attn_post_norm, pass);
}

absl::Status CudaModel::StoreKvAndAttend(int32_t layer, const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const bool local = c.IsLocalLayer(layer);
  const int64_t kv_dim = c.KvDim(layer);
  const int64_t q_dim = c.QDim(layer);
  // Each sequence's keys and values go to its own cache, and its rows attend over it.
  for (size_t s = 0; s < pass.slices.size(); ++s) {
    const SequenceSlice& slice = pass.slices[s];
    const int64_t r0 = slice.first_row;
    const kernels::KvStorage storage = slice.cache->storage();
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::StoreKvRows(d_.k_new + r0 * kv_dim, slice.rows, kv_dim,
                                                       storage, slice.cache->keys(layer),
                                                       FirstSlotOnDevice(s), stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::StoreKvRows(d_.v_new + r0 * kv_dim, slice.rows, kv_dim,
                                                       storage, slice.cache->values(layer),
                                                       FirstSlotOnDevice(s), stream_));
    kernels::AttentionArgs attention;
    attention.q = d_.q + r0 * q_dim;
    attention.keys = slice.cache->keys(layer);
    attention.values = slice.cache->values(layer);
    attention.storage = storage;
    attention.mask = d_.mask + slice.mask_offset;
    attention.out = d_.attention + r0 * q_dim;
    attention.scores = d_.scores + r0 * c.num_heads * options_.context;
    attention.rows = slice.rows;
    attention.prefix_length_on_device = PrefixLengthOnDevice(s);
    attention.mask_width = slice.mask_width;
    attention.score_stride = options_.context;
    attention.num_heads = c.num_heads;
    attention.num_kv_heads = c.NumKvHeads(layer);
    attention.head_dim = c.HeadDim(layer);
    attention.scale = c.attention_scale;
    attention.sinks = layer_vectors_[static_cast<size_t>(layer)].attn_sinks;  // null: none
    // A local layer sees the window's slots (PrepareSlidingWindow), a global one the mask's.
    if (local) {
      attention.visible_slots = d_.visible_slots + r0 * options_.context;
      attention.visible_counts = d_.visible_counts + r0;
      attention.visible_stride = options_.context;
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::Attention(attention, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::FeedForwardBlock(int32_t layer, const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const model::LayerNorms& vectors = layer_vectors_[static_cast<size_t>(layer)];
  const int64_t n = pass.rows;
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model, vectors.ffn_norm,
                                                 c.rms_norm_eps, d_.normed, stream_));
  if (c.dense_ffn) {
    float* const gate_up[] = {d_.gate, d_.up};
    BITSPLIT_RETURN_IF_ERROR(
        Linear({layer, LinearGroup::kGateUp}, d_.normed, n, gate_up, pass.verify));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::GatedActivationRows(
        d_.gate, d_.up, n, c.d_ff, c.d_ff, GatedActivationOf(c.ffn_activation),
        ops::kSwigluOaiAlpha, ops::kSwigluOaiLimit, d_.gate, stream_));
    float* const projected[] = {d_.projected};
    BITSPLIT_RETURN_IF_ERROR(
        Linear({layer, LinearGroup::kDown}, d_.gate, n, projected, pass.verify));
  }
  if (c.has_experts()) {
    if (c.parallel_experts) {
      // As LlamaModel (gemma4): the experts read pre_ffw_norm_2(x), the router
      // RMSNorm(x) / sqrt(d_model) * ffn_gate_inp.scale; the dense output and the experts' sum
      // get post_ffw_norm_1 and post_ffw_norm_2 before they are added.
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model,
                                                     vectors.experts_pre_norm, c.rms_norm_eps,
                                                     d_.experts_normed, stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model, nullptr,
                                                     c.rms_norm_eps, d_.router_input, stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ScaleRowsByVector(
          d_.router_input, n, c.d_model, 1.0f / std::sqrt(static_cast<float>(c.d_model)),
          vectors.router_input_scale, stream_));
      BITSPLIT_RETURN_IF_ERROR(
          ExpertsBlock(layer, d_.experts_normed, d_.router_input, d_.experts_sum, pass));
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.projected, nullptr, n, c.d_model,
                                                     vectors.dense_post_norm, c.rms_norm_eps,
                                                     d_.projected, stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.experts_sum, nullptr, n, c.d_model,
                                                     vectors.experts_post_norm, c.rms_norm_eps,
                                                     d_.experts_sum, stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          kernels::AddInPlace(d_.projected, d_.experts_sum, n * c.d_model, stream_));
    } else {
      BITSPLIT_RETURN_IF_ERROR(ExpertsBlock(layer, d_.normed, d_.normed, d_.projected, pass));
    }
  }
  BITSPLIT_RETURN_IF_ERROR(AddToHiddenState(vectors.ffn_post_norm, pass));
  if (c.layer_output_scale) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ScaleInPlace(
        d_.x, n * c.d_model, layer_output_scales_[static_cast<size_t>(layer)], stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::AddToHiddenState(const float* post_norm, const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  const int64_t n = pass.rows;
  if (c.post_norms) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.projected, nullptr, n, c.d_model, post_norm,
                                                   c.rms_norm_eps, d_.projected, stream_));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddInPlace(d_.x, d_.projected, n * c.d_model, stream_));
  return absl::OkStatus();
}

absl::Status CudaModel::OutputHead(const ForwardPass& pass) {
  const model::ModelConfig& c = config_;
  // The selected rows only, in the order asked (repeats allowed).
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, pass.selects_rows ? d_.logit_rows : nullptr,
                                                 pass.logit_rows, c.d_model, output_norm_,
                                                 c.rms_norm_eps, d_.normed, stream_));
  float* const head[] = {d_.logits};
  BITSPLIT_RETURN_IF_ERROR(
      Linear(LinearGroupId::Head(), d_.normed, pass.logit_rows, head, pass.verify));
  if (c.final_logit_softcap > 0.0f) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SoftCap(d_.logits, pass.logit_rows * c.vocab_size,
                                                   c.final_logit_softcap, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::LaunchDraftGraph(const ForwardShape& shape, const SequenceSlice& slice) {
  auto found = std::find_if(graphs_.begin(), graphs_.end(),
                            [&](const CapturedForward& g) { return g.shape == shape; });
  if (found == graphs_.end()) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status status = EnqueueForward(shape, {&slice, 1}, /*verify=*/false);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!status.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      BITSPLIT_RETURN_IF_ERROR(status);
      BITSPLIT_CUDA_RETURN_IF_ERROR(ended);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    BITSPLIT_CUDA_RETURN_IF_ERROR(instantiated);
    if (graphs_.size() >= kMaxCapturedForwards) {
      cudaGraphExecDestroy(graphs_.front().exec);
      graphs_.erase(graphs_.begin());
    }
    graphs_.push_back({shape, exec, timings_.groups});
    found = graphs_.end() - 1;
    ++graphs_captured_;
  }
  timings_.groups = found->groups;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(found->exec, stream_));
  ++graph_launches_;
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(const model::Batch& batch, DeviceKvCache& cache,
                                std::span<float> logits, model::ForwardMode mode) {
  const int64_t needed = batch.num_logit_rows() * config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) < needed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits buffer holds %d floats; %d rows x %d vocab need %d", logits.size(),
                        batch.num_logit_rows(), config_.vocab_size, needed));
  }
  BITSPLIT_RETURN_IF_ERROR(Forward(batch, cache, mode));
  return CopyLogits(logits.subspan(0, static_cast<size_t>(needed)));
}

}  // namespace bitsplit::cuda
