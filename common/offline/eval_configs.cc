#include "common/offline/eval_configs.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/ops/matmul.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"

namespace bitsplit::offline {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status SpecError(std::string_view spec, std::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat("configuration \"", Absl(spec), "\": ", Absl(detail)));
}

// A positive integer spelled in decimal digits only.
bool ParsePositive(std::string_view text, int* out) {
  if (text.empty() || text.size() > 6) return false;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value <= 0) return false;
  *out = value;
  return true;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

quant::SplitFormat BaseFormat(int bits, bool asymmetric) {
  switch (bits) {
    case 2:
      return asymmetric ? quant::SplitFormat::kB2Asym : quant::SplitFormat::kB2Sym;
    case 3:
      return asymmetric ? quant::SplitFormat::kB3Asym : quant::SplitFormat::kB3Sym;
    default:
      return asymmetric ? quant::SplitFormat::kB4Asym : quant::SplitFormat::kB4Sym;
  }
}

absl::Status CheckGroup(std::string_view spec, int group) {
  if (group % quant::kSplitSubBlock != 0) {
    return SpecError(
        spec, absl::StrFormat("group %d is not a multiple of %d", group, quant::kSplitSubBlock));
  }
  return absl::OkStatus();
}

// Per-worker sums of the weight comparison.
struct ErrorSums {
  double error2 = 0;
  double source2 = 0;
  int64_t exact = 0;
};

// Compares `count` rows: fill(row, source_row, config_row) writes both rows (cols floats each).
template <typename Fill>
void CompareRows(int64_t rows, int64_t cols, ThreadPool& pool, std::vector<ErrorSums>& sums,
                 const Fill& fill) {
  pool.ParallelFor(rows, [&](int64_t begin, int64_t end, int worker) {
    std::vector<float> source(static_cast<size_t>(cols));
    std::vector<float> config(static_cast<size_t>(cols));
    ErrorSums& s = sums[static_cast<size_t>(worker)];
    for (int64_t r = begin; r < end; ++r) {
      fill(r, source.data(), config.data());
      for (int64_t c = 0; c < cols; ++c) {
        const double a = source[static_cast<size_t>(c)];
        const double b = config[static_cast<size_t>(c)];
        s.error2 += (a - b) * (a - b);
        s.source2 += a * a;
        if (source[static_cast<size_t>(c)] == config[static_cast<size_t>(c)]) ++s.exact;
      }
    }
  });
}

// Sums of the layers' matrices ([0]) and the head ([1]), per worker.
struct PartSums {
  std::vector<ErrorSums> parts[2];
  int64_t weights[2] = {0, 0};
  explicit PartSums(int workers) {
    parts[0].resize(static_cast<size_t>(workers));
    parts[1].resize(static_cast<size_t>(workers));
  }
};

ErrorSums Total(const std::vector<ErrorSums>& sums) {
  ErrorSums total;
  for (const ErrorSums& s : sums) {
    total.error2 += s.error2;
    total.source2 += s.source2;
    total.exact += s.exact;
  }
  return total;
}

WeightErrorPart PartOf(const ErrorSums& s, int64_t weights, double gpu_bytes, double ram_bytes) {
  WeightErrorPart part;
  part.weights = weights;
  part.gpu_bytes = gpu_bytes;
  part.ram_bytes = ram_bytes;
  part.error2 = s.error2;
  part.source2 = s.source2;
  if (weights == 0) return part;
  part.relative_error = s.source2 > 0 ? std::sqrt(s.error2 / s.source2) : 0;
  part.exact_fraction = static_cast<double>(s.exact) / static_cast<double>(weights);
  return part;
}

WeightStats FromParts(const WeightErrorPart& layers, const WeightErrorPart& head) {
  WeightStats stats;
  stats.layers = layers;
  stats.head = head;
  stats.weights = layers.weights + head.weights;
  if (stats.weights == 0) return stats;
  const double n = static_cast<double>(stats.weights);
  stats.gpu_bytes_per_weight = (layers.gpu_bytes + head.gpu_bytes) / n;
  stats.ram_bytes_per_weight = (layers.ram_bytes + head.ram_bytes) / n;
  const double source2 = layers.source2 + head.source2;
  stats.relative_error = source2 > 0 ? std::sqrt((layers.error2 + head.error2) / source2) : 0;
  stats.exact_fraction = (layers.exact_fraction * static_cast<double>(layers.weights) +
                          head.exact_fraction * static_cast<double>(head.weights)) /
                         n;
  return stats;
}

WeightStats Finish(const PartSums& sums, const double gpu_bytes[2], const double ram_bytes[2]) {
  return FromParts(PartOf(Total(sums.parts[0]), sums.weights[0], gpu_bytes[0], ram_bytes[0]),
                   PartOf(Total(sums.parts[1]), sums.weights[1], gpu_bytes[1], ram_bytes[1]));
}

}  // namespace

absl::StatusOr<EvalConfigSpec> ParseEvalConfigSpec(std::string_view spec,
                                                   const EvalSpecDefaults& defaults) {
  EvalConfigSpec out;
  if (spec == "ref") {
    out.kind = EvalConfigSpec::Kind::kReference;
    out.label = "ref";
    return out;
  }
  if (StartsWith(spec, "gguf:")) {
    out.kind = EvalConfigSpec::Kind::kGguf;
    out.gguf_path = std::string(spec.substr(5));
    if (out.gguf_path.empty()) return SpecError(spec, "gguf: needs a path");
    out.label = std::string(spec);
    return out;
  }
  for (const auto& [prefix, verify] :
       {std::pair<std::string_view, bool>{"split:", true}, {"split-base:", false}}) {
    if (!StartsWith(spec, prefix)) continue;
    out.kind = EvalConfigSpec::Kind::kSplitFiles;
    out.split_prefix = std::string(spec.substr(prefix.size()));
    if (out.split_prefix.empty()) return SpecError(spec, "needs the model's output prefix");
    out.verify = verify;
    out.label = std::string(spec);
    return out;
  }
  const std::vector<std::string> parts = absl::StrSplit(Absl(spec), ':');
  const std::string& head = parts[0];
  const bool is_q8_0 = head == "q8_0";
  int base_bits = 0;
  bool ternary = false;  // "bt": the ternary base (symmetric only)
  int residual_bits = 0;
  if (!is_q8_0) {
    const std::vector<std::string> halves = absl::StrSplit(head, '+');
    if (halves.size() > 2 || halves[0].size() != 2 || halves[0][0] != 'b' ||
        (halves[0][1] != '2' && halves[0][1] != '3' && halves[0][1] != '4' &&
         halves[0][1] != 't')) {
      return SpecError(
          spec, "expected ref, q8_0, gguf:PATH, bN or bN+rM (N in 2..4 or t, M in 3..6 or 8)");
    }
    ternary = halves[0][1] == 't';
    base_bits = ternary ? 0 : halves[0][1] - '0';
    if (halves.size() == 2) {
      const std::string& residual = halves[1];
      if (residual.size() != 2 || residual[0] != 'r' ||
          !quant::ResidualFormatOfBits(residual[1] - '0').ok()) {
        return SpecError(
            spec, absl::StrCat("unknown residual \"", residual, "\" (r3, r4, r5, r6 or r8)"));
      }
      residual_bits = residual[1] - '0';
    }
  }

  int base_group = defaults.base_group;
  int residual_group = defaults.residual_group;
  bool asymmetric = defaults.asymmetric;
  int rotation_block = is_q8_0 ? 0 : defaults.rotation_block;
  bool importance = is_q8_0 ? false : defaults.importance;
  bool head_q8_0 = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& option = parts[i];
    int value = 0;
    if (is_q8_0 && !StartsWith(option, "rot") && option != "norot") {
      return SpecError(spec, absl::StrCat("q8_0 takes only rot/rotK/norot, not \"", option, "\""));
    }
    if (option == "sym" || option == "asym") {
      if (ternary && option == "asym") {
        return SpecError(spec, "the ternary base bt is symmetric only");
      }
      asymmetric = option == "asym";
    } else if (option == "imp" || option == "noimp") {
      importance = option == "imp";
    } else if (option == "hq8") {
      head_q8_0 = true;
    } else if (option == "norot") {
      rotation_block = 0;
    } else if (option == "rot") {
      rotation_block = defaults.rotation_block > 0 ? defaults.rotation_block : 64;
    } else if (StartsWith(option, "rot") && ParsePositive(option.substr(3), &value)) {
      if (value < 8 || value > 1024 || (value & (value - 1)) != 0) {
        return SpecError(spec, "rotation block must be a power of two in [8, 1024]");
      }
      rotation_block = value;
    } else if (StartsWith(option, "bg") && ParsePositive(option.substr(2), &value)) {
      base_group = value;
    } else if (StartsWith(option, "rg") && ParsePositive(option.substr(2), &value)) {
      residual_group = value;
    } else if (StartsWith(option, "g") && ParsePositive(option.substr(1), &value)) {
      base_group = residual_group = value;
    } else {
      return SpecError(spec, absl::StrCat("unknown option \"", option, "\""));
    }
  }

  out.kind = EvalConfigSpec::Kind::kSplit;
  out.importance = importance;
  out.verify = residual_bits != 0;
  out.head_q8_0 = head_q8_0;
  model::SplitQuantization& q = out.quantization;
  q.rotation.block = rotation_block;
  q.rotation.seed = rotation_block > 0 ? defaults.rotation_seed : 0;
  const std::string rotation_label =
      rotation_block > 0 ? absl::StrCat("rot", rotation_block) : "norot";
  if (is_q8_0) {
    q.base_format = quant::SplitFormat::kQ8_0;
    q.base_group = 32;
    q.residual_format = std::nullopt;
    q.residual_group = 32;
    out.label = absl::StrCat("q8_0:", rotation_label);
    return out;
  }
  BITSPLIT_RETURN_IF_ERROR(CheckGroup(spec, base_group));
  if (ternary) asymmetric = false;
  q.base_format = ternary ? quant::SplitFormat::kBTern : BaseFormat(base_bits, asymmetric);
  q.base_group = base_group;
  std::string groups = absl::StrCat("g", base_group);
  if (residual_bits != 0) {
    BITSPLIT_RETURN_IF_ERROR(CheckGroup(spec, residual_group));
    q.residual_format = *quant::ResidualFormatOfBits(residual_bits);
    q.residual_group = residual_group;
    if (residual_group != base_group)
      groups = absl::StrCat("bg", base_group, ":rg", residual_group);
  } else {
    q.residual_format = std::nullopt;
    q.residual_group = base_group;
  }
  out.label = absl::StrCat("b", ternary ? "t" : absl::StrCat(base_bits),
                           residual_bits != 0 ? absl::StrCat("+r", residual_bits) : "", ":", groups,
                           ":", asymmetric ? "asym" : "sym", ":", rotation_label, ":",
                           importance ? "imp" : "noimp", head_q8_0 ? ":hq8" : "");
  return out;
}

absl::StatusOr<std::vector<EvalConfigSpec>> ParseEvalConfigSpecs(std::string_view specs,
                                                                 const EvalSpecDefaults& defaults) {
  std::vector<EvalConfigSpec> out;
  // gguf:PATH may hold commas only if the caller passes it alone; split on commas otherwise.
  for (absl::string_view item : absl::StrSplit(Absl(specs), ',')) {
    if (item.empty()) return absl::InvalidArgumentError("empty configuration in the list");
    BITSPLIT_ASSIGN_OR_RETURN(
        EvalConfigSpec spec,
        ParseEvalConfigSpec(std::string_view(item.data(), item.size()), defaults));
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<const ops::WeightMatrix*> GgufMatricesOf(const model::ModelWeights& weights,
                                                     model::LinearGroupId id) {
  const model::GgufGroupMatrices group = model::GroupMatricesOf(weights, id);
  return {group.matrices.begin(), group.matrices.begin() + group.count};
}

WeightStats CombineLayersAndHead(const WeightStats& layers_from, const WeightStats& head_from) {
  return FromParts(layers_from.layers, head_from.head);
}

absl::StatusOr<WeightStats> MeasureSplitWeights(const model::ModelWeights& source,
                                                const model::ModelConfig& config,
                                                const model::SplitModelFiles& split, bool verify,
                                                ThreadPool& pool) {
  if (verify && split.residual_linear() == nullptr) {
    return absl::FailedPreconditionError("verify weights asked of a split model without residual");
  }
  const model::HadamardRotation rotation = split.quantization().rotation;
  PartSums sums(pool.num_threads());
  double gpu_bytes[2] = {0, 0};
  double ram_bytes[2] = {0, 0};
  for (const model::LinearGroupId& id : model::AllLinearGroups(config)) {
    const std::span<const quant::MatrixView> base = split.base_linear().group(id);
    const std::vector<const ops::WeightMatrix*> src = GgufMatricesOf(source, id);
    std::span<const quant::MatrixView> residual;
    if (verify) residual = split.residual_linear()->group(id);
    if (base.size() != src.size() || (verify && residual.size() != src.size())) {
      return absl::InternalError(
          absl::StrCat("group ", model::LinearGroupIdString(id), ": matrix counts differ"));
    }
    for (size_t m = 0; m < base.size(); ++m) {
      const quant::MatrixView& b = base[m];
      const ops::WeightMatrix& s = *src[m];
      if (b.rows != s.rows || b.cols != s.cols) {
        return absl::InternalError(absl::StrCat("group ", model::LinearGroupIdString(id),
                                                ": shapes differ from the source"));
      }
      const int part = id.group == model::LinearGroup::kOutputHead ? 1 : 0;
      sums.weights[part] += b.rows * b.cols;
      gpu_bytes[part] += static_cast<double>(b.rows) *
                         static_cast<double>(quant::SplitRowBytes(b.format, b.group, b.cols));
      const quant::MatrixView* r = verify ? &residual[m] : nullptr;
      if (r != nullptr) {
        ram_bytes[part] += static_cast<double>(r->rows) *
                           static_cast<double>(quant::SplitRowBytes(r->format, r->group, r->cols));
      }
      CompareRows(b.rows, b.cols, pool, sums.parts[part],
                  [&](int64_t row, float* src_row, float* cfg_row) {
                    ops::DequantizeWeightRow(s, row, src_row);
                    model::RotateRows(rotation, src_row, 1, b.cols);
                    quant::DequantizeSplitRow(b.format, b.group, b.row(row), b.cols, cfg_row);
                    if (r != nullptr) {
                      std::vector<float> residual_row(static_cast<size_t>(b.cols));
                      quant::DequantizeSplitRow(r->format, r->group, r->row(row), r->cols,
                                                residual_row.data());
                      for (int64_t c = 0; c < b.cols; ++c)
                        cfg_row[c] += residual_row[static_cast<size_t>(c)];
                    }
                  });
    }
  }
  return Finish(sums, gpu_bytes, ram_bytes);
}

absl::StatusOr<WeightStats> MeasureGgufWeights(const model::ModelWeights& source,
                                               const model::ModelConfig& config,
                                               const model::ModelWeights& candidate,
                                               ThreadPool& pool) {
  PartSums sums(pool.num_threads());
  double bytes[2] = {0, 0};
  const double no_bytes[2] = {0, 0};
  for (const model::LinearGroupId& id : model::AllLinearGroups(config)) {
    const std::vector<const ops::WeightMatrix*> src = GgufMatricesOf(source, id);
    const std::vector<const ops::WeightMatrix*> cand = GgufMatricesOf(candidate, id);
    for (size_t m = 0; m < src.size(); ++m) {
      const ops::WeightMatrix& s = *src[m];
      const ops::WeightMatrix& c = *cand[m];
      if (s.rows != c.rows || s.cols != c.cols) {
        return absl::InvalidArgumentError(absl::StrCat("group ", model::LinearGroupIdString(id),
                                                       ": shapes differ from the source"));
      }
      const int part = id.group == model::LinearGroup::kOutputHead ? 1 : 0;
      sums.weights[part] += s.rows * s.cols;
      bytes[part] += static_cast<double>(c.rows) * static_cast<double>(c.row_bytes);
      CompareRows(s.rows, s.cols, pool, sums.parts[part],
                  [&](int64_t row, float* src_row, float* cfg_row) {
                    ops::DequantizeWeightRow(s, row, src_row);
                    ops::DequantizeWeightRow(c, row, cfg_row);
                  });
    }
  }
  return Finish(sums, bytes, no_bytes);
}

}  // namespace bitsplit::offline
