#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"

namespace bitsplit::model {
namespace {

using ::bitsplit::testing::GgufBuilder;

const std::vector<float> kOnes(64, 1.0f);

TEST(ModelConfigTest, ReadsSmolLm2) {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  ASSERT_TRUE(file.ok()) << file.status();
  auto config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "llama");
  EXPECT_EQ(config->num_layers, 30);
  EXPECT_EQ(config->d_model, 576);
  EXPECT_EQ(config->d_ff, 1536);
  EXPECT_EQ(config->num_heads, 9);
  EXPECT_EQ(config->num_kv_heads, 3);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->rope_dims, 64);
  EXPECT_EQ(config->QDim(0), 576);
  EXPECT_EQ(config->KvDim(0), 192);
  EXPECT_EQ(config->vocab_size, 49152);
  EXPECT_EQ(config->context_length, 8192);
  EXPECT_EQ(config->rope_freq_base, 100000.0f);
  EXPECT_EQ(config->rope_freq_scale, 1.0f);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-5f);
}

// The expected values are llama.cpp's gemma3 rules (src/models/gemma3.cpp, llama-hparams.cpp)
// applied to the file's keys: window 512 with pattern 6 (every sixth layer global), local RoPE
// base 10000, queries scaled by 1/sqrt(key_length 256), embeddings by sqrt(640).
TEST(ModelConfigTest, ReadsGemma3) {
  auto file = gguf::File::Open(testing::ModelPath(testing::kGemma3File));
  ASSERT_TRUE(file.ok()) << file.status();
  auto config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "gemma3");
  EXPECT_EQ(config->num_layers, 18);
  EXPECT_EQ(config->d_model, 640);
  EXPECT_EQ(config->d_ff, 2048);
  EXPECT_EQ(config->num_heads, 4);
  EXPECT_EQ(config->num_kv_heads, 1);
  EXPECT_EQ(config->head_dim, 256);
  EXPECT_EQ(config->QDim(0), 1024);
  EXPECT_EQ(config->vocab_size, 262144);
  EXPECT_EQ(config->rope_style, RopeStyle::kHalves);
  EXPECT_EQ(config->ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_TRUE(config->qk_norm);
  EXPECT_TRUE(config->post_norms);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_EQ(config->attention_scale, 1.0f / 16.0f);
  EXPECT_EQ(config->embedding_scale, std::sqrt(640.0f));
  EXPECT_EQ(config->sliding_window, 512);
  for (int64_t layer = 0; layer < 18; ++layer) {
    const bool global = layer % 6 == 5;
    EXPECT_EQ(config->IsLocalLayer(layer), !global) << layer;
    EXPECT_EQ(config->AttentionWindow(layer), global ? 0 : 512) << layer;
    EXPECT_EQ(config->RopeFreqBase(layer), global ? 1e6f : 1e4f) << layer;
  }
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-6f);

  auto weights = ModelWeightsFromGguf(**file, *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->output_tied_to_embedding);
  for (const LayerWeights& layer : weights->layers) {
    EXPECT_NE(layer.vectors.attn_post_norm, nullptr);
    EXPECT_NE(layer.vectors.ffn_post_norm, nullptr);
    EXPECT_NE(layer.vectors.attn_q_norm, nullptr);
    EXPECT_NE(layer.vectors.attn_k_norm, nullptr);
    EXPECT_EQ(layer.vectors.q_bias, nullptr);
  }
}

TEST(ModelWeightsTest, SmolLm2TiesTheOutputHeadToTheEmbedding) {
  auto file = gguf::File::Open(testing::ModelPath(testing::kSmolLm2File));
  ASSERT_TRUE(file.ok()) << file.status();
  auto config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  auto weights = ModelWeightsFromGguf(**file, *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->output_tied_to_embedding);
  EXPECT_EQ(weights->output.data, weights->token_embd.data);
  EXPECT_EQ(weights->token_embd.type, GgmlType::kQ8_0);
  EXPECT_EQ(weights->token_embd.rows, 49152);
  EXPECT_EQ(weights->token_embd.cols, 576);
  EXPECT_EQ(weights->rope_freq_factors, nullptr);
  ASSERT_EQ(weights->layers.size(), 30u);
  const LayerWeights& last = weights->layers.back();
  EXPECT_EQ(last.wq.type, GgmlType::kQ4_1);
  EXPECT_EQ(last.wk.rows, 192);
  EXPECT_EQ(last.wk.cols, 576);
  EXPECT_EQ(last.w_down.rows, 576);
  EXPECT_EQ(last.w_down.cols, 1536);
  EXPECT_EQ(last.w_gate.rows, 1536);
  EXPECT_NE(last.vectors.attn_norm, nullptr);
  EXPECT_NE(last.vectors.ffn_norm, nullptr);
  EXPECT_EQ(last.vectors.attn_post_norm, nullptr);
}

// A tiny synthetic llama (2 layers, d_model 64, 4 heads over 2 kv heads, d_ff 96, vocab 40)
// that each test mutates before building.
struct TinyLlama {
  GgufBuilder builder;
  std::vector<uint8_t> image;
  std::unique_ptr<gguf::File> file;

  explicit TinyLlama(const std::function<void(GgufBuilder&)>& metadata = nullptr,
                     const std::function<void(GgufBuilder&)>& tensors = nullptr) {
    if (metadata) {
      metadata(builder);
    } else {
      AddMetadata(builder);
    }
    AddTensors(builder);
    if (tensors) tensors(builder);
  }

  static void AddMetadata(GgufBuilder& b, const std::string& architecture = "llama",
                          uint32_t head_count = 4) {
    const std::string p = architecture + ".";
    b.AddString("general.architecture", architecture);
    b.AddUint32(p + "block_count", 2);
    b.AddUint32(p + "context_length", 128);
    b.AddUint32(p + "embedding_length", 64);
    b.AddUint32(p + "feed_forward_length", 96);
    b.AddUint32(p + "attention.head_count", head_count);
    b.AddUint32(p + "attention.head_count_kv", 2);
    b.AddFloat32(p + "rope.freq_base", 10000.0f);
    b.AddFloat32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  }

  static void AddTensors(GgufBuilder& b) {
    b.AddTensor("token_embd.weight", GgmlType::kQ8_0, {64, 40});
    b.AddF32Tensor("output_norm.weight", {64}, kOnes);
    for (int i = 0; i < 2; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      b.AddF32Tensor(p + "attn_norm.weight", {64}, kOnes);
      b.AddTensor(p + "attn_q.weight", GgmlType::kQ4_1, {64, 64});
      b.AddTensor(p + "attn_k.weight", GgmlType::kQ4_1, {64, 32});
      b.AddTensor(p + "attn_v.weight", GgmlType::kQ4_1, {64, 32});
      b.AddTensor(p + "attn_output.weight", GgmlType::kF16, {64, 64});
      b.AddF32Tensor(p + "ffn_norm.weight", {64}, kOnes);
      b.AddTensor(p + "ffn_gate.weight", GgmlType::kQ8_0, {64, 96});
      b.AddTensor(p + "ffn_up.weight", GgmlType::kQ8_0, {64, 96});
      b.AddTensor(p + "ffn_down.weight", GgmlType::kF32, {96, 64});
    }
  }

  GgufBuilder::Tensor& Tensor(const std::string& name) {
    for (auto& t : builder.tensors()) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return builder.tensors().front();
  }

  absl::StatusOr<ModelConfig> Config() {
    image = builder.Build();
    auto parsed = gguf::File::Parse(image.data(), image.size(), "tiny.gguf");
    if (!parsed.ok()) return parsed.status();
    file = std::move(*parsed);
    return ModelConfigFromGguf(*file);
  }

  absl::StatusOr<ModelWeights> Weights() {
    auto config = Config();
    if (!config.ok()) return config.status();
    return ModelWeightsFromGguf(*file, *config);
  }
};

void ExpectErrorMentions(const absl::Status& status, const std::string& text) {
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(text), std::string::npos)
      << "error \"" << status.message() << "\" does not mention \"" << text << "\"";
}

// Removes the metadata entries named `key`, so that a test can write its own value.
GgufBuilder& Drop(GgufBuilder& b, const std::string& key) {
  std::erase_if(b.kvs(), [&](const GgufBuilder::Kv& kv) { return kv.key == key; });
  return b;
}

// The config of a tensor-less GGUF holding `b`'s metadata, as a split model's base file has.
absl::StatusOr<ModelConfig> MetadataConfig(GgufBuilder& b, int64_t embedding_rows) {
  const std::vector<uint8_t> image = b.Build();
  auto file = gguf::File::Parse(image.data(), image.size(), "meta.gguf");
  if (!file.ok()) return file.status();
  return ModelConfigFromGgufMetadata(**file, embedding_rows);
}

TEST(TinyLlamaTest, ValidFileLoads) {
  TinyLlama tiny;
  auto weights = tiny.Weights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ModelConfig config = *tiny.Config();
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.KvDim(0), 32);
  EXPECT_EQ(config.vocab_size, 40);
  EXPECT_TRUE(weights->output_tied_to_embedding);
  EXPECT_EQ(weights->layers[1].wo.type, GgmlType::kF16);
}

TEST(TinyLlamaTest, SeparateOutputHeadIsUsed) {
  TinyLlama tiny(nullptr, [](GgufBuilder& b) {
    b.AddTensor("output.weight", GgmlType::kQ8_0, {64, 40});
  });
  auto weights = tiny.Weights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_FALSE(weights->output_tied_to_embedding);
  EXPECT_NE(weights->output.data, weights->token_embd.data);
}

TEST(TinyLlamaTest, RejectsOtherArchitectureNamingTheSupportedOnes) {
  TinyLlama tiny([](GgufBuilder& b) { TinyLlama::AddMetadata(b, "mamba"); });
  const absl::Status status = tiny.Config().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  ExpectErrorMentions(status, "\"mamba\"");
  ExpectErrorMentions(status, "llama, gemma3, gemma4, qwen2, qwen3, qwen3moe, gpt-oss");
}

// qwen2 reads the same tensors plus q/k/v biases; without them the file is incomplete.
TEST(TinyLlamaTest, Qwen2NeedsItsBiases) {
  TinyLlama missing([](GgufBuilder& b) { TinyLlama::AddMetadata(b, "qwen2"); });
  ExpectErrorMentions(missing.Weights().status(), "blk.0.attn_q.bias");
  TinyLlama complete([](GgufBuilder& b) { TinyLlama::AddMetadata(b, "qwen2"); },
                     [](GgufBuilder& b) {
                       for (int i = 0; i < 2; ++i) {
                         const std::string p = "blk." + std::to_string(i) + ".";
                         b.AddF32Tensor(p + "attn_q.bias", {64}, kOnes);
                         b.AddF32Tensor(p + "attn_k.bias", {32}, std::vector<float>(32, 1.0f));
                         b.AddF32Tensor(p + "attn_v.bias", {32}, std::vector<float>(32, 1.0f));
                       }
                     });
  auto weights = complete.Weights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_NE(weights->layers[1].vectors.v_bias, nullptr);
  EXPECT_EQ(complete.Config()->rope_style, RopeStyle::kHalves);
}

TEST(TinyLlamaTest, RejectsTensorsOfAnExtraLayer) {
  TinyLlama tiny(nullptr,
                 [](GgufBuilder& b) { b.AddF32Tensor("blk.2.attn_norm.weight", {64}, kOnes); });
  ExpectErrorMentions(tiny.Weights().status(), "blk.2.attn_norm.weight");
}

// Tiny gemma3 metadata with a sliding window of 8, then `extra`.
std::function<void(GgufBuilder&)> Gemma3Window(const std::function<void(GgufBuilder&)>& extra) {
  return [extra](GgufBuilder& b) {
    TinyLlama::AddMetadata(b, "gemma3");
    b.AddUint32("gemma3.attention.sliding_window", 8);
    if (extra) extra(b);
  };
}

// A sliding-window family reads its layer pattern as a period or as one flag per layer.
TEST(TinyLlamaTest, Gemma3SlidingWindowPattern) {
  TinyLlama by_default(Gemma3Window(nullptr));
  auto config = by_default.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->IsLocalLayer(0));  // period 6: layers 0-4 local
  EXPECT_TRUE(config->IsLocalLayer(1));
  TinyLlama by_period(Gemma3Window(
      [](GgufBuilder& b) { b.AddUint32("gemma3.attention.sliding_window_pattern", 2); }));
  config = by_period.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->IsLocalLayer(0));
  EXPECT_FALSE(config->IsLocalLayer(1));
  EXPECT_EQ(config->AttentionWindow(0), 8);
  EXPECT_EQ(config->RopeFreqBase(0), 10000.0f);
  TinyLlama by_flags(Gemma3Window([](GgufBuilder& b) {
    b.AddArray("gemma3.attention.sliding_window_pattern", gguf::ValueType::kBool,
               std::vector<uint8_t>{0, 1});
  }));
  config = by_flags.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->IsLocalLayer(0));
  EXPECT_TRUE(config->IsLocalLayer(1));
  TinyLlama wrong_length(Gemma3Window([](GgufBuilder& b) {
    b.AddArray("gemma3.attention.sliding_window_pattern", gguf::ValueType::kBool,
               std::vector<uint8_t>{1});
  }));
  ExpectErrorMentions(wrong_length.Config().status(), "sliding_window_pattern");
}

// The local layers' RoPE base and the bounds of the window keys; a window of 0 turns the
// pattern and the local RoPE base off.
TEST(TinyLlamaTest, Gemma3SlidingWindowKeys) {
  TinyLlama local_base(Gemma3Window([](GgufBuilder& b) {
    Drop(b, "gemma3.rope.freq_base").AddFloat32("gemma3.rope.freq_base", 1e6f);
    b.AddFloat32("gemma3.rope.freq_base_swa", 20000.0f);
    b.AddUint32("gemma3.attention.sliding_window_pattern", 2);
  }));
  auto config = local_base.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->RopeFreqBase(0), 20000.0f);
  EXPECT_EQ(config->RopeFreqBase(1), 1e6f);
  TinyLlama all_local(Gemma3Window(
      [](GgufBuilder& b) { b.AddUint32("gemma3.attention.sliding_window_pattern", 0); }));
  config = all_local.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->IsLocalLayer(0));
  EXPECT_TRUE(config->IsLocalLayer(1));
  TinyLlama no_window(Gemma3Window([](GgufBuilder& b) {
    Drop(b, "gemma3.attention.sliding_window").AddUint32("gemma3.attention.sliding_window", 0);
    b.AddFloat32("gemma3.rope.freq_base_swa", 0.0f);
  }));
  config = no_window.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_TRUE(config->layer_is_local.empty());
  EXPECT_EQ(config->AttentionWindow(0), 0);

  const struct {
    std::function<void(GgufBuilder&)> edit;
    std::string message;
  } cases[] = {
      {[](GgufBuilder& b) { b.AddFloat32("gemma3.rope.freq_base_swa", 0.0f); },
       "rope.freq_base_swa must be positive"},
      {[](GgufBuilder& b) {
         Drop(b, "gemma3.attention.sliding_window")
             .AddUint64("gemma3.attention.sliding_window", (uint64_t{1} << 31) + 1);
       },
       "attention.sliding_window = 2147483649 is out of range"},
      {[](GgufBuilder& b) {
         b.AddUint32("gemma3.attention.sliding_window_pattern", (1u << 20) + 1);
       },
       "gemma3.attention.sliding_window_pattern = 1048577 is out of range"},
      {[](GgufBuilder& b) {
         b.AddArray("gemma3.attention.sliding_window_pattern", gguf::ValueType::kUint8,
                    std::vector<uint8_t>{0, 1});
       },
       "gemma3.attention.sliding_window_pattern is not a bool array"},
  };
  for (const auto& c : cases) {
    TinyLlama tiny(Gemma3Window(c.edit));
    const absl::Status status = tiny.Config().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    ExpectErrorMentions(status, c.message);
  }
}

// gemma_pytorch scales gemma3 27B's queries by query_pre_attn_scalar = hidden_size / heads
// (5376 / 32 = 168), not by its head width 128; 12B's scalar is its head width, 256.
TEST(ModelConfigTest, Gemma3QueryScaleFollowsGemmaPytorch) {
  const auto gemma3 = [](uint32_t layers, uint32_t width, uint32_t heads, uint32_t kv_heads,
                         uint32_t head_width) {
    GgufBuilder b;
    b.AddString("general.architecture", "gemma3");
    b.AddUint32("gemma3.block_count", layers);
    b.AddUint32("gemma3.context_length", 131072);
    b.AddUint32("gemma3.embedding_length", width);
    b.AddUint32("gemma3.feed_forward_length", width * 4);
    b.AddUint32("gemma3.attention.head_count", heads);
    b.AddUint32("gemma3.attention.head_count_kv", kv_heads);
    b.AddUint32("gemma3.attention.key_length", head_width);
    b.AddUint32("gemma3.attention.value_length", head_width);
    b.AddUint32("gemma3.attention.sliding_window", 1024);
    return MetadataConfig(b, 262144);
  };
  auto large = gemma3(62, 5376, 32, 16, 128);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->head_dim, 128);
  EXPECT_FLOAT_EQ(large->attention_scale, 1.0f / std::sqrt(168.0f));
  EXPECT_FALSE(large->IsLocalLayer(5));
  auto medium = gemma3(48, 3840, 16, 8, 256);
  ASSERT_TRUE(medium.ok()) << medium.status();
  EXPECT_FLOAT_EQ(medium->attention_scale, 1.0f / 16.0f);
}

// The flags of design.md §10's table of families.
TEST(TinyLlamaTest, EachFamilySetsItsFlags) {
  const struct {
    std::string architecture;
    RopeStyle rope_style;
    FfnActivation activation;
    bool scaled_embedding, qk_norm, post_norms, qkv_bias;
  } families[] = {
      {"llama", RopeStyle::kAdjacentPairs, FfnActivation::kSilu, false, false, false, false},
      {"gemma3", RopeStyle::kHalves, FfnActivation::kGeluTanh, true, true, true, false},
      {"qwen2", RopeStyle::kHalves, FfnActivation::kSilu, false, false, false, true},
      {"qwen3", RopeStyle::kHalves, FfnActivation::kSilu, false, true, false, false},
  };
  for (const auto& f : families) {
    TinyLlama tiny([&](GgufBuilder& b) { TinyLlama::AddMetadata(b, f.architecture); });
    auto config = tiny.Config();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->rope_style, f.rope_style) << f.architecture;
    EXPECT_EQ(config->ffn_activation, f.activation) << f.architecture;
    EXPECT_EQ(config->embedding_scale, f.scaled_embedding ? 8.0f : 1.0f) << f.architecture;
    EXPECT_EQ(config->qk_norm, f.qk_norm) << f.architecture;
    EXPECT_EQ(config->post_norms, f.post_norms) << f.architecture;
    EXPECT_EQ(config->qkv_bias, f.qkv_bias) << f.architecture;
  }
}

// Without the optional keys: as many KV heads as heads, RoPE over the whole head at base
// 10000 and unscaled, RMS epsilon 1e-5, no sliding window.
TEST(TinyLlamaTest, AbsentOptionalKeysTakeTheirDefaults) {
  TinyLlama tiny([](GgufBuilder& b) {
    TinyLlama::AddMetadata(b);
    Drop(b, "llama.attention.head_count_kv");
    Drop(b, "llama.rope.freq_base");
    Drop(b, "llama.attention.layer_norm_rms_epsilon");
  });
  auto config = tiny.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->rope_dims, 16);
  EXPECT_EQ(config->rope_freq_base, 10000.0f);
  EXPECT_EQ(config->rope_freq_scale, 1.0f);
  EXPECT_EQ(config->rms_norm_eps, 1e-5f);
  EXPECT_EQ(config->attention_scale, 0.25f);
  EXPECT_EQ(config->embedding_scale, 1.0f);
  EXPECT_EQ(config->sliding_window, 0);
}

TEST(TinyLlamaTest, ReadsTheOptionalKeys) {
  TinyLlama tiny([](GgufBuilder& b) {
    TinyLlama::AddMetadata(b);
    b.AddUint32("llama.attention.key_length", 32);
    b.AddUint32("llama.attention.value_length", 32);
    b.AddUint32("llama.rope.dimension_count", 8);
    b.AddString("llama.rope.scaling.type", "linear");
    b.AddFloat32("llama.rope.scaling.factor", 4.0f);
    b.AddUint32("llama.vocab_size", 40);
    b.AddUint32("llama.expert_count", 0);
    b.AddFloat32("llama.final_logit_softcapping", 0.0f);
    b.AddUint32("llama.attention.sliding_window", 16);  // llama has no sliding window
  });
  auto config = tiny.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 32);
  EXPECT_EQ(config->QDim(0), 128);
  EXPECT_FLOAT_EQ(config->attention_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_EQ(config->rope_dims, 8);
  EXPECT_EQ(config->rope_freq_scale, 0.25f);
  EXPECT_EQ(config->sliding_window, 0);
  TinyLlama unscaled([](GgufBuilder& b) {
    TinyLlama::AddMetadata(b);
    b.AddString("llama.rope.scaling.type", "none");
    b.AddFloat32("llama.rope.scaling.factor", 4.0f);
  });
  config = unscaled.Config();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_freq_scale, 1.0f);
}

// Each key is held to its range and to the keys it must agree with (tiny: 4 heads of 16 over 2
// KV heads, 40 embedding rows).
// A metadata edit and the error it must cause.
using Edit = std::function<void(GgufBuilder&)>;
struct RefusalCase {
  Edit edit;
  absl::StatusCode code;
  std::string message;
};
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;
Edit SetUint(const std::string& key, uint32_t value) {
  return [=](GgufBuilder& b) { Drop(b, key).AddUint32(key, value); };
}
Edit SetFloat(const std::string& key, float value) {
  return [=](GgufBuilder& b) { Drop(b, key).AddFloat32(key, value); };
}

TEST(TinyLlamaTest, RejectsEachKeyOutOfRange) {
  const auto set_uint = SetUint;
  const auto set_float = SetFloat;
  const RefusalCase cases[] = {
      {[](GgufBuilder& b) { Drop(b, "llama.feed_forward_length"); }, absl::StatusCode::kNotFound,
       "llama.feed_forward_length"},
      {set_uint("llama.context_length", 0), kInvalid,
       "llama.context_length = 0 is out of range [1, 2147483648]"},
      {set_uint("llama.attention.head_count_kv", 0), kInvalid,
       "llama.attention.head_count_kv = 0 is out of range [1, 2147483648]"},
      {set_uint("llama.attention.head_count_kv", 3), kInvalid,
       "attention.head_count 4 is not a multiple of attention.head_count_kv 3"},
      {set_uint("llama.attention.value_length", 8), kInvalid,
       "attention.key_length 16 != attention.value_length 8 is not supported"},
      {set_uint("llama.rope.dimension_count", 7), kInvalid,
       "rope.dimension_count 7 must be even and at most the head width 16"},
      {set_uint("llama.rope.dimension_count", 18), kInvalid,
       "rope.dimension_count 18 must be even and at most the head width 16"},
      {set_float("llama.rope.freq_base", 0.0f), kInvalid,
       "rope.freq_base 0 / layer_norm_rms_epsilon 1e-05 out of range"},
      {set_float("llama.attention.layer_norm_rms_epsilon", -1.0f), kInvalid,
       "rope.freq_base 10000 / layer_norm_rms_epsilon -1 out of range"},
      {[](GgufBuilder& b) {
         b.AddString("llama.rope.scaling.type", "linear");
         b.AddFloat32("llama.rope.scaling.factor", 0.0f);
       },
       kInvalid, "rope.scaling.factor must be positive"},
      {[](GgufBuilder& b) { b.AddString("llama.rope.scaling.type", "longrope"); }, kUnimplemented,
       "rope scaling type \"longrope\" is not supported"},
      {set_uint("llama.expert_count", 8), kUnimplemented,
       "llama with experts (8) is not supported; the mixture-of-experts architectures supported "
       "are qwen3moe, gemma4 and gpt-oss"},
      {set_float("llama.final_logit_softcapping", 30.0f), kUnimplemented,
       "final logit soft-capping (30) is not supported"},
      {set_uint("llama.vocab_size", 41), kInvalid,
       "llama.vocab_size 41 != token_embd.weight rows 40"},
      {[](GgufBuilder& b) {
         b.AddStringArray("tokenizer.ggml.tokens", std::vector<std::string>(41, "a"));
       },
       kInvalid, "tokenizer has 41 tokens but token_embd.weight only 40 rows"},
  };
  for (const auto& c : cases) {
    TinyLlama tiny([&](GgufBuilder& b) {
      TinyLlama::AddMetadata(b);
      c.edit(b);
    });
    const absl::Status status = tiny.Config().status();
    EXPECT_EQ(status.code(), c.code) << c.message;
    ExpectErrorMentions(status, c.message);
  }
  GgufBuilder metadata;
  TinyLlama::AddMetadata(metadata);
  ExpectErrorMentions(MetadataConfig(metadata, 0).status(), "embedding table has 0 rows");
}

// gemma4 metadata of the tiny shape: layer 0 local (4 heads of 16 over 2 KV heads, RoPE over all
// 16 dims), layer 1 global (4 heads of 32 over 1 KV head, RoPE over 32), window 8, soft-cap 30.
void AddGemma4Metadata(GgufBuilder& b) {
  TinyLlama::AddMetadata(b, "gemma4");
  Drop(b, "gemma4.attention.head_count_kv");
  b.AddUint32Array("gemma4.attention.head_count_kv", {2, 1});
  b.AddUint32("gemma4.attention.key_length", 32);
  b.AddUint32("gemma4.attention.value_length", 32);
  b.AddUint32("gemma4.attention.key_length_swa", 16);
  b.AddUint32("gemma4.attention.value_length_swa", 16);
  b.AddUint32("gemma4.rope.dimension_count", 32);
  b.AddUint32("gemma4.rope.dimension_count_swa", 16);
  b.AddFloat32("gemma4.rope.freq_base_swa", 10000.0f);
  b.AddUint32("gemma4.attention.sliding_window", 8);
  b.AddArray("gemma4.attention.sliding_window_pattern", gguf::ValueType::kBool,
             std::vector<uint8_t>{1, 0});
  b.AddFloat32("gemma4.final_logit_softcapping", 30.0f);
  b.AddUint32("gemma4.embedding_length_per_layer_input", 0);
  b.AddUint32("gemma4.attention.shared_kv_layers", 0);
}

// gemma4: each layer kind's head width, RoPE dims and KV heads, attention scale 1, the soft-cap,
// the value norm and layer output scale; a layer without attn_v takes v from k.
TEST(ModelConfigTest, Gemma4ReadsPerLayerAttentionShapes) {
  GgufBuilder b;
  AddGemma4Metadata(b);
  auto config = MetadataConfig(b, 40);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->IsLocalLayer(0));
  EXPECT_FALSE(config->IsLocalLayer(1));
  EXPECT_EQ(config->HeadDim(0), 16);
  EXPECT_EQ(config->HeadDim(1), 32);
  EXPECT_EQ(config->RopeDims(0), 16);
  EXPECT_EQ(config->RopeDims(1), 32);
  EXPECT_EQ(config->NumKvHeads(0), 2);
  EXPECT_EQ(config->NumKvHeads(1), 1);
  EXPECT_EQ(config->QDim(0), 4 * 16);
  EXPECT_EQ(config->QDim(1), 4 * 32);
  EXPECT_EQ(config->KvDim(0), 2 * 16);
  EXPECT_EQ(config->KvDim(1), 1 * 32);
  EXPECT_EQ(config->MaxQDim(), 128);
  EXPECT_EQ(config->MaxKvDim(), 32);
  EXPECT_EQ(config->RopeFreqBase(0), 10000.0f);
  EXPECT_EQ(config->attention_scale, 1.0f);
  EXPECT_EQ(config->final_logit_softcap, 30.0f);
  EXPECT_EQ(config->embedding_scale, 8.0f);
  EXPECT_TRUE(config->value_norm && config->layer_output_scale && config->qk_norm &&
              config->post_norms);
  EXPECT_EQ(config->ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_FALSE(config->ValueIsKey(1));

  ReadTensorLayout([](const std::string& name) { return name != "blk.1.attn_v.weight"; }, *config);
  EXPECT_FALSE(config->ValueIsKey(0));
  EXPECT_TRUE(config->ValueIsKey(1));
  const LinearGroupId global_qkv{1, LinearGroup::kQkv};
  EXPECT_EQ(LinearGroupTensorNames(*config, global_qkv),
            (std::vector<std::string>{"blk.1.attn_q.weight", "blk.1.attn_k.weight"}));
  EXPECT_EQ(LinearGroupOutputDims(*config, global_qkv), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(LinearGroupOutputDims(*config, {0, LinearGroup::kQkv}),
            (std::vector<int64_t>{64, 32, 32}));
  EXPECT_EQ(LinearGroupInputDim(*config, {1, LinearGroup::kAttnOutput}), 128);
  EXPECT_EQ(KvCache::LayerKvDims(*config), (std::vector<int64_t>{32, 32}));
  const std::vector<LayerVectorSpec> specs = LayerVectorSpecs(*config, 1);
  const auto q_norm = std::find_if(specs.begin(), specs.end(), [](const LayerVectorSpec& spec) {
    return std::string(spec.tensor) == "attn_q_norm.weight";
  });
  ASSERT_NE(q_norm, specs.end());
  EXPECT_EQ(q_norm->length, 32);
  EXPECT_TRUE(std::any_of(specs.begin(), specs.end(), [](const LayerVectorSpec& spec) {
    return std::string(spec.tensor) == "layer_output_scale.weight" && spec.length == 1;
  }));
}

// Each layout's groups per layer, and FindLinearGroupIndex as the inverse of AllLinearGroups:
// group i of the list has index i; a group the layers do not have, a layer out of range and a
// head with a layer have none.
TEST(LinearGroupLayoutTest, IndexInvertsTheGroupList) {
  using G = LinearGroup;
  const struct {
    LinearGroupLayout layout;
    std::vector<LinearGroup> per_layer;
  } cases[] = {
      {{.num_layers = 3}, {G::kQkv, G::kAttnOutput, G::kGateUp, G::kDown}},
      {{.num_layers = 2, .dense_ffn = false, .experts = true},
       {G::kQkv, G::kAttnOutput, G::kExpertGateUp, G::kExpertDown}},
      {{.num_layers = 2, .dense_ffn = true, .experts = true},
       {G::kQkv, G::kAttnOutput, G::kGateUp, G::kDown, G::kExpertGateUp, G::kExpertDown}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.layout.LayerGroups(), c.per_layer);
    const std::vector<LinearGroupId> all = AllLinearGroups(c.layout);
    ASSERT_EQ(all.size(), c.layout.num_layers * c.per_layer.size() + 1);
    EXPECT_EQ(all.back(), LinearGroupId::Head());
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ(FindLinearGroupIndex(c.layout, all[i]), static_cast<int64_t>(i));
    }
    for (int g = 0; g < kNumLinearGroups; ++g) {
      const auto group = static_cast<LinearGroup>(g);
      if (group == G::kOutputHead) continue;
      const bool has =
          std::find(c.per_layer.begin(), c.per_layer.end(), group) != c.per_layer.end();
      EXPECT_EQ(FindLinearGroupIndex(c.layout, {0, group}) >= 0, has) << LinearGroupName(group);
      EXPECT_EQ(FindLinearGroupIndex(c.layout, {c.layout.num_layers, group}), -1);
      EXPECT_EQ(FindLinearGroupIndex(c.layout, {-1, group}), -1);
    }
    EXPECT_EQ(FindLinearGroupIndex(c.layout, {0, G::kOutputHead}), -1);
  }
}

// The E2B/E4B features and malformed per-layer keys are refused by name.
TEST(ModelConfigTest, Gemma4RefusesWhatItDoesNotRun) {
  const auto set_uint = SetUint;
  const RefusalCase cases[] = {
      {set_uint("gemma4.attention.shared_kv_layers", 4), kUnimplemented, "shared-KV layers (4)"},
      {set_uint("gemma4.embedding_length_per_layer_input", 256), kUnimplemented,
       "per-layer embeddings (256 wide)"},
      {[](GgufBuilder& b) {
         Drop(b, "gemma4.feed_forward_length")
             .AddUint32Array("gemma4.feed_forward_length", {96, 96});
       },
       kUnimplemented, "per-layer feed_forward_length"},
      {set_uint("gemma4.attention.sliding_window_pattern", 2), kInvalid,
       "must be a per-layer bool array"},
      {[](GgufBuilder& b) { Drop(b, "gemma4.attention.sliding_window"); }, kInvalid,
       "gemma4.attention.sliding_window is missing"},
      {[](GgufBuilder& b) {
         Drop(b, "gemma4.attention.head_count_kv")
             .AddUint32Array("gemma4.attention.head_count_kv", {2});
       },
       kInvalid, "has 1 entries for 2 layers"},
      {[](GgufBuilder& b) {
         Drop(b, "gemma4.attention.head_count_kv")
             .AddUint32Array("gemma4.attention.head_count_kv", {2, 3});
       },
       kInvalid, "is not a multiple of attention.head_count_kv 3"},
      {set_uint("gemma4.attention.value_length_swa", 8), kInvalid,
       "attention.key_length_swa 16 != attention.value_length_swa 8"},
      {set_uint("gemma4.rope.dimension_count_swa", 18), kInvalid,
       "rope.dimension_count_swa 18 must be even and at most the head width 16"},
      {set_uint("gemma4.expert_count", 8), absl::StatusCode::kNotFound, "gemma4.expert_used_count"},
  };
  for (const auto& c : cases) {
    GgufBuilder b;
    AddGemma4Metadata(b);
    c.edit(b);
    const absl::Status status = MetadataConfig(b, 40).status();
    EXPECT_EQ(status.code(), c.code) << c.message << ": " << status;
    ExpectErrorMentions(status, c.message);
  }
  // Soft-capping is the gemma families' only.
  GgufBuilder qwen;
  TinyLlama::AddMetadata(qwen, "qwen3");
  qwen.AddFloat32("qwen3.final_logit_softcapping", 30.0f);
  ExpectErrorMentions(MetadataConfig(qwen, 40).status(),
                      "qwen3: final logit soft-capping (30) is not supported");
}

// qwen3moe: the expert keys, llama.cpp's routing rules, and a clear error for every other rule.
TEST(ModelConfigTest, Qwen3MoeReadsItsExpertsAndRefusesOtherRouting) {
  auto config_with = [](const Edit& edit) {
    GgufBuilder b;
    TinyLlama::AddMetadata(b, "qwen3moe");
    b.AddUint32("qwen3moe.expert_count", 16);
    b.AddUint32("qwen3moe.expert_used_count", 4);
    b.AddUint32("qwen3moe.expert_feed_forward_length", 24);
    edit(b);
    return MetadataConfig(b, 40);
  };
  auto config = config_with([](GgufBuilder&) {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->has_experts());
  EXPECT_EQ(config->num_experts, 16);
  EXPECT_EQ(config->num_experts_used, 4);
  EXPECT_EQ(config->d_ff_expert, 24);
  EXPECT_EQ(config->expert_weights_scale, 1.0f);
  EXPECT_TRUE(config->qk_norm);
  EXPECT_EQ(config->rope_style, RopeStyle::kHalves);
  // The keys may restate llama.cpp's rules.
  config = config_with([](GgufBuilder& b) {
    b.AddBool("qwen3moe.expert_weights_norm", true);
    b.AddFloat32("qwen3moe.expert_weights_scale", 1.0f);
    b.AddUint32("qwen3moe.expert_gating_func", 1);
  });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->expert_weights_scale, 1.0f);
  // Dense families have no experts.
  GgufBuilder dense;
  TinyLlama::AddMetadata(dense, "qwen3");
  ASSERT_TRUE(MetadataConfig(dense, 40).ok());
  EXPECT_FALSE(MetadataConfig(dense, 40)->has_experts());

  const struct {
    Edit edit;
    absl::StatusCode code;
    std::string message;
  } cases[] = {
      {[](GgufBuilder& b) { Drop(b, "qwen3moe.expert_count"); }, absl::StatusCode::kNotFound,
       "qwen3moe.expert_count"},
      {[](GgufBuilder& b) {
         Drop(b, "qwen3moe.expert_used_count").AddUint32("qwen3moe.expert_used_count", 17);
       },
       absl::StatusCode::kInvalidArgument,
       "qwen3moe.expert_used_count = 17 is out of range [1, 16]"},
      {[](GgufBuilder& b) { Drop(b, "qwen3moe.expert_feed_forward_length"); },
       absl::StatusCode::kNotFound, "qwen3moe.expert_feed_forward_length"},
      {[](GgufBuilder& b) { b.AddUint32("qwen3moe.expert_shared_count", 1); },
       absl::StatusCode::kUnimplemented, "qwen3moe: shared experts (1) are not supported"},
      {[](GgufBuilder& b) { b.AddUint32("qwen3moe.expert_gating_func", 2); },
       absl::StatusCode::kUnimplemented,
       "qwen3moe: expert gating function 2 is not supported (softmax only)"},
      {[](GgufBuilder& b) { b.AddBool("qwen3moe.expert_weights_norm", false); },
       absl::StatusCode::kUnimplemented, "qwen3moe: expert_weights_norm must be true"},
      {[](GgufBuilder& b) { b.AddFloat32("qwen3moe.expert_weights_scale", 2.5f); },
       absl::StatusCode::kUnimplemented, "qwen3moe: expert_weights_scale 2.5 is not supported"},
  };
  for (const auto& c : cases) {
    const absl::Status status = config_with(c.edit).status();
    EXPECT_EQ(status.code(), c.code) << c.message << ": " << status;
    ExpectErrorMentions(status, c.message);
  }
}

// gpt-oss: its family rules (sinks, biases, top-k-then-softmax gating, the swiglu_oai activation,
// the pre-FFN norm under llama.cpp's post_attention_norm name), the local/global alternation
// from a local layer 0 (llama.cpp's set_swa_pattern(2)), local layers with the global RoPE base
// and scaling, and YaRN read as llama_context derives it.
TEST(ModelConfigTest, GptOssReadsItsLayersAndYarn) {
  auto config_with = [](const Edit& edit) {
    GgufBuilder b;
    TinyLlama::AddMetadata(b, "gpt-oss");
    b.AddUint32("gpt-oss.expert_count", 8);
    b.AddUint32("gpt-oss.expert_used_count", 2);
    b.AddUint32("gpt-oss.expert_feed_forward_length", 32);
    b.AddUint32("gpt-oss.attention.sliding_window", 16);
    b.AddString("gpt-oss.rope.scaling.type", "yarn");
    b.AddFloat32("gpt-oss.rope.scaling.factor", 32.0f);
    b.AddUint32("gpt-oss.rope.scaling.original_context_length", 4096);
    edit(b);
    return MetadataConfig(b, 40);
  };
  auto config = config_with([](GgufBuilder&) {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ffn_activation, FfnActivation::kSwigluOai);
  EXPECT_EQ(config->expert_gating, ExpertGating::kTopKThenSoftmax);
  EXPECT_TRUE(config->expert_biases && config->attention_sinks && config->attn_output_bias &&
              config->qkv_bias);
  EXPECT_FALSE(config->dense_ffn);
  EXPECT_EQ(config->ffn_norm_tensor, "post_attention_norm.weight");
  EXPECT_EQ(config->rope_style, RopeStyle::kHalves);
  EXPECT_EQ(config->sliding_window, 16);
  EXPECT_EQ(config->layer_is_local, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(config->RopeFreqBase(0), 10000.0f);  // the global base: no freq_base_swa
  EXPECT_EQ(config->RopeFreqScale(0), 1.0f / 32.0f);
  EXPECT_EQ(config->RopeFreqScale(1), 1.0f / 32.0f);
  EXPECT_EQ(config->rope_ext_factor, 1.0f);
  EXPECT_EQ(config->rope_yarn_original_context, 4096);
  // llama.cpp: get_mscale(32) / (1 + 0.1 ln 32), in f32; within an ulp or two of 1.
  const float mscale = 0.1f * std::log(32.0f) + 1.0f;
  EXPECT_EQ(config->rope_attn_factor, mscale * (1.0f / (1.0f + 0.1f * std::log(32.0f))));
  EXPECT_NEAR(config->rope_attn_factor, 1.0f, 1e-6f);
  // Linear scaling and no scaling leave YaRN off; an attn_factor key multiplies either way.
  config = config_with([](GgufBuilder& b) {
    Drop(b, "gpt-oss.rope.scaling.type").AddString("gpt-oss.rope.scaling.type", "linear");
    b.AddFloat32("gpt-oss.rope.scaling.attn_factor", 0.5f);
    b.AddFloat32("gpt-oss.rope.freq_base_swa", 500.0f);
  });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_ext_factor, 0.0f);
  EXPECT_EQ(config->rope_attn_factor, 0.5f);
  EXPECT_EQ(config->RopeFreqBase(0), 500.0f);
  EXPECT_EQ(config->RopeFreqBase(1), 10000.0f);
  const struct {
    Edit edit;
    absl::StatusCode code;
    std::string message;
  } cases[] = {
      {[](GgufBuilder& b) { b.AddFloat32("gpt-oss.rope.scaling.yarn_log_multiplier", 0.1f); },
       absl::StatusCode::kUnimplemented, "yarn_log_multiplier 0.1 is not supported"},
      {[](GgufBuilder& b) {
         Drop(b, "gpt-oss.rope.scaling.type").AddString("gpt-oss.rope.scaling.type", "longrope");
       },
       absl::StatusCode::kUnimplemented, "rope scaling type \"longrope\" is not supported"},
      {[](GgufBuilder& b) { b.AddFloat32("gpt-oss.expert_weights_scale", 2.0f); },
       absl::StatusCode::kUnimplemented, "gpt-oss: expert_weights_scale 2 is not supported"},
      {[](GgufBuilder& b) { Drop(b, "gpt-oss.expert_count"); }, absl::StatusCode::kNotFound,
       "gpt-oss.expert_count"},
  };
  for (const auto& c : cases) {
    const absl::Status status = config_with(c.edit).status();
    EXPECT_EQ(status.code(), c.code) << c.message << ": " << status;
    ExpectErrorMentions(status, c.message);
  }
}

TEST(TinyLlamaTest, RejectsHeadsThatDoNotDivideTheWidth) {
  TinyLlama tiny([](GgufBuilder& b) { TinyLlama::AddMetadata(b, "llama", 6); });
  ExpectErrorMentions(tiny.Config().status(), "head_count");
}

TEST(TinyLlamaTest, RejectsMissingHyperparameter) {
  TinyLlama tiny([](GgufBuilder& b) { b.AddString("general.architecture", "llama"); });
  ExpectErrorMentions(tiny.Config().status(), "llama.block_count");
}

// A tiny qwen3moe: TinyLlama's attention with QK-norm, and 4 experts of width 32 (2 used) in
// each layer's FFN.
TinyLlama TinyQwen3Moe(const std::function<void(GgufBuilder&)>& edit = nullptr) {
  return TinyLlama(
      [](GgufBuilder& b) {
        TinyLlama::AddMetadata(b, "qwen3moe");
        b.AddUint32("qwen3moe.expert_count", 4);
        b.AddUint32("qwen3moe.expert_used_count", 2);
        b.AddUint32("qwen3moe.expert_feed_forward_length", 32);
      },
      [&edit](GgufBuilder& b) {
        std::erase_if(b.tensors(), [](const GgufBuilder::Tensor& t) {
          return t.name.find(".ffn_gate.") != std::string::npos ||
                 t.name.find(".ffn_up.") != std::string::npos ||
                 t.name.find(".ffn_down.") != std::string::npos;
        });
        for (int i = 0; i < 2; ++i) {
          const std::string p = "blk." + std::to_string(i) + ".";
          b.AddF32Tensor(p + "attn_q_norm.weight", {16}, std::vector<float>(16, 1.0f));
          b.AddF32Tensor(p + "attn_k_norm.weight", {16}, std::vector<float>(16, 1.0f));
          b.AddTensor(p + "ffn_gate_inp.weight", GgmlType::kF32, {64, 4});
          b.AddTensor(p + "ffn_gate_exps.weight", GgmlType::kQ8_0, {64, 32, 4});
          b.AddTensor(p + "ffn_up_exps.weight", GgmlType::kQ8_0, {64, 32, 4});
          b.AddTensor(p + "ffn_down_exps.weight", GgmlType::kF16, {32, 64, 4});
        }
        if (edit) edit(b);
      });
}

TEST(TinyLlamaTest, Qwen3MoeExpertsAreViewsOfTheThreeDimensionalTensors) {
  TinyLlama tiny = TinyQwen3Moe();
  auto weights = tiny.Weights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LayerWeights& layer = weights->layers[1];
  EXPECT_EQ(layer.vectors.router.rows, 4);
  EXPECT_EQ(layer.vectors.router.cols, 64);
  ASSERT_EQ(layer.expert_gate_up.size(), 4u);
  ASSERT_EQ(layer.expert_down.size(), 4u);
  // The expert groups hold the 3-D tensors as tall matrices; qwen3moe has no dense FFN.
  const gguf::TensorInfo* gate = tiny.file->FindTensor("blk.1.ffn_gate_exps.weight");
  const gguf::TensorInfo* up = tiny.file->FindTensor("blk.1.ffn_up_exps.weight");
  const gguf::TensorInfo* down = tiny.file->FindTensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(gate, nullptr);
  ASSERT_NE(up, nullptr);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(layer.w_gate.data, nullptr);
  ASSERT_EQ(layer.experts_gate_up.size(), 2u);
  EXPECT_EQ(layer.experts_gate_up[0].data, gate->data);
  EXPECT_EQ(layer.experts_gate_up[1].data, up->data);
  EXPECT_EQ(layer.experts_gate_up[0].rows, 4 * 32);
  EXPECT_EQ(layer.experts_down.rows, 4 * 64);
  EXPECT_EQ(layer.experts_down.cols, 32);
  for (size_t e = 0; e < 4; ++e) {
    // Expert e's rows follow the e earlier experts' d_ff_expert (gate) or d_model (down) rows.
    ASSERT_EQ(layer.expert_gate_up[e].size(), 2u);
    EXPECT_EQ(layer.expert_gate_up[e][0].data, gate->data + e * gate->num_bytes / 4);
    EXPECT_EQ(layer.expert_gate_up[e][1].data, up->data + e * up->num_bytes / 4);
    EXPECT_EQ(layer.expert_gate_up[e][0].rows, 32);
    EXPECT_EQ(layer.expert_gate_up[e][0].cols, 64);
    ASSERT_EQ(layer.expert_down[e].size(), 1u);
    EXPECT_EQ(layer.expert_down[e][0].data, down->data + e * down->num_bytes / 4);
    EXPECT_EQ(layer.expert_down[e][0].rows, 64);
    EXPECT_EQ(layer.expert_down[e][0].row_bytes, 32 * 2);  // F16
  }
}

TEST(TinyLlamaTest, Qwen3MoeTensorErrorsNameTheTensor) {
  TinyLlama missing = TinyQwen3Moe([](GgufBuilder& b) {
    std::erase_if(b.tensors(), [](const GgufBuilder::Tensor& t) {
      return t.name == "blk.1.ffn_down_exps.weight";
    });
  });
  ExpectErrorMentions(missing.Weights().status(), "tensor blk.1.ffn_down_exps.weight is missing");
  TinyLlama wrong = TinyQwen3Moe([](GgufBuilder& b) {
    for (auto& t : b.tensors()) {
      if (t.name != "blk.0.ffn_up_exps.weight") continue;
      t.dims = {64, 32, 3};
      t.data.resize(GgufBuilder::TensorBytes(t.type, t.dims).value());
    }
  });
  ExpectErrorMentions(wrong.Weights().status(),
                      "tensor blk.0.ffn_up_exps.weight has dims {64, 32, 3}, expected {64, 32, 4}");
  TinyLlama dense = TinyQwen3Moe([](GgufBuilder& b) {
    b.AddTensor("blk.0.ffn_gate.weight", GgmlType::kQ8_0, {64, 96});
  });
  ExpectErrorMentions(dense.Weights().status(),
                      "tensor blk.0.ffn_gate.weight is not part of a 2-layer qwen3moe model");
}

TEST(TinyLlamaTest, RejectsMissingTensorByName) {
  TinyLlama tiny;
  tiny.Tensor("blk.1.ffn_up.weight").name = "blk.1.ffn_up_renamed.weight";
  ExpectErrorMentions(tiny.Weights().status(), "blk.1.ffn_up.weight");
}

TEST(TinyLlamaTest, RejectsWrongDimsByName) {
  TinyLlama tiny;
  auto& tensor = tiny.Tensor("blk.0.attn_k.weight");
  tensor.dims = {64, 64};
  tensor.data.resize(GgufBuilder::TensorBytes(tensor.type, tensor.dims).value());
  const absl::Status status = tiny.Weights().status();
  ExpectErrorMentions(status, "blk.0.attn_k.weight");
  ExpectErrorMentions(status, "{64, 32}");
}

TEST(TinyLlamaTest, RejectsNonF32Norm) {
  TinyLlama tiny;
  auto& tensor = tiny.Tensor("blk.1.ffn_norm.weight");
  tensor.type = static_cast<uint32_t>(GgmlType::kF16);
  tensor.data.resize(64 * 2);
  ExpectErrorMentions(tiny.Weights().status(), "blk.1.ffn_norm.weight");
}

TEST(TinyLlamaTest, RejectsUndequantizableType) {
  TinyLlama tiny;
  auto& tensor = tiny.Tensor("blk.0.attn_q.weight");
  tensor.type = static_cast<uint32_t>(GgmlType::kI32);
  tensor.data.resize(64 * 64 * 4);
  const absl::Status status = tiny.Weights().status();
  ExpectErrorMentions(status, "blk.0.attn_q.weight");
  ExpectErrorMentions(status, "cannot be dequantized");
}

TEST(TinyLlamaTest, RejectsBiasTensors) {
  TinyLlama tiny(nullptr, [](GgufBuilder& b) { b.AddF32Tensor("blk.0.attn_q.bias", {64}, kOnes); });
  ExpectErrorMentions(tiny.Weights().status(), "blk.0.attn_q.bias");
}

TEST(TinyLlamaTest, RejectsAnEmbeddingLengthTheEmbeddingTableDoesNotHave) {
  TinyLlama tiny([](GgufBuilder& b) {
    TinyLlama::AddMetadata(b);
    Drop(b, "llama.embedding_length").AddUint32("llama.embedding_length", 128);
  });
  const absl::Status status = tiny.Config().status();
  ExpectErrorMentions(status, "llama.embedding_length = 128");
  ExpectErrorMentions(status, "token_embd.weight is 64 wide");
}

TEST(TinyLlamaTest, RejectsAGapInTheLayerIndices) {
  TinyLlama tiny;
  for (auto& tensor : tiny.builder.tensors()) {
    if (tensor.name.rfind("blk.1.", 0) == 0) tensor.name.replace(0, 6, "blk.2.");
  }
  const absl::Status status = tiny.Config().status();
  ExpectErrorMentions(status, "'blk.2.attn_norm.weight' belongs to layer 2");
}

// The weights are held to their own file's tensor table, whatever config they are given.
TEST(TinyLlamaTest, WeightsRefuseAForgedLayerCountQuickly) {
  TinyLlama tiny;
  ModelConfig config = *tiny.Config();
  for (const int64_t layers : {int64_t{0x7fffffff}, int64_t{0x80000000}, int64_t{3}}) {
    config.num_layers = layers;
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = ModelWeightsFromGguf(*tiny.file, config).status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << layers;
    ExpectErrorMentions(status, absl::StrCat("llama.block_count = ", layers));
  }
}

// A copy of the real SmolLM2 file in a temporary directory, with bytes patched in place.
class PatchedSmolLm2 {
 public:
  PatchedSmolLm2() {
    std::string pattern = (std::filesystem::temp_directory_path() / "bitsplit-config-XXXXXX");
    EXPECT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/model.gguf";
    std::filesystem::copy_file(testing::ModelPath(testing::kSmolLm2File), path_);
    std::ifstream in(path_, std::ios::binary);
    header_.resize(1 << 16);
    in.read(reinterpret_cast<char*>(header_.data()), static_cast<std::streamsize>(header_.size()));
  }
  ~PatchedSmolLm2() { std::filesystem::remove_all(dir_); }

  const std::string& path() const { return path_; }
  // Offset of the value of the first metadata entry `key` whose type is UINT32.
  size_t Uint32ValueOffset(const std::string& key) const {
    const std::string needle = key + std::string("\x04\0\0\0", 4);
    auto it = std::search(header_.begin(), header_.end(), needle.begin(), needle.end());
    EXPECT_NE(it, header_.end()) << key;
    return static_cast<size_t>(it - header_.begin()) + needle.size();
  }
  void PatchUint32(size_t offset, uint32_t value) {
    std::memcpy(header_.data() + offset, &value, 4);
    std::fstream out(path_, std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(static_cast<std::streamoff>(offset));
    out.write(reinterpret_cast<const char*>(&value), 4);
  }

 private:
  std::string dir_;
  std::string path_;
  std::vector<uint8_t> header_;  // the first 64 KiB: all of the metadata but the tokenizer's
};

// `bitsplit generate`, the drafter and the coordinator load through LlamaModel::Load or the
// split loader (ModelConfigFromGgufMetadata, below); a forged block_count must come back as an
// error naming the key and its bound, at once, never as an allocation of 2^31 layers.
TEST(ForgedBlockCountTest, RealFileLoadFailsFastNamingTheBound) {
  PatchedSmolLm2 model;
  const size_t at = model.Uint32ValueOffset("llama.block_count");
  EXPECT_EQ(at, 486u);  // where the file format puts it in this file (the 30 is there)
  for (const uint32_t forged : {0x7fffffffu, 0x80000000u}) {
    model.PatchUint32(at, forged);
    const auto start = std::chrono::steady_clock::now();
    auto loaded = LlamaModel::Load(model.path(), 1);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << forged;
    ASSERT_FALSE(loaded.ok()) << forged;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    ExpectErrorMentions(loaded.status(), absl::StrCat("llama.block_count = ", forged,
                                                      " is out of range [1, ", kMaxLayers, "]"));
  }
}

TEST(ForgedBlockCountTest, RealFileNamesTheStrayOrMissingLayer) {
  PatchedSmolLm2 model;
  const size_t at = model.Uint32ValueOffset("llama.block_count");
  const struct {
    uint32_t block_count;
    std::string expected;
  } cases[] = {
      {1, "llama.block_count = 1, but tensor 'blk.1.attn_norm.weight' belongs to layer 1"},
      {29, "llama.block_count = 29, but tensor 'blk.29.attn_norm.weight' belongs to layer 29"},
      {31,
       "llama.block_count = 31, but the tensor table has no blk.30.* tensors (it has blk.N "
       "tensors for 30 layers)"},
  };
  for (const auto& c : cases) {
    model.PatchUint32(at, c.block_count);
    auto loaded = LlamaModel::Load(model.path(), 1);
    ASSERT_FALSE(loaded.ok()) << c.block_count;
    ExpectErrorMentions(loaded.status(), c.expected);
  }
  model.PatchUint32(at, 30);
  EXPECT_TRUE(LlamaModel::Load(model.path(), 1).ok());
}

// A split model's base file embeds the source metadata without tensors (the GGUF prefix up to
// the tensor infos, tensor count 0); its config is read before the split tensor table is.
TEST(ForgedBlockCountTest, TensorLessMetadataImageBoundsTheLayerCount) {
  PatchedSmolLm2 model;
  auto source = gguf::File::Open(model.path());
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<uint8_t> image((*source)->image_data(),
                             (*source)->image_data() + (*source)->metadata_end_offset());
  std::memset(image.data() + 8, 0, 8);  // tensor count
  const size_t at = model.Uint32ValueOffset("llama.block_count");
  for (const uint32_t forged : {0x7fffffffu, 0x80000000u, 1025u}) {
    std::memcpy(image.data() + at, &forged, 4);
    auto metadata = gguf::File::Parse(image.data(), image.size(), "base.bsplit:gguf_metadata");
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    const absl::Status status = ModelConfigFromGgufMetadata(**metadata, 49152).status();
    ExpectErrorMentions(status, absl::StrCat("llama.block_count = ", forged, " is out of range"));
  }
  const uint32_t deepest = kMaxLayers;
  std::memcpy(image.data() + at, &deepest, 4);
  auto metadata = gguf::File::Parse(image.data(), image.size(), "base.bsplit:gguf_metadata");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  auto config = ModelConfigFromGgufMetadata(**metadata, 49152);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, kMaxLayers);
}

}  // namespace
}  // namespace bitsplit::model
