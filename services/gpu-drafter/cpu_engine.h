#pragma once
// The cpu backend of the gpu-drafter service: the reference engine (LlamaModel::Forward) with
// CpuSpeculativeSession. The target is the split model (base file; the residual in process or
// from cpu-residual through SetResidualSource); the draft is the same model's base weights,
// reading the verifier's KV.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/speculation/cpu_session.h"
#include "services/gpu-drafter/drafter_engine.h"

namespace bitsplit::drafter {

struct CpuEngineOptions {
  std::string base_path;
  std::string residual_path;                    // non-empty: the residual is computed in process
  int threads = 0;                              // forward threads (<= 0: every hardware thread)
  model::KvType kv_type = model::KvType::kF16;  // every session's KV cache rows
};

class CpuEngine final : public DrafterEngine {
 public:
  // Loads the split model. Errors name the file (malformed, missing, a residual of another
  // quantize run).
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Create(const CpuEngineOptions& options);

  const std::string& name() const override { return info_.name; }
  const EngineInfo& info() const override { return info_; }
  bool has_residual() const override { return model_->SupportsMode(model::ForwardMode::kVerify); }
  absl::Status SetResidualSource(model::ResidualSource* source) override;
  absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> NewSession(
      int64_t context) override;
  // The verifier's KV cache (the draft reads it).
  uint64_t SessionHostBytes(int64_t context) const override;
  // Batched: speculation::CpuSpeculativeSession::StepMany.
  void Step(std::span<speculation::SpeculativeSession* const> sessions,
            std::span<speculation::SessionStep> steps) override;

 private:
  CpuEngine() = default;

  CpuEngineOptions options_;
  EngineInfo info_;
  std::unique_ptr<model::LlamaModel> model_;  // verify mode for the target, draft mode drafts
};

}  // namespace bitsplit::drafter
