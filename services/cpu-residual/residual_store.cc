#include "services/cpu-residual/residual_store.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "spdlog/spdlog.h"

namespace bitsplit::residual {

void CopyActivations(int64_t rows, int64_t cols, int64_t block_stride, const void* codes,
                     const void* scales, const void* sums, quant::QuantizedActivations* x) {
  x->rows = rows;
  x->cols = cols;
  x->block_stride = block_stride;
  x->codes.resize(static_cast<size_t>(rows * cols));
  x->scales.resize(static_cast<size_t>(rows * block_stride));
  x->sums.resize(static_cast<size_t>(rows * block_stride));
  std::memcpy(x->codes.data(), codes, x->codes.size());
  std::memcpy(x->scales.data(), scales, x->scales.size() * sizeof(float));
  std::memcpy(x->sums.data(), sums, x->sums.size() * sizeof(float));
}
namespace {

using model::LinearGroup;
using model::LinearGroupId;

std::string Bytes(uint64_t bytes) { return absl::StrCat(bytes, " bytes (", bytes >> 20, " MiB)"); }

// MemTotal and MemAvailable in bytes (0 when unknown).
void ReadMeminfo(uint64_t* total, uint64_t* available) {
  *total = *available = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") *total = kib << 10;
    if (key == "MemAvailable:") *available = kib << 10;
  }
}

std::string RlimitText(rlim_t value) {
  return value == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResidualStore>> ResidualStore::Open(const std::string& path,
                                                                   const StoreOptions& options) {
  std::unique_ptr<ResidualStore> store(new ResidualStore());
  store->options_ = options;
  BITSPLIT_ASSIGN_OR_RETURN(store->file_, SplitFile::Open(path, SplitFileKind::kResidual,
                                                          model::SplitFormatRowSizeOracle()));
  BITSPLIT_RETURN_IF_ERROR(store->LoadGroups());
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

absl::Status ResidualStore::LoadGroups() {
  const SplitFile& file = *file_;
  auto bad = [&](const std::string& detail) {
    return absl::InvalidArgumentError(absl::StrCat(file.name(), ": ", detail));
  };
  const nlohmann::json& metadata = file.metadata();
  const auto record = metadata.find(model::kSplitMetadataKey);
  if (record == metadata.end() || !record->is_object() || !record->contains("quantization")) {
    return bad("metadata has no quantization record; not a residual written by bitsplit quantize");
  }
  auto q = model::SplitRecordQuantization(*record);
  if (!q.ok()) return bad(std::string(q.status().message()));
  if (!q->residual_format) return bad("the quantization record says the model has no residual");
  quantization_ = model::SplitQuantizationString(*q);

  while (file.FindTensor(absl::StrCat("blk.", num_layers_, ".attn_q.weight")) != nullptr) {
    ++num_layers_;
  }
  if (num_layers_ == 0) return bad("no layers (tensor blk.0.attn_q.weight is missing)");
  std::vector<LinearGroupId> ids;
  for (int32_t layer = 0; layer < num_layers_; ++layer) {
    for (LinearGroup g :
         {LinearGroup::kQkv, LinearGroup::kAttnOutput, LinearGroup::kGateUp, LinearGroup::kDown}) {
      ids.push_back({layer, g});
    }
  }
  ids.push_back(LinearGroupId::Head());
  size_t matrices = 0;
  shapes_.num_layers = num_layers_;
  for (const LinearGroupId id : ids) {
    StoreGroup group;
    group.id = id;
    for (const std::string& name : model::LinearGroupTensorNames(id)) {
      BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* tensor, file.GetTensor(name));
      const uint32_t expected = SplitTensorFormat(static_cast<uint32_t>(*q->residual_format));
      if (tensor->format != expected ||
          tensor->group_size != static_cast<uint32_t>(q->residual_group) ||
          tensor->dims.size() != 2) {
        return bad(absl::StrCat("tensor ", name, " is not a 2-D ", quantization_,
                                " residual matrix (format ", TensorFormatName(tensor->format),
                                ", group ", tensor->group_size, ", ", tensor->dims.size(),
                                " dims)"));
      }
      auto view = quant::MakeMatrixView(*q->residual_format, q->residual_group, tensor->rows(),
                                        tensor->cols(), tensor->data, tensor->num_bytes);
      if (!view.ok()) return bad(absl::StrCat("tensor ", name, ": ", view.status().message()));
      if (group.matrices.empty()) group.cols = view->cols;
      if (view->cols != group.cols) {
        return bad(absl::StrCat("tensor ", name, " has ", view->cols, " columns, but ",
                                group.names[0], " of the same group has ", group.cols));
      }
      group.matrices.push_back(*view);
      group.names.push_back(name);
      group.total_rows += view->rows;
      group.bytes += tensor->num_bytes;
      ++matrices;
    }
    weight_bytes_ += group.bytes;
    model::ResidualGroupShape shape;
    shape.cols = group.cols;
    for (const quant::MatrixView& m : group.matrices) shape.rows.push_back(m.rows);
    shapes_.groups.push_back(shape);
    groups_.push_back(std::move(group));
  }
  if (matrices != file.tensors().size()) {
    for (const SplitTensor& tensor : file.tensors()) {
      bool known = false;
      for (const StoreGroup& g : groups_) {
        known = known || std::find(g.names.begin(), g.names.end(), tensor.name) != g.names.end();
      }
      if (!known) return bad(absl::StrCat("unexpected tensor ", tensor.name));
    }
  }
  return absl::OkStatus();
}

absl::Status ResidualStore::PrepareMemory() {
  const SplitFile& file = *file_;
  const uint64_t size = file.image_size();
  uint64_t total = 0, available = 0;
  ReadMeminfo(&total, &available);
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
  if (options_.prefault) {
    const auto start = std::chrono::steady_clock::now();
    const uint8_t* data = file.image_data();
    const uint64_t pages = (size + 4095) / 4096;
    std::vector<uint64_t> sinks(static_cast<size_t>(pool_->num_threads()), 0);
    pool_->RunOnEveryWorker([&](int worker) {
      const uint64_t n = static_cast<uint64_t>(pool_->num_threads());
      const uint64_t begin = pages * static_cast<uint64_t>(worker) / n;
      const uint64_t end = pages * static_cast<uint64_t>(worker + 1) / n;
      uint64_t sum = 0;
      for (uint64_t page = begin; page < end; ++page) {
        sum += *reinterpret_cast<const volatile uint8_t*>(data + page * 4096);
      }
      sinks[static_cast<size_t>(worker)] = sum;
    });
    spdlog::info("pre-faulted {} pages of {} in {:.3f} s", pages, file.name(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return absl::OkStatus();
}

absl::StatusOr<const StoreGroup*> ResidualStore::Validate(int64_t layer, int64_t group,
                                                          int64_t rows, int64_t cols,
                                                          int64_t max_rows) const {
  if (group < 0 || group >= model::kNumLinearGroups) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group, " is not a matrix group (0..",
                                                   model::kNumLinearGroups - 1, ")"));
  }
  const auto g = static_cast<LinearGroup>(group);
  size_t index = 0;
  if (g == LinearGroup::kOutputHead) {
    if (layer != LinearGroupId::kHeadLayer) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " with the output head group (expected -1)"));
    }
    index = static_cast<size_t>(num_layers_) * 4;
  } else {
    if (layer < 0 || layer >= num_layers_) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " is out of range [0, ", num_layers_, ")"));
    }
    index = static_cast<size_t>(layer) * 4 + static_cast<size_t>(group);
  }
  const StoreGroup& found = groups_[index];
  if (rows < 1 || rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows (T) ", rows, " is out of range [1, ", max_rows, "]"));
  }
  if (cols != found.cols) {
    return absl::InvalidArgumentError(absl::StrCat("cols ", cols,
                                                   " does not match the input width ", found.cols,
                                                   " of ", model::LinearGroupIdString(found.id)));
  }
  return &found;
}

uint64_t ResidualStore::Compute(const StoreGroup& group, const quant::QuantizedActivations& x,
                                float* y) {
  std::lock_guard<std::mutex> lock(compute_mutex_);
  const auto start = std::chrono::steady_clock::now();
  const model::GroupRowRanges ranges(group.matrices);
  float* outputs[model::kMaxMatricesPerGroup] = {nullptr};
  int64_t offset = 0;
  for (size_t i = 0; i < ranges.count; ++i) {
    outputs[i] = y + offset;
    offset += x.rows * group.matrices[i].rows;
  }
  const std::span<float* const> output_span(outputs, ranges.count);
  const int64_t total = ranges.total();
  // Small groups run on the calling thread alone: waking workers would cost more than the
  // work (how rows are split never changes results).
  constexpr int64_t kSmallGroupWeights = int64_t{1} << 18;
  if (total * group.cols <= kSmallGroupWeights) {
    model::MatMulGroupRows(group.matrices, ranges, x, 0, total, output_span,
                           /*accumulate=*/false);
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
  }
  const int64_t n = pool_->num_threads();
  // Chunks of whole row tiles (tiling never changes results: split_matmul.h).
  constexpr int64_t kGrain = quant::kMatMulRowGrain;
  const int64_t per = (total / kGrain + n - 1) / n * kGrain + (total % kGrain != 0 ? kGrain : 0);
  pool_->RunOnEveryWorker([&](int worker) {
    const int64_t begin = std::min(total, per * worker);
    model::MatMulGroupRows(group.matrices, ranges, x, begin, std::min(total, begin + per),
                           output_span, /*accumulate=*/false);
  });
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

}  // namespace bitsplit::residual
