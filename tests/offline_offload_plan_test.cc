// The offload planner (common/offline/offload_plan.h) and `bitsplit plan` on shapes-only GGUFs of
// real models (Llama-3.1-70B, Qwen2.5-72B, Qwen2.5-32B, Gemma-3-27B: metadata and tensor table
// as published, no tensor data): the residual and base bytes against the matrices' sizes computed
// here from the shapes, the fit against bounds derived from those bytes and the KV cache, and the
// command's output and exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/vram_plan.h"
#include "common/offline/offload_plan.h"
#include "common/quant/split_format.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"
#include "tests/testing/shell.h"

namespace bitsplit::offline {
namespace {

using quant::SplitFormat;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A published model's shape.
struct Shape {
  const char* name;
  const char* architecture;
  int64_t layers, d_model, heads, kv_heads, head_dim, d_ff, vocab, context;
  bool tied;
  int64_t sliding_window = 0;  // gemma3
};

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      {"Llama-3.1-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, 131072, false},
      {"Qwen2.5-72B", "qwen2", 80, 8192, 64, 8, 128, 29568, 152064, 32768, false},
      {"Qwen2.5-32B", "qwen2", 64, 5120, 40, 8, 128, 27648, 152064, 32768, false},
      {"Gemma-3-27B", "gemma3", 62, 5376, 32, 16, 128, 21504, 262208, 131072, true, 1024}};
  return shapes;
}

// The shapes-only GGUF of `shape` (Q8_0 tensors, f32 norms), written once per process.
std::string ShapesOnlyGguf(const Shape& s) {
  const std::string path = (testing::TestTempDir() / absl::StrCat(s.name, ".gguf")).string();
  if (std::filesystem::exists(path)) return path;
  testing::GgufBuilder b;
  const std::string a = s.architecture;
  b.AddString("general.architecture", a);
  b.AddUint32(a + ".block_count", static_cast<uint32_t>(s.layers));
  b.AddUint32(a + ".context_length", static_cast<uint32_t>(s.context));
  b.AddUint32(a + ".embedding_length", static_cast<uint32_t>(s.d_model));
  b.AddUint32(a + ".feed_forward_length", static_cast<uint32_t>(s.d_ff));
  b.AddUint32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  b.AddUint32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  b.AddUint32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  b.AddUint32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  b.AddFloat32(a + ".rope.freq_base", 1000000.0f);
  b.AddFloat32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  if (s.sliding_window > 0) {
    b.AddUint32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  }
  const uint64_t d = static_cast<uint64_t>(s.d_model),
                 q = static_cast<uint64_t>(s.heads * s.head_dim),
                 kv = static_cast<uint64_t>(s.kv_heads * s.head_dim),
                 ff = static_cast<uint64_t>(s.d_ff);
  b.AddShapeOnlyTensor("token_embd.weight", GgmlType::kQ8_0, {d, static_cast<uint64_t>(s.vocab)});
  b.AddShapeOnlyTensor("output_norm.weight", GgmlType::kF32, {d});
  if (!s.tied) {
    b.AddShapeOnlyTensor("output.weight", GgmlType::kQ8_0, {d, static_cast<uint64_t>(s.vocab)});
  }
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    const std::string p = absl::StrCat("blk.", layer, ".");
    b.AddShapeOnlyTensor(p + "attn_q.weight", GgmlType::kQ8_0, {d, q});
    b.AddShapeOnlyTensor(p + "attn_k.weight", GgmlType::kQ8_0, {d, kv});
    b.AddShapeOnlyTensor(p + "attn_v.weight", GgmlType::kQ8_0, {d, kv});
    b.AddShapeOnlyTensor(p + "attn_output.weight", GgmlType::kQ8_0, {q, d});
    b.AddShapeOnlyTensor(p + "ffn_gate.weight", GgmlType::kQ8_0, {d, ff});
    b.AddShapeOnlyTensor(p + "ffn_up.weight", GgmlType::kQ8_0, {d, ff});
    b.AddShapeOnlyTensor(p + "ffn_down.weight", GgmlType::kQ8_0, {ff, d});
  }
  EXPECT_TRUE(testing::WriteFileBytes(path, b.Build()));
  return path;
}

// Rows and columns of every linear matrix of `s` (q, k, v, o, gate, up, down per layer; the head).
std::vector<std::pair<int64_t, int64_t>> Matrices(const Shape& s) {
  std::vector<std::pair<int64_t, int64_t>> m;
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    m.insert(m.end(), {{q, s.d_model},
                       {kv, s.d_model},
                       {kv, s.d_model},
                       {s.d_model, q},
                       {s.d_ff, s.d_model},
                       {s.d_ff, s.d_model},
                       {s.d_model, s.d_ff}});
  }
  m.push_back({s.vocab, s.d_model});
  return m;
}

// One 8192-token session on `card` bytes of VRAM, the embedding table `embedding` bytes of Q8_0
// (which the device can gather).
OffloadRequest RequestFor(const model::ModelConfig& config, uint64_t card, uint64_t embedding) {
  OffloadRequest request;
  request.config = config;
  request.vram_budget_bytes = model::DefaultVramBudget(card);
  request.embedding_device_bytes = embedding;
  request.embedding_table_bytes = embedding;
  return request;
}

TEST(OffloadPlanTest, AShapesOnlyGgufOpensWithoutItsData) {
  const std::string path = ShapesOnlyGguf(Shapes()[2]);
  const auto required = gguf::File::Open(path);
  ASSERT_FALSE(required.ok());
  EXPECT_THAT(required.status().message(), HasSubstr("extends past end of file"));
  const auto file = gguf::File::Open(path, gguf::TensorData::kMayBeAbsent);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const gguf::TensorInfo& tensor : (*file)->tensors()) EXPECT_EQ(tensor.data, nullptr);
  const auto config = model::ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 64);
  EXPECT_EQ(config->vocab_size, 152064);
  // Everything but the data is still checked: a table whose offsets overlap is refused.
  testing::GgufBuilder b;
  b.AddString("general.architecture", "llama");
  b.AddShapeOnlyTensor("a", GgmlType::kF32, {64});
  b.AddShapeOnlyTensor("b", GgmlType::kF32, {64}).offset = 0;
  const std::vector<uint8_t> image = b.Build();
  const auto overlapping =
      gguf::File::Parse(image.data(), image.size(), "overlap", gguf::TensorData::kMayBeAbsent);
  ASSERT_FALSE(overlapping.ok());
  EXPECT_THAT(overlapping.status().message(), HasSubstr("overlaps"));
}

TEST(OffloadPlanTest, FlagshipShapesPlanTheBytesTheirMatricesHold) {
  for (const Shape& s : Shapes()) {
    const auto file = gguf::File::Open(ShapesOnlyGguf(s), gguf::TensorData::kMayBeAbsent);
    ASSERT_TRUE(file.ok()) << file.status();
    const auto config = model::ModelConfigFromGguf(**file);
    ASSERT_TRUE(config.ok()) << s.name << ": " << config.status();
    // The embedding table, Q8_0: 34 bytes per 32 values.
    const uint64_t embedding = static_cast<uint64_t>(s.vocab) * s.d_model / 32 * 34;
    for (const ops::KvType kv_type : {ops::KvType::kF16, ops::KvType::kQ8_0}) {
      // KV cache of one 8192-token session, f16 or q8_0 (34 bytes per 32 values; gemma3's
      // windowed layers hold the whole context too: the cache is not a ring).
      const uint64_t kv_values = 2ull * 8192 * s.layers * s.kv_heads * s.head_dim;
      const uint64_t kv = kv_type == ops::KvType::kF16 ? kv_values * 2 : kv_values / 32 * 34;
      for (const uint64_t card : {16 * kGiB, 24 * kGiB}) {
        const std::string what = absl::StrCat(s.name, " on ", card / kGiB, " GiB, ",
                                              std::string(ops::KvTypeName(kv_type)), " KV");
        OffloadRequest request = RequestFor(*config, card, embedding);
        request.kv_type = kv_type;
        for (const SplitFormat base : {SplitFormat::kBTern, SplitFormat::kB2Asym,
                                       SplitFormat::kB3Asym, SplitFormat::kB4Asym}) {
          uint64_t base_bytes = 0, residual_bytes = 0;
          for (const auto& [rows, cols] : Matrices(s)) {
            base_bytes += model::AlignVram(static_cast<uint64_t>(rows) *
                                           model::DeviceRowStride(base, 64, cols));
            residual_bytes +=
                static_cast<uint64_t>(rows) * quant::SplitRowBytes(ResidualForBase(base), 32, cols);
          }
          const absl::StatusOr<OffloadPlan> plan = PlanOffloadWith(request, base, base);
          const std::string with = absl::StrCat(what, " ", quant::GetSplitFormatInfo(base).name);
          // Base and KV alone over the budget: refused. With the embedding too and 1 GiB to spare
          // for norms, tables and scratch (a few hundred MiB at these shapes): planned, the
          // embedding on the device. With 1 GiB to spare only without it: planned, the embedding in
          // RAM.
          const uint64_t budget = request.vram_budget_bytes;
          const uint64_t known = model::RoundVramSlab(base_bytes) + kv;
          if (known > budget) {
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << with;
            continue;
          }
          if (known + embedding + kGiB < budget) {
            ASSERT_TRUE(plan.ok()) << with << ": " << plan.status();
            EXPECT_EQ(plan->host_embedding_bytes, 0u) << with;
          } else if (known + kGiB < budget && known + embedding > budget) {
            ASSERT_TRUE(plan.ok()) << with << ": " << plan.status();
            EXPECT_EQ(plan->host_embedding_bytes, embedding) << with;
          }
          if (!plan.ok()) continue;
          EXPECT_EQ(plan->vram.base_weights_bytes, model::RoundVramSlab(base_bytes)) << with;
          EXPECT_EQ(plan->residual_bytes, residual_bytes) << with;
          EXPECT_EQ(plan->host_embedding_bytes, plan->vram.embedding_bytes > 0 ? 0u : embedding)
              << with;
          EXPECT_LE(plan->vram.total_bytes, request.vram_budget_bytes) << with;
          // A verify of a dense model reads every residual byte once, whatever its rows.
          EXPECT_DOUBLE_EQ(plan->residual_read_bytes, static_cast<double>(residual_bytes)) << with;
          EXPECT_GE(plan->tokens_per_second, plan->tokens_per_second_without_speculation) << with;
        }
        // The chosen plan is the fastest of those that fit.
        const absl::StatusOr<OffloadPlan> best = PlanOffload(request);
        double fastest = 0;
        for (const SplitFormat base : {SplitFormat::kBTern, SplitFormat::kB2Asym,
                                       SplitFormat::kB3Asym, SplitFormat::kB4Asym}) {
          if (auto p = PlanOffloadWith(request, base, base); p.ok()) {
            fastest = std::max(fastest, p->tokens_per_second);
          }
        }
        if (fastest == 0) {
          EXPECT_EQ(best.status().code(), absl::StatusCode::kResourceExhausted) << what;
          EXPECT_THAT(best.status().message(), HasSubstr("fewest base bits")) << what;
        } else {
          ASSERT_TRUE(best.ok()) << what;
          EXPECT_EQ(best->tokens_per_second, fastest) << what;
        }
      }
    }
  }
  // What the flagship case looks like today: a 70B's 2-bit base does not fit a 24 GB card with
  // one 8192-token session; a 32B's does, on 16 GB and 24 GB alike.
  const auto plan_of = [](const Shape& s, uint64_t card, bool ternary = false,
                          ops::KvType kv_type = ops::KvType::kF16) {
    const auto file = gguf::File::Open(ShapesOnlyGguf(s), gguf::TensorData::kMayBeAbsent);
    const auto config = model::ModelConfigFromGguf(**file);
    const uint64_t embedding = static_cast<uint64_t>(s.vocab) * s.d_model / 32 * 34;
    OffloadRequest request = RequestFor(*config, card, embedding);
    request.ternary = ternary;
    request.kv_type = kv_type;
    return PlanOffload(request);
  };
  EXPECT_FALSE(plan_of(Shapes()[0], 24 * kGiB).ok());
  EXPECT_FALSE(plan_of(Shapes()[1], 24 * kGiB).ok());
  EXPECT_TRUE(plan_of(Shapes()[2], 16 * kGiB).ok());
  EXPECT_TRUE(plan_of(Shapes()[2], 24 * kGiB).ok());
  // A q8_0 KV cache (1.33 GiB at 8192 tokens) and the embedding table in RAM make the 70B's and
  // the 72B's b2 base fit 24 GB: 20.23 and 20.80 GiB of base beside 1.33 GiB of KV and scratch.
  for (const Shape* s : {&Shapes()[0], &Shapes()[1]}) {
    const absl::StatusOr<OffloadPlan> q8 = plan_of(*s, 24 * kGiB, false, ops::KvType::kQ8_0);
    ASSERT_TRUE(q8.ok()) << s->name << ": " << q8.status();
    EXPECT_EQ(q8->attention_base, SplitFormat::kB2Asym) << s->name;
    EXPECT_EQ(q8->vram.embedding_bytes, 0u) << s->name;
    EXPECT_EQ(q8->host_embedding_bytes, static_cast<uint64_t>(s->vocab) * s->d_model / 32 * 34);
  }
  // The ternary base makes the 70B fit 24 GB. Every Llama-3.1-70B input width (8192, 28672) is
  // a multiple of 64, so a bt_sym/g64 row is cols / 32 x 7 code bytes + cols / 64 x 2 scale
  // bytes = cols / 4 bytes, a multiple of 4 (no device padding): 2 bits per weight, 17.5 GB of
  // base for its 69.5 B linear weights (+ 2.1 GB of Q8_0 embedding + 2.5 GiB of KV cache).
  const Shape& llama70 = Shapes()[0];
  uint64_t ternary_bytes = 0;
  for (const auto& [rows, cols] : Matrices(llama70)) {
    ASSERT_EQ(cols % 64, 0);
    ternary_bytes += model::AlignVram(static_cast<uint64_t>(rows) * (cols / 4));
  }
  EXPECT_NEAR(static_cast<double>(ternary_bytes), 17.4e9, 0.1e9);
  const absl::StatusOr<OffloadPlan> ternary = plan_of(llama70, 24 * kGiB, true);
  ASSERT_TRUE(ternary.ok()) << ternary.status();
  EXPECT_EQ(ternary->attention_base, SplitFormat::kBTern);
  EXPECT_EQ(ternary->vram.base_weights_bytes, model::RoundVramSlab(ternary_bytes));
  // Beside it r8/g32: 8 bits + an fp16 per 32 = 8.5 bits per weight in RAM.
  uint64_t weights = 0;
  for (const auto& [rows, cols] : Matrices(llama70)) weights += rows * cols;
  EXPECT_EQ(ternary->residual_bytes, weights / 32 * 34);
  EXPECT_FALSE(plan_of(llama70, 16 * kGiB, true).ok());  // 17.4 GB of base alone
}

testing::CommandResult Plan(const std::vector<std::string>& args) {
  static int calls = 0;
  const std::string err = (testing::TestTempDir() / absl::StrCat("stderr.", calls++)).string();
  testing::CommandResult result = testing::RunCapturing(
      std::string(BITSPLIT_BINARY_DIR) + "/tools/bitsplit/bitsplit", args, err);
  std::filesystem::remove(err);
  return result;
}

TEST(OffloadPlanTest, PlanCommandPrintsThePlanOrSaysWhatFits) {
  const std::string qwen32 = ShapesOnlyGguf(Shapes()[2]);
  const testing::CommandResult fits =
      Plan({"plan", qwen32, "--vram", "16GiB", "--ram", "64GiB", "--context", "8192"});
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  for (const char* line : {"model: qwen2, 64 layers", "plan: attention, dense FFN and head base",
                           "VRAM: base weights", "fits:", "session", "RAM: residual", "tok/s"}) {
    EXPECT_THAT(fits.out, HasSubstr(line));
  }
  // The RAM the plan needs, over what --ram gives: exit 2, saying both.
  const testing::CommandResult short_ram =
      Plan({"plan", qwen32, "--vram", "16GiB", "--ram", "4GiB"});
  EXPECT_EQ(short_ram.exit_code, 2);
  EXPECT_THAT(short_ram.err, HasSubstr("GiB of RAM for the model; --ram gives 4.00 GiB"));
  // Nothing fits: exit 2 with PlanVram's account of what would.
  const testing::CommandResult too_big = Plan(
      {"plan", ShapesOnlyGguf(Shapes()[0]), "--vram", "24GiB", "--ram", "256GiB", "--no-ternary"});
  EXPECT_EQ(too_big.exit_code, 2);
  EXPECT_THAT(too_big.err, HasSubstr("even the fewest base bits"));
  EXPECT_THAT(too_big.err, HasSubstr("the VRAM budget of"));
  EXPECT_THAT(too_big.err, HasSubstr("fits"));
  // With the ternary base (the default) the 70B fits the same card; with a q8_0 KV cache its b2
  // base does, the embedding table in RAM.
  const testing::CommandResult ternary =
      Plan({"plan", ShapesOnlyGguf(Shapes()[0]), "--vram", "24GiB", "--ram", "256GiB"});
  EXPECT_EQ(ternary.exit_code, 0) << ternary.err;
  EXPECT_THAT(ternary.out, HasSubstr("head base bt_sym/g64"));
  const testing::CommandResult q8 = Plan({"plan", ShapesOnlyGguf(Shapes()[0]), "--vram", "24GiB",
                                          "--ram", "256GiB", "--kv-type", "q8_0"});
  EXPECT_EQ(q8.exit_code, 0) << q8.err;
  for (const char* line : {"head base b2_asym/g64", "(embedding in RAM)", "(8192 tokens, q8_0)",
                           "+ embedding table 1.04 GiB"}) {
    EXPECT_THAT(q8.out, HasSubstr(line));
  }
  // Bad input: one line, exit 2.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", qwen32, "--vram", "lots", "--ram", "64GiB"},
        std::vector<std::string>{"plan", "/nonexistent.gguf", "--vram", "16GiB", "--ram", "1GiB"},
        std::vector<std::string>{"plan", qwen32, "--vram", "16GiB", "--ram", "64GiB", "--context",
                                 "0"},
        std::vector<std::string>{"plan", qwen32, "--vram", "16GiB", "--ram", "64GiB", "--kv-type",
                                 "q4"}}) {
    const testing::CommandResult bad = Plan(args);
    EXPECT_EQ(bad.exit_code, 2) << args[2];
    EXPECT_THAT(bad.err, HasSubstr("bitsplit plan: error:")) << args[2];
  }
}

}  // namespace
}  // namespace bitsplit::offline
