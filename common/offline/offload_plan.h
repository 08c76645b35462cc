#pragma once
// The plan of a model too big for its GPU, from its shapes alone (no weights): which uniform
// bases fit the card (attention, dense FFN and head on one base; a mixture of experts' experts on
// another, with no more bits), the residual beside each, what goes to RAM, and the decode speed
// the split can be expected to reach. `bitsplit plan` prints it before anything is quantized;
// bench/offload_projection_bench tabulates it for published shapes. The VRAM arithmetic is
// model::PlanVram's, the one the CUDA backend allocates by and `quantize --vram-budget` checks
// every plan with.
//
// Candidates: bases b2/b3/b4 (asym, group 64), each with the residual that puts base + residual
// at 8 bits (b2+r6, b3+r5, b4+r4; at or below Q8_0's KL on SmolLM2, docs/quality.md), and below
// them the ternary bt_sym/g64 + r8 (OffloadRequest::ternary; with r6 it missed Q8_0's KL),
// residual group 32. Speculation
// shapes: off; a chain of 1 to 8 drafts; a 16-node tree drafted in 4 forwards of 4 rows. The
// fastest (plan, shape) that fits is chosen:
//   time per token = (residual read / RAM + base read / VRAM + draft forwards' base / VRAM) / tau
// where a forward of n rows reads the experts n rows touch under uniform routing
// (model::ExpectedDistinctExperts) and tau, the tokens per verify, is SmolLM2's measured
// acceptance (docs/performance.md: the 16-node tree 1.72 on a b2 base, 4.18 on b4; the chain's
// acceptance by depth on each), interpolated linearly in the mean base bits a token reads (bt_sym
// at log2(3) bits, with its own measured acceptance below b2's). That acceptance is an assumption
// for any other model.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/linear_backend.h"
#include "common/model/vram_plan.h"
#include "common/quant/split_format.h"

namespace bitsplit::offline {

// Tokens per verify of a 16-node tree (k 4) drafted by the ternary bt_sym/g64 base of
// SmolLM2-135M-Instruct under its verifier (+ r8/g32), first 8 prompts of the committed set,
// docs/quality.md ("The ternary base"): the
// acceptance prior of the plans whose fewest-bits base is ternary (here and in quantize
// --vram-budget --base-format tern).
inline constexpr double kTernaryTreeTau = 1.31;

struct OffloadMachine {
  double ram_bytes_per_second = 60e9;
  double vram_bytes_per_second = 1e12;
};

struct OffloadRequest {
  model::ModelConfig config;
  uint64_t vram_budget_bytes = 0;
  // The embedding table's bytes were it on the device (model::DeviceEmbeddingBytes; 0: a type
  // only the host gathers). Each plan places it by model::PlacedEmbeddingBytes.
  uint64_t embedding_device_bytes = 0;
  uint64_t embedding_table_bytes = 0;  // the table's bytes in the source
  int64_t context = 8192;
  int64_t sessions = 1;
  int64_t max_batch_rows = 64;
  OffloadMachine machine;
  bool ternary = true;                      // whether PlanOffload considers the ternary base bt_sym
  ops::KvType kv_type = ops::KvType::kF16;  // the KV cache's rows on the device
};

// One linear group's matrices, as the planner and the bench's llama.cpp projection see it.
struct LinearGroupShape {
  model::LinearGroupId id;
  std::vector<std::string> tensors;  // LinearGroupTensorNames
  std::vector<int64_t> rows;         // per matrix (all experts' rows for an expert group)
  int64_t cols = 0;
  bool experts = false;
  double token_share = 1;  // of its bytes one token reads: k / E for an expert group
};
std::vector<LinearGroupShape> LinearGroupShapes(const model::ModelConfig& config);

// The residual beside a base: base + residual = 8 bits; r8 beside the ternary base (with r6 it
// missed Q8_0's KL, docs/quality.md, "The ternary base").
quant::SplitFormat ResidualForBase(quant::SplitFormat base);

struct OffloadPlan {
  quant::SplitFormat attention_base = quant::SplitFormat::kB2Asym;  // and the dense FFN, head
  quant::SplitFormat expert_base = quant::SplitFormat::kB2Asym;     // = attention_base if dense
  model::VramPlan vram;
  uint64_t residual_bytes = 0;        // RAM: every residual matrix
  uint64_t host_embedding_bytes = 0;  // RAM: the embedding table when it is not on the device
  // The fastest speculation shape ("off", "chain L", "tree 16"), its bytes read per verify, its
  // tokens per verify and the projected speed; the same without speculation.
  std::string shape;
  double residual_read_bytes = 0;
  double base_read_bytes = 0;
  double tau = 1;
  double tokens_per_second = 0;
  double tokens_per_second_without_speculation = 0;
  uint64_t ram_bytes() const { return residual_bytes + host_embedding_bytes; }
};

// The plan of one pair of bases; RESOURCE_EXHAUSTED (PlanVram's message) when it does not fit.
absl::StatusOr<OffloadPlan> PlanOffloadWith(const OffloadRequest& request,
                                            quant::SplitFormat attention_base,
                                            quant::SplitFormat expert_base);
// The fastest plan that fits; RESOURCE_EXHAUSTED when none does, with PlanVram's message for the
// fewest bits (what would fit instead). INVALID_ARGUMENT for a malformed request.
absl::StatusOr<OffloadPlan> PlanOffload(const OffloadRequest& request);

}  // namespace bitsplit::offline
