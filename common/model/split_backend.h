#pragma once
// Linear layers of a split model (docs/design.md §1, §4): every weight W ~= B + R with a low-bit
// base B and a 6/8-bit residual R, both stored in split formats (common/quant/split_format.h) and
// multiplied with int8 activations (common/quant/split_matmul.h).
//
//   draft   y = x·Bᵀ
//   verify  y = x·Bᵀ, then y += x·Rᵀ: two matmuls whose outputs are added, exactly as the
//           services split the work (base on the GPU, residual in the cpu-residual process).
//           The residual request is submitted before the base matmul runs, so a remote residual
//           overlaps with it.
//
// Per group the input is rotated (block Hadamard, when the model was quantized rotated) and
// quantized to int8 ONCE; the base and the residual matmuls read the same quantized rows. The
// residual half goes through a ResidualSource: in process (InProcessResidual) or the
// cpu-residual service over shared memory (RemoteResidual), the forward the same for both.
//
// Batch invariance: rotation and activation quantization are per row, and split_matmul's
// kernels give each output element one fixed arithmetic sequence; the residual is added to the
// base result in one fixed order. So a row's logits do not depend on the batch or threads.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/linear_backend.h"
#include "common/quant/split_matmul.h"
#include "common/util/thread_pool.h"

namespace bitsplit::model {

// A group input as the split kernels read it: int8 codes [T][cols], f32 block scales and sums
// [T][block_stride] (common/quant/split_matmul.h).
using QuantizedActivations = quant::QuantizedActivations;

// Fills `x` (reusing its buffers) with T = rows activation rows received from a client or a staging
// area: int8 codes [rows][cols] and f32 block scales and sums [rows][block_stride], copied from
// `codes`, `scales` and `sums`. The caller has validated the sizes; every transport (shared memory,
// an RPC, a source's staging memory) hands its bytes to the kernels through this one copy.
void CopyActivations(int64_t rows, int64_t cols, int64_t block_stride, const void* codes,
                     const void* scales, const void* sums, QuantizedActivations* x);

// Rows [first, first + count) of `x` into `out` (reusing its buffers).
void SliceActivations(const QuantizedActivations& x, int64_t first, int64_t count,
                      QuantizedActivations* out);

// The instruction set the split kernels of this process use ("avx512", "avx2", "scalar").
const char* SplitKernelIsaName();

// Block Hadamard rotation of every linear layer's input dimension (common/quant/hadamard.h).
struct HadamardRotation {
  int block = 0;  // 0: not rotated; else a power of two in [8, 1024] dividing every input dim
  uint64_t seed = 0;

  bool enabled() const { return block > 0; }
  bool operator==(const HadamardRotation&) const = default;
};

// Applies `rotation` in place to x[rows][cols] (no-op when disabled).
void RotateRows(const HadamardRotation& rotation, float* x, int64_t rows, int64_t cols);

// One matrix view per linear weight of a model, grouped like LinearGroupId (base or residual).
// The views point into a mapped split file that must outlive this table.
// Thread safety: immutable after construction.
class SplitLinearWeights {
 public:
  SplitLinearWeights() = default;
  explicit SplitLinearWeights(const ModelConfig& config)
      : config_(config), groups_(AllLinearGroups(config).size()) {}

  // The matrices of group `id`, in output order (LinearGroupTensorNames order).
  std::span<const quant::MatrixView> group(LinearGroupId id) const {
    return groups_[static_cast<size_t>(LinearGroupIndex(config_, id))];
  }
  std::vector<quant::MatrixView>& mutable_group(LinearGroupId id) {
    return groups_[static_cast<size_t>(LinearGroupIndex(config_, id))];
  }
  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  std::vector<std::vector<quant::MatrixView>> groups_;  // [LinearGroupIndex][matrix]
};

// A group's weight rows laid end to end: matrix i owns [start[i], start[i + 1]).
struct GroupRowRanges {
  explicit GroupRowRanges(std::span<const quant::MatrixView> matrices);
  int64_t total() const { return start[count]; }

  size_t count = 0;
  int64_t start[kMaxMatricesPerGroup + 1] = {0};
};

// Rows [begin, end) of a group, numbered as in `ranges`: each matrix's share of them,
// y_i (=|+=) x · W_iᵀ into outputs[i]. One thread's part of SplitMatMulGroup.
void MatMulGroupRows(std::span<const quant::MatrixView> matrices, const GroupRowRanges& ranges,
                     const quant::QuantizedActivations& x, int64_t begin, int64_t end,
                     std::span<float* const> outputs, bool accumulate);

// y_i (=|+=) x · W_iᵀ for every matrix of a group, in one parallel pass over all their rows
// (work split over weight rows only; results equal quant::MatMul's bits). A group of at most
// kSmallGroupWeights weights runs on the calling thread alone.
void SplitMatMulGroup(std::span<const quant::MatrixView> matrices,
                      const quant::QuantizedActivations& x, std::span<float* const> outputs,
                      bool accumulate, ThreadPool& pool);
// Expert `expert`'s row slice of each tall matrix of an expert group (`num_experts` experts).
struct ExpertViews {
  std::array<quant::MatrixView, kMaxMatricesPerGroup> matrices{};
  size_t count = 0;
};
ExpertViews ExpertSlicesOf(std::span<const quant::MatrixView> tall, int64_t num_experts,
                           int32_t expert);

// For every segment, its rows of outputs[i] (=|+=) those rows of x · W_iᵀ, W_i the segment's
// expert's slice of tall matrix i of an expert group (the base or the residual's);
// outputs.size() is the group's matrix count, output i's rows as wide as one expert's slice.
// `scratch` holds one segment's rows of x. Each expert's slice is read once for all its rows.
void SplitMatMulExperts(std::span<const quant::MatrixView> tall, int64_t num_experts,
                        std::span<const ExpertRows> segments, const QuantizedActivations& x,
                        std::span<float* const> outputs, bool accumulate,
                        QuantizedActivations* scratch, ThreadPool& pool);

// Waking the pool's workers costs more than the work below this many weights (a residual
// service's per-request groups of the small test models); how rows are split never changes
// results.
inline constexpr int64_t kSmallGroupWeights = int64_t{1} << 18;

// y = x · W_iᵀ for every matrix i of a group, written back to back: matrix i's [T][rows_i] at
// y + T * (rows of the matrices before it). The layout a residual source returns.
void SplitMatMulGroupPacked(std::span<const quant::MatrixView> matrices,
                            const quant::QuantizedActivations& x, float* y, ThreadPool& pool);

// Memory a residual source reads its activations from and leaves its output in, for callers
// that make the activations elsewhere (the CUDA backend): they copy the activations straight in
// and the output straight out, by DMA once `region` is registered (cudaHostRegister). Layouts as
// quant::QuantizedActivations: codes [T][cols], scales and sums [T][block_stride]; outputs: y =
// x · R_iᵀ of each matrix i of the group, [T][rows_i], back to back. `region` is page-aligned and
// holds all four.
struct ResidualStaging {
  int8_t* codes = nullptr;
  float* scales = nullptr;
  float* sums = nullptr;
  const float* outputs = nullptr;
  int64_t max_rows = 0;
  std::span<std::byte> region;
};

// Where the residual half of a verify matmul is computed.
class ResidualSource {
 public:
  virtual ~ResidualSource() = default;
  // The source's staging memory for forwards of up to `max_rows` tokens (made on the first call;
  // a source with fixed memory may hold fewer: ResidualStaging::max_rows says how many), or
  // nullptr when the source has none (then Accumulate is the only way in).
  virtual absl::StatusOr<const ResidualStaging*> Staging(int64_t max_rows) { return nullptr; }
  // Starts y = x · Rᵀ of group `id` on the `rows` x `cols` activations already in Staging();
  // WaitStaged finishes it, with y in Staging()->outputs. Sources without staging:
  // FAILED_PRECONDITION.
  virtual absl::Status SubmitStaged(LinearGroupId id, int64_t rows, int64_t cols) {
    return absl::FailedPreconditionError("this residual source has no staging memory");
  }
  virtual absl::Status WaitStaged(LinearGroupId id, ThreadPool& pool) {
    return absl::FailedPreconditionError("this residual source has no staging memory");
  }
  // outputs[i] += x · R_iᵀ for every matrix of group `id`. `x` is the group input already
  // rotated and quantized exactly as the base matmul saw it. Called by one forward at a time.
  virtual absl::Status Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                                  std::span<float* const> outputs, ThreadPool& pool) = 0;
  // Starts x · Rᵀ of group `id` where that can run beside this process's own work (a remote
  // service), before the base matmul; the next Accumulate of the same group and `x` finishes it.
  // A source that computes in process does nothing here.
  virtual absl::Status Submit(LinearGroupId id, const quant::QuantizedActivations& x) {
    return absl::OkStatus();
  }
  // outputs[i] rows of each segment += those rows of x · R_iᵀ, R_i the segment's expert's i-th
  // residual matrix of `group` in mixture-of-experts layer `layer` (LinearBackend::ApplyExperts
  // for the layout; x quantized as the base saw it). Each routed expert's residual is read once
  // for all its rows. Sources that do not compute experts: UNIMPLEMENTED.
  virtual absl::Status AccumulateExperts(int32_t layer, LinearGroup group,
                                         std::span<const ExpertRows> segments,
                                         const quant::QuantizedActivations& x,
                                         std::span<float* const> outputs, ThreadPool& pool) {
    return absl::UnimplementedError(
        "this residual source does not compute mixture-of-experts layers");
  }
};

// The residual file mapped in this process. Thread safety: Accumulate is stateless apart from
// the views; the staged calls keep the staged activations (one forward at a time, like every
// ResidualSource).
class InProcessResidual final : public ResidualSource {
 public:
  // `residual` must outlive this object.
  explicit InProcessResidual(const SplitLinearWeights& residual) : residual_(residual) {}
  absl::Status Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                          std::span<float* const> outputs, ThreadPool& pool) override;
  absl::Status AccumulateExperts(int32_t layer, LinearGroup group,
                                 std::span<const ExpertRows> segments,
                                 const quant::QuantizedActivations& x,
                                 std::span<float* const> outputs, ThreadPool& pool) override;

  // Page-aligned buffers of its own; WaitStaged computes y = x · Rᵀ into them (the activations
  // are read through a copy, as Accumulate's x).
  absl::StatusOr<const ResidualStaging*> Staging(int64_t max_rows) override;
  absl::Status SubmitStaged(LinearGroupId id, int64_t rows, int64_t cols) override;
  absl::Status WaitStaged(LinearGroupId id, ThreadPool& pool) override;

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };

  const SplitLinearWeights& residual_;
  std::unique_ptr<std::byte, FreeDeleter> staging_memory_;
  ResidualStaging staging_;
  std::optional<LinearGroupId> submitted_;
  quant::QuantizedActivations staged_x_;
  quant::QuantizedActivations segment_;  // one expert's rows (AccumulateExperts)
};

// Draft (residual == nullptr) or verify backend of a split model.
// Thread safety: Apply keeps scratch buffers; one forward at a time (like LlamaModel::Forward).
class SplitLinearBackend final : public LinearBackend {
 public:
  // `base` and `residual` (nullable: draft) must outlive the backend.
  SplitLinearBackend(const SplitLinearWeights& base, HadamardRotation rotation,
                     ResidualSource* residual)
      : base_(base), rotation_(rotation), residual_(residual) {}

  absl::Status Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override;
  // Per segment, the rows' base products through the segment's expert, then (verify) the
  // residual of every segment in one AccumulateExperts call. Rows are rotated and quantized to
  // int8 once, each on its own, as in Apply.
  absl::Status ApplyExperts(int32_t layer, LinearGroup group, const float* x, int64_t num_rows,
                            std::span<const ExpertRows> segments, std::span<float* const> outputs,
                            ThreadPool& pool) override;

 private:
  // activations_ = the int8 rows of x [rows, cols], rotated first when the model is.
  void QuantizeInput(const float* x, int64_t rows, int64_t cols);

  const SplitLinearWeights& base_;
  const HadamardRotation rotation_;
  ResidualSource* const residual_;
  std::vector<float> rotated_;               // [num_tokens, input dim] scratch
  quant::QuantizedActivations activations_;  // the group input as int8, reused across calls
  quant::QuantizedActivations segment_;      // one expert's rows of activations_
};

}  // namespace bitsplit::model
