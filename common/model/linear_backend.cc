#include "common/model/linear_backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ops/matmul.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

// Tensor name suffixes of a group's matrices, in output order.
std::vector<std::string_view> GroupTensorSuffixes(const ModelConfig& config, LinearGroup group) {
  switch (group) {
    case LinearGroup::kQkv:
      return {"attn_q", "attn_k", "attn_v"};
    case LinearGroup::kAttnOutput:
      return {"attn_output"};
    case LinearGroup::kGateUp:
      if (config.has_experts()) return {"ffn_gate_exps", "ffn_up_exps"};
      return {"ffn_gate", "ffn_up"};
    case LinearGroup::kDown:
      if (config.has_experts()) return {"ffn_down_exps"};
      return {"ffn_down"};
    case LinearGroup::kOutputHead:
      return {"output"};
  }
  BITSPLIT_CHECK(false);
  return {};
}

}  // namespace

std::string_view LinearGroupName(LinearGroup group) {
  switch (group) {
    case LinearGroup::kQkv:
      return "qkv";
    case LinearGroup::kAttnOutput:
      return "attn_output";
    case LinearGroup::kGateUp:
      return "gate_up";
    case LinearGroup::kDown:
      return "down";
    case LinearGroup::kOutputHead:
      return "output_head";
  }
  return "unknown";
}

std::string LinearGroupIdString(LinearGroupId id) {
  if (id.group == LinearGroup::kOutputHead) return "output head";
  const std::string_view name = LinearGroupName(id.group);
  return absl::StrCat("blk.", id.layer, " ", absl::string_view(name.data(), name.size()));
}

std::vector<LinearGroupId> AllLinearGroups(int32_t num_layers) {
  std::vector<LinearGroupId> groups;
  groups.reserve(static_cast<size_t>(num_layers) * 4 + 1);
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    for (LinearGroup group :
         {LinearGroup::kQkv, LinearGroup::kAttnOutput, LinearGroup::kGateUp, LinearGroup::kDown}) {
      groups.push_back({layer, group});
    }
  }
  groups.push_back(LinearGroupId::Head());
  return groups;
}

std::vector<LinearGroupId> AllLinearGroups(const ModelConfig& config) {
  return AllLinearGroups(static_cast<int32_t>(config.num_layers));
}

int64_t FindLinearGroupIndex(int32_t num_layers, LinearGroupId id) {
  if (id.group == LinearGroup::kOutputHead) {
    return id.layer == LinearGroupId::kHeadLayer ? int64_t{num_layers} * 4 : -1;
  }
  const auto group = static_cast<int32_t>(id.group);
  if (id.layer < 0 || id.layer >= num_layers || group < 0 || group >= 4) return -1;
  return int64_t{id.layer} * 4 + group;
}

int64_t LinearGroupIndex(const ModelConfig& config, LinearGroupId id) {
  const int64_t index = FindLinearGroupIndex(static_cast<int32_t>(config.num_layers), id);
  BITSPLIT_CHECK(index >= 0);
  return index;
}

std::vector<std::string> LinearGroupTensorNames(const ModelConfig& config, LinearGroupId id) {
  std::vector<std::string> names;
  for (std::string_view suffix : GroupTensorSuffixes(config, id.group)) {
    const absl::string_view s(suffix.data(), suffix.size());
    names.push_back(id.group == LinearGroup::kOutputHead
                        ? absl::StrCat(s, ".weight")
                        : absl::StrCat("blk.", id.layer, ".", s, ".weight"));
  }
  return names;
}

int64_t LinearGroupInputDim(const ModelConfig& config, LinearGroup group) {
  switch (group) {
    case LinearGroup::kQkv:
    case LinearGroup::kGateUp:
    case LinearGroup::kOutputHead:
      return config.d_model;
    case LinearGroup::kAttnOutput:
      return config.q_dim();
    case LinearGroup::kDown:
      return config.has_experts() ? config.d_ff_expert : config.d_ff;
  }
  BITSPLIT_CHECK(false);
  return 0;
}

std::vector<int64_t> LinearGroupOutputDims(const ModelConfig& config, LinearGroup group) {
  switch (group) {
    case LinearGroup::kQkv:
      return {config.q_dim(), config.kv_dim(), config.kv_dim()};
    case LinearGroup::kAttnOutput:
      return {config.d_model};
    case LinearGroup::kDown:
      if (config.has_experts()) return {config.num_experts * config.d_model};
      return {config.d_model};
    case LinearGroup::kGateUp:
      if (config.has_experts()) {
        return {config.num_experts * config.d_ff_expert, config.num_experts * config.d_ff_expert};
      }
      return {config.d_ff, config.d_ff};
    case LinearGroup::kOutputHead:
      return {config.vocab_size};
  }
  BITSPLIT_CHECK(false);
  return {};
}

GgufGroupMatrices GroupMatricesOf(const ModelWeights& weights, LinearGroupId id) {
  GgufGroupMatrices group;
  auto add = [&group](const ops::WeightMatrix& matrix) { group.matrices[group.count++] = &matrix; };
  if (id.group == LinearGroup::kOutputHead) {
    add(weights.output);
    return group;
  }
  BITSPLIT_CHECK(id.layer >= 0 && static_cast<size_t>(id.layer) < weights.layers.size());
  const LayerWeights& w = weights.layers[static_cast<size_t>(id.layer)];
  switch (id.group) {
    case LinearGroup::kQkv:
      add(w.wq);
      add(w.wk);
      add(w.wv);
      break;
    case LinearGroup::kAttnOutput:
      add(w.wo);
      break;
    case LinearGroup::kGateUp:
      add(w.w_gate);
      add(w.w_up);
      break;
    case LinearGroup::kDown:
      add(w.w_down);
      break;
    case LinearGroup::kOutputHead:
      break;  // handled above
  }
  return group;
}

absl::Status GgufLinearBackend::Apply(LinearGroupId id, const float* x, int64_t num_tokens,
                                      std::span<float* const> outputs, ThreadPool& pool) {
  const GgufGroupMatrices group = GroupMatricesOf(weights_, id);
  BITSPLIT_CHECK(outputs.size() == group.count);
  ops::MatMulMany(x, num_tokens, group.span(), outputs, pool);
  return absl::OkStatus();
}

std::string_view ExpertGroupName(ExpertGroup group) {
  return group == ExpertGroup::kGateUp ? "expert_gate_up" : "expert_down";
}

int64_t ExpertGroupInputDim(const ModelConfig& config, ExpertGroup group) {
  return group == ExpertGroup::kGateUp ? config.d_model : config.d_ff_expert;
}

std::vector<int64_t> ExpertGroupOutputDims(const ModelConfig& config, ExpertGroup group) {
  if (group == ExpertGroup::kGateUp) return {config.d_ff_expert, config.d_ff_expert};
  return {config.d_model};
}

absl::Status ValidateExpertSegments(int32_t layer, int64_t num_experts, int64_t num_rows,
                                    std::span<const ExpertRows> segments) {
  for (const ExpertRows& segment : segments) {
    if (segment.expert < 0 || segment.expert >= num_experts || segment.first_row < 0 ||
        segment.count < 0 || segment.first_row + segment.count > num_rows) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blk.%d: expert segment (expert %d, rows %d+%d) is outside %d experts x %d rows", layer,
          segment.expert, segment.first_row, segment.count, num_experts, num_rows));
    }
  }
  return absl::OkStatus();
}

absl::Status GgufLinearBackend::ApplyExperts(int32_t layer, ExpertGroup group, const float* x,
                                             int64_t num_rows, std::span<const ExpertRows> segments,
                                             std::span<float* const> outputs, ThreadPool& pool) {
  BITSPLIT_CHECK(layer >= 0 && static_cast<size_t>(layer) < weights_.layers.size());
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int64_t experts = static_cast<int64_t>(w.expert_down.size());
  BITSPLIT_CHECK(outputs.size() == (group == ExpertGroup::kGateUp ? 2u : 1u));
  BITSPLIT_RETURN_IF_ERROR(ValidateExpertSegments(layer, experts, num_rows, segments));
  for (const ExpertRows& segment : segments) {
    const auto e = static_cast<size_t>(segment.expert);
    const ops::WeightMatrix* gate_up[] = {&w.expert_gate[e], &w.expert_up[e]};
    const ops::WeightMatrix* down[] = {&w.expert_down[e]};
    const std::span<const ops::WeightMatrix* const> matrices =
        group == ExpertGroup::kGateUp ? std::span<const ops::WeightMatrix* const>(gate_up)
                                      : std::span<const ops::WeightMatrix* const>(down);
    std::array<float*, 2> rows{};
    for (size_t i = 0; i < outputs.size(); ++i) {
      rows[i] = outputs[i] + segment.first_row * matrices[i]->rows;
    }
    ops::MatMulMany(x + segment.first_row * matrices[0]->cols, segment.count, matrices,
                    std::span<float* const>(rows.data(), outputs.size()), pool);
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
