// The VRAM planner: byte arithmetic against hand computation (the real SmolLM2 config, an
// 8B-class llama config and a gemma3-1B-shaped one), the refusal and its "what fits"
// suggestions, and bad requests.
#include <string>

#include "common/io/gguf.h"
#include "common/model/vram_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace bitsplit::model {
namespace {

using quant::SplitFormat;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

ModelConfig SmolLm2Config() {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  EXPECT_TRUE(file.ok()) << file.status();
  auto config = ModelConfigFromGguf(**file);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(VramPlanTest, SmolLm2ConfigIsTheOneTheNumbersAssume) {
  const ModelConfig c = SmolLm2Config();
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.q_dim(), 576);
  EXPECT_EQ(c.kv_dim(), 192);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.rope_dims, 64);
  EXPECT_EQ(c.vocab_size, 49152);
}

TEST(VramPlanTest, SmolLm2BaseBytesMatchHandComputation) {
  // b2_asym/g64: a 576-wide row is 18 sub-blocks x 8 + 9 scales x 2 + 9 mins x 2 = 180 bytes, a
  // 1536-wide row 48 x 8 + 24 x 4 = 480. Per layer q 576x180 + k, v 192x180 + o 576x180 + gate,
  // up 1536x180 + down 576x480 = 1,105,920 (every matrix a multiple of 256 bytes); 30 layers plus
  // the head 49152 x 180 = 42,024,960 = 2.5 bits x 134,479,872 linear weights.
  auto bytes = SplitLinearBytes(SmolLm2Config(), SplitFormat::kB2Asym, 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 42'024'960u);
  EXPECT_EQ(*bytes * 8, 134'479'872ull * 5 / 2);
}

TEST(VramPlanTest, SmolLm2PlanMatchesHandComputation) {
  VramRequest request;
  request.config = SmolLm2Config();
  request.base_format = SplitFormat::kB2Asym;
  request.base_group = 64;
  request.embedding_bytes = 49152ull * 576 / 32 * 34;  // Q8_0 table: 30,081,024 bytes
  request.context = 2048;
  request.sessions = 1;
  request.max_batch_rows = 64;
  auto plan = PlanVram(request, 1 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 42,024,960 in 2 MiB pages: 21 pages.
  EXPECT_EQ(plan->base_weights_bytes, 21 * 2 * kMiB);
  // Embedding 30,081,024 + norms 4 x 576 x 61 = 140,544 + RoPE table 2048 x 32 pairs x 8 =
  // 524,288 + Hadamard signs 4 x 1536 = 6,144 = 30,752,000 -> 15 pages.
  EXPECT_EQ(plan->norms_bytes, 140'544u);
  EXPECT_EQ(plan->rope_table_bytes, 524'288u);
  EXPECT_EQ(plan->hadamard_bytes, 6'144u);
  EXPECT_EQ(plan->constants_slab_bytes, 15 * 2 * kMiB);
  // fp16 KV: 2 x 30 layers x 192 x 2 bytes = 23,040 per token; 2048 tokens = 47,185,920 -> 23
  // pages.
  EXPECT_EQ(plan->kv_bytes_per_token, 23'040u);
  EXPECT_EQ(plan->kv_bytes_per_session, 23 * 2 * kMiB);
  EXPECT_EQ(plan->kv_cache_bytes, 23 * 2 * kMiB);
  // Scratch for T = 64, context 2048 (see ForwardScratchLayout): residual output and logits
  // 4 x 64 x 49152 each, scores 4 x 64 x 9 x 2048, sampling 8 x 64 x 49152, ...
  EXPECT_EQ(plan->scratch.residual_output_bytes, 12'582'912u);
  EXPECT_EQ(plan->scratch.logits_bytes, 12'582'912u);
  EXPECT_EQ(plan->scratch.scores_bytes, 4'718'592u);
  EXPECT_EQ(plan->scratch.sampling_bytes, 25'165'824u);
  EXPECT_EQ(plan->scratch.activation_bytes, 64u * 1536 + 2 * 4 * 64 * 48);
  EXPECT_EQ(plan->scratch.batch_bytes, 3u * 256 + 2 * 64 * 64);
  EXPECT_EQ(plan->scratch.choice_bytes, 2u * 64 * 64 * 4 + 512 + 256 + 512);
  EXPECT_EQ(plan->scratch.total_bytes, 57'231'360u);
  EXPECT_EQ(plan->scratch_slab_bytes, 28 * 2 * kMiB);
  EXPECT_EQ(plan->total_bytes, (21 + 15 + 23 + 28) * 2 * kMiB);  // 182,452,224
  EXPECT_EQ(plan->budget_bytes, 1 * kGiB);

  uint64_t sum = 0;
  for (const VramItem& item : plan->Items()) sum += item.bytes;
  EXPECT_EQ(sum, plan->total_bytes);
  EXPECT_THAT(plan->ToString(), HasSubstr("1 x 46.0 MiB (2048 tokens)"));
}

TEST(VramPlanTest, DeviceRowsArePaddedToFourBytes) {
  // b2_sym/g64: a 576-wide row is 144 + 9 x 2 = 162 bytes, padded to 164 on the device; a
  // 1536-wide row is 384 + 24 x 2 = 432. Per layer q, o 576x164 + k, v 192x164 + gate, up
  // 1536x164 + down 576x432 = 1,004,544; 30 layers + head 49152 x 164.
  EXPECT_EQ(DeviceRowStride(SplitFormat::kB2Sym, 64, 576), 164u);
  EXPECT_EQ(DeviceRowStride(SplitFormat::kB2Sym, 64, 1536), 432u);
  auto bytes = SplitLinearBytes(SmolLm2Config(), SplitFormat::kB2Sym, 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 30ull * 1'004'544 + 49152ull * 164);  // 38,197,248
}

TEST(VramPlanTest, EightBBaseBytesMatchHandComputation) {
  const ModelConfig c = EightBClassConfig();
  // b2_asym/g64: 4096-wide rows 128 x 8 + 64 x 4 = 1280 bytes, 14336-wide rows 448 x 8 + 224 x 4
  // = 4480. Per layer 2 x 4096x1280 + 2 x 1024x1280 + 3 x 14336x1280 (= 4096x4480) = 68,157,440.
  auto b2 = SplitLinearBytes(c, SplitFormat::kB2Asym, 64);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(*b2, 32ull * 68'157'440 + 128256ull * 1280);  // 2,345,205,760
  // q8_0: 4096-wide rows 128 x 34 = 4352 bytes, 14336-wide 448 x 34 = 15232.
  auto q8 = SplitLinearBytes(c, SplitFormat::kQ8_0, 32);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(*q8, 32ull * (2 * 4096 * 4352 + 2 * 1024 * 4352 + 3 * 14336ull * 4352) +
                     128256ull * 4352);  // 7,973,699,584
  // b4_asym/g64: 2304 and 8064 bytes.
  auto b4 = SplitLinearBytes(c, SplitFormat::kB4Asym, 64);
  ASSERT_TRUE(b4.ok()) << b4.status();
  EXPECT_EQ(*b4,
            32ull * (2 * 4096 * 2304 + 2 * 1024 * 2304 + 3 * 14336ull * 2304) + 128256ull * 2304);
}

TEST(VramPlanTest, EightBKvCacheAndScratch) {
  VramRequest request;
  request.config = EightBClassConfig();
  request.embedding_bytes = 128256ull * 4096 / 32 * 34;
  request.context = 8192;
  request.sessions = 4;
  request.max_batch_rows = 16;
  auto plan = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 2 x 32 layers x 1024 x 2 bytes = 128 KiB per token; 8192 tokens = 1 GiB per session.
  EXPECT_EQ(plan->kv_bytes_per_token, 131'072u);
  EXPECT_EQ(plan->kv_bytes_per_session, 1 * kGiB);
  EXPECT_EQ(plan->kv_cache_bytes, 4 * kGiB);
  EXPECT_EQ(plan->base_weights_bytes, 1119 * 2 * kMiB);  // 2,345,205,760 rounded up
  EXPECT_EQ(plan->constants_slab_bytes, 564'133'888u);
  EXPECT_EQ(plan->scratch.total_bytes, 54'102'016u);
  EXPECT_EQ(plan->total_bytes, 1119 * 2 * kMiB + 564'133'888u + 4 * kGiB + 26 * 2 * kMiB);
}

// A gemma3-1B-shaped config: what the device holds beyond the llama layer (every per-layer
// vector, the local layers' RoPE table, each slot's position, the windowed
// layers' slot lists), and none of it for llama.
TEST(VramPlanTest, WindowedGeGluModelPlansItsExtraBuffers) {
  ModelConfig c = EightBClassConfig();
  c.architecture = "gemma3";
  c.num_layers = 26;
  c.d_model = 1152;
  c.d_ff = 6912;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 256;
  c.rope_dims = 256;
  c.vocab_size = 262144;
  c.context_length = 32768;
  c.rope_style = RopeStyle::kHalves;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.qk_norm = true;
  c.post_norms = true;
  c.sliding_window = 512;
  c.layer_is_local.assign(26, 1);
  VramRequest request;
  request.config = c;
  request.context = 4096;
  request.sessions = 1;
  request.max_batch_rows = 64;
  auto plan = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Per layer 4 x 1152 (attention, FFN, two post-norms) + 2 x 256 (QK-norms) = 5120 floats;
  // 26 layers + the output norm 1152 = 134,272 floats = 537,088 bytes.
  EXPECT_EQ(plan->norms_bytes, 537'088u);
  // Two tables (global and local base) of 4096 positions x 128 pairs x cos, sin.
  EXPECT_EQ(plan->rope_table_bytes, 2u * 4096 * 128 * 8);
  // Keys and values 2 x 26 x 4096 x 256 x 2 = 109,051,904 (52 pages) + positions 4 x 4096.
  EXPECT_EQ(plan->kv_positions_bytes, 16'384u);
  EXPECT_EQ(plan->kv_bytes_per_session, 53 * 2 * kMiB);
  EXPECT_EQ(plan->scratch.visible_slots_bytes, 4u * 64 * 4096 + 256);

  request.config = EightBClassConfig();
  auto llama = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->kv_positions_bytes, 0u);
  EXPECT_EQ(llama->scratch.visible_slots_bytes, 0u);
  EXPECT_EQ(llama->rope_table_bytes, 4096u * 64 * 8);
}

// --max-sessions auto on cuda: the SmolLM2 plan above is 64 fixed 2 MiB pages (base 21, constants
// 15, scratch 28) plus 23 pages of KV cache per session of 2048 tokens.
TEST(VramPlanTest, SessionsThatFitTheBudget) {
  VramRequest request;
  request.config = SmolLm2Config();
  request.base_format = SplitFormat::kB2Asym;
  request.base_group = 64;
  request.embedding_bytes = 49152ull * 576 / 32 * 34;
  request.context = 2048;
  request.sessions = 99;  // not read
  request.max_batch_rows = 64;
  const uint64_t page = 2 * kMiB;
  auto five = VramSessionsThatFit(request, (64 + 5 * 23) * page + kMiB, 256);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(*five, 5);
  auto exact = VramSessionsThatFit(request, (64 + 5 * 23) * page, 256);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(*exact, 5);
  auto capped = VramSessionsThatFit(request, (64 + 5 * 23) * page, 3);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(*capped, 3);
  auto none = VramSessionsThatFit(request, (64 + 23) * page - 1, 256);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("1 sessions x 2048 tokens"));
}

TEST(VramPlanTest, RefusesAndSaysWhatFits) {
  VramRequest request;
  request.config = EightBClassConfig();
  request.base_format = SplitFormat::kB4Asym;
  request.base_group = 64;
  request.embedding_bytes = 128256ull * 4096 / 32 * 34;
  request.context = 8192;
  request.sessions = 4;
  request.max_batch_rows = 16;
  const uint64_t budget = 7 * kGiB;
  auto plan = PlanVram(request, budget);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("7.00 GiB"));
  EXPECT_THAT(message, HasSubstr("base b4_asym/g64"));
  EXPECT_THAT(message, HasSubstr("4 sessions x 8192 tokens (4.00 GiB)"));
  // At context 5120 with 4 sessions: b4 weights 2013 pages (4,221,566,976) + constants
  // (558,170,112 + 1,064,960 norms + 2,621,440 RoPE + 57,344 signs -> 268 pages, 562,036,736) +
  // KV 4 x 5120 x 128 KiB (2,684,354,560) + scratch (54,102,016 - 2048 x (8192 - 5120) -> 23
  // pages, 48,234,496) = 7,516,192,768: exactly 7 GiB.
  EXPECT_THAT(message, HasSubstr("fits: context 5120 with 4 sessions"));
  EXPECT_THAT(message, HasSubstr("or 2 sessions at context 8192"));
  // b2 (2.19 GiB) fits as asked; b3 (3.06 GiB) does not.
  EXPECT_THAT(message, HasSubstr("base b2_asym/g64 needs 2.19 GiB and fits as requested"));
  EXPECT_THAT(message, HasSubstr("base b3_asym/g64 needs 3.06 GiB"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("3.06 GiB and fits")));

  // The suggestions are true: each fits, and one more session or 256 more tokens do not.
  VramRequest shorter = request;
  shorter.context = 5120;
  EXPECT_TRUE(PlanVram(shorter, budget).ok());
  shorter.context = 5121;
  EXPECT_FALSE(PlanVram(shorter, budget).ok());
  VramRequest fewer = request;
  fewer.sessions = 2;
  EXPECT_TRUE(PlanVram(fewer, budget).ok());
  fewer.sessions = 3;
  EXPECT_FALSE(PlanVram(fewer, budget).ok());
  VramRequest smaller_base = request;
  smaller_base.base_format = SplitFormat::kB2Asym;
  EXPECT_TRUE(PlanVram(smaller_base, budget).ok());
  smaller_base.base_format = SplitFormat::kB3Asym;
  EXPECT_FALSE(PlanVram(smaller_base, budget).ok());
}

TEST(VramPlanTest, SaysWhenNothingFits) {
  VramRequest request;
  request.config = EightBClassConfig();
  request.context = 4096;
  request.max_batch_rows = 16;
  auto plan = PlanVram(request, 1 * kGiB);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("not even one session of 16 tokens fits"));
}

TEST(VramPlanTest, SymmetricBaseSuggestsSymmetricFormats) {
  VramRequest request;
  request.config = EightBClassConfig();
  request.base_format = SplitFormat::kB4Sym;
  request.context = 8192;
  request.sessions = 8;
  request.max_batch_rows = 16;
  auto plan = PlanVram(request, 8 * kGiB);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("base b2_sym/g64"));
  EXPECT_THAT(message, HasSubstr("base b3_sym/g64"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("asym")));
}

TEST(VramPlanTest, RejectsMalformedRequests) {
  VramRequest good;
  good.config = EightBClassConfig();
  good.context = 1024;
  good.max_batch_rows = 16;
  ASSERT_TRUE(PlanVram(good, 80 * kGiB).ok());

  auto expect_invalid = [](const VramRequest& request, const std::string& text) {
    auto plan = PlanVram(request, 80 * kGiB);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(text));
  };
  VramRequest r = good;
  r.context = 0;
  expect_invalid(r, "context, sessions and batch rows >= 1");
  r = good;
  r.sessions = 0;
  expect_invalid(r, "context, sessions and batch rows >= 1");
  r = good;
  r.max_batch_rows = 0;
  expect_invalid(r, "context, sessions and batch rows >= 1");
  r = good;
  r.max_batch_rows = 2048;
  expect_invalid(r, "a forward of 2048 tokens cannot fit a session of 1024 tokens");
  r = good;
  r.context = 16384;
  expect_invalid(r, "exceeds the model's context length of 8192");
  r = good;
  r.kv_element_bytes = 1;
  expect_invalid(r, "KV cache elements are 2 (fp16) or 4 (f32) bytes");
  r = good;
  r.base_format = SplitFormat::kR8;
  expect_invalid(r, "r8 is not a base format");
  r = good;
  r.base_group = 96;  // 4096 is not a multiple of 96
  expect_invalid(r, "does not fit the 4096-wide input");
  r = good;
  r.config.d_model = 0;
  expect_invalid(r, "non-positive or inconsistent size");
  r = good;
  r.config.rope_dims = 256;  // > head_dim
  expect_invalid(r, "non-positive or inconsistent size");

  EXPECT_EQ(VramTotalBytes(r).status().code(), absl::StatusCode::kInvalidArgument);
  auto total = VramTotalBytes(good);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, PlanVram(good, 80 * kGiB)->total_bytes);
}

TEST(VramPlanTest, DefaultBudgetKeepsAMargin) {
  EXPECT_EQ(DefaultVramBudget(0), 0u);
  EXPECT_EQ(DefaultVramBudget(256 * kMiB), 0u);
  EXPECT_EQ(DefaultVramBudget(4 * kGiB), 4 * kGiB - 512 * kMiB);    // 5% < 512 MiB
  EXPECT_EQ(DefaultVramBudget(100 * kGiB), 100 * kGiB - 5 * kGiB);  // 5%
}

TEST(VramPlanTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
}

}  // namespace
}  // namespace bitsplit::model
