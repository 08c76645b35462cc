#pragma once
// SpeculativeSession on the CPU (common/speculation/session.h): LlamaModel forwards, the target
// and the draft sharing one KV cache (or, for the ablation, the draft keeping its own).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/speculation/session.h"

namespace bitsplit::speculation {

// The CPU session: the target and the draft are LlamaModels (the split model in
// verify and draft mode, or a separate draft GGUF in reference mode).
class CpuSpeculativeSession final : public SpeculativeSession {
 public:
  struct Options {
    int64_t capacity = 2048;  // tokens the session may hold (prompt + output + a tree)
    DraftKv draft_kv = DraftKv::kShared;
    int64_t own_kv_chunk = 64;  // own KV: rows of each draft forward that catches it up
    model::KvType kv_type = model::KvType::kF32;  // the KV caches' rows
  };

  // `target` runs in `target_mode` (verify for a split model), `draft` in `draft_mode` (draft for
  // the split model's base; reference for a separate GGUF draft model). Both must outlive the
  // session and have the same layer count and KV width when the draft reads the verifier's KV.
  static absl::StatusOr<std::unique_ptr<CpuSpeculativeSession>> Create(
      model::LlamaModel& target, model::ForwardMode target_mode, model::LlamaModel& draft,
      model::ForwardMode draft_mode, const Options& options);

  int64_t committed_length() const override { return target_cache_.committed_length(); }
  int64_t capacity() const override { return capacity_; }
  std::span<const int32_t> committed_tokens() const override { return committed_tokens_; }
  // Grows the KV caches when `capacity` needs it.
  absl::Status Reuse(int64_t length, int64_t capacity) override;
  // The verifier's KV cache (what the draft reads too, unless it keeps its own).
  const model::KvCache& target_cache() const { return target_cache_; }

  // RunBatchedStep over sessions that share their target and draft models (their forwards are
  // model::LlamaModel::ForwardSequences).
  static void StepMany(std::span<CpuSpeculativeSession* const> sessions,
                       std::span<SessionStep> steps);
  // This session's step alone (StepMany of one); its status.
  absl::Status Step(SessionStep& step);

 private:
  friend class CpuBatchedStep;
  CpuSpeculativeSession(model::LlamaModel& target, model::ForwardMode target_mode,
                        model::LlamaModel& draft, model::ForwardMode draft_mode,
                        const Options& options, model::KvCache target_cache);
  // Brings the draft's own cache up to the committed tokens (own-KV mode).
  absl::Status CatchUpDraftCache();

  model::LlamaModel& target_;
  const model::ForwardMode target_mode_;
  model::LlamaModel& draft_;
  const model::ForwardMode draft_mode_;
  const Options options_;
  model::KvCache target_cache_;
  int64_t capacity_;                             // <= target_cache_.capacity()
  std::unique_ptr<model::KvCache> draft_cache_;  // own-KV mode only
  std::vector<int32_t> committed_tokens_;
  model::Sampler sampler_;
  std::vector<float> logits_;
};

}  // namespace bitsplit::speculation
