#pragma once
// The linear layers of a llama forward pass, behind one interface so that one forward serves
// every way of computing them (docs/design.md §11):
//
//   reference  the source GGUF weights, dequantized to f32 (GgufLinearBackend, here)
//   draft      the split model's base weights only          (SplitLinearBackend, split_backend.h)
//   verify     base + residual, as two matmuls whose outputs are added
//
// The forward hands a backend one matrix GROUP at a time: the matrices of a layer that read the
// same input (q|k|v, o, gate|up, down, and the output head). A group is the unit a residual
// service computes (docs/design.md §2), so its identity (layer + group) is explicit in every call.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/model/config.h"
#include "common/model/weights.h"
#include "common/util/thread_pool.h"

namespace bitsplit::model {

enum class LinearGroup : int32_t {
  kQkv = 0,         // attn_q | attn_k | attn_v; input: attention-normed x [d_model]
                    // (attn_q | attn_k where the layer's values are its keys)
  kAttnOutput = 1,  // attn_output;              input: attention output [QDim(layer)]
  kGateUp = 2,      // ffn_gate | ffn_up;        input: ffn-normed x [d_model]
  kDown = 3,        // ffn_down;                 input: act(gate) * up [d_ff]
  kOutputHead = 4,  // output (token_embd's matrix when tied); input: final-normed x [d_model]
  // A mixture-of-experts layer's experts, each tensor held as one tall matrix: expert e's rows
  // are [e * rows, (e + 1) * rows) of it (every split format is row-wise, so splitting the tall
  // matrix splits each expert). Computed per expert through LinearBackend::ApplyExperts.
  kExpertGateUp = 5,  // ffn_gate_exps | ffn_up_exps, or the fused ffn_gate_up_exps (each
                      // expert's gate rows, then its up rows); input: the experts' x [d_model]
  kExpertDown = 6,    // ffn_down_exps;              input: act(gate) * up [d_ff_expert]
};
inline constexpr int kNumLinearGroups = 7;
inline constexpr int kMaxMatricesPerGroup = 3;
std::string_view LinearGroupName(LinearGroup group);  // "qkv", "attn_output", ...
bool IsExpertGroup(LinearGroup group);

// One group of one layer.
struct LinearGroupId {
  static constexpr int32_t kHeadLayer = -1;  // the output head belongs to no layer

  int32_t layer = 0;  // [0, num_layers), or kHeadLayer for kOutputHead
  LinearGroup group = LinearGroup::kQkv;

  static LinearGroupId Head() { return {kHeadLayer, LinearGroup::kOutputHead}; }
  bool operator==(const LinearGroupId&) const = default;
};
std::string LinearGroupIdString(LinearGroupId id);  // "blk.3 qkv", "output head"

// Which groups every layer of a model has: the attention groups; the dense FFN's unless every
// FFN is a mixture of experts (qwen3moe); the experts' where there are experts (gemma4's MoE
// layers have both).
struct LinearGroupLayout {
  int32_t num_layers = 0;
  bool dense_ffn = true;
  bool experts = false;

  static LinearGroupLayout Of(const ModelConfig& config);
  std::vector<LinearGroup> LayerGroups() const;  // in forward order
  bool operator==(const LinearGroupLayout&) const = default;
};

// Every group of a model in forward order: per layer its LayerGroups(); then the head.
std::vector<LinearGroupId> AllLinearGroups(const LinearGroupLayout& layout);
std::vector<LinearGroupId> AllLinearGroups(const ModelConfig& config);
// Dense index of a group in AllLinearGroups order (for tables indexed by group), or -1 when `id`
// names no group of such a model (a layer out of range, the head with a layer, a group the
// layers do not have).
int64_t FindLinearGroupIndex(const LinearGroupLayout& layout, LinearGroupId id);
// FindLinearGroupIndex of a group the caller knows is valid (checked: a bad id aborts).
int64_t LinearGroupIndex(const ModelConfig& config, LinearGroupId id);

// GGUF-style names of a group's weight tensors, in output order: {"blk.3.attn_q.weight",
// "blk.3.attn_k.weight", "blk.3.attn_v.weight"}; the head is "output.weight" (split models store
// the head under this name even when the source ties it to token_embd.weight); the expert groups
// name the 3-D expert tensors ("blk.3.ffn_gate_exps.weight", ...).
std::vector<std::string> LinearGroupTensorNames(const ModelConfig& config, LinearGroupId id);
// Input width of a group's matrices and the output width of each (the tall expert matrices'
// rows for the expert groups), in output order.
int64_t LinearGroupInputDim(const ModelConfig& config, LinearGroupId id);
std::vector<int64_t> LinearGroupOutputDims(const ModelConfig& config, LinearGroupId id);

// The GGUF weights of group `id`, in output order (the head of a tied model is token_embd's
// matrix). Views into `weights`.
struct GgufGroupMatrices {
  std::array<const ops::WeightMatrix*, kMaxMatricesPerGroup> matrices{};
  size_t count = 0;

  std::span<const ops::WeightMatrix* const> span() const { return {matrices.data(), count}; }
  const ops::WeightMatrix& operator[](size_t i) const { return *matrices[i]; }
};
GgufGroupMatrices GroupMatricesOf(const ModelWeights& weights, LinearGroupId id);

// One expert's share of an expert group: the input width and each matrix's rows.
int64_t ExpertInputDim(const ModelConfig& config, LinearGroup group);
std::vector<int64_t> ExpertOutputDims(const ModelConfig& config, LinearGroup group);

// The rows [first_row, first_row + count) of an ApplyExperts input that go to `expert`.
struct ExpertRows {
  int32_t expert = 0;
  int64_t first_row = 0;
  int64_t count = 0;
};

// OK when every segment names an expert in [0, num_experts) and rows inside [0, num_rows);
// INVALID_ARGUMENT naming the first that does not.
absl::Status ValidateExpertSegments(int32_t layer, int64_t num_experts, int64_t num_rows,
                                    std::span<const ExpertRows> segments);

// Computes the linear layers of a forward pass.
//
// Thread safety: Apply is called by one forward at a time (it may keep scratch state); the pool
// is the forward's. Implementations must be batch-invariant: output row t may depend only on
// input row t (not on num_tokens, the row's position in the batch, or the thread count).
class LinearBackend {
 public:
  virtual ~LinearBackend() = default;

  // outputs[i] = x · W_iᵀ for every matrix i of group `id`: x is [num_tokens, input dim] and
  // outputs[i] is [num_tokens, rows of W_i], both row-major; outputs.size() is the group's matrix
  // count. x is not modified. An error (e.g. a residual service that went away) aborts the
  // forward; outputs are then unspecified.
  virtual absl::Status Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                             std::span<float* const> outputs, ThreadPool& pool) = 0;

  // One expert group (kExpertGateUp, kExpertDown) of mixture-of-experts layer `layer` for all
  // experts a forward routed to, in one call (so that a backend can read each expert's weights once
  // for all its rows): for every segment s, outputs[i] rows [s.first_row, s.first_row + s.count) =
  // the same rows of x · W_iᵀ, W_i the s.expert's i-th matrix of `group`. x is [num_rows, input
  // dim]; the segments do not overlap. Rows outside every segment are left as they are.
  virtual absl::Status ApplyExperts(int32_t layer, LinearGroup group, const float* x,
                                    int64_t num_rows, std::span<const ExpertRows> segments,
                                    std::span<float* const> outputs, ThreadPool& pool) = 0;
};

// The reference backend: the source GGUF's weights, dequantized to f32 tile by tile
// (ops::MatMulMany). Thread safety: stateless apart from the views; see LinearBackend.
class GgufLinearBackend final : public LinearBackend {
 public:
  // `weights` must outlive the backend.
  explicit GgufLinearBackend(const ModelWeights& weights) : weights_(weights) {}

  absl::Status Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override;
  absl::Status ApplyExperts(int32_t layer, LinearGroup group, const float* x, int64_t num_rows,
                            std::span<const ExpertRows> segments, std::span<float* const> outputs,
                            ThreadPool& pool) override;

 private:
  const ModelWeights& weights_;
};

}  // namespace bitsplit::model
