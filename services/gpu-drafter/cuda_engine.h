#pragma once
// The cuda backend of the gpu-drafter service (docs/cuda.md): the split model's base weights and
// every session's fp16 KV cache in VRAM (cuda::CudaModel), the speculation step on the device
// (cuda::CudaSpeculativeSession). The residual half of every verify matmul stays on the CPU:
// cpu-residual through SetResidualSource, or the residual file in process (--residual-file).
//
// The VRAM is planned once at start-up for --max-sessions KV caches (auto: as many as the budget
// holds, at most --max-batch-rows) of --max-context tokens and forwards of
// max(--max-batch-rows, --max-tree-nodes + 1) tokens (every session's rows of one scheduler
// iteration); Create refuses with the plan's RESOURCE_EXHAUSTED message (what fits instead) when
// that does not fit the budget.
//
// Device 0 of the visible ones (CUDA_VISIBLE_DEVICES picks it): the scheduler's thread runs the
// forwards, and a thread's current device is 0 unless it sets another.
//
// Built only with BITSPLIT_CUDA (BITSPLIT_HAVE_CUDA). Thread safety: as DrafterEngine (the
// service serializes every call); a session may be destroyed on any thread.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_model.h"
#include "common/model/kv_cache.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "services/gpu-drafter/drafter_engine.h"

namespace bitsplit::drafter {

struct CudaEngineOptions {
  std::string base_path;
  std::string residual_path;  // non-empty: the residual is computed in process
  int threads = 0;            // host threads of the residual (<= 0: every hardware thread)
  int64_t context = 2048;     // every session's KV capacity (--max-context)
  int64_t sessions = 1;  // KV caches held at once (--max-sessions); 0: as many as the budget holds
  int64_t max_sessions = 256;    // the bound of sessions = 0
  int64_t max_tree_nodes = 129;  // largest tree, root included (--max-tree-nodes)
  int64_t max_batch_rows = 256;  // rows of one scheduler iteration (--max-batch-rows)
  uint64_t vram_budget = 0;      // 0: free device memory minus model::DefaultVramBudget's margin
  model::KvType kv_type = model::KvType::kF16;  // f16 or q8_0 (--kv-type)
};

class CudaEngine final : public DrafterEngine {
 public:
  // Opens the files and uploads the base weights. Errors: the files' (as CpuEngine), the VRAM
  // plan's refusal (RESOURCE_EXHAUSTED, naming what fits), CUDA failures (FAILED_PRECONDITION
  // without a device, RESOURCE_EXHAUSTED out of memory, INTERNAL otherwise). A context beyond the
  // model's is planned at the model's context length (the caller rejects the flag).
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const CudaEngineOptions& options);

  const std::string& name() const override { return info_.name; }
  const EngineInfo& info() const override { return info_; }
  bool has_residual() const override { return model_->has_residual(); }
  absl::Status SetResidualSource(model::ResidualSource* source) override;
  // A session with one of the planned KV caches; `context` (at most the planned context,
  // INVALID_ARGUMENT beyond) bounds what the session accepts, as on the cpu backend.
  // RESOURCE_EXHAUSTED when every planned KV cache is in use.
  absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> NewSession(
      int64_t context) override;
  uint64_t SessionHostBytes(int64_t) const override { return 0; }
  // Batched: cuda::CudaSpeculativeSession::StepMany.
  void Step(std::span<speculation::SpeculativeSession* const> sessions,
            std::span<speculation::SessionStep> steps) override;

  const model::VramPlan& plan() const { return model_->plan(); }

 private:
  CudaEngine() = default;

  CudaEngineOptions options_;
  EngineInfo info_;
  std::unique_ptr<model::SplitModelFiles> files_;  // the residual views and host embedding rows
  std::unique_ptr<model::InProcessResidual> in_process_residual_;
  std::unique_ptr<cuda::CudaModel> model_;
};

}  // namespace bitsplit::drafter
