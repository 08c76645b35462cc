#pragma once
// The residual file the service holds: mapped (never copied), validated, optionally locked in
// RAM, advised for transparent huge pages and pre-faulted, with a view of every matrix group and
// the kernels that compute a group for a batch of activations.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/split_file.h"
#include "common/model/linear_backend.h"
#include "common/model/remote_residual.h"
#include "common/quant/split_matmul.h"
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

// One group's matrices.
struct StoreGroup {
  model::LinearGroupId id;
  std::vector<quant::MatrixView> matrices;  // output order
  std::vector<std::string> names;
  int64_t cols = 0;
  int64_t total_rows = 0;
  uint64_t bytes = 0;
};

// Fills `x` (reusing its buffers) with T = rows activation rows received from a client: int8
// codes [rows][cols] and f32 block scales and sums [rows][block_stride], copied from `codes`,
// `scales` and `sums`. The caller has validated the sizes; both transports (shared memory and
// the MatMul RPC) hand their bytes to the kernels through this one copy.
void CopyActivations(int64_t rows, int64_t cols, int64_t block_stride, const void* codes,
                     const void* scales, const void* sums, quant::QuantizedActivations* x);

class ResidualStore {
 public:
  // Opens and validates `path` (a residual split file) and prepares memory as `options` say.
  // INVALID_ARGUMENT for a corrupt file or one that is not a residual, RESOURCE_EXHAUSTED when
  // RAM is clearly insufficient or mlock fails (with the numbers and RLIMIT_MEMLOCK).
  static absl::StatusOr<std::unique_ptr<ResidualStore>> Open(const std::string& path,
                                                             const StoreOptions& options);

  const SplitFile& file() const { return *file_; }
  const std::string& quantization() const { return quantization_; }
  int32_t num_layers() const { return num_layers_; }
  const std::vector<StoreGroup>& groups() const { return groups_; }  // LinearGroupIndex order
  const model::ResidualShapes& shapes() const { return shapes_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  int threads() const { return pool_->num_threads(); }
  bool mlocked() const { return mlocked_; }
  bool huge_pages() const { return options_.huge_pages; }
  bool pinned() const { return !cpus_.empty(); }
  // The CPU of worker 0 when pinned (threads that call Compute pin themselves there), else -1.
  int worker0_cpu() const { return cpus_.empty() ? -1 : cpus_[0]; }

  // The group a request names, after checking every field: layer in range (or -1 with the
  // head), a known group, 1 <= rows <= max_rows, cols equal to the group's input width.
  // INVALID_ARGUMENT naming the field otherwise.
  absl::StatusOr<const StoreGroup*> Validate(int64_t layer, int64_t group, int64_t rows,
                                             int64_t cols, int64_t max_rows) const;

  // y = x · R_iᵀ for every matrix i of `group`, matrix i written to y + T * (rows of the
  // matrices before it) as [T][rows_i]. Work is split over weight rows (batch invariant);
  // concurrent callers are serialized. Returns the kernel time in ns.
  uint64_t Compute(const StoreGroup& group, const quant::QuantizedActivations& x, float* y);

 private:
  ResidualStore() = default;
  absl::Status LoadGroups();
  absl::Status PrepareMemory();

  StoreOptions options_;
  std::unique_ptr<SplitFile> file_;
  std::string quantization_;
  int32_t num_layers_ = 0;
  std::vector<StoreGroup> groups_;
  model::ResidualShapes shapes_;
  uint64_t weight_bytes_ = 0;
  bool mlocked_ = false;
  std::vector<int> cpus_;
  std::unique_ptr<ThreadPool> pool_;
  std::mutex compute_mutex_;
};

}  // namespace bitsplit::residual
