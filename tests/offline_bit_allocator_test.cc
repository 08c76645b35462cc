// Bits by budget: the bit plan in the split record, the measured sensitivities against the
// files the quantizer writes, the allocator's budget (checked with PlanVram, the CUDA backend's
// own arithmetic) and quality bound, and a planned model's speculation against plain decoding.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/model/residual_file.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/model/weights.h"
#include "common/offline/bit_allocator.h"
#include "common/offline/eval.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/matmul.h"
#include "common/quant/split_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"
#include "tests/testing/speculation_runs.h"
#include "tests/testing/synthetic_weights.h"

namespace bitsplit::offline {
namespace {

using quant::SplitFormat;
using ::testing::HasSubstr;

constexpr int kThreads = 2;

// A small random-weight llama: 2 layers, d_model 128, d_ff 256, 4 heads over 2 KV heads, vocab
// 320, an untied output head; F32 tensors from the counter-based rule of synthetic_weights.h.
std::string WriteTinyModel() {
  static const std::string path = [] {
    testing::GgufBuilder b;
    b.AddString("general.architecture", "llama");
    b.AddUint32("llama.block_count", 2);
    b.AddUint32("llama.context_length", 256);
    b.AddUint32("llama.embedding_length", 128);
    b.AddUint32("llama.feed_forward_length", 256);
    b.AddUint32("llama.attention.head_count", 4);
    b.AddUint32("llama.attention.head_count_kv", 2);
    b.AddFloat32("llama.rope.freq_base", 10000.0f);
    b.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    auto add = [&](const std::string& name, std::vector<uint64_t> dims, double scale,
                   double offset) {
      uint64_t count = 1;
      for (uint64_t d : dims) count *= d;
      b.AddF32Tensor(name, dims, testing::SyntheticValues("llama", name, count, scale, offset));
    };
    add("token_embd.weight", {128, 320}, 1.0, 0.0);
    add("output_norm.weight", {128}, 0.25, 1.0);
    add("output.weight", {128, 320}, 0.2, 0.0);
    for (int layer = 0; layer < 2; ++layer) {
      const std::string p = absl::StrCat("blk.", layer, ".");
      add(p + "attn_norm.weight", {128}, 0.25, 1.0);
      add(p + "attn_q.weight", {128, 128}, 0.2, 0.0);
      add(p + "attn_k.weight", {128, 64}, 0.2, 0.0);
      add(p + "attn_v.weight", {128, 64}, 0.2, 0.0);
      add(p + "attn_output.weight", {128, 128}, 0.2, 0.0);
      add(p + "ffn_norm.weight", {128}, 0.25, 1.0);
      add(p + "ffn_gate.weight", {128, 256}, 0.2, 0.0);
      add(p + "ffn_up.weight", {128, 256}, 0.2, 0.0);
      add(p + "ffn_down.weight", {256, 128}, 0.15, 0.0);
    }
    const std::string file =
        (testing::TestTempDir() / absl::StrCat("bitsplit-tiny-plan-", getpid(), ".gguf")).string();
    EXPECT_TRUE(testing::WriteFileBytes(file, b.Build()));
    return file;
  }();
  return path;
}

struct Tiny {
  std::unique_ptr<gguf::File> file;
  model::ModelConfig config;
  model::ModelWeights weights;
};
const Tiny& TinyModel() {
  static const Tiny* const tiny = [] {
    auto* t = new Tiny();
    auto file = gguf::File::Open(WriteTinyModel());
    EXPECT_TRUE(file.ok()) << file.status();
    t->file = std::move(*file);
    auto config = model::ModelConfigFromGguf(*t->file);
    EXPECT_TRUE(config.ok()) << config.status();
    t->config = *config;
    auto weights = model::ModelWeightsFromGguf(*t->file, t->config);
    EXPECT_TRUE(weights.ok()) << weights.status();
    t->weights = *weights;
    return t;
  }();
  return *tiny;
}

model::SplitQuantization RotatedQuantization() {
  model::SplitQuantization q;
  q.base_format = SplitFormat::kB2Asym;
  q.base_group = 64;
  q.residual_format = SplitFormat::kR8;
  q.residual_group = 32;
  q.rotation = {.block = 64, .seed = 1};
  return q;
}

// Every linear tensor of a group gets `formats`.
void PlanGroup(const model::LinearGroupId id, model::TensorSplitFormats formats,
               model::SplitQuantization* q) {
  for (const std::string& name : model::LinearGroupTensorNames(TinyModel().config, id))
    q->tensor_formats[name] = formats;
}

// A mixed plan: layer 0 b4 + r3, layer 1 b2 + r8 (its down projection b3 + r5), head b3 + r4.
model::SplitQuantization MixedPlan() {
  model::SplitQuantization q = RotatedQuantization();
  for (const model::LinearGroupId id : model::AllLinearGroups(TinyModel().config)) {
    model::TensorSplitFormats formats{SplitFormat::kB2Asym, SplitFormat::kR8};
    if (id.group == model::LinearGroup::kOutputHead) {
      formats = {SplitFormat::kB3Asym, SplitFormat::kR4};
    } else if (id.layer == 0) {
      formats = {SplitFormat::kB4Asym, SplitFormat::kR3};
    } else if (id.group == model::LinearGroup::kDown) {
      formats = {SplitFormat::kB3Asym, SplitFormat::kR5};
    }
    PlanGroup(id, formats, &q);
  }
  return q;
}

std::string TempPrefix(const std::string& name) {
  return (testing::TestTempDir() / absl::StrCat("bitsplit-", name, "-", getpid())).string();
}

// ---- The plan in the record -----------------------------------------------------------------

TEST(BitPlanRecordTest, RoundTripsThroughJsonWithItsOwnVersion) {
  const model::SplitQuantization uniform = RotatedQuantization();
  EXPECT_FALSE(model::SplitQuantizationToJson(uniform).contains("tensor_formats"));
  EXPECT_EQ(model::SplitRecordVersionOf(uniform), model::kSplitRecordVersion);

  const model::SplitQuantization planned = MixedPlan();
  const nlohmann::json json = model::SplitQuantizationToJson(planned);
  ASSERT_TRUE(json.contains("tensor_formats"));
  EXPECT_EQ(json["tensor_formats"]["blk.1.ffn_down.weight"], nlohmann::json({"b3_asym", "r5"}));
  absl::StatusOr<model::SplitQuantization> back = model::SplitQuantizationFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, planned);
  EXPECT_EQ(back->BaseFormatOf("blk.0.attn_k.weight"), SplitFormat::kB4Asym);
  EXPECT_EQ(back->ResidualFormatOf("output.weight"), SplitFormat::kR4);
  EXPECT_EQ(model::SplitRecordVersionOf(planned), model::kSplitRecordVersionWithPlan);
  EXPECT_EQ(model::SplitQuantizationString(planned),
            "{b2_asym x6, b3_asym x2, b4_asym x7}/g64 + {r3 x7, r4 x1, r5 x1, r8 x6}/g32, "
            "hadamard 64 (seed 1)");

  // A plan needs a version 3 record; older versions never had one.
  EXPECT_TRUE(model::SplitRecordQuantization({{"version", 3}, {"quantization", json}}).ok());
  EXPECT_THAT(
      model::SplitRecordQuantization({{"version", 2}, {"quantization", json}}).status().message(),
      HasSubstr("holds a bit plan"));
}

TEST(BitPlanRecordTest, MalformedPlansAreRejectedNamingTheTensor) {
  nlohmann::json json = model::SplitQuantizationToJson(MixedPlan());
  json["tensor_formats"]["blk.0.attn_q.weight"] = {"r4", "r4"};
  EXPECT_THAT(model::SplitQuantizationFromJson(json).status().message(),
              HasSubstr("tensor_formats[\"blk.0.attn_q.weight\"] has no base format"));
  json["tensor_formats"]["blk.0.attn_q.weight"] = {"b2_asym", nullptr};
  EXPECT_THAT(model::SplitQuantizationFromJson(json).status().message(),
              HasSubstr("has no residual in a model with one"));
  json["tensor_formats"]["blk.0.attn_q.weight"] = "b2_asym";
  EXPECT_THAT(model::SplitQuantizationFromJson(json).status().message(), HasSubstr("is not [base"));

  // One group, one format: the kernels run a group's matrices together.
  model::SplitQuantization split_group = MixedPlan();
  split_group.tensor_formats["blk.0.attn_v.weight"] = {SplitFormat::kB2Asym, SplitFormat::kR3};
  EXPECT_THAT(ValidateSplitQuantization(split_group, TinyModel().config).message(),
              HasSubstr("must share their formats"));
  model::SplitQuantization unknown = MixedPlan();
  unknown.tensor_formats["blk.7.attn_q.weight"] = {SplitFormat::kB2Asym, SplitFormat::kR8};
  EXPECT_THAT(ValidateSplitQuantization(unknown, TinyModel().config).message(),
              HasSubstr("blk.7.attn_q.weight is not a linear weight"));
}

// ---- A planned model through the files, the loaders and speculation ---------------------------

TEST(BitPlanFilesTest, PlannedModelLoadsWithItsFormatsAndSpeculatesLosslessly) {
  const model::SplitQuantization q = MixedPlan();
  const std::string prefix = TempPrefix("mixed-plan");
  absl::StatusOr<QuantizeSummary> summary = QuantizeSplitModel(
      WriteTinyModel(), model::SplitBasePath(prefix), model::SplitResidualPath(prefix),
      {.quantization = q, .num_threads = kThreads});
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->base_format_counts.at("b4_asym"), 7);
  EXPECT_EQ(summary->residual_format_counts.at("r3"), 7);

  absl::StatusOr<std::unique_ptr<model::SplitModelFiles>> files =
      model::SplitModelFiles::Open(model::SplitBasePath(prefix), model::SplitResidualPath(prefix));
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ((*files)->quantization(), summary->quantization);
  const model::ModelConfig& config = (*files)->config();
  std::map<std::string, SplitFormat, std::less<>> base_formats;
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const std::vector<std::string> names = model::LinearGroupTensorNames(config, id);
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ((*files)->base_linear().group(id)[i].format, q.BaseFormatOf(names[i])) << names[i];
      EXPECT_EQ((*files)->residual_linear()->group(id)[i].format, *q.ResidualFormatOf(names[i]))
          << names[i];
      base_formats[names[i]] = q.BaseFormatOf(names[i]);
    }
  }
  // The residual service's loader reads the same per-tensor formats.
  absl::StatusOr<std::unique_ptr<model::ResidualFile>> residual =
      model::ResidualFile::Open(model::SplitResidualPath(prefix));
  ASSERT_TRUE(residual.ok()) << residual.status();
  // The device plan counts every matrix at its own format: the sum of its rows' device strides.
  uint64_t expected = 0, expected_residual = 0;
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const std::vector<std::string> names = model::LinearGroupTensorNames(config, id);
    const std::vector<int64_t> rows = model::LinearGroupOutputDims(config, id);
    const int64_t cols = model::LinearGroupInputDim(config, id);
    for (size_t i = 0; i < names.size(); ++i) {
      expected +=
          model::AlignVram(static_cast<uint64_t>(rows[i]) *
                           ((quant::SplitRowBytes(base_formats[names[i]], 64, cols) + 3) / 4 * 4));
      expected_residual += static_cast<uint64_t>(rows[i]) *
                           quant::SplitRowBytes(*q.ResidualFormatOf(names[i]), 32, cols);
    }
  }
  EXPECT_EQ((*residual)->weight_bytes(), expected_residual);
  absl::StatusOr<uint64_t> planned_bytes =
      model::SplitLinearBytes(config, SplitFormat::kB2Asym, 64, &base_formats);
  ASSERT_TRUE(planned_bytes.ok()) << planned_bytes.status();
  EXPECT_EQ(*planned_bytes, expected);

  // Mixed formats in one forward: speculation with the draft base emits exactly what plain
  // decoding with the verifier emits.
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::LoadSplit(
      model::SplitBasePath(prefix), model::SplitResidualPath(prefix), kThreads);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 7, 250, 3, 64};
  const std::vector<int32_t> plain = testing::PlainDecode(**model, prompt, {}, 40);
  for (const speculation::TreeShape shape :
       {speculation::TreeShape{16, 4, 4}, speculation::TreeShape{128, 8, 16}}) {
    const testing::SpecRun run =
        testing::SpeculativeDecode(**model, prompt, {}, 40, shape, model::ForwardMode::kDraft);
    EXPECT_EQ(run.tokens, plain) << shape.nodes << " nodes";
  }
  std::filesystem::remove(model::SplitBasePath(prefix));
  std::filesystem::remove(model::SplitResidualPath(prefix));
}

// ---- Sensitivities ----------------------------------------------------------------------------

// Unweighted squared error of the rows of `view` (dequantized) against `expected` rows.
double SquaredError(const quant::MatrixView& view, const std::vector<std::vector<float>>& expected,
                    const quant::MatrixView* residual = nullptr) {
  double sum = 0;
  std::vector<float> row(static_cast<size_t>(view.cols)), extra(static_cast<size_t>(view.cols));
  for (int64_t r = 0; r < view.rows; ++r) {
    quant::DequantizeSplitRow(view.format, view.group, view.data + r * view.row_stride, view.cols,
                              row.data());
    if (residual != nullptr) {
      quant::DequantizeSplitRow(residual->format, residual->group,
                                residual->data + r * residual->row_stride, view.cols, extra.data());
      for (int64_t j = 0; j < view.cols; ++j) row[j] += extra[j];
    }
    for (int64_t j = 0; j < view.cols; ++j) {
      const double d = static_cast<double>(expected[r][j]) - row[j];
      sum += d * d;
    }
  }
  return sum;
}

TEST(SensitivitiesTest, MatchTheErrorsOfTheFilesTheQuantizerWrites) {
  const Tiny& tiny = TinyModel();
  const model::SplitQuantization q = MixedPlan();
  const BitCandidates candidates;
  absl::StatusOr<std::vector<GroupSensitivity>> groups =
      MeasureSensitivities(tiny.weights, tiny.config, q, candidates, nullptr, kThreads);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), model::AllLinearGroups(tiny.config).size());

  const std::string prefix = TempPrefix("sensitivity");
  ASSERT_TRUE(QuantizeSplitModel(WriteTinyModel(), model::SplitBasePath(prefix),
                                 model::SplitResidualPath(prefix),
                                 {.quantization = q, .num_threads = kThreads})
                  .ok());
  model::SplitQuantization q8_0;
  q8_0.base_format = SplitFormat::kQ8_0;
  q8_0.base_group = 32;
  q8_0.residual_format.reset();
  const std::string q8_prefix = TempPrefix("sensitivity-q8");
  ASSERT_TRUE(QuantizeSplitModel(WriteTinyModel(), model::SplitBasePath(q8_prefix), "",
                                 {.quantization = q8_0, .num_threads = kThreads})
                  .ok());
  auto files =
      model::SplitModelFiles::Open(model::SplitBasePath(prefix), model::SplitResidualPath(prefix));
  auto q8_files = model::SplitModelFiles::Open(model::SplitBasePath(q8_prefix), "");
  ASSERT_TRUE(files.ok() && q8_files.ok());

  for (const GroupSensitivity& group : *groups) {
    const std::span<const quant::MatrixView> base = (*files)->base_linear().group(group.id);
    const std::span<const quant::MatrixView> residual =
        (*files)->residual_linear()->group(group.id);
    const std::span<const quant::MatrixView> q8 = (*q8_files)->base_linear().group(group.id);
    const size_t b = std::find(candidates.bases.begin(), candidates.bases.end(),
                               q.BaseFormatOf(group.tensors[0])) -
                     candidates.bases.begin();
    const size_t k = std::find(candidates.residuals.begin(), candidates.residuals.end(),
                               *q.ResidualFormatOf(group.tensors[0])) -
                     candidates.residuals.begin();
    double base_error = 0, verify_error = 0, q8_error = 0, signal = 0, source_signal = 0;
    const model::GgufGroupMatrices sources = model::GroupMatricesOf(tiny.weights, group.id);
    for (size_t m = 0; m < sources.count; ++m) {
      const ops::WeightMatrix& w = sources[m];
      std::vector<std::vector<float>> rotated(static_cast<size_t>(w.rows)),
          plain(static_cast<size_t>(w.rows));
      for (int64_t r = 0; r < w.rows; ++r) {
        plain[r].resize(static_cast<size_t>(w.cols));
        ops::DequantizeWeightRow(w, r, plain[r].data());
        rotated[r] = plain[r];
        model::RotateRows(q.rotation, rotated[r].data(), 1, w.cols);
        for (int64_t j = 0; j < w.cols; ++j) {
          signal += static_cast<double>(rotated[r][j]) * rotated[r][j];
          source_signal += static_cast<double>(plain[r][j]) * plain[r][j];
        }
      }
      base_error += SquaredError(base[m], rotated);
      verify_error += SquaredError(base[m], rotated, &residual[m]);
      q8_error += SquaredError(q8[m], plain);  // unweighted: the rotation keeps its norm
    }
    const std::string what = model::LinearGroupIdString(group.id);
    EXPECT_NEAR(group.signal, signal, 1e-9 * signal) << what;
    EXPECT_NEAR(group.signal, source_signal, 1e-5 * source_signal) << what;  // orthonormal
    EXPECT_NEAR(group.bases[b].base_error, base_error, 1e-9 * base_error) << what;
    // The measurement subtracts the residual from W - B, the files' sum adds B + R in float
    // first: the two differ by float rounding only.
    EXPECT_NEAR(group.bases[b].verify_error[k], verify_error, 1e-6 * verify_error) << what;
    EXPECT_NEAR(group.q8_0_error, q8_error, 1e-4 * q8_error) << what;
    // More bits, less error, for the base and for every residual on it.
    for (size_t i = 1; i < group.bases.size(); ++i) {
      EXPECT_LT(group.bases[i].base_error, group.bases[i - 1].base_error) << what;
    }
    for (const BaseOption& option : group.bases) {
      for (size_t i = 1; i < option.verify_error.size(); ++i) {
        EXPECT_LT(option.verify_error[i], option.verify_error[i - 1]) << what;
      }
      EXPECT_LT(option.verify_error.front(), option.base_error) << what;
    }
  }
  for (const std::string& p : {prefix, q8_prefix}) {
    std::filesystem::remove(model::SplitBasePath(p));
    std::filesystem::remove(model::SplitResidualPath(p));
  }
}

TEST(SensitivitiesTest, KlPerErrorIsOnePerKindAndTheHeadsIsTheSecondOrderKl) {
  const Tiny& tiny = TinyModel();
  const BitCandidates candidates;
  absl::StatusOr<std::vector<GroupSensitivity>> groups = MeasureSensitivities(
      tiny.weights, tiny.config, RotatedQuantization(), candidates, nullptr, kThreads);
  ASSERT_TRUE(groups.ok()) << groups.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> model =
      model::LlamaModel::Load(WriteTinyModel(), kThreads);
  ASSERT_TRUE(model.ok()) << model.status();
  Calibration calibration;
  EXPECT_EQ(MeasureKlSensitivities(**model, calibration, *groups).code(),
            absl::StatusCode::kInvalidArgument);  // no window
  for (int32_t t = 0; t < 64; ++t) calibration.first_window.push_back((t * 37 + 5) % 320);
  ASSERT_TRUE(MeasureKlSensitivities(**model, calibration, *groups).ok());
  std::map<model::LinearGroup, double> verify, draft;
  for (const GroupSensitivity& group : *groups) {
    EXPECT_GT(group.kl_per_error, 0) << model::LinearGroupIdString(group.id);
    EXPECT_GT(group.draft_kl_per_error, 0) << model::LinearGroupIdString(group.id);
    // One factor per kind.
    if (verify.contains(group.id.group)) {
      EXPECT_EQ(verify[group.id.group], group.kl_per_error);
      EXPECT_EQ(draft[group.id.group], group.draft_kl_per_error);
    }
    verify[group.id.group] = group.kl_per_error;
    draft[group.id.group] = group.draft_kl_per_error;
  }
  EXPECT_EQ(verify.size(), 5u);
  // Noise on the head's outputs is noise on the logits: i.i.d. N(0, s^2) on every logit gives,
  // to second order, E[KL(p || p')] = s^2 (1 - sum_v p_v^2) / 2, and the probe's energy per token
  // is s^2 x vocab, so the head's factor is the mean of (1 - sum p^2) / (2 vocab).
  const int64_t vocab = tiny.config.vocab_size;
  const std::vector<int32_t>& tokens = calibration.first_window;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(vocab));
  absl::StatusOr<model::KvCache> cache = (*model)->NewKvCache(static_cast<int64_t>(tokens.size()));
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(
      (*model)
          ->Forward(model::Batch::Causal(tokens, 0), *cache, logits, model::ForwardMode::kReference)
          .ok());
  double expected = 0;
  std::vector<double> log_p;
  for (size_t t = 0; t < tokens.size(); ++t) {
    LogSoftmax(std::span<const float>(logits).subspan(t * vocab, vocab), &log_p);
    double sum_p2 = 0;
    for (const double l : log_p) sum_p2 += std::exp(2 * l);
    expected += (1 - sum_p2) / (2.0 * static_cast<double>(vocab));
  }
  expected /= static_cast<double>(tokens.size());
  EXPECT_NEAR(verify[model::LinearGroup::kOutputHead], expected, 0.1 * expected);
}

// ---- The allocation ---------------------------------------------------------------------------

// SmolLM2-135M's shapes with made-up errors: every extra base bit divides a group's base error
// by 4 and every residual bit its verify error by 4, with group-to-group variation, so that the
// budget arithmetic runs at a real model's sizes without measuring one.
model::ModelConfig SmolLm2Shapes() {
  model::ModelConfig c;
  c.num_layers = 30;
  c.d_model = 576;
  c.d_ff = 1536;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.rope_dims = 64;
  c.vocab_size = 49152;
  c.context_length = 8192;
  return c;
}

std::vector<GroupSensitivity> SyntheticSensitivities(const model::ModelConfig& config,
                                                     const BitCandidates& candidates) {
  std::vector<GroupSensitivity> groups;
  uint64_t state = 7;
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    GroupSensitivity g;
    g.id = id;
    g.tensors = model::LinearGroupTensorNames(config, id);
    const int64_t cols = model::LinearGroupInputDim(config, id);
    g.signal = 1;
    g.kl_per_error = g.draft_kl_per_error = 1;
    state = testing::SplitMix64(state);
    const double variation = 0.5 + static_cast<double>(state >> 11) * 0x1p-53;
    g.q8_0_error = 1e-5 * variation;
    g.residual_bytes.assign(candidates.residuals.size(), 0);
    for (const int64_t rows : model::LinearGroupOutputDims(config, id)) {
      g.weights += rows * cols;
      g.q8_0_bytes +=
          static_cast<uint64_t>(rows) * quant::SplitRowBytes(SplitFormat::kQ8_0, 32, cols);
      for (size_t k = 0; k < candidates.residuals.size(); ++k) {
        g.residual_bytes[k] +=
            static_cast<uint64_t>(rows) * quant::SplitRowBytes(candidates.residuals[k], 32, cols);
      }
    }
    for (const SplitFormat base : candidates.bases) {
      BaseOption option;
      option.base = base;
      for (const int64_t rows : model::LinearGroupOutputDims(config, id)) {
        option.device_bytes +=
            model::AlignVram(static_cast<uint64_t>(rows) * model::DeviceRowStride(base, 64, cols));
      }
      const int bits = quant::GetSplitFormatInfo(base).bits;
      option.base_error = variation * std::pow(4.0, -bits);
      for (const SplitFormat residual : candidates.residuals) {
        option.verify_error.push_back(option.base_error *
                                      std::pow(4.0, -quant::GetSplitFormatInfo(residual).bits));
      }
      g.bases.push_back(option);
    }
    if (model::IsExpertGroup(id.group)) {
      g.expert_frequencies.assign(
          static_cast<size_t>(config.num_experts),
          static_cast<double>(config.num_experts_used) / static_cast<double>(config.num_experts));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

AllocationRequest RequestFor(const model::ModelConfig& config) {
  AllocationRequest request;
  request.vram.config = config;
  request.vram.base_group = 64;
  request.vram.embedding_bytes = 0;
  request.vram.context = 2048;
  request.vram.sessions = 1;
  request.vram.max_batch_rows = 256;
  return request;
}

// The device plan of per-group bases, by PlanVram (the CUDA backend's arithmetic).
model::VramRequest VramRequestOf(const AllocationRequest& request,
                                 const std::vector<GroupSensitivity>& groups,
                                 const BitCandidates& candidates,
                                 const std::vector<size_t>& bases) {
  model::VramRequest vram = request.vram;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const std::string& name : groups[g].tensors) {
      vram.base_tensor_formats[name] = candidates.bases[bases[g]];
    }
  }
  return vram;
}

// The device totals with every group at the fewest and at the most base bits.
struct BudgetRange {
  uint64_t low = 0, high = 0;
};
BudgetRange BudgetRangeOf(const AllocationRequest& request,
                          const std::vector<GroupSensitivity>& groups,
                          const BitCandidates& candidates) {
  const std::vector<size_t> lowest(groups.size(), 0),
      highest(groups.size(), candidates.bases.size() - 1);
  return {*model::VramTotalBytes(VramRequestOf(request, groups, candidates, lowest)),
          *model::VramTotalBytes(VramRequestOf(request, groups, candidates, highest))};
}

TEST(AllocateBitsTest, FitsEveryBudgetExactlyAndLeavesNoUpgradeThatWouldFit) {
  const model::ModelConfig config = SmolLm2Shapes();
  const BitCandidates candidates;
  const std::vector<GroupSensitivity> groups = SyntheticSensitivities(config, candidates);
  AllocationRequest request = RequestFor(config);
  const auto [low, high] = BudgetRangeOf(request, groups, candidates);
  ASSERT_GT(high, low + (8ull << 20));
  int upgraded_plans = 0;
  for (uint64_t budget = low; budget <= high + (1ull << 20); budget += (high - low) / 23) {
    request.budget_bytes = budget;
    absl::StatusOr<BitPlan> plan = AllocateBits(groups, candidates, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<size_t> bases;
    for (const BitPlan::Choice& choice : plan->choices) bases.push_back(choice.base);
    const model::VramRequest chosen = VramRequestOf(request, groups, candidates, bases);
    absl::StatusOr<model::VramPlan> vram = model::PlanVram(chosen, budget);
    ASSERT_TRUE(vram.ok()) << "budget " << budget << ": " << vram.status();
    EXPECT_EQ(vram->total_bytes, plan->vram.total_bytes);
    EXPECT_LE(plan->vram.total_bytes, budget);
    // Maximal: every single-step upgrade left would exceed the budget.
    for (size_t g = 0; g < groups.size(); ++g) {
      if (bases[g] + 1 >= candidates.bases.size()) continue;
      std::vector<size_t> more = bases;
      ++more[g];
      EXPECT_EQ(
          model::PlanVram(VramRequestOf(request, groups, candidates, more), budget).status().code(),
          absl::StatusCode::kResourceExhausted)
          << "budget " << budget << ": " << groups[g].tensors[0] << " could still be upgraded";
    }
    if (plan->base_linear_bytes > groups.size()) ++upgraded_plans;
    EXPECT_LE(plan->verify_error, plan->error_target * (1 + 1e-12));
    EXPECT_TRUE(plan->meets_quality);
  }
  EXPECT_GT(upgraded_plans, 10);
  // With VRAM reads free every extra base bit only helps, so a budget for all of them takes all.
  request.budget_bytes = high;
  request.machine.vram_bytes_per_second = 1e30;
  absl::StatusOr<BitPlan> all = AllocateBits(groups, candidates, request);
  ASSERT_TRUE(all.ok());
  for (const BitPlan::Choice& choice : all->choices) EXPECT_EQ(choice.base, 2u);
}

// The verifier's KL factors price the residuals against a bound proportional to them, and the
// draft's factors enter τ only through ratios of draft distortions: scaling either set by a
// power of two (exact in floating point) leaves the plan unchanged. Scaling only the verify
// factors would move the bases if an upgrade's draft distortion were judged with them.
TEST(AllocateBitsTest, PlanIsInvariantToTheScaleOfEachKlFactor) {
  const model::ModelConfig config = SmolLm2Shapes();
  const BitCandidates candidates;
  const std::vector<GroupSensitivity> groups = SyntheticSensitivities(config, candidates);
  AllocationRequest request = RequestFor(config);
  const auto [low, high] = BudgetRangeOf(request, groups, candidates);
  for (const double share : {0.3, 0.6}) {
    request.budget_bytes = low + static_cast<uint64_t>(share * static_cast<double>(high - low));
    absl::StatusOr<BitPlan> plan = AllocateBits(groups, candidates, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int upgraded = 0;
    for (const BitPlan::Choice& choice : plan->choices) upgraded += choice.base > 0;
    ASSERT_GT(upgraded, 0);
    for (const double verify_scale : {1.0, 16.0, 1.0 / 16}) {
      for (const double draft_scale : {1.0, 16.0, 1.0 / 16}) {
        std::vector<GroupSensitivity> scaled = groups;
        for (GroupSensitivity& group : scaled) {
          group.kl_per_error *= verify_scale;
          group.draft_kl_per_error *= draft_scale;
        }
        absl::StatusOr<BitPlan> rescaled = AllocateBits(scaled, candidates, request);
        ASSERT_TRUE(rescaled.ok()) << rescaled.status();
        for (size_t g = 0; g < groups.size(); ++g) {
          EXPECT_EQ(rescaled->choices[g].base, plan->choices[g].base)
              << "share " << share << " verify x" << verify_scale << " draft x" << draft_scale
              << ": " << groups[g].tensors[0];
          EXPECT_EQ(rescaled->choices[g].residual, plan->choices[g].residual)
              << "share " << share << " verify x" << verify_scale << " draft x" << draft_scale
              << ": " << groups[g].tensors[0];
        }
        EXPECT_NEAR(rescaled->projected_tau, plan->projected_tau, 1e-12 * plan->projected_tau);
      }
    }
  }
}

TEST(AllocateBitsTest, RefusesABudgetBelowTheFewestBitsSayingWhatFits) {
  const model::ModelConfig config = SmolLm2Shapes();
  const BitCandidates candidates;
  const std::vector<GroupSensitivity> groups = SyntheticSensitivities(config, candidates);
  AllocationRequest request = RequestFor(config);
  request.budget_bytes = BudgetRangeOf(request, groups, candidates).low - 1;
  const absl::Status status = AllocateBits(groups, candidates, request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("even the fewest base bits (every linear weight b2_asym)"));
  EXPECT_THAT(status.message(), HasSubstr("fits: context"));
}

TEST(AllocateBitsTest, ResidualsMeetTheBoundWithNearlyTheFewestBytes) {
  // 2 layers: 9 groups, 5^9 residual choices, few enough to search them all.
  const model::ModelConfig config = TinyModel().config;
  const BitCandidates candidates;
  std::vector<GroupSensitivity> groups = SyntheticSensitivities(config, candidates);
  AllocationRequest request = RequestFor(config);
  request.vram.context = 256;
  request.vram.max_batch_rows = 64;
  request.budget_bytes = 1ull << 30;
  for (const double factor : {0.05, 0.3, 1.0, 3.0}) {
    request.error_factor = factor;
    absl::StatusOr<BitPlan> plan = AllocateBits(groups, candidates, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->meets_quality);
    EXPECT_LE(plan->verify_error, plan->error_target * (1 + 1e-12));
    // The cheapest residual bytes meeting the bound on the same bases, by exhaustion.
    const size_t n = groups.size(), options = candidates.residuals.size();
    uint64_t best = UINT64_MAX;
    std::vector<size_t> choice(n, 0);
    for (;;) {
      double error = 0;
      uint64_t bytes = 0;
      for (size_t g = 0; g < n; ++g) {
        error += groups[g].bases[plan->choices[g].base].verify_error[choice[g]] / groups[g].signal;
        bytes += groups[g].residual_bytes[choice[g]];
      }
      if (error <= plan->error_target) best = std::min(best, bytes);
      size_t g = 0;
      while (g < n && ++choice[g] == options) choice[g++] = 0;
      if (g == n) break;
    }
    // The Lagrangian choice plus the slack pass is not exact; it stays within 5% here.
    EXPECT_LE(plan->residual_bytes, best * 105 / 100) << "factor " << factor;
    EXPECT_GE(plan->residual_bytes, best) << "factor " << factor;
  }
  // A bound even the most residual bits miss: all of them, and the plan says so.
  request.error_factor = 1e-9;
  absl::StatusOr<BitPlan> missed = AllocateBits(groups, candidates, request);
  ASSERT_TRUE(missed.ok());
  EXPECT_FALSE(missed->meets_quality);
  for (const BitPlan::Choice& choice : missed->choices) EXPECT_EQ(choice.residual, 4u);
  EXPECT_THAT(BitPlanReport(groups, candidates, *missed, request), HasSubstr("MISSED"));
}

// ---- Mixture of experts -------------------------------------------------------------------------

constexpr char kMoeFixture[] = "tests/fixtures/oracle/gemma4moe_synthetic_logits.json";

// The random gemma4 MoE of the oracle fixtures (3 layers, a dense FFN beside 16 experts, 4 used).
struct MoeModel {
  std::unique_ptr<testing::SyntheticModelFile> source;
  std::unique_ptr<gguf::File> file;
  model::ModelConfig config;
  model::ModelWeights weights;
  std::unique_ptr<model::LlamaModel> reference;
};
const MoeModel& GemmaMoe() {
  static const MoeModel* const moe = [] {
    auto* m = new MoeModel();
    m->source = std::make_unique<testing::SyntheticModelFile>(kMoeFixture);
    EXPECT_TRUE(m->source->ok());
    auto file = gguf::File::Open(m->source->path());
    EXPECT_TRUE(file.ok()) << file.status();
    m->file = std::move(*file);
    auto config = model::ModelConfigFromGguf(*m->file);
    EXPECT_TRUE(config.ok()) << config.status();
    m->config = *config;
    auto weights = model::ModelWeightsFromGguf(*m->file, m->config);
    EXPECT_TRUE(weights.ok()) << weights.status();
    m->weights = *weights;
    auto reference = model::LlamaModel::Load(m->source->path(), kThreads);
    EXPECT_TRUE(reference.ok()) << reference.status();
    m->reference = std::move(*reference);
    return m;
  }();
  return *moe;
}

std::vector<int32_t> MoeCalibrationTokens() {
  std::vector<int32_t> tokens;
  for (int32_t t = 0; t < 96; ++t) tokens.push_back((t * 7919 + 13) % 150000);
  return tokens;
}

TEST(MoeBitsTest, CalibrationCountsEveryRoutedRow) {
  const MoeModel& moe = GemmaMoe();
  ASSERT_EQ(moe.config.num_experts, 16);
  const std::vector<int32_t> tokens = MoeCalibrationTokens();
  absl::StatusOr<Calibration> calibration =
      CollectCalibration(*moe.reference, tokens, 48, -1, RotatedQuantization().rotation);
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  ASSERT_EQ(calibration->expert_rows.size(), static_cast<size_t>(moe.config.num_layers));
  for (const std::vector<int64_t>& layer : calibration->expert_rows) {
    ASSERT_EQ(layer.size(), 16u);
    int64_t total = 0;
    for (const int64_t rows : layer) total += rows;
    // Every token is routed to k distinct experts.
    EXPECT_EQ(total, static_cast<int64_t>(tokens.size()) * moe.config.num_experts_used);
    EXPECT_LE(*absl::c_max_element(layer), static_cast<int64_t>(tokens.size()));
  }
}

// An expert group's error is linear in its experts' routing weights f_e E / k. Routed rows on
// experts 0-7 alone (weight 2 each) measure A = 2 x their errors, on experts 8-15 alone B = 2 x
// theirs; three rows to each of 0-7 for one to each of 8-15 (weights 1.5 and 0.5) must measure
// 0.75 A + 0.25 B. Dense groups do not see the routing.
TEST(MoeBitsTest, ExpertErrorsWeighByRoutingFrequency) {
  const MoeModel& moe = GemmaMoe();
  const size_t experts = static_cast<size_t>(moe.config.num_experts);
  ASSERT_EQ(experts, 16u);
  BitCandidates candidates;
  candidates.bases = {SplitFormat::kB2Asym};
  candidates.residuals = {SplitFormat::kR4};
  absl::StatusOr<Calibration> collected = CollectCalibration(
      *moe.reference, MoeCalibrationTokens(), 48, -1, RotatedQuantization().rotation);
  ASSERT_TRUE(collected.ok()) << collected.status();
  // The same activations, routed rows per expert as given.
  auto measure = [&](const std::vector<int64_t>& rows) {
    Calibration calibration = *collected;
    for (std::vector<int64_t>& layer : calibration.expert_rows) layer = rows;
    auto groups = MeasureSensitivities(moe.weights, moe.config, RotatedQuantization(), candidates,
                                       &calibration, kThreads);
    EXPECT_TRUE(groups.ok()) << groups.status();
    return *groups;
  };
  std::vector<int64_t> first(experts, 0), second(experts, 0), skewed(experts, 1);
  for (size_t e = 0; e < 8; ++e) {
    first[e] = 1;
    second[e + 8] = 1;
    skewed[e] = 3;
  }
  const std::vector<GroupSensitivity> a = measure(first), b = measure(second), s = measure(skewed);
  int expert_groups = 0;
  for (size_t g = 0; g < s.size(); ++g) {
    const std::string what = model::LinearGroupIdString(s[g].id);
    if (!model::IsExpertGroup(s[g].id.group)) {
      EXPECT_TRUE(s[g].expert_frequencies.empty()) << what;
      EXPECT_EQ(s[g].bases[0].base_error, a[g].bases[0].base_error) << what;
      continue;
    }
    ++expert_groups;
    // f_e = k x rows_e / total: 4 x 3 / 32 and 4 x 1 / 32.
    ASSERT_EQ(s[g].expert_frequencies.size(), experts);
    EXPECT_DOUBLE_EQ(s[g].expert_frequencies[0], 0.375) << what;
    EXPECT_DOUBLE_EQ(s[g].expert_frequencies[15], 0.125) << what;
    auto expect_mix = [&](double got, double from_a, double from_b, const char* name) {
      const double want = 0.75 * from_a + 0.25 * from_b;
      EXPECT_NEAR(got, want, 1e-9 * want) << what << " " << name;
    };
    expect_mix(s[g].bases[0].base_error, a[g].bases[0].base_error, b[g].bases[0].base_error,
               "base");
    expect_mix(s[g].bases[0].verify_error[0], a[g].bases[0].verify_error[0],
               b[g].bases[0].verify_error[0], "verify");
    expect_mix(s[g].q8_0_error, a[g].q8_0_error, b[g].q8_0_error, "q8_0");
    EXPECT_GT(std::abs(a[g].bases[0].base_error / b[g].bases[0].base_error - 1), 1e-6) << what;
  }
  EXPECT_EQ(expert_groups, 2 * moe.config.num_layers);
  // Routing that names another model's experts is refused.
  Calibration wrong = *collected;
  wrong.expert_rows[0].pop_back();
  EXPECT_EQ(MeasureSensitivities(moe.weights, moe.config, RotatedQuantization(), candidates, &wrong,
                                 kThreads)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A verify of n rows reads ExpectedDistinctExperts(f, n) / E of an expert group and all of a
// dense one: on 16 experts, 4 used, uniform routing, 16 rows touch 16 (1 - (3/4)^16) = 15.84.
TEST(MoeBitsTest, PlanReadsTheExpertsAVerifyTouches) {
  model::ModelConfig config = SmolLm2Shapes();
  config.num_experts = 16;
  config.num_experts_used = 4;
  config.d_ff_expert = 512;
  const BitCandidates candidates;
  std::vector<GroupSensitivity> groups = SyntheticSensitivities(config, candidates);
  AllocationRequest request = RequestFor(config);
  const BudgetRange range = BudgetRangeOf(request, groups, candidates);
  request.budget_bytes = (range.low + range.high) / 2;
  auto read_bytes = [&](const BitPlan& plan, const std::vector<GroupSensitivity>& of,
                        double verify_share) {
    double read = 0;
    for (size_t g = 0; g < of.size(); ++g) {
      const double share = model::IsExpertGroup(of[g].id.group) ? verify_share : 1.0;
      read += share * static_cast<double>(of[g].residual_bytes[plan.choices[g].residual]);
    }
    return read;
  };
  absl::StatusOr<BitPlan> uniform = AllocateBits(groups, candidates, request);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  const double uniform_share = (1 - std::pow(0.75, 16));
  EXPECT_NEAR(static_cast<double>(uniform->residual_bytes),
              read_bytes(*uniform, groups, uniform_share), 1.0);
  EXPECT_LT(uniform->residual_bytes, uniform->residual_stored_bytes);
  EXPECT_THAT(BitPlanReport(groups, candidates, *uniform, request),
              HasSubstr("a 16-row verify touches 15.8 experts per layer"));

  // Routing concentrated on 4 hot experts (each 0.7, the other 12 share the rest): 16 rows touch
  // 4 (1 - 0.3^16) + 12 (1 - (1 - 1.2/12)^16) experts.
  std::vector<double> hot(16, 1.2 / 12);
  for (int e = 0; e < 4; ++e) hot[e] = 0.7;
  for (GroupSensitivity& group : groups) {
    if (model::IsExpertGroup(group.id.group)) group.expert_frequencies = hot;
  }
  absl::StatusOr<BitPlan> skewed = AllocateBits(groups, candidates, request);
  ASSERT_TRUE(skewed.ok()) << skewed.status();
  const double skewed_share = (4 * (1 - std::pow(0.3, 16)) + 12 * (1 - std::pow(0.9, 16))) / 16;
  EXPECT_NEAR(static_cast<double>(skewed->residual_bytes),
              read_bytes(*skewed, groups, skewed_share), 1.0);
  EXPECT_LT(skewed->residual_bytes, uniform->residual_bytes);
  EXPECT_THAT(BitPlanReport(groups, candidates, *skewed, request),
              HasSubstr("the hottest 1 of 16 experts take 17.5% of routed rows"));

  groups.back().expert_frequencies.clear();  // the head is dense: no frequencies allowed
  for (GroupSensitivity& group : groups) {
    if (model::IsExpertGroup(group.id.group)) group.expert_frequencies.pop_back();
  }
  EXPECT_EQ(AllocateBits(groups, candidates, request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The whole --vram-budget path on the MoE: calibration, sensitivities, the KL probes (noise on
// the routed experts' outputs), the allocation, the files, and speculation with the planned
// draft equal to plain decoding with the planned verifier.
TEST(MoeBitsTest, PlannedMoeModelSpeculatesLosslessly) {
  const MoeModel& moe = GemmaMoe();
  const BitCandidates candidates;
  const model::SplitQuantization q = RotatedQuantization();
  absl::StatusOr<Calibration> calibration =
      CollectCalibration(*moe.reference, MoeCalibrationTokens(), 48, -1, q.rotation);
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  absl::StatusOr<std::vector<GroupSensitivity>> groups =
      MeasureSensitivities(moe.weights, moe.config, q, candidates, &*calibration, kThreads);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_TRUE(MeasureKlSensitivities(*moe.reference, *calibration, *groups).ok());
  std::map<model::LinearGroup, double> factors;
  for (const GroupSensitivity& group : *groups) factors[group.id.group] = group.kl_per_error;
  ASSERT_EQ(factors.size(), 7u);  // attention 2, dense FFN 2, experts 2, head
  for (const auto& [kind, factor] : factors) {
    EXPECT_GT(factor, 1e-20) << model::LinearGroupName(kind);  // 1e-30: the noise did nothing
  }
  AllocationRequest request = RequestFor(moe.config);
  request.vram.context = 128;
  request.vram.max_batch_rows = 64;
  const BudgetRange range = BudgetRangeOf(request, *groups, candidates);
  request.budget_bytes = (range.low + range.high) / 2;
  absl::StatusOr<BitPlan> plan = AllocateBits(*groups, candidates, request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->vram.total_bytes, request.budget_bytes);
  const std::string report = BitPlanReport(*groups, candidates, *plan, request);
  EXPECT_THAT(report, HasSubstr("routing (calibration text)"));
  std::printf("%s", report.c_str());

  const std::string prefix = TempPrefix("moe-plan");
  absl::StatusOr<QuantizeSummary> summary = QuantizeSplitModel(
      moe.source->path(), model::SplitBasePath(prefix), model::SplitResidualPath(prefix),
      {.quantization = ApplyBitPlan(*groups, candidates, *plan, q), .num_threads = kThreads},
      &*calibration);
  ASSERT_TRUE(summary.ok()) << summary.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> split = model::LlamaModel::LoadSplit(
      model::SplitBasePath(prefix), model::SplitResidualPath(prefix), kThreads);
  ASSERT_TRUE(split.ok()) << split.status();
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 7, 250, 3, 64};
  const std::vector<int32_t> plain = testing::PlainDecode(**split, prompt, {}, 24);
  const testing::SpecRun run = testing::SpeculativeDecode(
      **split, prompt, {}, 24, speculation::TreeShape{16, 4, 4}, model::ForwardMode::kDraft);
  EXPECT_EQ(run.tokens, plain);
  std::filesystem::remove(model::SplitBasePath(prefix));
  std::filesystem::remove(model::SplitResidualPath(prefix));
}

// The check rounds' search against responses of the form KL = c x bound^b: the power law it
// models locally. Each step from two trials lands where the law says the aim (0.95 x target) is;
// the search reaches [kKlCloseEnough, 1] x target in at most four plans from either side.
TEST(BitAllocatorTest, BoundSearchReachesTheTargetOfAPowerLawResponse) {
  const double target = 0.004, aim = (1 + kKlCloseEnough) / 2 * target;
  struct Response {
    double c, b;  // KL = c x bound^b
    double operator()(double bound) const { return c * std::pow(bound, b); }
  };
  // Measured KL falling slower than the prediction (b < 1, as the plans of real models measure),
  // faster (b > 1), from above and from below the target.
  for (const Response response : {Response{4.2 * target, 0.7}, Response{2.5 * target, 1.4},
                                  Response{0.3 * target, 0.7}, Response{0.5 * target, 1.6}}) {
    std::vector<BoundTrial> trials;
    double bound = 1;
    bool reached = false;
    for (int round = 1; round <= 4 && !reached; ++round) {
      trials.push_back({.error_factor = bound, .measured_kl = response(bound)});
      reached = trials.back().measured_kl <= target &&
                trials.back().measured_kl >= kKlCloseEnough * target;
      if (trials.size() >= 2 && !reached) {
        // From two trials on a power law the next bound is exact (inside the exponent's clamp).
        const double next = NextErrorFactor(trials, target);
        EXPECT_NEAR(response(next) / aim, 1.0, 1e-9) << response.c << " " << response.b;
      }
      bound = NextErrorFactor(trials, target);
    }
    EXPECT_TRUE(reached) << "c " << response.c / target << " x target, b " << response.b
                         << ": last KL " << trials.back().measured_kl / target << " x target";
  }
  // A bracket whose response is far from a power law: the next bound stays in its middle 60%.
  const std::vector<BoundTrial> bracket = {{.error_factor = 1, .measured_kl = 0.94 * target},
                                           {.error_factor = 4, .measured_kl = 100 * target}};
  const double next = NextErrorFactor(bracket, target);
  EXPECT_NEAR(next, std::pow(4.0, 0.2), 1e-12);
  // One trial: KL taken as proportional to the bound.
  EXPECT_NEAR(NextErrorFactor({{.error_factor = 2, .measured_kl = 2 * target}}, target),
              2 * aim / (2 * target), 1e-12);
}

}  // namespace
}  // namespace bitsplit::offline
