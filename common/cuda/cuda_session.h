#pragma once
// One sequence on the CUDA backend: speculation::SpeculativeSession (common/speculation/session.h)
// with the verifier's KV cache on the device, read by the draft (shared KV; the own-KV ablation is
// CPU-only), stepped by StepMany. The draft's children and the target's choices are computed on
// the device (CudaModel::TopK, CudaModel::ChooseTargets); only the chosen ids cross to the host,
// plus the logits when log-probabilities are asked for.
//
// Thread safety: as speculation::SpeculativeSession; sessions of one CudaModel must be serialized
// (one forward at a time), and a session may be destroyed on any thread.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/cuda_model.h"
#include "common/model/sampler.h"
#include "common/speculation/session.h"

namespace bitsplit::cuda {

class CudaSpeculativeSession final : public speculation::SpeculativeSession {
 public:
  struct Options {
    // Tokens the session accepts, at most the planned context (0: all of it). A session may
    // accept fewer than its KV cache holds, so that it behaves as a CPU session of that capacity.
    int64_t capacity = 0;
  };

  // A session with one of the VRAM plan's KV caches. RESOURCE_EXHAUSTED when every KV cache of
  // the plan is in use; INVALID_ARGUMENT for a capacity beyond the planned context.
  static absl::StatusOr<std::unique_ptr<CudaSpeculativeSession>> Create(CudaModel& model,
                                                                        const Options& options);

  int64_t committed_length() const override { return cache_->committed_length(); }
  int64_t capacity() const override { return capacity_; }
  std::span<const int32_t> committed_tokens() const override { return committed_tokens_; }
  // Within the planned KV cache only (FAILED_PRECONDITION beyond it).
  absl::Status Reuse(int64_t length, int64_t capacity) override;
  DeviceKvCache& cache() { return *cache_; }

  // speculation::RunBatchedStep over sessions of one CudaModel: each draft round and the verifier
  // pass of every session in one CudaModel::ForwardSequences. A tree or prefill chunk takes at most
  // the model's max_batch_rows rows.
  static void StepMany(std::span<CudaSpeculativeSession* const> sessions,
                       std::span<speculation::SessionStep> steps);
  // This session's step alone (StepMany of one); its status.
  absl::Status Step(speculation::SessionStep& step);
  // The last verifier forward this session took part in: residual wait, GPU wait, GPU idle
  // (CudaModel::last_timings).
  const ForwardTimings& verify_forward_timings() const { return verify_forward_timings_; }

 private:
  friend class CudaBatchedStep;
  CudaSpeculativeSession(CudaModel& model, std::unique_ptr<DeviceKvCache> cache, int64_t capacity)
      : model_(model), cache_(std::move(cache)), capacity_(capacity) {}

  CudaModel& model_;
  std::unique_ptr<DeviceKvCache> cache_;
  int64_t capacity_;  // <= cache_->capacity()
  std::vector<int32_t> committed_tokens_;
  model::Sampler sampler_;
  std::vector<float> logits_;
  ForwardTimings verify_forward_timings_;
};

}  // namespace bitsplit::cuda
