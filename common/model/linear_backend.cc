#include "common/model/linear_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ops/matmul.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

// Tensor name suffixes of a group's matrices, in output order.
std::vector<std::string_view> GroupTensorSuffixes(const ModelConfig& config, LinearGroupId id) {
  switch (id.group) {
    case LinearGroup::kQkv:
      if (config.ValueIsKey(id.layer)) return {"attn_q", "attn_k"};
      return {"attn_q", "attn_k", "attn_v"};
    case LinearGroup::kAttnOutput:
      return {"attn_output"};
    case LinearGroup::kGateUp:
      return {"ffn_gate", "ffn_up"};
    case LinearGroup::kDown:
      return {"ffn_down"};
    case LinearGroup::kOutputHead:
      return {"output"};
    case LinearGroup::kExpertGateUp:
      if (config.fused_expert_gate_up) return {"ffn_gate_up_exps"};
      return {"ffn_gate_exps", "ffn_up_exps"};
    case LinearGroup::kExpertDown:
      return {"ffn_down_exps"};
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
    case LinearGroup::kExpertGateUp:
      return "expert_gate_up";
    case LinearGroup::kExpertDown:
      return "expert_down";
  }
  return "unknown";
}

bool IsExpertGroup(LinearGroup group) {
  return group == LinearGroup::kExpertGateUp || group == LinearGroup::kExpertDown;
}

std::string LinearGroupIdString(LinearGroupId id) {
  if (id.group == LinearGroup::kOutputHead) return "output head";
  const std::string_view name = LinearGroupName(id.group);
  return absl::StrCat("blk.", id.layer, " ", absl::string_view(name.data(), name.size()));
}

LinearGroupLayout LinearGroupLayout::Of(const ModelConfig& config) {
  return {.num_layers = static_cast<int32_t>(config.num_layers),
          .dense_ffn = config.dense_ffn,
          .experts = config.has_experts()};
}

std::vector<LinearGroup> LinearGroupLayout::LayerGroups() const {
  std::vector<LinearGroup> groups = {LinearGroup::kQkv, LinearGroup::kAttnOutput};
  if (dense_ffn) groups.insert(groups.end(), {LinearGroup::kGateUp, LinearGroup::kDown});
  if (experts) groups.insert(groups.end(), {LinearGroup::kExpertGateUp, LinearGroup::kExpertDown});
  return groups;
}

std::vector<LinearGroupId> AllLinearGroups(const LinearGroupLayout& layout) {
  const std::vector<LinearGroup> layer_groups = layout.LayerGroups();
  std::vector<LinearGroupId> groups;
  groups.reserve(static_cast<size_t>(layout.num_layers) * layer_groups.size() + 1);
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (const LinearGroup group : layer_groups) groups.push_back({layer, group});
  }
  groups.push_back(LinearGroupId::Head());
  return groups;
}

std::vector<LinearGroupId> AllLinearGroups(const ModelConfig& config) {
  return AllLinearGroups(LinearGroupLayout::Of(config));
}

int64_t FindLinearGroupIndex(const LinearGroupLayout& layout, LinearGroupId id) {
  const std::vector<LinearGroup> layer_groups = layout.LayerGroups();
  const auto per_layer = static_cast<int64_t>(layer_groups.size());
  if (id.group == LinearGroup::kOutputHead) {
    return id.layer == LinearGroupId::kHeadLayer ? int64_t{layout.num_layers} * per_layer : -1;
  }
  if (id.layer < 0 || id.layer >= layout.num_layers) return -1;
  const auto found = std::find(layer_groups.begin(), layer_groups.end(), id.group);
  if (found == layer_groups.end()) return -1;
  return int64_t{id.layer} * per_layer + (found - layer_groups.begin());
}

int64_t LinearGroupIndex(const ModelConfig& config, LinearGroupId id) {
  const int64_t index = FindLinearGroupIndex(LinearGroupLayout::Of(config), id);
  BITSPLIT_CHECK(index >= 0);
  return index;
}

std::vector<std::string> LinearGroupTensorNames(const ModelConfig& config, LinearGroupId id) {
  std::vector<std::string> names;
  for (std::string_view suffix : GroupTensorSuffixes(config, id)) {
    const absl::string_view s(suffix.data(), suffix.size());
    names.push_back(id.group == LinearGroup::kOutputHead
                        ? absl::StrCat(s, ".weight")
                        : absl::StrCat("blk.", id.layer, ".", s, ".weight"));
  }
  return names;
}

int64_t LinearGroupInputDim(const ModelConfig& config, LinearGroupId id) {
  switch (id.group) {
    case LinearGroup::kQkv:
    case LinearGroup::kGateUp:
    case LinearGroup::kOutputHead:
    case LinearGroup::kExpertGateUp:
      return config.d_model;
    case LinearGroup::kAttnOutput:
      return config.QDim(id.layer);
    case LinearGroup::kDown:
      return config.d_ff;
    case LinearGroup::kExpertDown:
      return config.d_ff_expert;
  }
  BITSPLIT_CHECK(false);
  return 0;
}

std::vector<int64_t> LinearGroupOutputDims(const ModelConfig& config, LinearGroupId id) {
  switch (id.group) {
    case LinearGroup::kQkv:
      if (config.ValueIsKey(id.layer)) return {config.QDim(id.layer), config.KvDim(id.layer)};
      return {config.QDim(id.layer), config.KvDim(id.layer), config.KvDim(id.layer)};
    case LinearGroup::kAttnOutput:
      return {config.d_model};
    case LinearGroup::kDown:
      return {config.d_model};
    case LinearGroup::kGateUp:
      return {config.d_ff, config.d_ff};
    case LinearGroup::kOutputHead:
      return {config.vocab_size};
    case LinearGroup::kExpertGateUp:
    case LinearGroup::kExpertDown: {
      std::vector<int64_t> rows = ExpertOutputDims(config, id.group);
      for (int64_t& r : rows) r *= config.num_experts;
      return rows;
    }
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
      if (w.wv.data != nullptr) add(w.wv);  // none where the values are the keys
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
    case LinearGroup::kExpertGateUp:
      for (const ops::WeightMatrix& tall : w.experts_gate_up) add(tall);
      break;
    case LinearGroup::kExpertDown:
      add(w.experts_down);
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

int64_t ExpertInputDim(const ModelConfig& config, LinearGroup group) {
  BITSPLIT_CHECK(IsExpertGroup(group));
  return group == LinearGroup::kExpertGateUp ? config.d_model : config.d_ff_expert;
}

std::vector<int64_t> ExpertOutputDims(const ModelConfig& config, LinearGroup group) {
  BITSPLIT_CHECK(IsExpertGroup(group));
  if (group == LinearGroup::kExpertDown) return {config.d_model};
  if (config.fused_expert_gate_up) return {2 * config.d_ff_expert};
  return {config.d_ff_expert, config.d_ff_expert};
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

absl::Status GgufLinearBackend::ApplyExperts(int32_t layer, LinearGroup group, const float* x,
                                             int64_t num_rows, std::span<const ExpertRows> segments,
                                             std::span<float* const> outputs, ThreadPool& pool) {
  BITSPLIT_CHECK(layer >= 0 && static_cast<size_t>(layer) < weights_.layers.size() &&
                 IsExpertGroup(group));
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const std::vector<std::vector<ops::WeightMatrix>>& experts =
      group == LinearGroup::kExpertGateUp ? w.expert_gate_up : w.expert_down;
  BITSPLIT_RETURN_IF_ERROR(
      ValidateExpertSegments(layer, static_cast<int64_t>(experts.size()), num_rows, segments));
  for (const ExpertRows& segment : segments) {
    const std::vector<ops::WeightMatrix>& matrices = experts[static_cast<size_t>(segment.expert)];
    BITSPLIT_CHECK(outputs.size() == matrices.size());
    std::array<const ops::WeightMatrix*, kMaxMatricesPerGroup> views{};
    std::array<float*, kMaxMatricesPerGroup> rows{};
    for (size_t i = 0; i < matrices.size(); ++i) {
      views[i] = &matrices[i];
      rows[i] = outputs[i] + segment.first_row * matrices[i].rows;
    }
    ops::MatMulMany(x + segment.first_row * matrices[0].cols, segment.count,
                    std::span<const ops::WeightMatrix* const>(views.data(), matrices.size()),
                    std::span<float* const>(rows.data(), matrices.size()), pool);
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
