#pragma once
// The compute side of the gpu-drafter service: the models and every session's KV cache. The
// service (drafter_service.h) checks requests, its scheduler (scheduler.h) owns the sessions,
// their limits and the residual link; an engine only runs the math of
// common/speculation/session.h. Engines (chosen by --backend): cpu (cpu_engine.h, always built) and
// cuda (cuda_engine.h, built with BITSPLIT_CUDA).
//
// Thread safety: an engine and its sessions are NOT thread-safe. Only the scheduler's thread
// calls into the engine: one forward runs at a time, and each iteration (Step) batches the
// generations' rows into it. A session may be destroyed on any thread
// (speculation::SpeculativeSession).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/sampler.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/speculation/session.h"

namespace bitsplit::drafter {

// What an engine reports about itself (DrafterInfo, the "serving" line).
struct EngineInfo {
  std::string name;                  // "cpu", "cuda"
  std::string model_name;            // the source GGUF's general.name
  model::ModelConfig config;         // of the target (the split model)
  std::string base_format;           // one line (SplitQuantizationString)
  std::string kv_type;               // the KV cache's element type: "f16", "q8_0", "f32"
  std::string fingerprint;           // 64 hex digits of the base file
  int threads = 0;                   // forward threads
  uint64_t base_bytes = 0;           // size of the mapped base file
  bool residual_in_process = false;  // the residual file is mapped in process
  std::string residual_format;       // one line, when in process
  uint64_t residual_bytes = 0;       // size of the mapped residual file, when in process
  // cuda: the device's name and the VRAM plan ("ITEM: SIZE" per line, then "total: ..."; one
  // line for the "serving" message); empty on the cpu backend.
  std::string device;
  std::string vram_plan;
  std::string vram_summary;
  uint64_t vram_budget_bytes = 0;
  int64_t planned_sessions = 0;  // cuda: the KV caches the VRAM plan holds; 0 on cpu
};

// The fields of EngineInfo that come from the split model's files: model name (general.name,
// else the base file's name), config, base format, fingerprint, file sizes, and the residual's
// when `residual_path` (in process) is given.
EngineInfo SplitModelInfo(const model::SplitModelFiles& files, const std::string& base_path,
                          const std::string& residual_path);

// `sessions` as the engine's own session type: every session an engine steps is one of its
// NewSession's.
template <class Session>
std::vector<Session*> OwnSessions(std::span<speculation::SpeculativeSession* const> sessions) {
  std::vector<Session*> own;
  own.reserve(sessions.size());
  for (speculation::SpeculativeSession* session : sessions)
    own.push_back(static_cast<Session*>(session));
  return own;
}

class DrafterEngine {
 public:
  virtual ~DrafterEngine() = default;
  virtual const std::string& name() const = 0;
  virtual const EngineInfo& info() const = 0;
  // Whether verifier forwards can run now: the residual is in process or a source is attached.
  virtual bool has_residual() const = 0;
  // Replaces the verifier's residual with `source` (a RemoteResidual of cpu-residual); nullptr
  // detaches it (verifier forwards then fail with FAILED_PRECONDITION). The source must outlive
  // its use. FAILED_PRECONDITION for an engine whose residual is in process.
  virtual absl::Status SetResidualSource(model::ResidualSource* source) = 0;
  // A session holding up to `context` tokens (prompt + output + one tree).
  virtual absl::StatusOr<std::unique_ptr<speculation::SpeculativeSession>> NewSession(
      int64_t context) = 0;
  // Host memory a session of `context` tokens allocates: its KV caches on the cpu backend; 0 on
  // cuda, whose caches are part of the VRAM plan.
  virtual uint64_t SessionHostBytes(int64_t context) const = 0;
  // One scheduler iteration over sessions this engine made (speculation::SessionStep): every step
  // in shared forwards where the engine batches sessions, else one session after another.
  virtual void Step(std::span<speculation::SpeculativeSession* const> sessions,
                    std::span<speculation::SessionStep> steps) = 0;
};

}  // namespace bitsplit::drafter
