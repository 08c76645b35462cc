#include "common/model/vram_plan.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/linear_backend.h"
#include "common/model/weights.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

uint64_t RoundUp(uint64_t n, uint64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

uint64_t U(int64_t n) { return static_cast<uint64_t>(n); }

// The widest input of any linear group (the rotation and quantization scratch); d_ff only where
// the layers have a dense FFN (a qwen3moe file states one that no group reads).
int64_t WidestInput(const ModelConfig& c) {
  return std::max({c.d_model, c.MaxQDim(), c.dense_ffn ? c.d_ff : 0, c.d_ff_expert});
}

// The widest output of any group (the residual's result for one group, all its matrices).
// An expert group's result is per routed row: k rows of each token.
int64_t WidestOutput(const ModelConfig& c) {
  return std::max({c.MaxQDim() + 2 * c.MaxKvDim(), c.d_model, c.dense_ffn ? 2 * c.d_ff : 0,
                   c.vocab_size, c.num_experts_used * std::max(2 * c.d_ff_expert, c.d_model)});
}

absl::Status ValidateConfig(const ModelConfig& c) {
  if (c.num_layers < 1 || c.d_model < 1 || c.d_ff < 1 || c.num_heads < 1 || c.num_kv_heads < 1 ||
      c.head_dim < 1 || c.vocab_size < 1 || c.rope_dims < 0 || c.rope_dims > c.head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model config has a non-positive or inconsistent size (layers %d, d_model %d, d_ff %d, "
        "heads %d/%d x %d, rope dims %d, vocab %d)",
        c.num_layers, c.d_model, c.d_ff, c.num_heads, c.num_kv_heads, c.head_dim, c.rope_dims,
        c.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const VramRequest& r) {
  BITSPLIT_RETURN_IF_ERROR(ValidateConfig(r.config));
  if (r.context < 1 || r.sessions < 1 || r.max_batch_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("VRAM plan needs context, sessions and batch rows >= 1 (got %d, %d, %d)",
                        r.context, r.sessions, r.max_batch_rows));
  }
  if (r.max_batch_rows > r.context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a forward of %d tokens cannot fit a session of %d tokens", r.max_batch_rows, r.context));
  }
  if (r.config.context_length > 0 && r.context > r.config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a session of %d tokens exceeds the model's context length of %d",
                        r.context, r.config.context_length));
  }
  if (r.kv_type != ops::KvType::kF16 && r.kv_type != ops::KvType::kQ8_0) {
    return absl::InvalidArgumentError(absl::StrCat("the device's KV cache is f16 or q8_0, not ",
                                                   std::string(ops::KvTypeName(r.kv_type))));
  }
  for (int64_t layer = 0; layer < r.config.num_layers; ++layer) {
    if (!ops::KvTypeFitsHead(r.kv_type, r.config.HeadDim(layer))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a q8_0 KV cache needs head widths that are multiples of %d; layer %d's heads are %d "
          "wide",
          ops::kKvQ8Block, layer, r.config.HeadDim(layer)));
    }
  }
  const quant::SplitFormatInfo& info = quant::GetSplitFormatInfo(r.base_format);
  if (!info.is_base && r.base_format != quant::SplitFormat::kQ8_0) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.name, " is not a base format (b2/b3/b4 sym/asym or q8_0)"));
  }
  for (const auto& [name, format] : r.base_tensor_formats) {
    if (!quant::GetSplitFormatInfo(format).is_base) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, "'s ", quant::GetSplitFormatInfo(format).name, " is not a base format"));
    }
  }
  return absl::OkStatus();
}

// The plan's arithmetic for an already validated request (no budget check).
VramPlan Compute(const VramRequest& r, uint64_t base_bytes) {
  const ModelConfig& c = r.config;
  VramPlan plan;
  plan.context = r.context;
  plan.sessions = r.sessions;
  plan.max_batch_rows = r.max_batch_rows;
  plan.base_weights_bytes = RoundVramSlab(base_bytes);
  plan.embedding_bytes = AlignVram(r.embedding_bytes);
  uint64_t vector_floats = U(c.d_model);  // output norm, every layer's norms and biases
  uint64_t kv_row_bytes = 0;              // a slot's keys in every layer (values as many)
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    for (const LayerVectorSpec& spec : LayerVectorSpecs(c, layer)) vector_floats += U(spec.length);
    kv_row_bytes += U(ops::KvRowBytes(r.kv_type, c.KvDim(layer)));
  }
  plan.norms_bytes = AlignVram(4 * vector_floats);
  // The routers stay at source precision so that the verifier routes as the full model does.
  if (c.has_experts()) {
    plan.router_bytes = AlignVram(4 * U(c.num_layers) * U(c.num_experts) * U(c.d_model));
  }
  // One cos/sin table per RoPE kind: the global layers', and the local layers' (their own
  // rotary dims) when windowed.
  plan.rope_table_bytes = AlignVram(U(r.context) * U(c.rope_dims / 2) * 2 * 4);
  if (c.sliding_window > 0) {
    const int64_t local_dims = c.rope_dims_local > 0 ? c.rope_dims_local : c.rope_dims;
    plan.rope_table_bytes += AlignVram(U(r.context) * U(local_dims / 2) * 2 * 4);
  }
  plan.hadamard_bytes = AlignVram(4 * U(WidestInput(c)));
  plan.constants_slab_bytes =
      RoundVramSlab(plan.embedding_bytes + plan.norms_bytes + plan.router_bytes +
                    plan.rope_table_bytes + plan.hadamard_bytes);
  plan.kv_bytes_per_token = 2 * kv_row_bytes;
  const uint64_t one_side = AlignVram(U(r.context) * kv_row_bytes);
  if (c.sliding_window > 0) plan.kv_positions_bytes = AlignVram(4 * U(r.context));
  plan.kv_bytes_per_session = RoundVramSlab(2 * one_side + plan.kv_positions_bytes);
  plan.kv_cache_bytes = plan.kv_bytes_per_session * U(r.sessions);
  plan.scratch = ForwardScratchLayout::For(c, r.max_batch_rows, r.context);
  plan.scratch_slab_bytes = RoundVramSlab(plan.scratch.total_bytes);
  plan.total_bytes = plan.base_weights_bytes + plan.constants_slab_bytes + plan.kv_cache_bytes +
                     plan.scratch_slab_bytes;
  return plan;
}

std::string FormatName(quant::SplitFormat format, int group) {
  return absl::StrCat(quant::GetSplitFormatInfo(format).name, "/g", group);
}

// A context to suggest: a multiple of 256 when that large (people configure round numbers).
int64_t RoundContext(int64_t context) { return context >= 256 ? context / 256 * 256 : context; }

}  // namespace

uint64_t AlignVram(uint64_t bytes) { return RoundUp(bytes, kVramAlign); }
uint64_t RoundVramSlab(uint64_t bytes) { return RoundUp(bytes, kVramSlabGranularity); }

uint64_t DeviceRowStride(quant::SplitFormat format, int group, int64_t cols) {
  return RoundUp(quant::SplitRowBytes(format, group, cols), kDeviceRowAlign);
}

absl::StatusOr<uint64_t> SplitLinearBytes(
    const ModelConfig& config, quant::SplitFormat format, int group,
    const std::map<std::string, quant::SplitFormat, std::less<>>* tensor_formats) {
  BITSPLIT_RETURN_IF_ERROR(ValidateConfig(config));
  uint64_t total = 0;
  for (const LinearGroupId id : AllLinearGroups(config)) {
    const int64_t cols = LinearGroupInputDim(config, id);
    const std::vector<std::string> names = LinearGroupTensorNames(config, id);
    const std::vector<int64_t> rows = LinearGroupOutputDims(config, id);
    for (size_t i = 0; i < names.size(); ++i) {
      quant::SplitFormat matrix_format = format;
      if (tensor_formats != nullptr) {
        if (const auto it = tensor_formats->find(names[i]); it != tensor_formats->end()) {
          matrix_format = it->second;
        }
      }
      const absl::Status layout = quant::ValidateSplitLayout(matrix_format, group, cols);
      if (!layout.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "base %s does not fit the %d-wide input of %s: %s", FormatName(matrix_format, group),
            cols, LinearGroupName(id.group), layout.message()));
      }
      total += AlignVram(U(rows[i]) * DeviceRowStride(matrix_format, group, cols));
    }
  }
  return total;
}

ForwardScratchLayout ForwardScratchLayout::For(const ModelConfig& c, int64_t max_rows,
                                               int64_t max_context) {
  const uint64_t t = U(max_rows);
  ForwardScratchLayout s;
  s.linear_rows = max_rows * std::max<int64_t>(1, c.num_experts_used);
  s.linear_cols = WidestInput(c);
  const uint64_t linear_rows = U(s.linear_rows);
  const uint64_t widest_input = U(s.linear_cols);
  const uint64_t block_stride = RoundUp((widest_input + 31) / 32, 8);
  s.batch_bytes = 3 * AlignVram(4 * t) + AlignVram(2 * t * t);
  s.hidden_state_bytes = AlignVram(4 * t * U(c.d_model));
  s.normed_bytes = AlignVram(4 * t * U(c.d_model));
  s.q_bytes = AlignVram(4 * t * U(c.MaxQDim()));
  s.kv_new_bytes = 2 * AlignVram(4 * t * U(c.MaxKvDim()));
  s.attention_bytes = AlignVram(4 * t * U(c.MaxQDim()));
  s.gate_up_bytes = c.dense_ffn ? 2 * AlignVram(4 * t * U(c.d_ff)) : 0;
  s.projected_bytes = AlignVram(4 * t * U(c.d_model));
  s.rotated_bytes = AlignVram(4 * linear_rows * widest_input);
  s.activation_bytes =
      AlignVram(linear_rows * widest_input) + 2 * AlignVram(4 * linear_rows * block_stride);
  s.residual_output_bytes = AlignVram(4 * t * U(WidestOutput(c)));
  s.logits_bytes = AlignVram(4 * t * U(c.vocab_size));
  s.scores_bytes = AlignVram(4 * t * U(c.num_heads) * U(max_context));
  if (c.sliding_window > 0)
    s.visible_slots_bytes = AlignVram(4 * t * U(max_context)) + AlignVram(4 * t);
  if (c.has_experts()) {
    const uint64_t routed = t * U(c.num_experts_used);
    const uint64_t d = U(c.d_model), width = U(c.d_ff_expert);
    s.expert_bytes = AlignVram(4 * t * U(c.num_experts)) + 2 * AlignVram(4 * t * d) +
                     4 * AlignVram(4 * routed) + AlignVram(4 * routed * d) +
                     AlignVram(4 * routed * 2 * width) + AlignVram(4 * routed * width) +
                     AlignVram(4 * routed * d) + AlignVram(4 * t * d);
  }
  s.sampling_bytes = AlignVram(8 * t * U(c.vocab_size));
  s.choice_bytes =
      2 * AlignVram(t * 64 * 4) + AlignVram(8 * t) + AlignVram(4 * t) + AlignVram(8 * t);
  s.total_bytes = s.batch_bytes + s.hidden_state_bytes + s.normed_bytes + s.q_bytes +
                  s.kv_new_bytes + s.attention_bytes + s.gate_up_bytes + s.projected_bytes +
                  s.rotated_bytes + s.activation_bytes + s.residual_output_bytes + s.logits_bytes +
                  s.scores_bytes + s.visible_slots_bytes + s.expert_bytes + s.sampling_bytes +
                  s.choice_bytes;
  return s;
}

std::vector<VramItem> VramPlan::Items() const {
  return {
      {"base weights", base_weights_bytes},
      {embedding_bytes > 0 ? "embedding, norms and tables" : "norms and tables (embedding in RAM)",
       constants_slab_bytes},
      {absl::StrFormat("KV cache (%d sessions x %d tokens)", sessions, context), kv_cache_bytes},
      {absl::StrFormat("scratch (forwards of up to %d tokens)", max_batch_rows),
       scratch_slab_bytes}};
}

std::string VramPlan::ToString() const {
  return absl::StrFormat(
      "base weights %s, embedding/norms/tables %s%s, KV cache %d x %s (%d tokens), scratch %s: %s "
      "of %s",
      FormatBytes(base_weights_bytes), FormatBytes(constants_slab_bytes),
      embedding_bytes > 0 ? "" : " (embedding in RAM)", sessions, FormatBytes(kv_bytes_per_session),
      context, FormatBytes(scratch_slab_bytes), FormatBytes(total_bytes),
      FormatBytes(budget_bytes));
}

absl::StatusOr<uint64_t> VramTotalBytes(const VramRequest& request) {
  BITSPLIT_RETURN_IF_ERROR(ValidateRequest(request));
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t base_bytes,
                            SplitLinearBytes(request.config, request.base_format,
                                             request.base_group, &request.base_tensor_formats));
  return Compute(request, base_bytes).total_bytes;
}

absl::StatusOr<int64_t> VramSessionsThatFit(const VramRequest& request, uint64_t budget_bytes,
                                            int64_t cap) {
  VramRequest one = request;
  one.sessions = 1;
  BITSPLIT_RETURN_IF_ERROR(PlanVram(one, budget_bytes).status());
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t base_bytes,
                            SplitLinearBytes(request.config, request.base_format,
                                             request.base_group, &request.base_tensor_formats));
  return LargestFitting(std::max<int64_t>(cap, 1), [&](int64_t sessions) {
    one.sessions = sessions;
    return Compute(one, base_bytes).total_bytes <= budget_bytes;
  });
}

absl::StatusOr<VramPlan> PlanVram(const VramRequest& request, uint64_t budget_bytes) {
  BITSPLIT_RETURN_IF_ERROR(ValidateRequest(request));
  BITSPLIT_ASSIGN_OR_RETURN(const uint64_t base_bytes,
                            SplitLinearBytes(request.config, request.base_format,
                                             request.base_group, &request.base_tensor_formats));
  VramPlan plan = Compute(request, base_bytes);
  plan.budget_bytes = budget_bytes;
  if (plan.total_bytes <= budget_bytes) return plan;

  // Does not fit: find what does. Totals grow with context and sessions, so search each.
  auto fits = [&](int64_t context, int64_t sessions) {
    VramRequest r = request;
    r.context = context;
    r.sessions = sessions;
    r.max_batch_rows = std::min(request.max_batch_rows, context);
    return Compute(r, base_bytes).total_bytes <= budget_bytes;
  };
  std::vector<std::string> fitting;
  const int64_t max_context = LargestFitting(
      request.context, [&](int64_t context) { return fits(context, request.sessions); });
  if (max_context >= request.max_batch_rows) {
    fitting.push_back(absl::StrFormat("context %d with %d sessions", RoundContext(max_context),
                                      request.sessions));
  }
  const int64_t max_sessions = LargestFitting(
      request.sessions, [&](int64_t sessions) { return fits(request.context, sessions); });
  if (max_sessions > 0) {
    fitting.push_back(absl::StrFormat("%d sessions at context %d", max_sessions, request.context));
  }
  if (request.sessions > 1) {
    const int64_t single =
        LargestFitting(request.context, [&](int64_t context) { return fits(context, 1); });
    if (single >= request.max_batch_rows && single != max_context) {
      fitting.push_back(absl::StrFormat("context %d with 1 session", RoundContext(single)));
    }
  }
  // Fewer base bits, same symmetry and group, as requested; and the ternary base, the fewest
  // bytes of all, whatever the symmetry.
  const quant::SplitFormatInfo& info = quant::GetSplitFormatInfo(request.base_format);
  std::vector<std::string> smaller_bases;
  for (const quant::SplitFormat format :
       {quant::SplitFormat::kBTern, quant::SplitFormat::kB2Sym, quant::SplitFormat::kB2Asym,
        quant::SplitFormat::kB3Sym, quant::SplitFormat::kB3Asym, quant::SplitFormat::kB4Sym,
        quant::SplitFormat::kB4Asym}) {
    const quant::SplitFormatInfo& other = quant::GetSplitFormatInfo(format);
    if (format == quant::SplitFormat::kBTern) {
      if (request.base_format == quant::SplitFormat::kBTern) continue;
    } else {
      if (other.bits >= info.bits || request.base_format == quant::SplitFormat::kBTern) continue;
      // A q8_0 base has no min; its smaller alternatives are the asymmetric formats (the
      // default).
      if (info.is_base && other.has_min != info.has_min) continue;
      if (!info.is_base && !other.has_min) continue;
    }
    absl::StatusOr<uint64_t> bytes = SplitLinearBytes(request.config, format, request.base_group);
    if (!bytes.ok()) continue;
    const bool ok = Compute(request, *bytes).total_bytes <= budget_bytes;
    smaller_bases.push_back(
        absl::StrFormat("base %s needs %s%s", FormatName(format, request.base_group),
                        FormatBytes(RoundVramSlab(*bytes)), ok ? " and fits as requested" : ""));
  }
  std::string what_fits =
      fitting.empty()
          ? "not even one session of " + std::to_string(request.max_batch_rows) + " tokens fits"
          : "fits: " + absl::StrJoin(fitting, ", or ");
  if (!smaller_bases.empty()) absl::StrAppend(&what_fits, "; ", absl::StrJoin(smaller_bases, "; "));
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the VRAM budget of %s is too small for base %s (%s) + embedding/norms/tables %s + KV cache "
      "%d sessions x %d tokens (%s) + scratch %s = %s; %s",
      FormatBytes(budget_bytes),
      request.base_tensor_formats.empty() ? FormatName(request.base_format, request.base_group)
                                          : absl::StrCat("bit plan /g", request.base_group),
      FormatBytes(plan.base_weights_bytes), FormatBytes(plan.constants_slab_bytes),
      request.sessions, request.context, FormatBytes(plan.kv_cache_bytes),
      FormatBytes(plan.scratch_slab_bytes), FormatBytes(plan.total_bytes), what_fits));
}

bool EmbeddingGatheredOnDevice(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kQ8_0;
}

uint64_t DeviceEmbeddingBytes(GgmlType type, int64_t rows, int64_t row_bytes) {
  return EmbeddingGatheredOnDevice(type) ? U(rows) * U(row_bytes) : 0;
}

uint64_t PlacedEmbeddingBytes(const VramRequest& request, uint64_t table_device_bytes,
                              uint64_t budget_bytes, int64_t max_sessions) {
  if (table_device_bytes == 0) return 0;
  VramRequest on_device = request;
  on_device.embedding_bytes = table_device_bytes;
  if (request.sessions > 0) return PlanVram(on_device, budget_bytes).ok() ? table_device_bytes : 0;
  VramRequest on_host = request;
  on_host.embedding_bytes = 0;
  const absl::StatusOr<int64_t> with = VramSessionsThatFit(on_device, budget_bytes, max_sessions);
  const absl::StatusOr<int64_t> without = VramSessionsThatFit(on_host, budget_bytes, max_sessions);
  return with.ok() && without.ok() && *with >= *without ? table_device_bytes : 0;
}

uint64_t DefaultVramBudget(uint64_t free_bytes) {
  const uint64_t margin = std::max<uint64_t>(512ull << 20, free_bytes / 20);
  return free_bytes > margin ? free_bytes - margin : 0;
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view text) {
  absl::string_view digits(text.data(), text.size());
  uint64_t unit = 1;
  for (const auto& [suffix, bytes] : {std::pair<const char*, uint64_t>{"KiB", 1ull << 10},
                                      {"MiB", 1ull << 20},
                                      {"GiB", 1ull << 30}}) {
    if (absl::ConsumeSuffix(&digits, suffix)) {
      unit = bytes;
      break;
    }
  }
  uint64_t value = 0;
  if (digits.empty() || !absl::c_all_of(digits, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &value) || value == 0 || value > UINT64_MAX / unit) {
    return absl::InvalidArgumentError("is not a positive size (BYTES, or N KiB/MiB/GiB)");
  }
  return value * unit;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) {
    return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  }
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
}

}  // namespace bitsplit::model
