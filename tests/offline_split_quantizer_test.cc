// The split quantizer and loader on the real SmolLM2 weights: knob validation, what the files
// hold, the reconstruction bound W' ~= B + R (rotated space and back), determinism, base-only
// (Q8_0) output, calibration statistics, and the loader's refusals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/io/gguf.h"
#include "common/io/split_file.h"
#include "common/model/config.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/model/weights.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/matmul.h"
#include "common/quant/hadamard.h"
#include "common/quant/split_format.h"
#include "common/util/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::offline {
namespace {

using ::testing::HasSubstr;

// The source model, opened once per process.
struct Source {
  std::unique_ptr<gguf::File> file;
  model::ModelConfig config;
  model::ModelWeights weights;
};
const Source& SmolLm2() {
  static const Source* const source = [] {
    auto* s = new Source();
    auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
    EXPECT_TRUE(file.ok()) << file.status();
    s->file = std::move(*file);
    auto config = model::ModelConfigFromGguf(*s->file);
    EXPECT_TRUE(config.ok()) << config.status();
    s->config = *config;
    auto weights = model::ModelWeightsFromGguf(*s->file, s->config);
    EXPECT_TRUE(weights.ok()) << weights.status();
    s->weights = *weights;
    return s;
  }();
  return *source;
}

// Source matrix i of group `id` (the tied head is token_embd's matrix).
const ops::WeightMatrix& SourceMatrix(const model::ModelWeights& w, model::LinearGroupId id,
                                      size_t i) {
  return model::GroupMatricesOf(w, id)[i];
}

// ---- Knob validation ----------------------------------------------------------------------------

TEST(ValidateSplitQuantizationTest, GroupThatDoesNotDivideNamesTheTensorAndTheGroupsThatFit) {
  model::SplitQuantization q = testing::SplitFixtureQuantization();
  q.base_group = 128;  // SmolLM2's d_model is 576 = 9 * 64
  const absl::Status status = ValidateSplitQuantization(q, SmolLm2().config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("base group size 128"));
  EXPECT_THAT(status.message(), HasSubstr("blk.0.attn_q.weight"));
  EXPECT_THAT(status.message(), HasSubstr("input dimension 576"));
  EXPECT_THAT(status.message(),
              HasSubstr("fit every linear weight of this model: 32, 64, 96, 192"));

  q = testing::SplitFixtureQuantization();
  q.residual_group = 48;
  EXPECT_THAT(ValidateSplitQuantization(q, SmolLm2().config).message(),
              HasSubstr("residual group size 48"));
}

TEST(ValidateSplitQuantizationTest, RejectsRotationBlocksAndFormatsThatDoNotFit) {
  model::SplitQuantization q = testing::SplitFixtureQuantization();
  q.rotation.block = 128;
  absl::Status status = ValidateSplitQuantization(q, SmolLm2().config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("rotation block 128 does not fit tensor "
                                          "blk.0.attn_q.weight"));
  EXPECT_THAT(status.message(), HasSubstr("8, 16, 32, 64"));

  q = testing::SplitFixtureQuantization();
  q.base_format = quant::SplitFormat::kQ8_0;
  q.base_group = 32;
  EXPECT_THAT(ValidateSplitQuantization(q, SmolLm2().config).message(),
              HasSubstr("takes no residual"));
  q.residual_format.reset();
  EXPECT_TRUE(ValidateSplitQuantization(q, SmolLm2().config).ok());
  q.base_group = 64;
  EXPECT_THAT(ValidateSplitQuantization(q, SmolLm2().config).message(),
              HasSubstr("q8_0 takes exactly 32"));

  q = testing::SplitFixtureQuantization();
  q.residual_format = quant::SplitFormat::kB4Sym;
  EXPECT_THAT(ValidateSplitQuantization(q, SmolLm2().config).message(),
              HasSubstr("not a residual format"));
}

// ---- The quantization record
// ----------------------------------------------------------------------

// The Q8_0 reference configuration: a q8_0 base and no residual.
model::SplitQuantization Q8_0Quantization() {
  model::SplitQuantization q;
  q.base_format = quant::SplitFormat::kQ8_0;
  q.base_group = 32;
  q.residual_format.reset();
  q.residual_group = 0;
  return q;
}

TEST(SplitQuantizationTest, RecordRoundTripsThroughJson) {
  const model::SplitQuantization base_only = Q8_0Quantization();
  model::SplitQuantization calibrated = testing::SplitFixtureQuantization();
  calibrated.residual_format = quant::SplitFormat::kR6;
  calibrated.rotation.seed = ~uint64_t{0};  // the full uint64 range survives JSON
  calibrated.calibration_sha256 = std::string(64, 'a');
  calibrated.calibration_tokens = 4096;
  calibrated.calibration_window = 512;
  for (const model::SplitQuantization& q :
       {testing::SplitFixtureQuantization(), base_only, calibrated}) {
    const nlohmann::json json = model::SplitQuantizationToJson(q);
    auto parsed = model::SplitQuantizationFromJson(nlohmann::json::parse(json.dump()));
    ASSERT_TRUE(parsed.ok()) << parsed.status() << " for " << json.dump();
    EXPECT_EQ(*parsed, q) << json.dump();
  }
  EXPECT_EQ(model::SplitQuantizationString(calibrated),
            "b2_asym/g64 + r6/g32, hadamard 64 (seed 18446744073709551615), calibrated on 4096 "
            "tokens");
  EXPECT_EQ(model::SplitQuantizationString(base_only), "q8_0/g32 (base only)");
}

TEST(SplitQuantizationTest, MalformedRecordsAreRejectedNamingTheField) {
  const nlohmann::json good = model::SplitQuantizationToJson(testing::SplitFixtureQuantization());
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json json = good;
    json[key] = std::move(value);
    return model::SplitQuantizationFromJson(json).status();
  };
  EXPECT_THAT(with("base_format", "b5_asym").message(), HasSubstr("unknown split format"));
  EXPECT_THAT(with("base_format", "r8").message(), HasSubstr("not a base format"));
  EXPECT_THAT(with("residual_format", "b2_sym").message(), HasSubstr("not a residual format"));
  EXPECT_THAT(with("base_group", "64").message(), HasSubstr("\"base_group\""));
  EXPECT_THAT(with("rotate_block", -1).message(), HasSubstr("rotate_block"));
  EXPECT_THAT(with("rotate_seed", -1).message(), HasSubstr("\"rotate_seed\""));
  nlohmann::json missing = good;
  missing.erase("residual_format");
  EXPECT_THAT(model::SplitQuantizationFromJson(missing).status().message(),
              HasSubstr("\"residual_format\""));
  EXPECT_FALSE(model::SplitQuantizationFromJson(nlohmann::json::array()).ok());
}

// Version 2 changed only q8_0's bytes (split rows instead of ggml's blocks), so version 1 records
// load unless their base is q8_0, which would be read wrongly.
TEST(SplitQuantizationTest, RecordVersionIsChecked) {
  const model::SplitQuantization q8_0 = Q8_0Quantization();
  auto record = [](const model::SplitQuantization& q, nlohmann::json version) {
    nlohmann::json json = {{"quantization", model::SplitQuantizationToJson(q)}};
    if (!version.is_null()) json["version"] = std::move(version);
    return json;
  };
  const model::SplitQuantization split = testing::SplitFixtureQuantization();
  for (const model::SplitQuantization& q : {split, q8_0}) {
    auto current = model::SplitRecordQuantization(record(q, model::kSplitRecordVersion));
    ASSERT_TRUE(current.ok()) << current.status();
    EXPECT_EQ(*current, q);
  }
  auto old_split = model::SplitRecordQuantization(record(split, 1));
  ASSERT_TRUE(old_split.ok()) << old_split.status();
  EXPECT_EQ(*old_split, split);
  EXPECT_THAT(model::SplitRecordQuantization(record(q8_0, 1)).status().message(),
              HasSubstr("q8_0 model of split record version 1"));
  EXPECT_THAT(model::SplitRecordQuantization(record(split, model::kSplitRecordVersionWithPlan + 1))
                  .status()
                  .message(),
              HasSubstr("not one this build reads"));
  EXPECT_THAT(model::SplitRecordQuantization(record(split, 0)).status().message(),
              HasSubstr("not one this build reads"));
  EXPECT_THAT(model::SplitRecordQuantization(record(split, nullptr)).status().message(),
              HasSubstr("no integer \"version\""));
  EXPECT_THAT(model::SplitRecordQuantization(record(split, "2")).status().message(),
              HasSubstr("no integer \"version\""));
  EXPECT_THAT(model::SplitRecordQuantization(nlohmann::json{{"version", 2}}).status().message(),
              HasSubstr("no quantization"));
}

// ---- The fixture files -------------------------------------------------------------------------

std::unique_ptr<model::SplitModelFiles> OpenFixture() {
  const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
  auto files = model::SplitModelFiles::Open(paths.base, paths.residual);
  EXPECT_TRUE(files.ok()) << files.status();
  return files.ok() ? std::move(*files) : nullptr;
}

TEST(SplitModelFilesTest, CarryTheQuantizationConfigMetadataAndSourceTensors) {
  auto files = OpenFixture();
  ASSERT_NE(files, nullptr);
  const Source& source = SmolLm2();
  EXPECT_EQ(files->quantization(), testing::SplitFixtureQuantization());
  EXPECT_EQ(files->base().fingerprint(), files->residual()->fingerprint());

  const model::ModelConfig& c = files->config();
  EXPECT_EQ(c.num_layers, source.config.num_layers);
  EXPECT_EQ(c.d_model, source.config.d_model);
  EXPECT_EQ(c.d_ff, source.config.d_ff);
  EXPECT_EQ(c.num_kv_heads, source.config.num_kv_heads);
  EXPECT_EQ(c.vocab_size, source.config.vocab_size);
  EXPECT_EQ(c.rope_freq_base, source.config.rope_freq_base);

  // The embedded GGUF image holds every metadata entry of the source and no tensors.
  const gguf::File& metadata = files->gguf_metadata();
  EXPECT_TRUE(metadata.tensors().empty());
  ASSERT_EQ(metadata.metadata().size(), source.file->metadata().size());
  auto tokens = metadata.GetStringArray("tokenizer.ggml.tokens");
  auto source_tokens = source.file->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok() && source_tokens.ok());
  EXPECT_EQ(*tokens, *source_tokens);

  // Embedding table and norms are the source's bytes, at the source's type.
  for (const std::string name : {"token_embd.weight", "output_norm.weight",
                                 "blk.0.attn_norm.weight", "blk.29.ffn_norm.weight"}) {
    SCOPED_TRACE(name);
    const gguf::TensorInfo* expected = source.file->FindTensor(name);
    const SplitTensor* actual = files->base().FindTensor(name);
    ASSERT_NE(expected, nullptr);
    ASSERT_NE(actual, nullptr);
    EXPECT_EQ(actual->format, GgmlTensorFormat(expected->type));
    EXPECT_EQ(actual->dims, expected->dims);
    ASSERT_EQ(actual->num_bytes, expected->num_bytes);
    EXPECT_EQ(std::memcmp(actual->data, expected->data, expected->num_bytes), 0);
  }
  // SmolLM2 ties its head to the embedding: the split head is token_embd's matrix, stored as
  // output.weight in both files; the residual file holds linear weights only.
  EXPECT_EQ(files->base().FindTensor("output.weight")->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(files->residual()->tensors().size(), 30u * 7 + 1);
  EXPECT_EQ(files->base().metadata()[model::kSplitMetadataKey]["output_tied_to_embedding"], true);
}

// Per matrix row: W' (the rotated source row) against B + R. In the rotated space every element
// is within half a residual step of its group (+ float rounding); after un-rotating, each
// rotation block's L2 error equals the rotated one (the rotation is orthonormal), so it is within
// the root sum of the half steps squared.
TEST(SplitModelFilesTest, BasePlusResidualReconstructsEveryWeightWithinHalfAResidualStep) {
  auto files = OpenFixture();
  ASSERT_NE(files, nullptr);
  const Source& source = SmolLm2();
  const model::SplitQuantization& q = files->quantization();
  ASSERT_TRUE(q.rotation.enabled());
  ThreadPool pool(2);
  std::mutex mutex;
  int64_t checked = 0;
  double worst_ratio = 0;  // max |W' - (B + R)| / (step / 2) over everything
  for (const model::LinearGroupId id : model::AllLinearGroups(source.config)) {
    const auto base = files->base_linear().group(id);
    const auto residual = files->residual_linear()->group(id);
    for (size_t i = 0; i < base.size(); ++i) {
      const ops::WeightMatrix& w = SourceMatrix(source.weights, id, i);
      const int64_t cols = w.cols;
      ASSERT_EQ(base[i].rows, w.rows);
      ASSERT_EQ(base[i].cols, cols);
      pool.ParallelFor(w.rows, [&](int64_t begin, int64_t end, int) {
        std::vector<float> original(cols), rotated(cols), b(cols), r(cols), sum(cols);
        double local_worst = 0;
        int failures = 0;
        for (int64_t row = begin; row < end; ++row) {
          ops::DequantizeWeightRow(w, row, original.data());
          rotated = original;
          quant::HadamardRotateRows(rotated.data(), 1, cols, q.rotation.block, q.rotation.seed);
          quant::DequantizeSplitRow(base[i].format, base[i].group, base[i].row(row), cols,
                                    b.data());
          quant::DequantizeSplitRow(residual[i].format, residual[i].group, residual[i].row(row),
                                    cols, r.data());
          for (int64_t j = 0; j < cols; ++j) sum[j] = b[j] + r[j];
          std::vector<float> half_steps(cols);
          for (int64_t j = 0; j < cols; ++j) {
            const float step = quant::SplitGroupScale(residual[i].format, residual[i].group, cols,
                                                      residual[i].row(row), j / q.residual_group);
            half_steps[j] = step / 2;
            const double error = std::fabs(static_cast<double>(rotated[j]) - sum[j]);
            const double slack = 4e-7 * std::max(std::fabs(rotated[j]), std::fabs(b[j])) + 1e-12;
            if (error > half_steps[j] * (1 + 1e-5) + slack && failures++ < 3) {
              ADD_FAILURE() << model::LinearGroupTensorNames(source.config, id)[i] << " row " << row
                            << " col " << j << ": |W' - (B + R)| = " << error
                            << " > step / 2 = " << half_steps[j];
            }
            if (half_steps[j] > 0) local_worst = std::max(local_worst, error / half_steps[j]);
          }
          quant::HadamardUnrotateRows(sum.data(), 1, cols, q.rotation.block, q.rotation.seed);
          for (int64_t block = 0; block < cols; block += q.rotation.block) {
            double error2 = 0, bound2 = 0, norm2 = 0;
            for (int64_t j = block; j < block + q.rotation.block; ++j) {
              const double d = static_cast<double>(original[j]) - sum[j];
              error2 += d * d;
              bound2 += static_cast<double>(half_steps[j]) * half_steps[j];
              norm2 += static_cast<double>(original[j]) * original[j];
            }
            if (std::sqrt(error2) > std::sqrt(bound2) * (1 + 1e-4) + 1e-6 * std::sqrt(norm2) &&
                failures++ < 3) {
              ADD_FAILURE() << model::LinearGroupTensorNames(source.config, id)[i] << " row " << row
                            << " block " << block << ": un-rotated L2 error " << std::sqrt(error2)
                            << " > bound " << std::sqrt(bound2);
            }
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        checked += (end - begin) * cols;
        worst_ratio = std::max(worst_ratio, local_worst);
      });
    }
  }
  std::printf("checked %lld weights; worst |W' - (B + R)| = %.6f x (residual step / 2)\n",
              static_cast<long long>(checked), worst_ratio);
  EXPECT_EQ(checked,
            int64_t{30} * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 576 * 1536) + int64_t{49152} * 576);
}

// ---- Loader refusals ----------------------------------------------------------------------------

std::string CopyWithFingerprintByteFlipped(const std::string& path) {
  const std::string copy = (testing::TestTempDir() / "flipped.residual.bsplit").string();
  std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
  std::fstream file(copy, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(offsetof(SplitFileHeader, fingerprint));
  char byte = 0;
  file.read(&byte, 1);
  byte ^= 1;
  file.seekp(offsetof(SplitFileHeader, fingerprint));
  file.write(&byte, 1);
  return copy;
}

TEST(SplitModelFilesTest, RefusesSwappedKindsAndMismatchedFingerprints) {
  const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
  auto swapped = model::SplitModelFiles::Open(paths.base, paths.base);
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(swapped.status().message(), HasSubstr("given as the residual file"));

  auto residual_as_base = model::SplitModelFiles::Open(paths.residual, "");
  EXPECT_EQ(residual_as_base.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(residual_as_base.status().message(), HasSubstr("given as the base file"));

  auto mismatched =
      model::SplitModelFiles::Open(paths.base, CopyWithFingerprintByteFlipped(paths.residual));
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("do not belong together"));

  auto gguf = model::SplitModelFiles::Open(testing::ModelPath(testing::kSmolLm2File), "");
  EXPECT_EQ(gguf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gguf.status().message(), HasSubstr("GGUF"));

  auto missing = model::SplitModelFiles::Open(paths.base + ".nope", "");
  EXPECT_FALSE(missing.ok());
}

TEST(SplitModelFilesTest, RefusesABaseFileWithoutItsLinearWeights) {
  // A well-formed base file with the fixture's metadata, config blob and norms but no weights.
  auto fixture = OpenFixture();
  ASSERT_NE(fixture, nullptr);
  const SplitFile& base = fixture->base();
  const std::string path = (testing::TestTempDir() / "partial.base.bsplit").string();
  {
    auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, base.fingerprint(),
                                          base.metadata(), model::SplitFormatRowSizeOracle());
    ASSERT_TRUE(writer.ok()) << writer.status();
    std::vector<const SplitTensor*> kept;
    for (const SplitTensor& tensor : base.tensors()) {
      if (IsGgmlTensorFormat(tensor.format)) kept.push_back(&tensor);
    }
    for (const SplitTensor* tensor : kept) {
      ASSERT_TRUE((*writer)->DeclareTensor(tensor->name, tensor->format, 0, tensor->dims).ok());
    }
    for (const SplitTensor* tensor : kept) {
      ASSERT_TRUE((*writer)->WriteTensorData(tensor->name, tensor->data, tensor->num_bytes).ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  auto files = model::SplitModelFiles::Open(path, "");
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("blk.0.attn_q.weight"));
}

// A version 1 record with a q8_0 base names files whose rows were ggml's 34-byte blocks: refused
// before any tensor is read. A version 1 record of another base gets past the record (and here
// on to the missing weights).
TEST(SplitModelFilesTest, RefusesAVersion1Q8_0BaseFile) {
  auto fixture = OpenFixture();
  ASSERT_NE(fixture, nullptr);
  const SplitFile& base = fixture->base();
  auto open_with_record = [&](const model::SplitQuantization& q, int version) {
    nlohmann::json metadata = base.metadata();
    metadata[model::kSplitMetadataKey]["version"] = version;
    metadata[model::kSplitMetadataKey]["quantization"] = model::SplitQuantizationToJson(q);
    const std::string path = (testing::TestTempDir() / "record.base.bsplit").string();
    auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, base.fingerprint(), metadata,
                                          model::SplitFormatRowSizeOracle());
    EXPECT_TRUE(writer.ok()) << writer.status();
    if (writer.ok()) {
      EXPECT_TRUE((*writer)->Finish().ok());
    }
    return model::SplitModelFiles::Open(path, "").status();
  };
  const absl::Status q8_0 = open_with_record(Q8_0Quantization(), 1);
  EXPECT_EQ(q8_0.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(q8_0.message(), HasSubstr("record.base.bsplit"));
  EXPECT_THAT(q8_0.message(), HasSubstr("q8_0 model of split record version 1"));
  const absl::Status newer = open_with_record(testing::SplitFixtureQuantization(), 4);
  EXPECT_EQ(newer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(newer.message(), HasSubstr("version 4 is not one this build reads"));
  const absl::Status old_b2 = open_with_record(testing::SplitFixtureQuantization(), 1);
  EXPECT_EQ(old_b2.code(), absl::StatusCode::kNotFound) << old_b2;
}

// ---- Base only (the Q8_0 configuration) and determinism
// ------------------------------------------

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(QuantizeSplitModelTest, Q8_0BaseOnlyIsDeterministicAndWithinHalfAStep) {
  const std::string source_path = testing::ModelPath(testing::kSmolLm2File);
  const std::string one = (testing::TestTempDir() / "q8_0_t1.base.bsplit").string();
  const std::string two = (testing::TestTempDir() / "q8_0_t2.base.bsplit").string();
  auto summary = QuantizeSplitModel(source_path, one, "",
                                    {.quantization = Q8_0Quantization(), .num_threads = 1});
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_TRUE(QuantizeSplitModel(source_path, two, "",
                                 {.quantization = Q8_0Quantization(), .num_threads = 2})
                  .ok());
  EXPECT_EQ(ReadAll(one), ReadAll(two)) << "output depends on the thread count";
  EXPECT_TRUE(summary->residual_path.empty());
  EXPECT_EQ(summary->residual_file_bytes, 0u);
  EXPECT_DOUBLE_EQ(summary->base_linear_bits_per_weight(), 8.5);  // 34 bytes per 32 weights
  EXPECT_EQ(summary->base_format_counts.at("q8_0"), 211);
  EXPECT_EQ(summary->base_format_counts.at("F32"), 61);

  // A residual path for a base-only quantization is refused.
  EXPECT_EQ(QuantizeSplitModel(source_path, one, one + ".r", {.quantization = Q8_0Quantization()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  auto opened = model::SplitModelFiles::Open(one, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  const model::SplitModelFiles& files = **opened;
  EXPECT_EQ(files.residual_linear(), nullptr);
  EXPECT_EQ(files.quantization(), summary->quantization);  // the record round-trips
  auto fixture = OpenFixture();
  ASSERT_NE(fixture, nullptr);
  EXPECT_NE(files.base().fingerprint(), fixture->base().fingerprint());
  // |W - B| <= d / 2 per block, plus the fp16 rounding of d (ggml stores d to nearest).
  const Source& source = SmolLm2();
  for (const model::LinearGroupId id :
       {model::LinearGroupId{0, model::LinearGroup::kQkv},
        model::LinearGroupId{17, model::LinearGroup::kDown}, model::LinearGroupId::Head()}) {
    const auto base = files.base_linear().group(id);
    for (size_t i = 0; i < base.size(); ++i) {
      const ops::WeightMatrix& w = SourceMatrix(source.weights, id, i);
      std::vector<float> original(w.cols), b(w.cols);
      for (int64_t row = 0; row < w.rows; row += 7) {
        ops::DequantizeWeightRow(w, row, original.data());
        quant::DequantizeSplitRow(base[i].format, 32, base[i].row(row), w.cols, b.data());
        for (int64_t j = 0; j < w.cols; ++j) {
          const float d =
              quant::SplitGroupScale(base[i].format, 32, w.cols, base[i].row(row), j / 32);
          ASSERT_LE(std::fabs(original[j] - b[j]), d * (0.5f + 127.0f / 2048.0f) + 1e-9f)
              << model::LinearGroupTensorNames(source.config, id)[i] << " row " << row << " col "
              << j;
        }
      }
    }
  }
}

// ---- Calibration --------------------------------------------------------------------------------

std::vector<int32_t> FixtureTokens(size_t count) {
  std::ifstream in(testing::SourcePath("tests/fixtures/oracle/smollm2_f32_logits.json"));
  const nlohmann::json fixture = nlohmann::json::parse(in);
  std::vector<int32_t> tokens = fixture["cases"][0]["tokens"].get<std::vector<int32_t>>();
  tokens.resize(std::min(tokens.size(), count));
  return tokens;
}

TEST(CollectCalibrationTest, MeanSquaredInputsPerGroupInTheRotatedSpace) {
  auto model = model::LlamaModel::Load(testing::ModelPath(testing::kSmolLm2File), 2);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens = FixtureTokens(100);
  const model::HadamardRotation rotation{.block = 64, .seed = 1};
  auto plain = CollectCalibration(**model, tokens, 40, /*bos=*/1, model::HadamardRotation{});
  auto rotated = CollectCalibration(**model, tokens, 40, /*bos=*/1, rotation);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_EQ(plain->tokens, 100);
  EXPECT_EQ(plain->window, 40);
  const model::ModelConfig& config = (*model)->config();
  ASSERT_EQ(plain->importance.size(), model::AllLinearGroups(config).size());
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const auto& p = plain->importance[static_cast<size_t>(model::LinearGroupIndex(config, id))];
    const auto& r = rotated->importance[static_cast<size_t>(model::LinearGroupIndex(config, id))];
    ASSERT_EQ(static_cast<int64_t>(p.size()), model::LinearGroupInputDim(config, id));
    // The rotation is orthonormal per block: it moves energy between a block's columns but
    // keeps the block's total.
    for (size_t block = 0; block < p.size(); block += 64) {
      double plain_sum = 0, rotated_sum = 0;
      for (size_t j = block; j < block + 64; ++j) {
        ASSERT_TRUE(std::isfinite(p[j]) && p[j] >= 0 && std::isfinite(r[j]) && r[j] >= 0);
        plain_sum += p[j];
        rotated_sum += r[j];
      }
      EXPECT_NEAR(rotated_sum, plain_sum, 1e-4 * plain_sum + 1e-12)
          << model::LinearGroupIdString(id) << " block " << block;
    }
  }
  // Activations are not all alike: some columns carry far more energy than others.
  const auto& qkv = plain->importance[0];
  EXPECT_GT(*std::max_element(qkv.begin(), qkv.end()),
            10 * *std::min_element(qkv.begin(), qkv.end()));

  EXPECT_EQ(CollectCalibration(**model, {}, 40, 1, rotation).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CollectCalibration(**model, tokens, 1, 1, rotation).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitsplit::offline
