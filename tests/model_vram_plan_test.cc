// The VRAM planner: byte arithmetic against hand computation (the real SmolLM2 config, an
// 8B-class llama config and a gemma3-1B-shaped one), the refusal and its "what fits"
// suggestions, and bad requests.
//
// The hand computation restates, from a model's shape alone, docs/formats.md's row layout and
// the device buffers vram_plan.h lists; it calls none of the planner's functions, so every
// expected number is a sum of parts a reader can check.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
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
constexpr uint64_t kPage = 2 * kMiB;  // each slab is whole pages of the CUDA allocator
constexpr uint64_t kAlign = 256;      // each buffer inside a slab starts on this

constexpr uint64_t RoundUp(uint64_t n, uint64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}
constexpr uint64_t Aligned(uint64_t bytes) { return RoundUp(bytes, kAlign); }
constexpr uint64_t Pages(uint64_t bytes) { return (bytes + kPage - 1) / kPage; }

// The dimensions the expectations are derived from (each test checks its config has them).
struct Shape {
  uint64_t layers, d_model, heads, kv_heads, head_dim, d_ff, vocab;
  constexpr uint64_t q_dim() const { return heads * head_dim; }
  constexpr uint64_t kv_dim() const { return kv_heads * head_dim; }
  constexpr uint64_t widest_input() const { return std::max({d_model, q_dim(), d_ff}); }
};
constexpr Shape kSmolLm2{30, 576, 9, 3, 64, 1536, 49152};
constexpr Shape kEightB{32, 4096, 32, 8, 128, 14336, 128256};

void ExpectConfigHasShape(const ModelConfig& c, const Shape& s) {
  EXPECT_EQ(c.num_layers, static_cast<int64_t>(s.layers));
  EXPECT_EQ(c.d_model, static_cast<int64_t>(s.d_model));
  EXPECT_EQ(c.num_heads, static_cast<int64_t>(s.heads));
  EXPECT_EQ(c.num_kv_heads, static_cast<int64_t>(s.kv_heads));
  EXPECT_EQ(c.head_dim, static_cast<int64_t>(s.head_dim));
  EXPECT_EQ(c.rope_dims, static_cast<int64_t>(s.head_dim));
  EXPECT_EQ(c.d_ff, static_cast<int64_t>(s.d_ff));
  EXPECT_EQ(c.vocab_size, static_cast<int64_t>(s.vocab));
}

// A base format as docs/formats.md defines its rows: `bits`-bit codes, then an fp16 scale per
// group of `group` weights, then (asymmetric formats) an fp16 min per group.
struct RowFormat {
  uint64_t bits, group;
  bool has_min;
  uint64_t sub_block_bytes = 0;  // nonzero: bytes of codes per 32 weights instead of bits * 4
};
constexpr RowFormat kB2AsymG64{2, 64, true};
constexpr RowFormat kB2SymG64{2, 64, false};
constexpr RowFormat kB3AsymG64{3, 64, true};
constexpr RowFormat kB4AsymG64{4, 64, true};
constexpr RowFormat kQ8_0{8, 32, false};         // ggml's block: an fp16 scale and 32 int8 codes
constexpr RowFormat kBTernG64{0, 64, false, 7};  // five trits a byte: 7 bytes per 32 weights

constexpr uint64_t RowBytes(RowFormat f, uint64_t cols) {
  return (f.sub_block_bytes != 0 ? cols / 32 * f.sub_block_bytes : cols * f.bits / 8) +
         cols / f.group * 2 * (f.has_min ? 2 : 1);
}
// On the device every row starts on a 4-byte boundary.
constexpr uint64_t DeviceRow(RowFormat f, uint64_t cols) { return RoundUp(RowBytes(f, cols), 4); }

// Every linear weight, each matrix rows x device row, aligned: per layer q, k, v (rows q_dim,
// kv_dim, kv_dim of d_model), o (d_model of q_dim), gate, up (d_ff of d_model), down (d_model of
// d_ff), then the output head (vocab of d_model).
uint64_t LinearBytes(const Shape& s, RowFormat f) {
  const uint64_t layer = Aligned(s.q_dim() * DeviceRow(f, s.d_model)) +
                         2 * Aligned(s.kv_dim() * DeviceRow(f, s.d_model)) +
                         Aligned(s.d_model * DeviceRow(f, s.q_dim())) +
                         2 * Aligned(s.d_ff * DeviceRow(f, s.d_model)) +
                         Aligned(s.d_model * DeviceRow(f, s.d_ff));
  return s.layers * layer + Aligned(s.vocab * DeviceRow(f, s.d_model));
}

// A ggml Q8_0 embedding table: 2 + 32 bytes per 32 weights.
constexpr uint64_t Q8_0EmbeddingBytes(const Shape& s) { return s.vocab * s.d_model / 32 * 34; }

// The constants of a llama model (one RoPE table, two norms per layer).
struct Constants {
  uint64_t norms, rope, hadamard, slab;
};
Constants LlamaConstants(const Shape& s, uint64_t embedding_bytes, uint64_t context) {
  Constants c;
  c.norms = Aligned(4 * (s.layers * 2 * s.d_model + s.d_model));  // attention, FFN; output norm
  c.rope = Aligned(context * s.head_dim / 2 * 2 * 4);  // f32 cos and sin per pair and position
  c.hadamard = Aligned(4 * s.widest_input());          // an f32 sign per input element
  c.slab = Pages(Aligned(embedding_bytes) + c.norms + c.rope + c.hadamard) * kPage;
  return c;
}

// One session's fp16 keys and values, each side one buffer, in whole pages.
constexpr uint64_t KvSessionBytes(const Shape& s, uint64_t context, uint64_t extra = 0) {
  return Pages(2 * Aligned(s.layers * context * s.kv_dim() * 2) + extra) * kPage;
}

// The scratch of a forward of `t` tokens, buffer by buffer as vram_plan.h lists them.
ForwardScratchLayout Scratch(const Shape& s, uint64_t t, uint64_t context) {
  const uint64_t widest_output =
      std::max({s.q_dim() + 2 * s.kv_dim(), s.d_model, 2 * s.d_ff, s.vocab});
  // The activation's per-block scales and sums: one per 32 inputs, rounded up to 8 per row.
  const uint64_t blocks = RoundUp(s.widest_input() / 32, 8);
  ForwardScratchLayout x;
  x.batch_bytes = 3 * Aligned(4 * t) + Aligned(2 * t * t);
  x.hidden_state_bytes = Aligned(4 * t * s.d_model);
  x.normed_bytes = Aligned(4 * t * s.d_model);
  x.q_bytes = Aligned(4 * t * s.q_dim());
  x.kv_new_bytes = 2 * Aligned(4 * t * s.kv_dim());
  x.attention_bytes = Aligned(4 * t * s.q_dim());
  x.gate_up_bytes = 2 * Aligned(4 * t * s.d_ff);
  x.projected_bytes = Aligned(4 * t * s.d_model);
  x.rotated_bytes = Aligned(4 * t * s.widest_input());
  x.activation_bytes = Aligned(t * s.widest_input()) + 2 * Aligned(4 * t * blocks);
  x.residual_output_bytes = Aligned(4 * t * widest_output);
  x.logits_bytes = Aligned(4 * t * s.vocab);
  x.scores_bytes = Aligned(4 * t * s.heads * context);
  x.sampling_bytes = Aligned(8 * t * s.vocab);
  x.choice_bytes = 2 * Aligned(4 * t * 64) + Aligned(8 * t) + Aligned(4 * t) + Aligned(8 * t);
  x.total_bytes = x.batch_bytes + x.hidden_state_bytes + x.normed_bytes + x.q_bytes +
                  x.kv_new_bytes + x.attention_bytes + x.gate_up_bytes + x.projected_bytes +
                  x.rotated_bytes + x.activation_bytes + x.residual_output_bytes + x.logits_bytes +
                  x.scores_bytes + x.sampling_bytes + x.choice_bytes;
  return x;
}

void ExpectScratch(const ForwardScratchLayout& got, const ForwardScratchLayout& want) {
  EXPECT_EQ(got.batch_bytes, want.batch_bytes);
  EXPECT_EQ(got.hidden_state_bytes, want.hidden_state_bytes);
  EXPECT_EQ(got.normed_bytes, want.normed_bytes);
  EXPECT_EQ(got.q_bytes, want.q_bytes);
  EXPECT_EQ(got.kv_new_bytes, want.kv_new_bytes);
  EXPECT_EQ(got.attention_bytes, want.attention_bytes);
  EXPECT_EQ(got.gate_up_bytes, want.gate_up_bytes);
  EXPECT_EQ(got.projected_bytes, want.projected_bytes);
  EXPECT_EQ(got.rotated_bytes, want.rotated_bytes);
  EXPECT_EQ(got.activation_bytes, want.activation_bytes);
  EXPECT_EQ(got.residual_output_bytes, want.residual_output_bytes);
  EXPECT_EQ(got.logits_bytes, want.logits_bytes);
  EXPECT_EQ(got.scores_bytes, want.scores_bytes);
  EXPECT_EQ(got.visible_slots_bytes, want.visible_slots_bytes);
  EXPECT_EQ(got.sampling_bytes, want.sampling_bytes);
  EXPECT_EQ(got.choice_bytes, want.choice_bytes);
  EXPECT_EQ(got.total_bytes, want.total_bytes);
}

// The whole plan of a llama model whose embedding table is Q8_0 on the device.
uint64_t LlamaTotal(const Shape& s, RowFormat base, uint64_t context, uint64_t sessions,
                    uint64_t rows) {
  return Pages(LinearBytes(s, base)) * kPage +
         LlamaConstants(s, Q8_0EmbeddingBytes(s), context).slab +
         sessions * KvSessionBytes(s, context) +
         Pages(Scratch(s, rows, context).total_bytes) * kPage;
}

ModelConfig SmolLm2Config() {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  EXPECT_TRUE(file.ok()) << file.status();
  auto config = ModelConfigFromGguf(**file);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(VramPlanTest, ConfigsHaveTheShapesTheNumbersAssume) {
  ExpectConfigHasShape(SmolLm2Config(), kSmolLm2);
  ExpectConfigHasShape(EightBClassConfig(), kEightB);
}

TEST(VramPlanTest, SmolLm2BaseBytesMatchHandComputation) {
  // b2_asym/g64: a 576-wide row is 144 bytes of codes + 9 scales + 9 mins = 180 bytes, a
  // 1536-wide row 384 + 24 x 2 x 2 = 480: 42,024,960 bytes in all.
  auto bytes = SplitLinearBytes(SmolLm2Config(), SplitFormat::kB2Asym, 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, LinearBytes(kSmolLm2, kB2AsymG64));
  // Every row and matrix is already a multiple of 4 and 256 bytes, so the total is also
  // 2 + 2 x 16 / 64 = 2.5 bits per linear weight.
  const Shape& s = kSmolLm2;
  const uint64_t weights = s.layers * (s.d_model * (s.q_dim() + 2 * s.kv_dim()) +
                                       s.q_dim() * s.d_model + 3 * s.d_model * s.d_ff) +
                           s.vocab * s.d_model;
  EXPECT_EQ(*bytes * 8, weights * 5 / 2);
}

TEST(VramPlanTest, SmolLm2PlanMatchesHandComputation) {
  const Shape& s = kSmolLm2;
  constexpr uint64_t kContext = 2048;
  constexpr uint64_t kRows = 64;
  VramRequest request;
  request.config = SmolLm2Config();
  request.base_format = SplitFormat::kB2Asym;
  request.base_group = 64;
  request.embedding_bytes = Q8_0EmbeddingBytes(s);  // 30,081,024
  request.context = kContext;
  request.sessions = 1;
  request.max_batch_rows = kRows;
  auto plan = PlanVram(request, 1 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint64_t base_pages = Pages(LinearBytes(s, kB2AsymG64));  // 21
  EXPECT_EQ(plan->base_weights_bytes, base_pages * kPage);
  // Norms 140,544 + RoPE 524,288 + signs 6,144 beside the embedding: 15 pages.
  const Constants constants = LlamaConstants(s, request.embedding_bytes, kContext);
  EXPECT_EQ(plan->norms_bytes, constants.norms);
  EXPECT_EQ(plan->rope_table_bytes, constants.rope);
  EXPECT_EQ(plan->hadamard_bytes, constants.hadamard);
  EXPECT_EQ(plan->constants_slab_bytes, constants.slab);
  // fp16 keys and values: 23,040 bytes per token, 2048 tokens in 23 pages.
  EXPECT_EQ(plan->kv_bytes_per_token, 2 * s.layers * s.kv_dim() * 2);
  const uint64_t kv_session = KvSessionBytes(s, kContext);
  EXPECT_EQ(plan->kv_bytes_per_session, kv_session);
  EXPECT_EQ(plan->kv_cache_bytes, kv_session);
  // 57,231,360 bytes of scratch, most of it the vocab-wide rows: 28 pages.
  const ForwardScratchLayout scratch = Scratch(s, kRows, kContext);
  ExpectScratch(plan->scratch, scratch);
  EXPECT_EQ(plan->scratch_slab_bytes, Pages(scratch.total_bytes) * kPage);
  EXPECT_EQ(plan->total_bytes,
            base_pages * kPage + constants.slab + kv_session + Pages(scratch.total_bytes) * kPage);
  EXPECT_EQ(plan->budget_bytes, 1 * kGiB);

  uint64_t sum = 0;
  for (const VramItem& item : plan->Items()) sum += item.bytes;
  EXPECT_EQ(sum, plan->total_bytes);
  EXPECT_THAT(plan->ToString(), HasSubstr(absl::StrFormat("1 x %.1f MiB (2048 tokens)",
                                                          static_cast<double>(kv_session) / kMiB)));
}

TEST(VramPlanTest, DeviceRowsArePaddedToFourBytes) {
  // b2_sym/g64: a 576-wide row is 144 + 9 x 2 = 162 bytes, padded to 164 on the device; a
  // 1536-wide row is 384 + 24 x 2 = 432.
  static_assert(RowBytes(kB2SymG64, 576) % 4 != 0, "the padding must matter");
  EXPECT_EQ(DeviceRowStride(SplitFormat::kB2Sym, 64, 576), RowBytes(kB2SymG64, 576) + 2);
  EXPECT_EQ(DeviceRowStride(SplitFormat::kB2Sym, 64, 1536), RowBytes(kB2SymG64, 1536));
  auto bytes = SplitLinearBytes(SmolLm2Config(), SplitFormat::kB2Sym, 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, LinearBytes(kSmolLm2, kB2SymG64));  // 38,197,248
  // bt_sym/g64: a 576-wide row is 18 x 7 + 9 x 2 = 144 bytes (no padding), a 1536-wide one
  // 48 x 7 + 24 x 2 = 384.
  static_assert(RowBytes(kBTernG64, 576) == 144 && RowBytes(kBTernG64, 1536) == 384);
  EXPECT_EQ(DeviceRowStride(SplitFormat::kBTern, 64, 576), 144u);
  EXPECT_EQ(DeviceRowStride(SplitFormat::kBTern, 32, 96), RowBytes({0, 32, false, 7}, 96) + 1);
  bytes = SplitLinearBytes(SmolLm2Config(), SplitFormat::kBTern, 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, LinearBytes(kSmolLm2, kBTernG64));
}

TEST(VramPlanTest, EightBBaseBytesMatchHandComputation) {
  const ModelConfig c = EightBClassConfig();
  // b2_asym/g64: 4096-wide rows 1024 + 64 x 4 = 1280 bytes, 14336-wide rows 3584 + 224 x 4 =
  // 4480: 2,345,205,760 in all.
  auto b2 = SplitLinearBytes(c, SplitFormat::kB2Asym, 64);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(*b2, LinearBytes(kEightB, kB2AsymG64));
  // q8_0: 4096-wide rows 128 blocks x 34 = 4352 bytes, 14336-wide 448 x 34: 7,973,699,584.
  auto q8 = SplitLinearBytes(c, SplitFormat::kQ8_0, 32);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(*q8, LinearBytes(kEightB, kQ8_0));
  // b4_asym/g64: 2048 + 64 x 4 = 2304 and 7168 + 224 x 4 = 8064 bytes.
  auto b4 = SplitLinearBytes(c, SplitFormat::kB4Asym, 64);
  ASSERT_TRUE(b4.ok()) << b4.status();
  EXPECT_EQ(*b4, LinearBytes(kEightB, kB4AsymG64));
}

TEST(VramPlanTest, EightBKvCacheAndScratch) {
  const Shape& s = kEightB;
  constexpr uint64_t kContext = 8192;
  constexpr uint64_t kRows = 16;
  VramRequest request;
  request.config = EightBClassConfig();
  request.embedding_bytes = Q8_0EmbeddingBytes(s);
  request.context = kContext;
  request.sessions = 4;
  request.max_batch_rows = kRows;
  auto plan = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 2 x 32 layers x 1024 x 2 bytes = 128 KiB per token; 8192 tokens = 1 GiB per session.
  EXPECT_EQ(plan->kv_bytes_per_token, 2 * s.layers * s.kv_dim() * 2);
  EXPECT_EQ(plan->kv_bytes_per_session, KvSessionBytes(s, kContext));
  EXPECT_EQ(plan->kv_cache_bytes, 4 * KvSessionBytes(s, kContext));
  EXPECT_EQ(plan->base_weights_bytes, Pages(LinearBytes(s, kB2AsymG64)) * kPage);
  EXPECT_EQ(plan->constants_slab_bytes,
            LlamaConstants(s, request.embedding_bytes, kContext).slab);  // 269 pages
  ExpectScratch(plan->scratch, Scratch(s, kRows, kContext));             // 54,102,016
  EXPECT_EQ(plan->total_bytes, LlamaTotal(s, kB2AsymG64, kContext, 4, kRows));
  // q8_0: 34 bytes per 32 values, 68 KiB per token; the rest of the plan unchanged.
  request.kv_type = ops::KvType::kQ8_0;
  auto q8 = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(q8.ok()) << q8.status();
  const uint64_t q8_row = s.kv_dim() / 32 * 34;
  EXPECT_EQ(q8->kv_bytes_per_token, 2 * s.layers * q8_row);
  EXPECT_EQ(q8->kv_bytes_per_session, Pages(2 * Aligned(s.layers * kContext * q8_row)) * kPage);
  EXPECT_EQ(q8->total_bytes,
            plan->total_bytes - 4 * plan->kv_bytes_per_session + 4 * q8->kv_bytes_per_session);
}

// A gemma3-1B-shaped config: what the device holds beyond the llama layer (every per-layer
// vector, the local layers' RoPE table, each slot's position, the windowed
// layers' slot lists), and none of it for llama.
TEST(VramPlanTest, WindowedGeGluModelPlansItsExtraBuffers) {
  constexpr Shape s{26, 1152, 4, 1, 256, 6912, 262144};
  constexpr uint64_t kContext = 4096;
  constexpr uint64_t kRows = 64;
  ModelConfig c = EightBClassConfig();
  c.architecture = "gemma3";
  c.num_layers = s.layers;
  c.d_model = s.d_model;
  c.d_ff = s.d_ff;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.rope_dims = s.head_dim;
  c.vocab_size = s.vocab;
  c.context_length = 32768;
  c.rope_style = RopeStyle::kHalves;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.qk_norm = true;
  c.post_norms = true;
  c.sliding_window = 512;
  c.layer_is_local.assign(26, 1);
  VramRequest request;
  request.config = c;
  request.context = kContext;
  request.sessions = 1;
  request.max_batch_rows = kRows;
  auto plan = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Per layer four d_model vectors (attention, FFN, two post-norms) and two head_dim ones
  // (QK-norms), then the output norm: 537,088 bytes.
  EXPECT_EQ(plan->norms_bytes,
            Aligned(4 * (s.layers * (4 * s.d_model + 2 * s.head_dim) + s.d_model)));
  // Two tables (global and local base) of positions x pairs x f32 cos, sin.
  EXPECT_EQ(plan->rope_table_bytes, 2 * Aligned(kContext * s.head_dim / 2 * 2 * 4));
  // Beside keys and values (exactly 52 pages), an i32 position per slot: 53 pages.
  const uint64_t positions = Aligned(4 * kContext);
  EXPECT_EQ(plan->kv_positions_bytes, positions);
  EXPECT_EQ(plan->kv_bytes_per_session, KvSessionBytes(s, kContext, positions));
  // Each row's visible slots, i32 [rows, context], and their counts, i32 [rows].
  EXPECT_EQ(plan->scratch.visible_slots_bytes, Aligned(4 * kRows * kContext) + Aligned(4 * kRows));

  request.config = EightBClassConfig();
  auto llama = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->kv_positions_bytes, 0u);
  EXPECT_EQ(llama->scratch.visible_slots_bytes, 0u);
  EXPECT_EQ(llama->rope_table_bytes, Aligned(kContext * kEightB.head_dim / 2 * 2 * 4));
}

// Qwen3-30B-A3B's shapes: 48 layers, d_model 2048, 32 heads over 4 KV heads of 128, 128
// experts of width 768 with 8 used per token, no dense FFN, vocab 151936.
TEST(VramPlanTest, MixtureOfExpertsPlansRoutersExpertsAndTheirScratch) {
  ModelConfig c = EightBClassConfig();
  c.architecture = "qwen3moe";
  c.num_layers = 48;
  c.d_model = 2048;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = c.rope_dims = 128;
  c.vocab_size = 151936;
  c.context_length = 40960;
  c.qk_norm = true;
  c.d_ff = 6144;  // read by no group: the layers have no dense FFN
  c.dense_ffn = false;
  c.num_experts = 128;
  c.num_experts_used = 8;
  c.d_ff_expert = 768;
  constexpr uint64_t kRows = 64;
  VramRequest request;
  request.config = c;
  request.base_format = SplitFormat::kB2Asym;
  request.context = 8192;
  request.max_batch_rows = kRows;
  auto plan = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // b2_asym/g64 rows: 2048 wide 640 bytes, 4096 wide 1280, 768 wide 240.
  const uint64_t per_layer = Aligned(4096 * 640) + 2 * Aligned(512 * 640) + Aligned(2048 * 1280) +
                             2 * Aligned(128 * 768 * 640) + Aligned(128 * 2048 * 240);
  const uint64_t linear = 48 * per_layer + Aligned(151936ull * 640);
  EXPECT_EQ(*SplitLinearBytes(c, SplitFormat::kB2Asym, 64), linear);
  EXPECT_EQ(plan->base_weights_bytes, Pages(linear) * kPage);
  // The routers at f32: 48 x 128 x 2048 x 4 bytes = 48 MiB.
  EXPECT_EQ(plan->router_bytes, 48ull * 128 * 2048 * 4);
  EXPECT_EQ(plan->constants_slab_bytes,
            Pages(plan->embedding_bytes + plan->norms_bytes + plan->router_bytes +
                  plan->rope_table_bytes + plan->hadamard_bytes) *
                kPage);
  // 64 rows route 512 (row, expert) pairs. Router logits [64, 128], the experts' and router's
  // inputs [64, 2048] each; per pair its expert, weight, grouped row and source row; per grouped
  // row its input (2048), gate|up (2 x 768), activation (768) and output (2048); the sum [64,
  // 2048].
  const uint64_t routed = kRows * 8;
  EXPECT_EQ(plan->scratch.expert_bytes,
            Aligned(4 * kRows * 128) + 2 * Aligned(4 * kRows * 2048) + 4 * Aligned(4 * routed) +
                2 * Aligned(4 * routed * 2048) + Aligned(4 * routed * 2 * 768) +
                Aligned(4 * routed * 768) + Aligned(4 * kRows * 2048));
  // The expert groups quantize every routed pair's row: 512 rows of the widest input (q: 4096).
  EXPECT_EQ(plan->scratch.linear_rows, 512);
  EXPECT_EQ(plan->scratch.linear_cols, 4096);
  EXPECT_EQ(plan->scratch.rotated_bytes, Aligned(4 * routed * 4096));
  EXPECT_EQ(plan->scratch.activation_bytes,
            Aligned(routed * 4096) + 2 * Aligned(4 * routed * (4096 / 32)));
  // No dense FFN: no scratch for one (the file's d_ff of 6144 is read by nothing).
  EXPECT_EQ(plan->scratch.gate_up_bytes, 0u);
  uint64_t sum = 0;
  for (const VramItem& item : plan->Items()) sum += item.bytes;
  EXPECT_EQ(sum, plan->total_bytes);
  // The residual's result of an expert group is k rows per token, 8 x max(2 x 768, 2048) wide:
  // narrower than this vocabulary, wider than one of 8000.
  EXPECT_EQ(plan->scratch.residual_output_bytes, Aligned(4 * kRows * 151936));
  request.config.vocab_size = 8000;
  auto small_vocab = PlanVram(request, 80 * kGiB);
  ASSERT_TRUE(small_vocab.ok()) << small_vocab.status();
  EXPECT_EQ(small_vocab->scratch.residual_output_bytes, Aligned(4 * kRows * 8 * 2048));
}

TEST(VramPlanTest, ExpectedDistinctExpertsFollowsTheRoutingFrequencies) {
  // Uniform: E (1 - (1 - k/E)^n).
  const std::vector<double> uniform(128, 8.0 / 128);
  EXPECT_NEAR(ExpectedDistinctExperts(uniform, 16), 128 * (1 - std::pow(1 - 8.0 / 128, 16)), 1e-9);
  EXPECT_NEAR(ExpectedDistinctExperts(128, 8, 16), 128 * (1 - std::pow(1 - 8.0 / 128, 16)), 1e-9);
  EXPECT_DOUBLE_EQ(ExpectedDistinctExperts(128, 8, 1), 8);
  // Two experts always taken, two never: n rows touch exactly 2.
  EXPECT_DOUBLE_EQ(ExpectedDistinctExperts(std::vector<double>{1, 1, 0, 0}, 5), 2);
  // One row touches its k experts whatever the frequencies.
  EXPECT_NEAR(ExpectedDistinctExperts(std::vector<double>{0.9, 0.6, 0.3, 0.2}, 1), 2.0, 1e-12);
  EXPECT_EQ(ExpectedDistinctExperts(0, 0, 16), 0);
}

// --max-sessions auto on cuda: the SmolLM2 plan above is 64 fixed 2 MiB pages (base 21, constants
// 15, scratch 28) plus 23 pages of KV cache per session of 2048 tokens.
TEST(VramPlanTest, SessionsThatFitTheBudget) {
  VramRequest request;
  request.config = SmolLm2Config();
  request.base_format = SplitFormat::kB2Asym;
  request.base_group = 64;
  request.embedding_bytes = Q8_0EmbeddingBytes(kSmolLm2);
  request.context = 2048;
  request.sessions = 99;  // not read
  request.max_batch_rows = 64;
  const uint64_t session = KvSessionBytes(kSmolLm2, 2048);
  const uint64_t fixed = LlamaTotal(kSmolLm2, kB2AsymG64, 2048, 0, 64);
  auto five = VramSessionsThatFit(request, fixed + 5 * session + kMiB, 256);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(*five, 5);
  auto exact = VramSessionsThatFit(request, fixed + 5 * session, 256);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(*exact, 5);
  auto capped = VramSessionsThatFit(request, fixed + 5 * session, 3);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(*capped, 3);
  auto none = VramSessionsThatFit(request, fixed + session - 1, 256);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("1 sessions x 2048 tokens"));
}

// The embedding table goes to the device only when that costs nothing: the request fits with it
// and, with sessions chosen by the budget, no session is lost to it.
TEST(VramPlanTest, EmbeddingGoesToTheDeviceOnlyWhenItCostsNothing) {
  VramRequest request;
  request.config = SmolLm2Config();
  request.base_format = SplitFormat::kB2Asym;
  request.base_group = 64;
  request.embedding_bytes = 12345;  // not read
  request.context = 2048;
  request.sessions = 1;
  request.max_batch_rows = 64;
  const uint64_t table = Q8_0EmbeddingBytes(kSmolLm2);  // 29.95 MiB, less than a session
  const uint64_t session = KvSessionBytes(kSmolLm2, 2048);
  ASSERT_LT(table, session);
  const auto total = [&](uint64_t sessions, bool on_device) {
    return LlamaTotal(kSmolLm2, kB2AsymG64, 2048, sessions, 64) -
           LlamaConstants(kSmolLm2, Q8_0EmbeddingBytes(kSmolLm2), 2048).slab +
           LlamaConstants(kSmolLm2, on_device ? table : 0, 2048).slab;
  };
  ASSERT_LT(total(1, false) + 4 * kMiB, total(1, true));
  // One session asked for: on the device exactly when it fits there.
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(1, true), 8), table);
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(1, true) - 1, 8), 0u);
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(1, false), 8), 0u);
  // A type only the host gathers stays there.
  EXPECT_EQ(PlacedEmbeddingBytes(request, 0, total(1, true) + kGiB, 8), 0u);
  // Sessions from the budget: room for 5 either way puts it on the device; a budget that holds 5
  // sessions only without it keeps it on the host; at the cap both hold the cap.
  request.sessions = 0;
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(5, true), 256), table);
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(5, false), 256), 0u);
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(5, false), 4), table);
  // Nothing fits either way: the host (the refusal then comes from PlanVram).
  EXPECT_EQ(PlacedEmbeddingBytes(request, table, total(1, false) - 1, 256), 0u);
}

TEST(VramPlanTest, RefusesAndSaysWhatFits) {
  VramRequest request;
  request.config = EightBClassConfig();
  request.base_format = SplitFormat::kB4Asym;
  request.base_group = 64;
  request.embedding_bytes = Q8_0EmbeddingBytes(kEightB);
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
  // At context 5120 with 4 sessions: b4 weights 2013 pages + constants 268 pages + KV 4 x 5120
  // x 128 KiB + scratch 23 pages = exactly 7 GiB; contexts are suggested in multiples of 256.
  ASSERT_EQ(LlamaTotal(kEightB, kB4AsymG64, 5120, 4, 16), budget);
  ASSERT_GT(LlamaTotal(kEightB, kB4AsymG64, 5121, 4, 16), budget);
  EXPECT_THAT(message, HasSubstr("fits: context 5120 with 4 sessions"));
  ASSERT_LE(LlamaTotal(kEightB, kB4AsymG64, 8192, 2, 16), budget);
  ASSERT_GT(LlamaTotal(kEightB, kB4AsymG64, 8192, 3, 16), budget);
  EXPECT_THAT(message, HasSubstr("or 2 sessions at context 8192"));
  // b2 fits as asked; b3 does not.
  auto gib = [](RowFormat f) {
    return absl::StrFormat("%.2f GiB",
                           static_cast<double>(Pages(LinearBytes(kEightB, f)) * kPage) / kGiB);
  };
  ASSERT_LE(LlamaTotal(kEightB, kB2AsymG64, 8192, 4, 16), budget);
  ASSERT_GT(LlamaTotal(kEightB, kB3AsymG64, 8192, 4, 16), budget);
  EXPECT_THAT(message,
              HasSubstr("base b2_asym/g64 needs " + gib(kB2AsymG64) + " and fits as requested"));
  EXPECT_THAT(message, HasSubstr("base b3_asym/g64 needs " + gib(kB3AsymG64)));
  EXPECT_THAT(message, ::testing::Not(HasSubstr(gib(kB3AsymG64) + " and fits")));
  // The ternary base is suggested too, whatever the requested grid: it fits as well.
  ASSERT_LE(LlamaTotal(kEightB, kBTernG64, 8192, 4, 16), budget);
  EXPECT_THAT(message,
              HasSubstr("base bt_sym/g64 needs " + gib(kBTernG64) + " and fits as requested"));

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
  r.kv_type = ops::KvType::kF32;
  expect_invalid(r, "the device's KV cache is f16 or q8_0, not f32");
  r = good;
  r.kv_type = ops::KvType::kQ8_0;
  r.config.head_dim = 80;  // 32 heads of 80: q_dim 2560
  r.config.rope_dims = 80;
  expect_invalid(r,
                 "a q8_0 KV cache needs head widths that are multiples of 32; layer 0's heads "
                 "are 80 wide");
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
