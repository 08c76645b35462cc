#include "common/model/residual_file.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<std::unique_ptr<ResidualFile>> ResidualFile::Open(const std::string& path) {
  std::unique_ptr<ResidualFile> residual(new ResidualFile());
  BITSPLIT_ASSIGN_OR_RETURN(
      residual->file_, SplitFile::Open(path, SplitFileKind::kResidual, SplitFormatRowSizeOracle()));
  BITSPLIT_RETURN_IF_ERROR(residual->LoadGroups());
  return residual;
}

absl::Status ResidualFile::LoadGroups() {
  const SplitFile& file = *file_;
  auto bad = [&](const std::string& detail) {
    return absl::InvalidArgumentError(absl::StrCat(file.name(), ": ", detail));
  };
  const nlohmann::json& metadata = file.metadata();
  const auto record = metadata.find(kSplitMetadataKey);
  if (record == metadata.end() || !record->is_object() || !record->contains("quantization")) {
    return bad("metadata has no quantization record; not a residual written by bitsplit quantize");
  }
  auto q = SplitRecordQuantization(*record);
  if (!q.ok()) return bad(std::string(q.status().message()));
  if (!q->residual_format) return bad("the quantization record says the model has no residual");
  quantization_ = *q;
  quantization_string_ = SplitQuantizationString(*q);

  while (file.FindTensor(absl::StrCat("blk.", num_layers_, ".attn_q.weight")) != nullptr) {
    ++num_layers_;
  }
  if (num_layers_ == 0) return bad("no layers (tensor blk.0.attn_q.weight is missing)");
  // Which groups the layers have, and their tensor names, from the tensors of layer 0: the dense
  // FFN, the experts (their count from the tall down matrix: experts x d_model rows), gate|up of
  // the experts fused or not.
  ModelConfig names;  // only what LinearGroupTensorNames reads
  names.dense_ffn = file.FindTensor("blk.0.ffn_down.weight") != nullptr;
  if (const SplitTensor* down = file.FindTensor("blk.0.ffn_down_exps.weight"); down != nullptr) {
    const SplitTensor* q = file.FindTensor("blk.0.attn_q.weight");
    const int64_t d_model = q->cols();
    if (d_model <= 0 || down->rows() % d_model != 0 || down->rows() / d_model < 1) {
      return bad(absl::StrCat("blk.0.ffn_down_exps.weight has ", down->rows(),
                              " rows, not a whole number of experts of ", d_model));
    }
    names.num_experts = down->rows() / d_model;
    names.fused_expert_gate_up = file.FindTensor("blk.0.ffn_gate_up_exps.weight") != nullptr;
  }
  size_t matrices = 0;
  shapes_.layout = LinearGroupLayout::Of(names);
  shapes_.layout.num_layers = num_layers_;
  shapes_.num_experts = names.num_experts;
  for (const LinearGroupId id : AllLinearGroups(shapes_.layout)) {
    ResidualGroup group;
    group.id = id;
    for (const std::string& name : LinearGroupTensorNames(names, id)) {
      // A layer whose values are its keys (gemma4's global layers) has no attn_v.
      if (absl::EndsWith(name, ".attn_v.weight") && file.FindTensor(name) == nullptr) continue;
      BITSPLIT_ASSIGN_OR_RETURN(const SplitTensor* tensor, file.GetTensor(name));
      const quant::SplitFormat format = *q->ResidualFormatOf(name);
      if (tensor->format != SplitTensorFormat(static_cast<uint32_t>(format)) ||
          tensor->group_size != static_cast<uint32_t>(q->residual_group) ||
          tensor->dims.size() != 2) {
        return bad(absl::StrCat("tensor ", name, " is not a 2-D ", SplitFormatName(format), "/g",
                                q->residual_group, " residual matrix (format ",
                                TensorFormatName(tensor->format), ", group ", tensor->group_size,
                                ", ", tensor->dims.size(), " dims)"));
      }
      auto view = quant::MakeMatrixView(format, q->residual_group, tensor->rows(), tensor->cols(),
                                        tensor->data, tensor->num_bytes);
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
    for (const quant::MatrixView& m : group.matrices) {
      if (IsExpertGroup(id.group) && m.rows % names.num_experts != 0) {
        return bad(absl::StrCat(group.names[0], " has ", m.rows, " rows, not ", names.num_experts,
                                " experts' worth"));
      }
    }
    weight_bytes_ += group.bytes;
    ResidualGroupShape shape;
    shape.cols = group.cols;
    for (const quant::MatrixView& m : group.matrices) shape.rows.push_back(m.rows);
    shapes_.groups.push_back(shape);
    groups_.push_back(std::move(group));
  }
  if (matrices != file.tensors().size()) {
    for (const SplitTensor& tensor : file.tensors()) {
      bool known = false;
      for (const ResidualGroup& g : groups_) {
        known = known || std::find(g.names.begin(), g.names.end(), tensor.name) != g.names.end();
      }
      if (!known) return bad(absl::StrCat("unexpected tensor ", tensor.name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const ResidualGroup*> ResidualFile::FindGroup(int64_t layer, int64_t group,
                                                             int64_t rows, int64_t cols,
                                                             int64_t max_rows) const {
  if (group < 0 || group >= kNumLinearGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is not a matrix group (0..", kNumLinearGroups - 1, ")"));
  }
  const auto g = static_cast<LinearGroup>(group);
  if (g == LinearGroup::kOutputHead && layer != LinearGroupId::kHeadLayer) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " with the output head group (expected -1)"));
  }
  if (g != LinearGroup::kOutputHead && (layer < 0 || layer >= num_layers_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is out of range [0, ", num_layers_, ")"));
  }
  const int64_t index = FindLinearGroupIndex(shapes_.layout, {static_cast<int32_t>(layer), g});
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group, " (", Absl(LinearGroupName(g)),
                                                   ") is not a group of this residual"));
  }
  BITSPLIT_CHECK(index < static_cast<int64_t>(groups_.size()));
  const ResidualGroup& found = groups_[static_cast<size_t>(index)];
  if (rows < 1 || rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows (T) ", rows, " is out of range [1, ", max_rows, "]"));
  }
  if (cols != found.cols) {
    return absl::InvalidArgumentError(absl::StrCat("cols ", cols,
                                                   " does not match the input width ", found.cols,
                                                   " of ", LinearGroupIdString(found.id)));
  }
  return &found;
}

}  // namespace bitsplit::model
