#include "common/offline/offload_plan.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::offline {
namespace {

using quant::SplitFormat;

constexpr int kBaseGroup = 64;
constexpr int kResidualGroup = 32;

// SmolLM2-135M-Instruct, b2_asym/g64 and b4_asym/g64 bases + r8 (docs/performance.md,
// acceptance): tokens per verify of a 16-node tree (k 4), and an 8-chain's acceptance by depth.
constexpr double kTreeTauB2 = 1.72, kTreeTauB4 = 4.18;
constexpr double kChainB2[8] = {0.25, 0.26, 0.17, 0.11, 0, 0, 0, 0};
constexpr double kChainB4[8] = {0.80, 0.78, 0.82, 0.80, 0.81, 0.77, 0.85, 0.74};
// The same for the ternary bt_sym/g64 base + r8 (docs/quality.md, "The ternary base").
constexpr double kTreeTauTern = kTernaryTreeTau;
constexpr double kChainTern[8] = {0.12, 0.07, 0, 0, 0, 0, 0, 0};
// The ternary base's place on the bits axis of the interpolation: log2(3) bits of information
// per code.
constexpr double kTernaryBits = 1.584962500721156;

// One step's shape: rows verified, draft forwards and their rows.
struct StepShape {
  std::string name;
  double verify_rows = 1, draft_forwards = 0, draft_rows = 0;
  int chain = 0;  // drafts of a chain; 0: the tree (or off when there are no draft forwards)
};

std::vector<StepShape> StepShapes() {
  std::vector<StepShape> shapes = {
      {.name = "off"},
      {.name = "tree 16", .verify_rows = 17, .draft_forwards = 4, .draft_rows = 4}};
  for (int l = 1; l <= 8; ++l) {
    shapes.push_back({.name = "chain " + std::to_string(l),
                      .verify_rows = static_cast<double>(l + 1),
                      .draft_forwards = static_cast<double>(l),
                      .draft_rows = 1,
                      .chain = l});
  }
  return shapes;
}

// Tokens per verify of `shape` for a base of `bits` mean bits (kTernaryBits to 4): linear between
// the measured ternary and b2 points below 2 bits, between b2 and b4 above.
double Tau(const StepShape& shape, double bits) {
  if (shape.draft_forwards == 0) return 1;
  const bool low = bits < 2;
  const double t = low ? (bits - kTernaryBits) / (2 - kTernaryBits) : (bits - 2) / 2;
  const double tree_from = low ? kTreeTauTern : kTreeTauB2;
  const double tree_to = low ? kTreeTauB2 : kTreeTauB4;
  const double* chain_from = low ? kChainTern : kChainB2;
  const double* chain_to = low ? kChainB2 : kChainB4;
  if (shape.chain == 0) return tree_from + t * (tree_to - tree_from);
  double tau = 1, reach = 1;
  for (int d = 0; d < shape.chain; ++d) {
    reach *= chain_from[d] + t * (chain_to[d] - chain_from[d]);
    tau += reach;
  }
  return tau;
}

// Bits per code as the acceptance interpolation counts them.
double Bits(SplitFormat f) {
  return f == SplitFormat::kBTern ? kTernaryBits : quant::GetSplitFormatInfo(f).bits;
}

// The share of a group's bytes a forward of `rows` rows reads.
double ReadShare(const model::ModelConfig& c, const LinearGroupShape& g, double rows) {
  if (!g.experts) return 1;
  if (rows <= 0) return 0;
  return model::ExpectedDistinctExperts(c.num_experts, c.num_experts_used, rows) /
         static_cast<double>(c.num_experts);
}

}  // namespace

std::vector<LinearGroupShape> LinearGroupShapes(const model::ModelConfig& c) {
  std::vector<LinearGroupShape> groups;
  for (const model::LinearGroupId id : model::AllLinearGroups(c)) {
    LinearGroupShape g{.id = id,
                       .tensors = model::LinearGroupTensorNames(c, id),
                       .rows = model::LinearGroupOutputDims(c, id),
                       .cols = model::LinearGroupInputDim(c, id)};
    if (model::IsExpertGroup(id.group)) {
      g.experts = true;
      g.token_share = static_cast<double>(c.num_experts_used) / static_cast<double>(c.num_experts);
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

SplitFormat ResidualForBase(SplitFormat base) {
  // Ternary + r6 missed Q8_0's KL on SmolLM2 (0.0084 vs 0.0047; ternary + r8 0.0010).
  if (base == SplitFormat::kBTern) return SplitFormat::kR8;
  switch (quant::GetSplitFormatInfo(base).bits) {
    case 2:
      return SplitFormat::kR6;
    case 3:
      return SplitFormat::kR5;
    default:
      return SplitFormat::kR4;
  }
}

absl::StatusOr<OffloadPlan> PlanOffloadWith(const OffloadRequest& request,
                                            SplitFormat attention_base, SplitFormat expert_base) {
  const model::ModelConfig& c = request.config;
  const std::vector<LinearGroupShape> groups = LinearGroupShapes(c);
  model::VramRequest vram;
  vram.config = c;
  vram.base_format = attention_base;
  vram.base_group = kBaseGroup;
  vram.context = request.context;
  vram.sessions = request.sessions;
  vram.kv_type = request.kv_type;
  vram.max_batch_rows = std::min(request.max_batch_rows, request.context);
  OffloadPlan plan;
  plan.attention_base = attention_base;
  plan.expert_base = expert_base;
  double token_weights = 0, token_bits = 0;
  for (const LinearGroupShape& g : groups) {
    const SplitFormat base = g.experts ? expert_base : attention_base;
    // A uniform base needs no per-tensor formats (and PlanVram's refusal then names it).
    if (expert_base != attention_base) {
      for (const std::string& name : g.tensors) vram.base_tensor_formats[name] = base;
    }
    for (const int64_t rows : g.rows) {
      const double weights = static_cast<double>(rows) * static_cast<double>(g.cols);
      plan.residual_bytes += static_cast<uint64_t>(rows) *
                             quant::SplitRowBytes(ResidualForBase(base), kResidualGroup, g.cols);
      token_weights += g.token_share * weights;
      token_bits += g.token_share * weights * Bits(base);
    }
  }
  vram.embedding_bytes = model::PlacedEmbeddingBytes(vram, request.embedding_device_bytes,
                                                     request.vram_budget_bytes, vram.sessions);
  BITSPLIT_ASSIGN_OR_RETURN(plan.vram, model::PlanVram(vram, request.vram_budget_bytes));
  plan.host_embedding_bytes = vram.embedding_bytes > 0 ? 0 : request.embedding_table_bytes;
  // Bytes of residual and base a forward of `rows` rows reads.
  const auto read = [&](double rows, double& residual_bytes, double& base_bytes) {
    residual_bytes = base_bytes = 0;
    for (const LinearGroupShape& g : groups) {
      const SplitFormat base = g.experts ? expert_base : attention_base;
      const double share = ReadShare(c, g, rows);
      for (const int64_t r : g.rows) {
        base_bytes += share * static_cast<double>(r) *
                      static_cast<double>(model::DeviceRowStride(base, kBaseGroup, g.cols));
        residual_bytes += share * static_cast<double>(r) *
                          static_cast<double>(
                              quant::SplitRowBytes(ResidualForBase(base), kResidualGroup, g.cols));
      }
    }
  };
  const OffloadMachine& m = request.machine;
  for (const StepShape& shape : StepShapes()) {
    double residual_read = 0, verify_base = 0, unused = 0, draft_base = 0;
    read(shape.verify_rows, residual_read, verify_base);
    read(shape.draft_rows, unused, draft_base);
    const double tau = Tau(shape, token_bits / token_weights);
    const double seconds =
        residual_read / m.ram_bytes_per_second +
        (verify_base + shape.draft_forwards * draft_base) / m.vram_bytes_per_second;
    const double tokens_per_second = tau / seconds;
    if (shape.draft_forwards == 0) plan.tokens_per_second_without_speculation = tokens_per_second;
    if (tokens_per_second > plan.tokens_per_second) {
      plan.shape = shape.name;
      plan.residual_read_bytes = residual_read;
      plan.base_read_bytes = verify_base;
      plan.tau = tau;
      plan.tokens_per_second = tokens_per_second;
    }
  }
  return plan;
}

absl::StatusOr<OffloadPlan> PlanOffload(const OffloadRequest& request) {
  std::vector<SplitFormat> bases = {SplitFormat::kB2Asym, SplitFormat::kB3Asym,
                                    SplitFormat::kB4Asym};
  if (request.ternary) bases.insert(bases.begin(), SplitFormat::kBTern);
  std::optional<OffloadPlan> best;
  absl::Status fewest_bits;
  for (const SplitFormat attention : bases) {
    for (const SplitFormat experts : bases) {
      if (Bits(experts) > Bits(attention)) continue;
      if (!request.config.has_experts() && experts != attention) continue;
      absl::StatusOr<OffloadPlan> plan = PlanOffloadWith(request, attention, experts);
      if (!plan.ok()) {
        if (plan.status().code() != absl::StatusCode::kResourceExhausted) return plan.status();
        if (fewest_bits.ok()) fewest_bits = plan.status();
        continue;
      }
      if (!best || plan->tokens_per_second > best->tokens_per_second) best = *std::move(plan);
    }
  }
  if (!best) {
    return absl::ResourceExhaustedError(
        absl::StrCat("even the fewest base bits (", request.ternary ? "bt_sym" : "b2_asym",
                     "/g64 everywhere) do not fit: ", fewest_bits.message()));
  }
  return *best;
}

}  // namespace bitsplit::offline
