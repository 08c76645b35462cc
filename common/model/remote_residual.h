#pragma once
// The residual half of verify mode computed by the cpu-residual service over a shared-memory
// channel (common/io/shm_channel.h): a ResidualSource, so SplitLinearBackend (and with it
// LlamaModel's forward) runs unchanged with a remote residual. Attaching the channel is a gRPC
// call (common/rpc/residual_client.h); this class only drives an attached channel.
//
// Bit-identity with InProcessResidual: the service runs the same kernels (quant::MatMulRows over
// the same MatrixViews, split over weight rows) on the same int8 activations, producing
// y = x·Rᵀ, and Accumulate adds out += y element by element: exactly what the in-process
// `accumulate` path computes (out + y, one f32 add per element).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/shm_channel.h"
#include "common/model/config.h"
#include "common/model/split_backend.h"

namespace bitsplit::model {

// The shapes of every residual group: input width and the output width of each matrix.
struct ResidualGroupShape {
  int64_t cols = 0;
  std::vector<int64_t> rows;  // output order
  bool operator==(const ResidualGroupShape&) const = default;
};
struct ResidualShapes {
  LinearGroupLayout layout;
  int64_t num_experts = 0;  // the expert groups' tall matrices hold this many experts each
  // In AllLinearGroups order (FindLinearGroupIndex).
  std::vector<ResidualGroupShape> groups;

  // Null when `id` is out of range.
  const ResidualGroupShape* Find(LinearGroupId id) const;
  int64_t max_cols() const;
  // The widest output a request row gets: a dense group's rows, one expert's share of an expert
  // group's (summed over the group's matrices).
  int64_t max_outputs() const;
  // Rows of each matrix a request's row gets for group `id` (one expert's share for the expert
  // groups); empty when `id` is out of range.
  std::vector<int64_t> OutputRows(LinearGroupId id) const;
  bool operator==(const ResidualShapes&) const = default;

  static ResidualShapes FromConfig(const ModelConfig& config);
};

// Counters of a RemoteResidual (cumulative).
struct RemoteResidualStats {
  int64_t calls = 0;
  uint64_t round_trip_ns = 0;  // submit to response, client side
  uint64_t server_ns = 0;      // the service's own time
  uint64_t compute_ns = 0;     // of which kernels
  uint64_t wait_ns = 0;        // time spent waiting for responses (what overlap did not hide)
};

// Thread safety: one Accumulate at a time (like every ResidualSource).
class RemoteResidual final : public ResidualSource {
 public:
  // `channel` is an attached channel of a service holding a residual of `shapes`, computing
  // with `service_threads` kernel threads on this machine (0: unknown, or elsewhere).
  RemoteResidual(std::unique_ptr<shm::ShmChannelClient> channel, ResidualShapes shapes,
                 int service_threads = 0);

  // outputs[i] += x · R_iᵀ computed by the service. INVALID_ARGUMENT for a group or activation
  // shape the residual does not have (or T above the channel's max_rows), the service's status
  // for a refused request, UNAVAILABLE / DEADLINE_EXCEEDED when the service is gone or hangs.
  absl::Status Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                          std::span<float* const> outputs, ThreadPool& pool) override;
  // Posts the request and returns at once; the Accumulate of the same group collects it.
  absl::Status Submit(LinearGroupId id, const quant::QuantizedActivations& x) override;
  // The segments' rows of outputs[i] += x · R_iᵀ through each segment's expert, in one request:
  // the service reads each routed expert's residual once. Errors as Accumulate's.
  absl::Status AccumulateExperts(int32_t layer, LinearGroup group,
                                 std::span<const ExpertRows> segments,
                                 const quant::QuantizedActivations& x,
                                 std::span<float* const> outputs, ThreadPool& pool) override;

  // The channel's own areas in the shared segment: the caller writes the activations there, and
  // y is read where the service wrote it (no copy on this side). They hold the channel's
  // max_rows, whatever `max_rows` asks.
  absl::StatusOr<const ResidualStaging*> Staging(int64_t max_rows) override;
  absl::Status SubmitStaged(LinearGroupId id, int64_t rows, int64_t cols) override;
  absl::Status WaitStaged(LinearGroupId id, ThreadPool& pool) override;

  // The raw operation: submits `x` for group `id` and leaves y = x·R_iᵀ (matrix i at
  // [T][rows_i], back to back) in the channel's output area, returned through `y`.
  absl::Status Compute(LinearGroupId id, const quant::QuantizedActivations& x, const float** y,
                       shm::ShmCallInfo* info);

  const ResidualShapes& shapes() const { return shapes_; }
  const RemoteResidualStats& stats() const { return stats_; }
  int64_t max_rows() const { return channel_->header().max_rows; }
  bool healthy() const { return channel_->Healthy(); }
  shm::ShmChannelClient& channel() { return *channel_; }

 private:
  absl::Status CheckFits(LinearGroupId id, int64_t rows, int64_t cols, int64_t block_stride) const;
  absl::Status Post(LinearGroupId id, int64_t rows, int64_t cols, size_t num_segments = 0);
  // Collects and drops an earlier submission nobody collected (its forward failed).
  void CollectAbandoned();
  // Writes x (and an expert group's segments) to the channel and posts the request.
  absl::Status Send(LinearGroupId id, const quant::QuantizedActivations& x,
                    std::span<const ExpertRows> segments = {});
  // Stops the pool's idle workers from polling where the service needs the CPUs they would take.
  void LeaveCpusToService(ThreadPool& pool) const;
  absl::Status Receive(LinearGroupId id, const float** y, shm::ShmCallInfo* info);

  std::unique_ptr<shm::ShmChannelClient> channel_;
  ResidualShapes shapes_;
  int service_threads_;
  size_t cpus_;                             // CPUs this process may run on
  std::optional<LinearGroupId> in_flight_;  // submitted, not yet received
  ResidualStaging staging_;
  RemoteResidualStats stats_;
};

}  // namespace bitsplit::model
