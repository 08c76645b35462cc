#include "services/cpu-residual/residual_store.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/vram_plan.h"
#include "common/rpc/server_runner.h"
#include "common/util/meminfo.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "spdlog/spdlog.h"

namespace bitsplit::residual {

namespace {

std::string Bytes(uint64_t bytes) { return absl::StrCat(bytes, " bytes (", bytes >> 20, " MiB)"); }

std::string RlimitText(rlim_t value) {
  return value == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResidualStore>> ResidualStore::Open(const std::string& path,
                                                                   const StoreOptions& options) {
  std::unique_ptr<ResidualStore> store(new ResidualStore());
  store->options_ = options;
  BITSPLIT_ASSIGN_OR_RETURN(store->residual_, model::ResidualFile::Open(path));
  const std::vector<int> allowed = AllowedCpus();
  std::vector<int> cpus;
  if (options.pin_threads) cpus = allowed;
  int threads = options.threads;
  if (threads <= 0) threads = std::max<int>(1, static_cast<int>(allowed.size()));
  if (!cpus.empty()) cpus.resize(std::min(cpus.size(), static_cast<size_t>(threads)));
  store->cpus_ = cpus;
  // Idle kernel threads busy-poll for the next request only where they leave a CPU free: where
  // they cover every CPU, busy polling takes the CPUs the client (the drafter, on the same
  // machine) needs between requests (on 2 cores: 40% of decode speed). There they poll between
  // yields instead, which gives way to the client at once, rather than sleep: a worker woken
  // by futex per request joined the kernels 40-50 us late, which cost a 2-thread service on
  // 2 cores 12-20% of a T = 4 pass over the 1B-class residual.
  const bool cpu_left_over = threads < static_cast<int>(allowed.size());
  store->pool_ = std::make_unique<ThreadPool>(
      threads, cpu_left_over ? options.spin : std::chrono::nanoseconds(0), cpus);
  if (!cpu_left_over) store->pool_->SetYieldSpin(options.yield_spin);
  BITSPLIT_RETURN_IF_ERROR(store->PrepareMemory());
  return store;
}

absl::Status ResidualStore::PrepareMemory() {
  const SplitFile& file = residual_->file();
  const uint64_t size = file.image_size();
  const MemInfo memory = ReadMemInfo();
  uint64_t total = memory.total_bytes, available = memory.available_bytes;
  if (options_.memory_total_override != 0) total = available = options_.memory_total_override;
  if (total != 0 && size > total) {
    return absl::ResourceExhaustedError(
        absl::StrCat(file.name(), ": the residual needs ", Bytes(size),
                     " of RAM, but this machine has only ", Bytes(total), " (MemTotal)"));
  }
  if (options_.mlock && available != 0 && size > available) {
    return absl::ResourceExhaustedError(
        absl::StrCat(file.name(), ": locking the residual needs ", Bytes(size),
                     " of RAM, but only ", Bytes(available), " is available (MemAvailable)"));
  }
  if (available != 0 && size > available) {
    spdlog::warn("{}: the residual ({} bytes) exceeds MemAvailable ({} bytes); expect paging",
                 file.name(), size, available);
  }
  // The image starts at the mmap address (page aligned).
  void* base = const_cast<uint8_t*>(file.image_data());
  if (options_.huge_pages && madvise(base, size, MADV_HUGEPAGE) != 0) {
    spdlog::info("madvise(MADV_HUGEPAGE) on {}: {} (continuing with small pages)", file.name(),
                 std::strerror(errno));
  }
  if (madvise(base, size, MADV_WILLNEED) != 0) {
    spdlog::debug("madvise(MADV_WILLNEED): {}", std::strerror(errno));
  }
  // Faulted in first, with progress, also before mlock: mlock then finds every page present
  // instead of reading the file in silence.
  if (options_.prefault) {
    rpc::PrefaultWithProgress("bitsplit-residual", file.name(), file.image_data(), size, *pool_);
  }
  if (options_.mlock) {
    if (mlock(base, size) != 0) {
      const int error = errno;
      rlimit limit{};
      getrlimit(RLIMIT_MEMLOCK, &limit);
      return absl::ResourceExhaustedError(absl::StrCat(
          file.name(), ": mlock of ", Bytes(size), " failed (", std::strerror(error),
          "); RLIMIT_MEMLOCK is ", RlimitText(limit.rlim_cur), " (hard ",
          RlimitText(limit.rlim_max), ") bytes, and at least ", size,
          " are needed: raise it (ulimit -l, or LimitMEMLOCK= in the systemd unit) or drop "
          "--mlock"));
    }
    mlocked_ = true;
  }
  if (!mlocked_) {
    spdlog::warn(
        "{}: the residual ({}) is not locked in RAM (no --mlock): under memory pressure the kernel "
        "pages it out, and verification then reads it from disk. Lock it with --mlock, with "
        "LimitMEMLOCK=infinity in the systemd unit or `ulimit -l unlimited` (root) first",
        file.name(), model::FormatBytes(size));
  }
  return absl::OkStatus();
}

uint64_t ResidualStore::Compute(const model::ResidualGroup& group,
                                const model::QuantizedActivations& x, float* y) {
  std::lock_guard<std::mutex> lock(compute_mutex_);
  const auto start = std::chrono::steady_clock::now();
  model::SplitMatMulGroupPacked(group.matrices, x, y, *pool_);
  const auto compute_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  ++counters_.requests;
  counters_.rows += static_cast<uint64_t>(x.rows);
  for (const auto& matrix : group.matrices) {
    counters_.weight_bytes_read += static_cast<uint64_t>(matrix.rows) * matrix.row_stride;
  }
  counters_.compute_ns += compute_ns;
  return compute_ns;
}

uint64_t ResidualStore::ComputeExperts(const model::ResidualGroup& group,
                                       std::span<const model::ExpertRows> segments,
                                       const model::QuantizedActivations& x, float* y) {
  std::lock_guard<std::mutex> lock(compute_mutex_);
  const int64_t experts = shapes().num_experts;
  const auto start = std::chrono::steady_clock::now();
  // Matrix i's rows of every segment at y + rows * (one expert's rows of the matrices before it).
  float* outputs[model::kMaxMatricesPerGroup] = {};
  float* next = y;
  for (size_t i = 0; i < group.matrices.size(); ++i) {
    outputs[i] = next;
    next += x.rows * (group.matrices[i].rows / experts);
  }
  model::SplitMatMulExperts(group.matrices, experts, segments, x,
                            std::span<float* const>(outputs, group.matrices.size()),
                            /*accumulate=*/false, &segment_, *pool_);
  const auto compute_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  ++counters_.requests;
  counters_.rows += static_cast<uint64_t>(x.rows);
  for (const auto& matrix : group.matrices) {  // each routed expert's slice, once
    counters_.weight_bytes_read +=
        segments.size() * static_cast<uint64_t>(matrix.rows / experts) * matrix.row_stride;
  }
  counters_.compute_ns += compute_ns;
  return compute_ns;
}

ResidualStore::Counters ResidualStore::counters() const {
  std::lock_guard<std::mutex> lock(compute_mutex_);
  return counters_;
}

}  // namespace bitsplit::residual
