#pragma once
// The residual file the service holds (model::ResidualFile: mapped, never copied, validated),
// its memory optionally locked in RAM, advised for transparent huge pages and pre-faulted, and
// the kernel threads that compute a group for a batch of activations.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/split_file.h"
#include "common/model/residual_file.h"
#include "common/util/thread_pool.h"

namespace bitsplit::residual {

struct StoreOptions {
  int threads = 0;           // <= 0: every CPU the process may use
  bool pin_threads = false;  // worker i on the i-th allowed CPU
  bool mlock = false;        // lock the mapping in RAM (needs RLIMIT_MEMLOCK >= file size)
  bool huge_pages = true;    // madvise(MADV_HUGEPAGE) on the mapping
  bool prefault = true;      // touch every page at startup
  // Workers, between jobs: busy polling, where a CPU is left over (Open)...
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);
  // ...else polling between sched_yield calls (ThreadPool::SetYieldSpin), then sleeping.
  std::chrono::nanoseconds yield_spin = std::chrono::milliseconds(2);
  uint64_t memory_total_override = 0;  // testing: pretend MemTotal/MemAvailable are this
};

class ResidualStore {
 public:
  // Opens and validates `path` (a residual split file) and prepares memory as `options` say.
  // INVALID_ARGUMENT for a corrupt file or one that is not a residual, RESOURCE_EXHAUSTED when
  // RAM is clearly insufficient or mlock fails (with the numbers and RLIMIT_MEMLOCK).
  static absl::StatusOr<std::unique_ptr<ResidualStore>> Open(const std::string& path,
                                                             const StoreOptions& options);

  const SplitFile& file() const { return residual_->file(); }
  const std::string& quantization() const { return residual_->quantization_string(); }
  int32_t num_layers() const { return residual_->num_layers(); }
  // AllLinearGroups order.
  const std::vector<model::ResidualGroup>& groups() const { return residual_->groups(); }
  const model::ResidualShapes& shapes() const { return residual_->shapes(); }
  uint64_t weight_bytes() const { return residual_->weight_bytes(); }
  int threads() const { return pool_->num_threads(); }
  bool mlocked() const { return mlocked_; }
  bool huge_pages() const { return options_.huge_pages; }
  bool pinned() const { return !cpus_.empty(); }
  // The CPU of worker 0 when pinned (threads that call Compute pin themselves there), else -1.
  int worker0_cpu() const { return cpus_.empty() ? -1 : cpus_[0]; }

  // The group a request names, after checking every field (model::ResidualFile::FindGroup).
  absl::StatusOr<const model::ResidualGroup*> Validate(int64_t layer, int64_t group, int64_t rows,
                                                       int64_t cols, int64_t max_rows) const {
    return residual_->FindGroup(layer, group, rows, cols, max_rows);
  }

  // model::SplitMatMulGroupPacked of `group` on the service's kernel threads; concurrent callers
  // are serialized. Returns the kernel time in ns.
  uint64_t Compute(const model::ResidualGroup& group, const model::QuantizedActivations& x,
                   float* y);
  // An expert group (`segments` already checked): for every segment, its rows of x through its
  // expert's slice of each matrix, into y laid out as Compute's with one expert's rows per
  // matrix (model::SplitMatMulExperts). Returns the kernel time in ns.
  uint64_t ComputeExperts(const model::ResidualGroup& group,
                          std::span<const model::ExpertRows> segments,
                          const model::QuantizedActivations& x, float* y);

  // What Compute did since the service started (InfoResponse; the coordinator's /metrics).
  struct Counters {
    uint64_t requests = 0;           // group matmuls computed
    uint64_t rows = 0;               // activation rows in them
    uint64_t weight_bytes_read = 0;  // residual bytes of the groups they read
    uint64_t compute_ns = 0;         // kernel time
  };
  Counters counters() const;

 private:
  ResidualStore() = default;
  absl::Status PrepareMemory();

  StoreOptions options_;
  std::unique_ptr<model::ResidualFile> residual_;
  bool mlocked_ = false;
  std::vector<int> cpus_;
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex compute_mutex_;
  model::QuantizedActivations segment_ ABSL_GUARDED_BY(compute_mutex_);  // one expert's rows
  Counters counters_ ABSL_GUARDED_BY(compute_mutex_);
};

}  // namespace bitsplit::residual
