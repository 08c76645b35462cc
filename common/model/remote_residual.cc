#include "common/model/remote_residual.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {

const ResidualGroupShape* ResidualShapes::Find(LinearGroupId id) const {
  const int64_t index = FindLinearGroupIndex(layout, id);
  if (index < 0 || index >= static_cast<int64_t>(groups.size())) return nullptr;
  return &groups[static_cast<size_t>(index)];
}

int64_t ResidualShapes::max_cols() const {
  int64_t result = 0;
  for (const ResidualGroupShape& g : groups) result = std::max(result, g.cols);
  return result;
}

int64_t ResidualShapes::max_outputs() const {
  int64_t result = 0;
  for (const LinearGroupId id : AllLinearGroups(layout)) {
    int64_t total = 0;
    for (int64_t r : OutputRows(id)) total += r;
    result = std::max(result, total);
  }
  return result;
}

std::vector<int64_t> ResidualShapes::OutputRows(LinearGroupId id) const {
  const ResidualGroupShape* shape = Find(id);
  if (shape == nullptr) return {};
  std::vector<int64_t> rows = shape->rows;
  if (IsExpertGroup(id.group)) {
    for (int64_t& r : rows) r /= num_experts;
  }
  return rows;
}

ResidualShapes ResidualShapes::FromConfig(const ModelConfig& config) {
  ResidualShapes shapes;
  shapes.layout = LinearGroupLayout::Of(config);
  shapes.num_experts = config.num_experts;
  for (const LinearGroupId id : AllLinearGroups(config)) {
    shapes.groups.push_back({LinearGroupInputDim(config, id), LinearGroupOutputDims(config, id)});
  }
  return shapes;
}

RemoteResidual::RemoteResidual(std::unique_ptr<shm::ShmChannelClient> channel,
                               ResidualShapes shapes, int service_threads)
    : channel_(std::move(channel)),
      shapes_(std::move(shapes)),
      service_threads_(service_threads),
      cpus_(AllowedCpus().size()) {
  BITSPLIT_CHECK(channel_ != nullptr);
}

absl::Status RemoteResidual::CheckFits(LinearGroupId id, int64_t rows, int64_t cols,
                                       int64_t block_stride) const {
  const ResidualGroupShape* shape = shapes_.Find(id);
  if (shape == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote residual has no group ", LinearGroupIdString(id)));
  }
  const shm::ShmHeader& header = channel_->header();
  if (rows < 1 || rows > header.max_rows || cols != shape->cols || cols > header.max_cols ||
      block_stride != static_cast<int64_t>(shm::BlockStride(static_cast<uint64_t>(cols)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activations [", rows, " x ", cols, "] do not fit group ", LinearGroupIdString(id),
        " (input width ", shape->cols, ", at most ", header.max_rows, " rows)"));
  }
  return absl::OkStatus();
}

absl::Status RemoteResidual::Post(LinearGroupId id, int64_t rows, int64_t cols,
                                  size_t num_segments) {
  BITSPLIT_RETURN_IF_ERROR(channel_->Post(id.layer, static_cast<uint32_t>(id.group),
                                          static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
                                          static_cast<uint32_t>(num_segments)));
  in_flight_ = id;
  return absl::OkStatus();
}

void RemoteResidual::LeaveCpusToService(ThreadPool& pool) const {
  // The service computes on this machine's CPUs: where its threads and the pool's leave none
  // free, the pool's idle workers must not poll on them (on 2 cores: 40% of decode speed).
  if (pool.num_threads() + service_threads_ > static_cast<int>(cpus_)) {
    pool.SetSpin(std::chrono::nanoseconds(0));
  }
}

void RemoteResidual::CollectAbandoned() {
  if (in_flight_.has_value()) {
    const float* ignored = nullptr;
    (void)Receive(*in_flight_, &ignored, nullptr);
  }
}

absl::Status RemoteResidual::Send(LinearGroupId id, const quant::QuantizedActivations& x,
                                  std::span<const ExpertRows> segments) {
  BITSPLIT_RETURN_IF_ERROR(CheckFits(id, x.rows, x.cols, x.block_stride));
  const size_t scale_floats = static_cast<size_t>(x.rows * x.block_stride);
  std::memcpy(channel_->codes(), x.codes.data(), static_cast<size_t>(x.rows * x.cols));
  std::memcpy(channel_->scales(), x.scales.data(), scale_floats * sizeof(float));
  std::memcpy(channel_->sums(), x.sums.data(), scale_floats * sizeof(float));
  shm::ShmExpertSegment* table = channel_->segments();
  for (size_t s = 0; s < segments.size(); ++s) {
    table[s] = {.expert = segments[s].expert,
                .first_row = static_cast<uint32_t>(segments[s].first_row),
                .count = static_cast<uint32_t>(segments[s].count),
                .reserved = 0};
  }
  return Post(id, x.rows, x.cols, segments.size());
}

absl::StatusOr<const ResidualStaging*> RemoteResidual::Staging(int64_t max_rows) {
  if (max_rows < 1) return absl::InvalidArgumentError("staging needs at least one row");
  const shm::ShmHeader& header = channel_->header();
  staging_.codes = channel_->codes();
  staging_.scales = channel_->scales();
  staging_.sums = channel_->sums();
  staging_.outputs = channel_->outputs();
  staging_.max_rows = header.max_rows;
  staging_.region = channel_->memory();
  return &staging_;
}

absl::Status RemoteResidual::SubmitStaged(LinearGroupId id, int64_t rows, int64_t cols) {
  BITSPLIT_RETURN_IF_ERROR(CheckFits(
      id, rows, cols, static_cast<int64_t>(shm::BlockStride(static_cast<uint64_t>(cols)))));
  CollectAbandoned();
  return Post(id, rows, cols);
}

absl::Status RemoteResidual::WaitStaged(LinearGroupId id, ThreadPool& pool) {
  if (!in_flight_.has_value() || !(*in_flight_ == id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", LinearGroupIdString(id), " was not submitted"));
  }
  const float* y = nullptr;
  return Receive(id, &y, nullptr);  // y is the channel's output area: Staging()->outputs
}

absl::Status RemoteResidual::Receive(LinearGroupId id, const float** y, shm::ShmCallInfo* info) {
  BITSPLIT_CHECK(in_flight_.has_value() && *in_flight_ == id);
  in_flight_.reset();
  const std::vector<int64_t> rows = shapes_.OutputRows(id);
  const uint64_t wait_start = shm::MonotonicNanos();
  shm::ShmCallInfo call;
  absl::Status status = channel_->Wait(&call);
  stats_.wait_ns += shm::MonotonicNanos() - wait_start;
  BITSPLIT_RETURN_IF_ERROR(status);
  bool shapes_match = call.num_outputs == rows.size();
  for (uint32_t i = 0; shapes_match && i < call.num_outputs; ++i) {
    shapes_match = call.output_rows[i] == rows[i];
  }
  if (!shapes_match) {
    return absl::InternalError(absl::StrCat("residual service answered group ",
                                            LinearGroupIdString(id), " with ", call.num_outputs,
                                            " outputs of other widths than it announced"));
  }
  ++stats_.calls;
  stats_.round_trip_ns += call.round_trip_ns;
  stats_.server_ns += call.server_ns;
  stats_.compute_ns += call.compute_ns;
  *y = channel_->outputs();
  if (info != nullptr) *info = call;
  return absl::OkStatus();
}

absl::Status RemoteResidual::Compute(LinearGroupId id, const quant::QuantizedActivations& x,
                                     const float** y, shm::ShmCallInfo* info) {
  BITSPLIT_RETURN_IF_ERROR(Send(id, x));
  return Receive(id, y, info);
}

absl::Status RemoteResidual::Submit(LinearGroupId id, const quant::QuantizedActivations& x) {
  CollectAbandoned();
  return Send(id, x);
}

absl::Status RemoteResidual::Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                                        std::span<float* const> outputs, ThreadPool& pool) {
  const ResidualGroupShape* shape = shapes_.Find(id);
  if (shape == nullptr || outputs.size() != shape->rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote residual: group ", LinearGroupIdString(id), " with ", outputs.size(),
                     " outputs does not match the service's residual"));
  }
  const float* y = nullptr;
  LeaveCpusToService(pool);
  if (in_flight_.has_value() && *in_flight_ == id) {
    BITSPLIT_RETURN_IF_ERROR(Receive(id, &y, nullptr));
  } else {
    BITSPLIT_RETURN_IF_ERROR(Submit(id, x));
    BITSPLIT_RETURN_IF_ERROR(Receive(id, &y, nullptr));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t n = x.rows * shape->rows[i];
    float* out = outputs[i];
    const float* in = y;
    // Element-wise adds: the order does not matter, so the work may be split any way.
    pool.ParallelForGrained(n, 4096, [&](int64_t begin, int64_t end, int /*worker*/) {
      for (int64_t j = begin; j < end; ++j) out[j] += in[j];
    });
    y += n;
  }
  return absl::OkStatus();
}

absl::Status RemoteResidual::AccumulateExperts(int32_t layer, LinearGroup group,
                                               std::span<const ExpertRows> segments,
                                               const quant::QuantizedActivations& x,
                                               std::span<float* const> outputs, ThreadPool& pool) {
  const LinearGroupId id{layer, group};
  const std::vector<int64_t> rows = shapes_.OutputRows(id);
  if (!IsExpertGroup(group) || rows.empty() || outputs.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote residual: group ", LinearGroupIdString(id), " with ", outputs.size(),
                     " outputs is not an expert group of the service's residual"));
  }
  BITSPLIT_RETURN_IF_ERROR(ValidateExpertSegments(layer, shapes_.num_experts, x.rows, segments));
  if (segments.empty()) return absl::OkStatus();
  LeaveCpusToService(pool);
  CollectAbandoned();
  BITSPLIT_RETURN_IF_ERROR(Send(id, x, segments));
  const float* y = nullptr;
  BITSPLIT_RETURN_IF_ERROR(Receive(id, &y, nullptr));
  // Matrix i's [rows][one expert's rows], back to back; only the segments' rows are results.
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t width = rows[i];
    for (const ExpertRows& segment : segments) {
      float* out = outputs[i] + segment.first_row * width;
      const float* in = y + segment.first_row * width;
      for (int64_t j = 0; j < segment.count * width; ++j) out[j] += in[j];
    }
    y += x.rows * width;
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
