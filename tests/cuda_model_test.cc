// The CUDA forward and speculation engine (common/cuda/cuda_model.h, cuda_session.h) against
// the CPU engine on small random-weight models quantized by `bitsplit quantize`'s code path (a
// llama, gemma3-, qwen2- and qwen3-shaped ones, and the oracle's gemma4 and mixture-of-experts
// fixtures): logits close to the CPU's (the device keeps
// K/V in fp16), batch invariance bit for bit (a token alone = in a batch; a tree node = its
// causal path, also past gemma3's sliding window), the losslessness invariant on the device
// (speculative output == plain decoding, greedy and sampled), the VRAM plan's refusal, and every
// bad-input path. RealModel* tests compare greedy tokens with the CPU on SmolLM2. Skips without
// a GPU (the CudaModelFixtureTest cases, which check the random models on the CPU, run
// everywhere).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#ifdef BITSPLIT_HAVE_CUDA
#include "absl/strings/str_cat.h"
#include "bench/synthetic_model.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_session.h"
#include "common/cuda/device_info.h"
#include "common/io/shm_channel.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/offline/split_quantizer.h"
#include "common/speculation/cpu_session.h"
#include "gmock/gmock.h"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/metrics.h"
#include "tests/testing/random.h"
#include "tests/testing/split_fixture.h"
#include "tests/testing/synthetic_weights.h"
#endif

namespace bitsplit::cuda {
namespace {

#ifndef BITSPLIT_HAVE_CUDA
TEST(CudaModelTest, SkippedWithoutCuda) {
  GTEST_SKIP() << "built without BITSPLIT_CUDA (no nvcc found at configure time)";
}
#else

using model::Batch;
using model::ForwardMode;
using ::testing::HasSubstr;

constexpr int64_t kLayers = 2, kDModel = 128, kDff = 256, kHeads = 4, kKvHeads = 2, kVocab = 320,
                  kContext = 256;

using testing::Gaussian;

// A random-weight llama (2 layers, d 128, 4 heads over 2 KV heads of 32, d_ff 256, vocab 320),
// written as F32 GGUF and split b2_asym/g64 + r8/g32 with rotation 64, like the SmolLM2 fixture.
const testing::SplitModelPaths& TinySplitModel() {
  static const testing::SplitModelPaths paths = [] {
    testing::GgufBuilder b;
    b.AddString("general.architecture", "llama");
    b.AddString("general.name", "tiny-random");
    b.AddUint32("llama.block_count", kLayers);
    b.AddUint32("llama.context_length", kContext);
    b.AddUint32("llama.embedding_length", kDModel);
    b.AddUint32("llama.feed_forward_length", kDff);
    b.AddUint32("llama.attention.head_count", kHeads);
    b.AddUint32("llama.attention.head_count_kv", kKvHeads);
    b.AddFloat32("llama.rope.freq_base", 10000.0f);
    b.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    uint32_t seed = 1;
    auto matrix = [&](const std::string& name, uint64_t cols, uint64_t rows) {
      b.AddF32Tensor(name, {cols, rows}, Gaussian(cols * rows, seed++, 1.0f / std::sqrt(cols)));
    };
    auto norm = [&](const std::string& name) {
      std::vector<float> w = Gaussian(kDModel, seed++, 0.1f);
      for (float& x : w) x += 1.0f;
      b.AddF32Tensor(name, {kDModel}, w);
    };
    b.AddF32Tensor("token_embd.weight", {kDModel, kVocab},
                   Gaussian(kDModel * kVocab, seed++, 1.0f));
    norm("output_norm.weight");
    for (int i = 0; i < kLayers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      norm(p + "attn_norm.weight");
      matrix(p + "attn_q.weight", kDModel, kHeads * 32);
      matrix(p + "attn_k.weight", kDModel, kKvHeads * 32);
      matrix(p + "attn_v.weight", kDModel, kKvHeads * 32);
      matrix(p + "attn_output.weight", kHeads * 32, kDModel);
      norm(p + "ffn_norm.weight");
      matrix(p + "ffn_gate.weight", kDModel, kDff);
      matrix(p + "ffn_up.weight", kDModel, kDff);
      matrix(p + "ffn_down.weight", kDff, kDModel);
    }
    const std::string gguf = (testing::TestTempDir() / "tiny.gguf").string();
    EXPECT_TRUE(testing::WriteFileBytes(gguf, b.Build()));
    const std::string prefix = (testing::TestTempDir() / "tiny").string();
    offline::SplitQuantizeOptions options;
    options.quantization = testing::SplitFixtureQuantization();
    options.num_threads = 2;
    auto summary = offline::QuantizeSplitModel(gguf, model::SplitBasePath(prefix),
                                               model::SplitResidualPath(prefix), options);
    EXPECT_TRUE(summary.ok()) << summary.status();
    return testing::SplitModelPaths{model::SplitBasePath(prefix), model::SplitResidualPath(prefix)};
  }();
  return paths;
}

// The other families' layers, on random weights of the same small size (2 layers, d 128, d_ff
// 256, vocab 320, 4 heads over 2 KV heads), split the same way:
//   gemma3: heads of 64 (q_dim 256 != d_model), GeGLU, embedding x sqrt(128), QK-norm,
//           post-norms, NEOX RoPE with base 1e6 on the global layer 1 and 10000 on the local
//           layer 0, whose sliding window is kFamilyWindow tokens;
//   qwen2:  heads of 32, q/k/v biases, NEOX RoPE;
//   qwen3:  heads of 32, QK-norm, NEOX RoPE.
constexpr int64_t kFamilyWindow = 8;
const char* const kFamilies[] = {"gemma3", "qwen2", "qwen3"};

const testing::SplitModelPaths& FamilySplitModel(const std::string& architecture) {
  static auto* models = new std::map<std::string, testing::SplitModelPaths>();
  if (auto found = models->find(architecture); found != models->end()) return found->second;
  const bool gemma = architecture == "gemma3";
  const int64_t head_dim = gemma ? 64 : 32;
  const std::string a = architecture + ".";
  testing::GgufBuilder b;
  b.AddString("general.architecture", architecture);
  b.AddString("general.name", "tiny-random-" + architecture);
  b.AddUint32(a + "block_count", kLayers);
  b.AddUint32(a + "context_length", kContext);
  b.AddUint32(a + "embedding_length", kDModel);
  b.AddUint32(a + "feed_forward_length", kDff);
  b.AddUint32(a + "attention.head_count", kHeads);
  b.AddUint32(a + "attention.head_count_kv", kKvHeads);
  b.AddUint32(a + "attention.key_length", static_cast<uint32_t>(head_dim));
  b.AddUint32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  b.AddFloat32(a + "rope.freq_base", gemma ? 1000000.0f : 10000.0f);
  b.AddFloat32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (gemma) {
    b.AddUint32(a + "attention.sliding_window", kFamilyWindow);
    b.AddUint32(a + "attention.sliding_window_pattern", 2);  // layer 0 local, layer 1 global
    b.AddFloat32(a + "rope.freq_base_swa", 10000.0f);
  }
  uint32_t seed = 101;
  auto matrix = [&](const std::string& name, uint64_t cols, uint64_t rows) {
    b.AddF32Tensor(name, {cols, rows}, Gaussian(cols * rows, seed++, 1.0f / std::sqrt(cols)));
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float> w = Gaussian(n, seed++, 0.1f);
    for (float& x : w) x += 1.0f;
    b.AddF32Tensor(name, {static_cast<uint64_t>(n)}, w);
  };
  auto bias = [&](const std::string& name, int64_t n) {
    b.AddF32Tensor(name, {static_cast<uint64_t>(n)}, Gaussian(n, seed++, 0.5f));
  };
  const int64_t q_dim = kHeads * head_dim, kv_dim = kKvHeads * head_dim;
  b.AddF32Tensor("token_embd.weight", {kDModel, kVocab},
                 Gaussian(kDModel * kVocab, seed++, gemma ? 0.1f : 1.0f));
  norm("output_norm.weight", kDModel);
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm.weight", kDModel);
    matrix(p + "attn_q.weight", kDModel, q_dim);
    matrix(p + "attn_k.weight", kDModel, kv_dim);
    matrix(p + "attn_v.weight", kDModel, kv_dim);
    matrix(p + "attn_output.weight", q_dim, kDModel);
    norm(p + "ffn_norm.weight", kDModel);
    matrix(p + "ffn_gate.weight", kDModel, kDff);
    matrix(p + "ffn_up.weight", kDModel, kDff);
    matrix(p + "ffn_down.weight", kDff, kDModel);
    if (architecture != "qwen2") {
      norm(p + "attn_q_norm.weight", head_dim);
      norm(p + "attn_k_norm.weight", head_dim);
    }
    if (gemma) {
      norm(p + "post_attention_norm.weight", kDModel);
      norm(p + "post_ffw_norm.weight", kDModel);
    }
    if (architecture == "qwen2") {
      bias(p + "attn_q.bias", q_dim);
      bias(p + "attn_k.bias", kv_dim);
      bias(p + "attn_v.bias", kv_dim);
    }
  }
  const std::string name = "tiny-" + architecture;
  const std::string gguf = (testing::TestTempDir() / (name + ".gguf")).string();
  EXPECT_TRUE(testing::WriteFileBytes(gguf, b.Build()));
  const std::string prefix = (testing::TestTempDir() / name).string();
  offline::SplitQuantizeOptions options;
  options.quantization = testing::SplitFixtureQuantization();
  options.num_threads = 2;
  auto summary = offline::QuantizeSplitModel(gguf, model::SplitBasePath(prefix),
                                             model::SplitResidualPath(prefix), options);
  EXPECT_TRUE(summary.ok()) << architecture << ": " << summary.status();
  return models
      ->emplace(architecture, testing::SplitModelPaths{model::SplitBasePath(prefix),
                                                       model::SplitResidualPath(prefix)})
      .first->second;
}

// The CPU engine and the CUDA engine of one split model; the CUDA verifier's residual is the
// residual file mapped in process.
struct Engines {
  std::unique_ptr<model::LlamaModel> cpu;
  std::unique_ptr<model::SplitModelFiles> files;
  std::unique_ptr<model::InProcessResidual> residual;
  std::unique_ptr<CudaModel> cuda;
};

Engines Load(const testing::SplitModelPaths& paths, CudaModelOptions options) {
  Engines e;
  auto cpu = model::LlamaModel::LoadSplit(paths.base, paths.residual, 2);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  e.cpu = std::move(*cpu);
  auto files = model::SplitModelFiles::Open(paths.base, paths.residual);
  EXPECT_TRUE(files.ok()) << files.status();
  e.files = std::move(*files);
  e.residual = std::make_unique<model::InProcessResidual>(*e.files->residual_linear());
  options.host_threads = 2;
  auto cuda = CudaModel::Create(*e.files, options);
  EXPECT_TRUE(cuda.ok()) << cuda.status();
  if (cuda.ok()) {
    e.cuda = std::move(*cuda);
    e.cuda->SetResidualSource(e.residual.get());
  }
  return e;
}

CudaModelOptions SmallOptions() {
  CudaModelOptions options;
  options.context = kContext;
  options.sessions = 2;
  options.max_batch_rows = 32;
  return options;
}

using testing::Nmse;

// The first `elements` keys (or values) of one layer of a host cache, decoded to f32.
std::vector<float> CacheRows(const model::KvCache& cache, int64_t layer, size_t elements,
                             bool values) {
  std::vector<float> rows(elements);
  const int64_t slots = static_cast<int64_t>(elements) / cache.kv_dim(layer);
  if (values) {
    cache.ReadValues(layer, 0, slots, rows.data());
  } else {
    cache.ReadKeys(layer, 0, slots, rows.data());
  }
  return rows;
}

std::vector<int32_t> Prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  return tokens;
}

// The random model itself, on the CPU (runs everywhere): the fixture the GPU tests compare with.
TEST(CudaModelFixtureTest, TinyRandomModelLoadsAndRunsOnTheCpu) {
  auto cpu = model::LlamaModel::LoadSplit(TinySplitModel().base, TinySplitModel().residual, 2);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->config().vocab_size, kVocab);
  EXPECT_EQ((*cpu)->config().KvDim(0), kKvHeads * 32);
  auto cache = (*cpu)->NewKvCache(kContext);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(kVocab);
  Batch batch = Batch::Causal(Prompt(6, 1), 0);
  batch.logit_rows = {5};
  ASSERT_TRUE((*cpu)->Forward(batch, *cache, logits, ForwardMode::kVerify).ok());
  // A random model still gives a spread distribution, not a degenerate one.
  const auto [low, high] = std::minmax_element(logits.begin(), logits.end());
  EXPECT_GT(*high - *low, 1.0f);
  EXPECT_TRUE(std::isfinite(*high) && std::isfinite(*low));
}

// The other families' random models on the CPU (runs everywhere): the flags the device forward
// reads are the families', and past the window the logits stay spread and finite.
TEST(CudaModelFixtureTest, FamilyRandomModelsLoadAndRunOnTheCpu) {
  for (const char* architecture : kFamilies) {
    SCOPED_TRACE(architecture);
    const testing::SplitModelPaths& paths = FamilySplitModel(architecture);
    auto cpu = model::LlamaModel::LoadSplit(paths.base, paths.residual, 2);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const model::ModelConfig& c = (*cpu)->config();
    const std::string arch = architecture;
    EXPECT_EQ(c.rope_style, model::RopeStyle::kHalves);
    EXPECT_EQ(c.ffn_activation,
              arch == "gemma3" ? model::FfnActivation::kGeluTanh : model::FfnActivation::kSilu);
    EXPECT_EQ(c.qk_norm, arch != "qwen2");
    EXPECT_EQ(c.post_norms, arch == "gemma3");
    EXPECT_EQ(c.qkv_bias, arch == "qwen2");
    EXPECT_EQ(c.embedding_scale, arch == "gemma3" ? std::sqrt(128.0f) : 1.0f);
    EXPECT_EQ(c.head_dim, arch == "gemma3" ? 64 : 32);
    if (arch == "gemma3") {
      EXPECT_EQ(c.sliding_window, kFamilyWindow);
      EXPECT_EQ(c.layer_is_local, (std::vector<uint8_t>{1, 0}));
      EXPECT_EQ(c.RopeFreqBase(0), 10000.0f);
      EXPECT_EQ(c.RopeFreqBase(1), 1000000.0f);
    } else {
      EXPECT_EQ(c.sliding_window, 0);
    }
    auto cache = (*cpu)->NewKvCache(kContext);
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits(kVocab);
    Batch batch = Batch::Causal(Prompt(3 * kFamilyWindow, 1), 0);
    batch.logit_rows = {static_cast<int32_t>(batch.size()) - 1};
    ASSERT_TRUE((*cpu)->Forward(batch, *cache, logits, ForwardMode::kVerify).ok());
    const auto [low, high] = std::minmax_element(logits.begin(), logits.end());
    EXPECT_GT(*high - *low, 1.0f);
    EXPECT_TRUE(std::isfinite(*high) && std::isfinite(*low));
  }
}

// The bench's synthetic model (CPU only): every matrix present in its format, finite values of
// about the intended magnitude, sizes as the formats say.
TEST(CudaModelFixtureTest, SyntheticModelHasTheShapeAndScaleAsked) {
  model::ModelConfig config = model::EightBClassConfig();
  config.num_layers = 2;
  config.d_model = 256;
  config.d_ff = 512;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.rope_dims = 64;
  config.vocab_size = 1000;
  model::SplitQuantization q = testing::SplitFixtureQuantization();
  ThreadPool pool(2);
  auto m = bench::MakeSyntheticSplitModel(config, q, 3, pool);
  ASSERT_TRUE(m.ok()) << m.status();
  // b2_asym/g64 is 2.5 bits and r8/g32 8.5 bits per weight: no padding in memory.
  const int64_t weights = 2 * (2 * 256 * 256 + 2 * 128 * 256 + 3 * 512 * 256) + 1000 * 256;
  EXPECT_EQ((*m)->base_linear_bytes, static_cast<uint64_t>(weights) * 5 / 16);
  EXPECT_EQ((*m)->residual_linear_bytes, static_cast<uint64_t>(weights) * 17 / 16);
  const quant::MatrixView& w = (*m)->base.group({1, model::LinearGroup::kDown})[0];
  EXPECT_EQ(w.rows, 256);
  EXPECT_EQ(w.cols, 512);
  std::vector<float> row(512);
  double sum_squares = 0.0;
  for (int64_t r = 0; r < w.rows; ++r) {
    quant::DequantizeSplitRow(w.format, w.group, w.row(r), w.cols, row.data());
    for (float x : row) {
      ASSERT_TRUE(std::isfinite(x));
      sum_squares += static_cast<double>(x) * x;
    }
  }
  const double rms = std::sqrt(sum_squares / (w.rows * w.cols));
  EXPECT_GT(rms, 0.3 / std::sqrt(512.0));
  EXPECT_LT(rms, 3.0 / std::sqrt(512.0));
  EXPECT_EQ((*m)->embedding_and_norms.token_embd.rows, 1000);
  EXPECT_EQ((*m)->embedding_and_norms.layers.size(), 2u);
  q.residual_format = std::nullopt;
  EXPECT_EQ(bench::MakeSyntheticSplitModel(config, q, 3, pool).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CountDevices() == 0) {
      GTEST_SKIP() << "CUDA code compiled, but no CUDA device is visible on this machine";
    }
  }
};

void ExpectForwardCloseToTheCpu(const CudaModelOptions& options) {
  Engines e = Load(TinySplitModel(), options);
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> prompt = Prompt(20, 3);
  for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
    // The CPU engine's cache has the device's row type (the device encodes as it does), so
    // what is left are the last-bit differences of RMSNorm, softmax and SiLU, which the int8
    // activation codes can amplify by one code step.
    auto cpu_cache = e.cpu->NewKvCache(kContext, options.kv_type);
    ASSERT_TRUE(cpu_cache.ok());
    auto cuda_cache = e.cuda->NewKvCache();
    ASSERT_TRUE(cuda_cache.ok()) << cuda_cache.status();
    const Batch batch = Batch::Causal(prompt, 0);
    std::vector<float> expected(prompt.size() * kVocab), actual(prompt.size() * kVocab);
    ASSERT_TRUE(e.cpu->Forward(batch, *cpu_cache, expected, mode).ok());
    ASSERT_TRUE(e.cuda->Forward(batch, **cuda_cache, actual, mode).ok());
    std::printf("%s: logits NMSE %.3g\n", std::string(model::ForwardModeName(mode)).c_str(),
                Nmse(actual, expected));
    EXPECT_LT(Nmse(actual, expected), 1e-4) << model::ForwardModeName(mode);
    int agree = 0;
    for (size_t r = 0; r < prompt.size(); ++r) {
      const auto row = [&](const std::vector<float>& l) {
        return std::max_element(l.begin() + r * kVocab, l.begin() + (r + 1) * kVocab) -
               (l.begin() + r * kVocab);
      };
      agree += row(actual) == row(expected) ? 1 : 0;
    }
    EXPECT_GE(agree, 18) << model::ForwardModeName(mode);
    // The batch's keys are in the cache, encoded as the CPU's up to the same differences.
    std::vector<float> keys, values;
    ASSERT_TRUE((*cuda_cache)->CopyToHost(1, 0, 20, &keys, &values).ok());
    std::vector<float> cpu_keys = CacheRows(*cpu_cache, 1, keys.size(), false);
    std::printf("%s: layer-1 keys NMSE %.3g\n", std::string(model::ForwardModeName(mode)).c_str(),
                Nmse(keys, cpu_keys));
    EXPECT_LT(Nmse(keys, cpu_keys), 1e-5);
  }
  const ForwardTimings& t = e.cuda->last_timings();
  EXPECT_EQ(t.groups, 4 * kLayers + 1);
  EXPECT_GT(t.residual_ns, 0);
  EXPECT_GT(t.total_ns, t.residual_ns);
}

TEST_F(CudaModelTest, ForwardIsCloseToTheCpuInDraftAndVerifyMode) {
  for (const model::KvType kv_type : {model::KvType::kF16, model::KvType::kQ8_0}) {
    SCOPED_TRACE(std::string(model::KvTypeName(kv_type)));
    CudaModelOptions options = SmallOptions();
    options.kv_type = kv_type;
    ExpectForwardCloseToTheCpu(options);
  }
}

// Forwards `prompt` in one batch into a cache of its own, then token by token into
// `one_cache` (committing each): every row's logits equal bit for bit.
void ExpectEachTokenAloneEqualsTheBatch(CudaModel& model, const std::vector<int32_t>& prompt,
                                        ForwardMode mode, DeviceKvCache& one_cache,
                                        const std::string& what) {
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  auto batch_cache = model.NewKvCache();
  ASSERT_TRUE(batch_cache.ok()) << what;
  std::vector<float> batched(prompt.size() * vocab), one(vocab);
  ASSERT_TRUE(model.Forward(Batch::Causal(prompt, 0), **batch_cache, batched, mode).ok()) << what;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const Batch batch =
        Batch::Causal(std::span<const int32_t>(&prompt[i], 1), static_cast<int32_t>(i));
    ASSERT_TRUE(model.Forward(batch, one_cache, one, mode).ok()) << what;
    ASSERT_TRUE(one_cache.Commit(1).ok()) << what;
    ASSERT_EQ(std::vector<float>(batched.begin() + i * vocab, batched.begin() + (i + 1) * vocab),
              one)
        << what << " token " << i << " in " << model::ForwardModeName(mode) << " mode";
  }
}

TEST_F(CudaModelTest, ATokenAloneEqualsTheSameTokenInABatchAndTreeNodesEqualTheirPaths) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> prompt = Prompt(12, 5);
  for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
    auto one_cache = e.cuda->NewKvCache();
    ASSERT_TRUE(one_cache.ok());
    ExpectEachTokenAloneEqualsTheBatch(*e.cuda, prompt, mode, **one_cache, "llama");
    std::vector<float> one(kVocab);
    // A tree over the committed prompt: two branches a-b and c; each node = its causal path.
    const std::vector<int32_t> tree_tokens = {7, 8, 9};
    const std::vector<int32_t> parents = {-1, 0, -1};
    auto tree = Batch::Tree(tree_tokens, parents, static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(tree.ok());
    std::vector<float> tree_logits(3 * kVocab);
    ASSERT_TRUE(e.cuda->Forward(*tree, **one_cache, tree_logits, mode).ok());
    (*one_cache)->DiscardPending();
    std::vector<float> chain(2 * kVocab);
    ASSERT_TRUE(e.cuda
                    ->Forward(Batch::Causal(std::vector<int32_t>{7, 8},
                                            static_cast<int32_t>(prompt.size())),
                              **one_cache, chain, mode)
                    .ok());
    (*one_cache)->DiscardPending();
    EXPECT_EQ(std::vector<float>(tree_logits.begin(), tree_logits.begin() + 2 * kVocab), chain);
    ASSERT_TRUE(
        e.cuda
            ->Forward(Batch::Causal(std::vector<int32_t>{9}, static_cast<int32_t>(prompt.size())),
                      **one_cache, one, mode)
            .ok());
    EXPECT_EQ(std::vector<float>(tree_logits.begin() + 2 * kVocab, tree_logits.end()), one);
  }
}

// Plain decoding (a tree of the root only) and speculation give the same tokens.
std::vector<int32_t> Generate(CudaModel& model, std::span<const int32_t> prompt,
                              const speculation::TreeShape& shape,
                              const model::SamplingParams& sampling, int count) {
  auto session = CudaSpeculativeSession::Create(model, {});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  EXPECT_TRUE(speculation::PrefillInChunks(**session, prompt.subspan(0, prompt.size() - 1),
                                           model.options().max_batch_rows)
                  .ok());
  std::vector<int32_t> out;
  int32_t root = prompt.back();
  while (static_cast<int>(out.size()) < count) {
    speculation::SessionStep step{.root = root, .shape = shape, .sampling = sampling};
    const absl::Status stepped = (*session)->Step(step);
    EXPECT_TRUE(stepped.ok()) << stepped;
    if (!stepped.ok()) return out;
    out.insert(out.end(), step.walk.tokens.begin(), step.walk.tokens.end());
    root = step.walk.tokens.back();
  }
  out.resize(static_cast<size_t>(count));
  return out;
}

TEST_F(CudaModelTest, SpeculativeOutputEqualsPlainDecoding) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> prompt = Prompt(9, 7);
  const model::SamplingParams greedy;
  const model::SamplingParams sampled{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 11};
  for (const model::SamplingParams& sampling : {greedy, sampled}) {
    const std::vector<int32_t> plain = Generate(*e.cuda, prompt, {.nodes = 0}, sampling, 24);
    ASSERT_EQ(plain.size(), 24u);
    for (const speculation::TreeShape shape :
         {speculation::TreeShape{.nodes = 8, .expansions = 2, .max_depth = 4},
          speculation::TreeShape{.nodes = 16, .expansions = 4, .max_depth = 8},
          speculation::TreeShape{.nodes = 5, .expansions = 1, .max_depth = 5}}) {
      EXPECT_EQ(Generate(*e.cuda, prompt, shape, sampling, 24), plain)
          << "nodes " << shape.nodes << " expansions " << shape.expansions << " temperature "
          << sampling.temperature;
    }
  }
}

// The greedy choice of logit row r of a vocabulary of `vocab`.
int64_t ArgMaxRow(const std::vector<float>& logits, size_t r, size_t vocab = kVocab) {
  return std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab) -
         (logits.begin() + r * vocab);
}

// One forward of `batch` on the CPU and the device in `mode`: the logits within NMSE 1e-4 and at
// least `min_agree` rows with the same argmax.
void ExpectForwardsClose(Engines& e, const Batch& batch, model::KvCache& cpu_cache,
                         DeviceKvCache& cuda_cache, ForwardMode mode, size_t min_agree,
                         const std::string& what) {
  const size_t vocab = static_cast<size_t>(e.cpu->config().vocab_size);
  const size_t rows = batch.tokens.size();
  std::vector<float> expected(rows * vocab), actual(rows * vocab);
  ASSERT_TRUE(e.cpu->Forward(batch, cpu_cache, expected, mode).ok()) << what;
  const absl::Status status = e.cuda->Forward(batch, cuda_cache, actual, mode);
  ASSERT_TRUE(status.ok()) << what << ": " << status;
  const double nmse = Nmse(actual, expected);
  size_t agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    agree += ArgMaxRow(actual, r, vocab) == ArgMaxRow(expected, r, vocab);
  }
  std::printf("%s: logits NMSE %.3g, argmax %zu of %zu\n", what.c_str(), nmse, agree, rows);
  EXPECT_LT(nmse, 1e-4) << what;
  EXPECT_GE(agree, min_agree) << what;
}

// gemma3, qwen2 and qwen3 on the device against the CPU with fp16-rounded K/V, in draft and
// verify mode: a prefill three windows long, a tree past the window, the tree's path committed
// (keys and slot positions as the CPU's), and the next decode step. The remaining differences
// are RMSNorm's (four per layer in gemma3, plus one per head for QK-norm) and softmax's sums, as
// for llama above.
TEST_F(CudaModelTest, FamilyForwardIsCloseToTheCpuPastTheWindow) {
  for (const char* architecture : kFamilies) {
    Engines e = Load(FamilySplitModel(architecture), SmallOptions());
    ASSERT_NE(e.cuda, nullptr) << architecture;
    const bool windowed = e.cuda->config().sliding_window > 0;
    const std::vector<int32_t> prompt = Prompt(3 * kFamilyWindow - 4, 3);  // 20 tokens
    for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
      const std::string what =
          std::string(architecture) + " " + std::string(model::ForwardModeName(mode));
      auto cpu_cache = e.cpu->NewKvCache(kContext, model::KvType::kF16);
      auto cuda_cache = e.cuda->NewKvCache();
      ASSERT_TRUE(cpu_cache.ok() && cuda_cache.ok()) << what;
      const auto compare = [&](const Batch& batch, const std::string& step, size_t min_agree) {
        ExpectForwardsClose(e, batch, *cpu_cache, **cuda_cache, mode, min_agree, what + step);
      };
      compare(Batch::Causal(prompt, 0), " prefill", prompt.size() - 2);
      ASSERT_TRUE(cpu_cache->Commit(static_cast<int64_t>(prompt.size())).ok());
      ASSERT_TRUE((*cuda_cache)->Commit(static_cast<int64_t>(prompt.size())).ok());
      for (int64_t layer = 0; layer < kLayers; ++layer) {  // layer 0 is gemma3's local one
        std::vector<float> keys, values;
        ASSERT_TRUE((*cuda_cache)->CopyToHost(layer, 0, 20, &keys, &values).ok());
        const std::vector<float> cpu_keys = CacheRows(*cpu_cache, layer, keys.size(), false);
        const std::vector<float> cpu_values = CacheRows(*cpu_cache, layer, values.size(), true);
        EXPECT_LT(Nmse(keys, cpu_keys), 1e-5) << what << " layer " << layer;
        EXPECT_LT(Nmse(values, cpu_values), 1e-5) << what << " layer " << layer;
      }
      // A tree at positions 20-23: a chain 0-1-2, a second child 3 of 0, another root 4.
      auto tree =
          Batch::Tree(std::vector<int32_t>{7, 8, 9, 10, 11}, std::vector<int32_t>{-1, 0, 1, 0, -1},
                      static_cast<int32_t>(prompt.size()));
      ASSERT_TRUE(tree.ok());
      compare(*tree, " tree", 4);
      const std::vector<int32_t> path = {0, 1, 2};
      ASSERT_TRUE(cpu_cache->CommitSlots(path).ok());
      ASSERT_TRUE((*cuda_cache)->CommitSlots(path).ok());
      const int64_t length = cpu_cache->committed_length();
      ASSERT_EQ((*cuda_cache)->committed_length(), length);
      std::vector<int32_t> positions;
      const absl::Status copied = (*cuda_cache)->CopyPositionsToHost(0, length, &positions);
      if (windowed) {
        ASSERT_TRUE(copied.ok()) << copied;
        EXPECT_EQ(positions,
                  std::vector<int32_t>(cpu_cache->positions(), cpu_cache->positions() + length))
            << what;
      } else {
        EXPECT_EQ(copied.code(), absl::StatusCode::kFailedPrecondition) << what;
      }
      compare(Batch::Causal(std::vector<int32_t>{12}, static_cast<int32_t>(length)), " decode", 1);
    }
  }
}

// An oracle fixture's random model (tests/fixtures/oracle/NAME_synthetic_logits.json) split as
// the fixtures are into a temporary prefix, loaded with a 128-token context, forwards of up to 64
// rows and 2 sessions. Empty engines when the fixture or the quantizer fails (the test's ASSERT
// on e.cuda stops it).
struct FixtureEngines {
  Engines engines;
  std::string prefix;
  ~FixtureEngines() {  // the mapped files stay readable until the engines go
    std::filesystem::remove(model::SplitBasePath(prefix));
    std::filesystem::remove(model::SplitResidualPath(prefix));
  }
};
std::unique_ptr<FixtureEngines> LoadOracleFixture(const std::string& name) {
  auto fixture = std::make_unique<FixtureEngines>();
  fixture->prefix = (testing::TestTempDir() / ("cuda-" + name)).string();
  const testing::SyntheticModelFile source("tests/fixtures/oracle/" + name +
                                           "_synthetic_logits.json");
  EXPECT_TRUE(source.ok()) << name;
  if (!source.ok()) return fixture;
  offline::SplitQuantizeOptions quantize;
  quantize.quantization = testing::SplitFixtureQuantization();
  quantize.num_threads = 2;
  const auto split =
      offline::QuantizeSplitModel(source.path(), model::SplitBasePath(fixture->prefix),
                                  model::SplitResidualPath(fixture->prefix), quantize);
  EXPECT_TRUE(split.ok()) << name << ": " << split.status();
  if (!split.ok()) return fixture;
  CudaModelOptions options = SmallOptions();
  options.context = 128;
  options.max_batch_rows = 64;
  fixture->engines = Load(
      {model::SplitBasePath(fixture->prefix), model::SplitResidualPath(fixture->prefix)}, options);
  return fixture;
}

// gemma4, the oracle fixture's random model (5 layers, d 256: local layers of 4 heads over 2 KV
// heads of 64 with a 32-token window, global layers of 4 heads over 1 KV head of 128 with
// proportional RoPE, one global layer whose values are its keys, the value norm, the layer
// output scale, soft-cap 30; the real 152,064-token vocabulary), split as the fixtures are, on
// the device against the CPU with fp16-rounded K/V: a prefill past the window, a tree, its path
// committed (every layer's keys at that layer's width), and the next decode step.
TEST_F(CudaModelTest, Gemma4ForwardIsCloseToTheCpuPastTheWindow) {
  const std::unique_ptr<FixtureEngines> fixture = LoadOracleFixture("gemma4");
  Engines& e = fixture->engines;
  ASSERT_NE(e.cuda, nullptr);
  const CudaModelOptions& options = e.cuda->options();
  const model::ModelConfig& c = e.cuda->config();
  ASSERT_GT(c.sliding_window, 0);
  const std::vector<int32_t> prompt = Prompt(c.sliding_window + 8, 5);
  for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
    const std::string what = std::string("gemma4 ") + std::string(model::ForwardModeName(mode));
    auto cpu_cache = e.cpu->NewKvCache(options.context, model::KvType::kF16);
    auto cuda_cache = e.cuda->NewKvCache();
    ASSERT_TRUE(cpu_cache.ok() && cuda_cache.ok()) << what;
    const auto compare = [&](const Batch& batch, const std::string& step, size_t min_agree) {
      ExpectForwardsClose(e, batch, *cpu_cache, **cuda_cache, mode, min_agree, what + step);
    };
    compare(Batch::Causal(prompt, 0), " prefill", prompt.size() - 2);
    ASSERT_TRUE(cpu_cache->Commit(static_cast<int64_t>(prompt.size())).ok());
    ASSERT_TRUE((*cuda_cache)->Commit(static_cast<int64_t>(prompt.size())).ok());
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      ASSERT_EQ((*cuda_cache)->kv_dim(layer), c.KvDim(layer));
      std::vector<float> keys, values;
      ASSERT_TRUE((*cuda_cache)
                      ->CopyToHost(layer, 0, static_cast<int64_t>(prompt.size()), &keys, &values)
                      .ok());
      const std::vector<float> cpu_keys = CacheRows(*cpu_cache, layer, keys.size(), false);
      const std::vector<float> cpu_values = CacheRows(*cpu_cache, layer, values.size(), true);
      EXPECT_LT(Nmse(keys, cpu_keys), 1e-5) << what << " layer " << layer;
      EXPECT_LT(Nmse(values, cpu_values), 1e-5) << what << " layer " << layer;
    }
    const int32_t next = static_cast<int32_t>(prompt.size());
    auto tree = Batch::Tree(std::vector<int32_t>{7, 8, 9, 10, 11},
                            std::vector<int32_t>{-1, 0, 1, 0, -1}, next);
    ASSERT_TRUE(tree.ok());
    compare(*tree, " tree", 4);
    const std::vector<int32_t> path = {0, 1, 2};
    ASSERT_TRUE(cpu_cache->CommitSlots(path).ok());
    ASSERT_TRUE((*cuda_cache)->CommitSlots(path).ok());
    const int64_t length = cpu_cache->committed_length();
    ASSERT_EQ((*cuda_cache)->committed_length(), length);
    for (const int64_t layer : {int64_t{0}, c.num_layers - 1}) {
      std::vector<float> keys, values;
      ASSERT_TRUE((*cuda_cache)->CopyToHost(layer, 0, length, &keys, &values).ok());
      const std::vector<float> cpu_keys = CacheRows(*cpu_cache, layer, keys.size(), false);
      EXPECT_LT(Nmse(keys, cpu_keys), 1e-5) << what << " committed layer " << layer;
    }
    compare(Batch::Causal(std::vector<int32_t>{12}, static_cast<int32_t>(length)), " decode", 1);
  }
}

// The mixture-of-experts fixtures of the oracle (random weights: qwen3moe, 3 layers of 16
// experts with 4 used; gemma4 MoE, a dense FFN beside 16 experts of which 4 are used, the router
// input scale, per-expert down scales and the fused gate|up tensor; gpt-oss, sinks, q/k/v/o,
// router and expert biases, YaRN, the clamped SwiGLU and top-k-then-softmax routing over 16
// MXFP4 experts), split as the fixtures are.
// On the device against the CPU (the same routing rules, router logits bit for bit from the same
// input): prefill, tree, decode in draft and verify mode; batch invariance bit for bit (a token
// alone = in a batch, a tree node = its causal path); no CUDA graph is captured (the host routes
// between kernels); and speculation equal to plain decoding of the device's own verifier.
TEST_F(CudaModelTest, MixtureOfExpertsForwardIsCloseToTheCpuAndBatchInvariant) {
  for (const char* fixture : {"qwen3moe", "gemma4moe", "gpt-oss"}) {
    const std::unique_ptr<FixtureEngines> loaded = LoadOracleFixture(fixture);
    Engines& e = loaded->engines;
    ASSERT_NE(e.cuda, nullptr) << fixture;
    const CudaModelOptions& options = e.cuda->options();
    const model::ModelConfig& c = e.cuda->config();
    ASSERT_TRUE(c.has_experts()) << fixture;
    const size_t vocab = static_cast<size_t>(c.vocab_size);
    const std::vector<int32_t> prompt = Prompt(40, 5);
    for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
      const std::string what =
          absl::StrCat(fixture, " ", std::string(model::ForwardModeName(mode)));
      auto cpu_cache = e.cpu->NewKvCache(options.context, model::KvType::kF16);
      auto cuda_cache = e.cuda->NewKvCache();
      ASSERT_TRUE(cpu_cache.ok() && cuda_cache.ok()) << what;
      // Near-tied routing may pick another expert on one side (RMSNorm's sums differ in the last
      // bits), so a few rows may disagree.
      ExpectForwardsClose(e, Batch::Causal(prompt, 0), *cpu_cache, **cuda_cache, mode,
                          prompt.size() - 4, what + " prefill");
      ASSERT_TRUE(cpu_cache->Commit(static_cast<int64_t>(prompt.size())).ok());
      ASSERT_TRUE((*cuda_cache)->Commit(static_cast<int64_t>(prompt.size())).ok());
      const int32_t length = static_cast<int32_t>(prompt.size());
      auto tree = Batch::Tree(std::vector<int32_t>{7, 8, 9, 10, 11},
                              std::vector<int32_t>{-1, 0, 1, 0, -1}, length);
      ASSERT_TRUE(tree.ok());
      ExpectForwardsClose(e, *tree, *cpu_cache, **cuda_cache, mode, 4, what + " tree");
      cuda_cache->reset();  // the plan holds two sessions

      // Batch invariance on the device.
      auto one_cache = e.cuda->NewKvCache();
      ASSERT_TRUE(one_cache.ok()) << what;
      ExpectEachTokenAloneEqualsTheBatch(*e.cuda, prompt, mode, **one_cache, what);
      std::vector<float> tree_logits(5 * vocab), chain(3 * vocab);
      ASSERT_TRUE(e.cuda->Forward(*tree, **one_cache, tree_logits, mode).ok());
      (*one_cache)->DiscardPending();
      ASSERT_TRUE(e.cuda
                      ->Forward(Batch::Causal(std::vector<int32_t>{7, 8, 9}, length), **one_cache,
                                chain, mode)
                      .ok());
      (*one_cache)->DiscardPending();
      EXPECT_EQ(std::vector<float>(tree_logits.begin(), tree_logits.begin() + 3 * vocab), chain)
          << what;
    }
    EXPECT_EQ(e.cuda->graphs_captured(), 0) << fixture;

    const model::SamplingParams greedy;
    const model::SamplingParams sampled{
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 11};
    for (const model::SamplingParams& sampling : {greedy, sampled}) {
      const std::vector<int32_t> plain = Generate(*e.cuda, prompt, {.nodes = 0}, sampling, 16);
      ASSERT_EQ(plain.size(), 16u) << fixture;
      EXPECT_EQ(
          Generate(*e.cuda, prompt, {.nodes = 8, .expansions = 2, .max_depth = 4}, sampling, 16),
          plain)
          << fixture << " temperature " << sampling.temperature;
    }
  }
}

// Past the window, on the device, bit for bit: a token alone = in a batch, a tree node = its
// causal path (draft and verify mode), and draft forwards from CUDA graphs = kernel by kernel.
TEST_F(CudaModelTest, FamilyBatchInvarianceAndGraphsPastTheWindow) {
  for (const char* architecture : kFamilies) {
    Engines e = Load(FamilySplitModel(architecture), SmallOptions());
    ASSERT_NE(e.cuda, nullptr) << architecture;
    const std::vector<int32_t> prompt = Prompt(2 * kFamilyWindow - 4, 5);  // 12 tokens
    for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
      const std::string what =
          std::string(architecture) + " " + std::string(model::ForwardModeName(mode));
      auto batch_cache = e.cuda->NewKvCache();
      ASSERT_TRUE(batch_cache.ok());
      std::vector<float> batched(prompt.size() * kVocab);
      ASSERT_TRUE(e.cuda->Forward(Batch::Causal(prompt, 0), **batch_cache, batched, mode).ok());
      batch_cache->reset();
      auto one_cache = e.cuda->NewKvCache();
      ASSERT_TRUE(one_cache.ok());
      std::vector<float> one(kVocab);
      for (size_t i = 0; i < prompt.size(); ++i) {
        const Batch batch =
            Batch::Causal(std::span<const int32_t>(&prompt[i], 1), static_cast<int32_t>(i));
        ASSERT_TRUE(e.cuda->Forward(batch, **one_cache, one, mode).ok());
        ASSERT_TRUE((*one_cache)->Commit(1).ok());
        ASSERT_EQ(
            std::vector<float>(batched.begin() + i * kVocab, batched.begin() + (i + 1) * kVocab),
            one)
            << what << " token " << i;
      }
      const int32_t length = static_cast<int32_t>(prompt.size());
      auto tree =
          Batch::Tree(std::vector<int32_t>{7, 8, 9}, std::vector<int32_t>{-1, 0, -1}, length);
      ASSERT_TRUE(tree.ok());
      std::vector<float> tree_logits(3 * kVocab), chain(2 * kVocab);
      ASSERT_TRUE(e.cuda->Forward(*tree, **one_cache, tree_logits, mode).ok());
      (*one_cache)->DiscardPending();
      ASSERT_TRUE(
          e.cuda
              ->Forward(Batch::Causal(std::vector<int32_t>{7, 8}, length), **one_cache, chain, mode)
              .ok());
      (*one_cache)->DiscardPending();
      EXPECT_EQ(std::vector<float>(tree_logits.begin(), tree_logits.begin() + 2 * kVocab), chain)
          << what;
      ASSERT_TRUE(
          e.cuda->Forward(Batch::Causal(std::vector<int32_t>{9}, length), **one_cache, one, mode)
              .ok());
      (*one_cache)->DiscardPending();
      EXPECT_EQ(std::vector<float>(tree_logits.begin() + 2 * kVocab, tree_logits.end()), one)
          << what;
    }
    // Draft forwards of 1 and 3 tokens in turn, eager and from graphs, into two caches.
    auto eager = e.cuda->NewKvCache();
    auto graphed = e.cuda->NewKvCache();
    ASSERT_TRUE(eager.ok() && graphed.ok());
    const std::vector<int32_t> tokens = Prompt(3 * kFamilyWindow, 11);
    std::vector<float> a, b;
    const auto forward = [&](bool graphs, DeviceKvCache& cache, const Batch& batch,
                             std::vector<float>& logits) {
      e.cuda->set_cuda_graphs(graphs);
      logits.assign(batch.num_logit_rows() * kVocab, 0.0f);
      return e.cuda->Forward(batch, cache, logits, ForwardMode::kDraft);
    };
    int32_t length = 0;
    for (int step = 0; step < 12; ++step) {
      const int32_t rows = step % 2 == 0 ? 1 : 3;
      const Batch batch = Batch::Causal(std::span(tokens).subspan(length, rows), length);
      ASSERT_TRUE(forward(false, **eager, batch, a).ok());
      ASSERT_TRUE(forward(true, **graphed, batch, b).ok());
      EXPECT_EQ(a, b) << architecture << " step " << step;
      ASSERT_TRUE((*eager)->Commit(rows).ok());
      ASSERT_TRUE((*graphed)->Commit(rows).ok());
      length += rows;
    }
    EXPECT_GT(e.cuda->graph_launches(), e.cuda->graphs_captured()) << architecture;
    e.cuda->set_cuda_graphs(true);
  }
}

// The losslessness invariant past the window: speculation = plain decoding on the device.
TEST_F(CudaModelTest, FamilySpeculativeOutputEqualsPlainDecoding) {
  for (const char* architecture : kFamilies) {
    Engines e = Load(FamilySplitModel(architecture), SmallOptions());
    ASSERT_NE(e.cuda, nullptr) << architecture;
    const std::vector<int32_t> prompt = Prompt(9, 7);
    const model::SamplingParams greedy;
    const model::SamplingParams sampled{
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 11};
    for (const model::SamplingParams& sampling : {greedy, sampled}) {
      const std::vector<int32_t> plain = Generate(*e.cuda, prompt, {.nodes = 0}, sampling, 24);
      ASSERT_EQ(plain.size(), 24u) << architecture;
      for (const speculation::TreeShape shape :
           {speculation::TreeShape{.nodes = 8, .expansions = 2, .max_depth = 4},
            speculation::TreeShape{.nodes = 5, .expansions = 1, .max_depth = 5}}) {
        EXPECT_EQ(Generate(*e.cuda, prompt, shape, sampling, 24), plain)
            << architecture << " nodes " << shape.nodes << " temperature " << sampling.temperature;
      }
    }
  }
}

// ForwardSequences: three sequences with their own caches, prefixes and masks (a tree, a causal
// chunk, one selected row) in one forward give each sequence exactly the logits of its own
// forward, in draft and verify mode, for the llama tiny model and every family (past the
// sliding window), and leave each cache with its own pending slots.
TEST_F(CudaModelTest, SequencesForwardedTogetherEqualEachForwardedAlone) {
  std::vector<std::pair<std::string, testing::SplitModelPaths> > models = {
      {"llama", TinySplitModel()}};
  for (const char* architecture : kFamilies) {
    models.emplace_back(architecture, FamilySplitModel(architecture));
  }
  for (const auto& [name, paths] : models) {
    CudaModelOptions options = SmallOptions();
    options.sessions = 6;
    Engines e = Load(paths, options);
    ASSERT_NE(e.cuda, nullptr) << name;
    const int32_t prefixes[3] = {5, 2 * kFamilyWindow + 3, 9};
    std::vector<std::unique_ptr<DeviceKvCache> > together, alone;
    for (int s = 0; s < 3; ++s) {
      for (auto* caches : {&together, &alone}) {
        auto cache = e.cuda->NewKvCache();
        ASSERT_TRUE(cache.ok()) << cache.status();
        const std::vector<int32_t> prompt = Prompt(static_cast<size_t>(prefixes[s]), 20 + s);
        ASSERT_TRUE(e.cuda->Forward(Batch::Causal(prompt, 0), **cache, ForwardMode::kVerify).ok());
        ASSERT_TRUE((*cache)->Commit(prefixes[s]).ok());
        caches->push_back(*std::move(cache));
      }
    }
    auto tree = Batch::Tree(std::vector<int32_t>{7, 8, 9, 10}, std::vector<int32_t>{-1, 0, 0, 1},
                            prefixes[0]);
    ASSERT_TRUE(tree.ok());
    const Batch chunk = Batch::Causal(Prompt(6, 31), prefixes[1]);
    Batch selected = Batch::Causal(Prompt(3, 32), prefixes[2]);
    selected.logit_rows = {2, 0};
    const Batch* batches[3] = {&*tree, &chunk, &selected};
    for (const ForwardMode mode : {ForwardMode::kDraft, ForwardMode::kVerify}) {
      const std::string what = name + " " + std::string(model::ForwardModeName(mode));
      std::vector<DeviceSequence> sequences;
      int64_t logit_rows = 0;
      for (int s = 0; s < 3; ++s) {
        sequences.push_back({batches[s], together[static_cast<size_t>(s)].get()});
        logit_rows += batches[s]->num_logit_rows();
      }
      ASSERT_TRUE(e.cuda->ForwardSequences(sequences, mode).ok()) << what;
      std::vector<float> joint(static_cast<size_t>(logit_rows * kVocab));
      ASSERT_TRUE(e.cuda->CopyLogits(joint).ok());
      int64_t at = 0;
      for (int s = 0; s < 3; ++s) {
        const int64_t rows = batches[s]->num_logit_rows();
        std::vector<float> own(static_cast<size_t>(rows * kVocab));
        ASSERT_TRUE(e.cuda->Forward(*batches[s], *alone[static_cast<size_t>(s)], own, mode).ok());
        EXPECT_EQ(
            std::vector<float>(joint.begin() + at * kVocab, joint.begin() + (at + rows) * kVocab),
            own)
            << what << " sequence " << s;
        EXPECT_EQ(together[static_cast<size_t>(s)]->pending_length(),
                  alone[static_cast<size_t>(s)]->pending_length());
        at += rows;
      }
      for (auto* caches : {&together, &alone}) {
        for (auto& cache : *caches) cache->DiscardPending();
      }
    }
    // One cache twice, or more rows than the largest forward: refused.
    const DeviceSequence twice[2] = {{&chunk, together[1].get()}, {&selected, together[1].get()}};
    EXPECT_EQ(e.cuda->ForwardSequences(twice, ForwardMode::kDraft).code(),
              absl::StatusCode::kInvalidArgument);
    const Batch wide = Batch::Causal(Prompt(20, 33), prefixes[2]);
    const DeviceSequence too_many[2] = {{&wide, together[2].get()}, {&wide, together[0].get()}};
    EXPECT_EQ(e.cuda->ForwardSequences(too_many, ForwardMode::kDraft).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// CudaSpeculativeSession::StepMany: sessions with different prompts, shapes and sampling,
// stepped together (one joining late with its prompt in chunks beside the others' steps), each
// give their own plain decoding.
TEST_F(CudaModelTest, SessionsSteppedTogetherEqualPlainDecoding) {
  CudaModelOptions options = SmallOptions();
  options.sessions = 8;
  options.max_batch_rows = 64;  // four trees and a prompt chunk
  Engines e = Load(TinySplitModel(), options);
  ASSERT_NE(e.cuda, nullptr);
  struct Stream {
    std::vector<int32_t> prompt;
    speculation::TreeShape shape;
    model::SamplingParams sampling;
  };
  const std::vector<Stream> streams = {
      {Prompt(9, 7), {.nodes = 8, .expansions = 2, .max_depth = 4}, {}},
      {Prompt(14, 8), {.nodes = 0}, {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 3}},
      {Prompt(5, 9),
       {.nodes = 5, .expansions = 1, .max_depth = 5},
       {.temperature = 0.7f, .seed = 4}},
      {Prompt(40, 10), {.nodes = 6, .expansions = 2, .max_depth = 3}, {}},
  };
  constexpr int kTokens = 20;
  std::vector<std::vector<int32_t> > plain;
  for (const Stream& stream : streams) {
    plain.push_back(Generate(*e.cuda, stream.prompt, {.nodes = 0}, stream.sampling, kTokens));
  }
  std::vector<std::unique_ptr<CudaSpeculativeSession> > sessions;
  for (size_t i = 0; i < streams.size(); ++i) {
    auto session = CudaSpeculativeSession::Create(*e.cuda, {});
    ASSERT_TRUE(session.ok()) << session.status();
    sessions.push_back(*std::move(session));
  }
  std::vector<std::vector<int32_t> > out(streams.size());
  std::vector<size_t> prefilled(streams.size(), 0);
  for (int iteration = 0; iteration < 200; ++iteration) {
    std::vector<CudaSpeculativeSession*> stepping;
    std::vector<speculation::SessionStep> steps;
    std::vector<size_t> who;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (out[i].size() >= kTokens) continue;
      if (i == 3 && iteration < 2) continue;  // joins late
      speculation::SessionStep step;
      const size_t prompt_rest = streams[i].prompt.size() - 1;
      if (prefilled[i] < prompt_rest) {
        const size_t chunk = std::min<size_t>(16, prompt_rest - prefilled[i]);
        step.prefill.assign(streams[i].prompt.begin() + prefilled[i],
                            streams[i].prompt.begin() + prefilled[i] + chunk);
      } else {
        step.root = out[i].empty() ? streams[i].prompt.back() : out[i].back();
        step.shape = streams[i].shape;
        step.sampling = streams[i].sampling;
      }
      stepping.push_back(sessions[i].get());
      steps.push_back(std::move(step));
      who.push_back(i);
    }
    if (stepping.empty()) break;
    CudaSpeculativeSession::StepMany(stepping, steps);
    for (size_t j = 0; j < steps.size(); ++j) {
      const size_t i = who[j];
      ASSERT_TRUE(steps[j].status.ok()) << "stream " << i << ": " << steps[j].status;
      if (!steps[j].prefill.empty()) {
        prefilled[i] += steps[j].prefill.size();
      } else {
        out[i].insert(out[i].end(), steps[j].walk.tokens.begin(), steps[j].walk.tokens.end());
      }
    }
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    ASSERT_GE(out[i].size(), static_cast<size_t>(kTokens)) << "stream " << i;
    out[i].resize(kTokens);
    EXPECT_EQ(out[i], plain[i]) << "stream " << i;
  }
}

TEST_F(CudaModelTest, DraftTreesMatchTheCpuDraftForTheSamePrefix) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> prompt = Prompt(10, 9);
  auto cuda_session = CudaSpeculativeSession::Create(*e.cuda, {});
  ASSERT_TRUE(cuda_session.ok());
  auto cpu_session = speculation::CpuSpeculativeSession::Create(
      *e.cpu, ForwardMode::kVerify, *e.cpu, ForwardMode::kDraft, {.capacity = kContext});
  ASSERT_TRUE(cpu_session.ok());
  ASSERT_TRUE(speculation::PrefillInChunks(**cuda_session, std::span(prompt).first(9), 32).ok());
  ASSERT_TRUE(speculation::PrefillInChunks(**cpu_session, std::span(prompt).first(9), 32).ok());
  const speculation::TreeShape shape{.nodes = 6, .expansions = 3, .max_depth = 3};
  speculation::SessionStep cuda_step{.root = prompt[9], .shape = shape};
  speculation::SessionStep cpu_step{.root = prompt[9], .shape = shape};
  ASSERT_TRUE((*cuda_session)->Step(cuda_step).ok()) << cuda_step.status;
  ASSERT_TRUE((*cpu_session)->Step(cpu_step).ok()) << cpu_step.status;
  // The root's children come from one draft forward of the same prefix: same top-3 unless two
  // draft logits are within the fp16-KV difference of each other.
  const speculation::DraftTree& cuda_tree = cuda_step.tree;
  const speculation::DraftTree& cpu_tree = cpu_step.tree;
  EXPECT_EQ(cuda_tree.size(), cpu_tree.size());
  EXPECT_EQ(cuda_tree.tokens[1], cpu_tree.tokens[1]);
  EXPECT_NEAR(cuda_tree.logprobs[1], cpu_tree.logprobs[1], 0.05);
}

// Draft forwards replayed from captured CUDA graphs give the bits of the same forwards launched
// kernel by kernel, at every step (the step's prefix length and slots come from device memory):
// logits, committed K/V, a tree batch, and a whole draft tree through the session.
TEST_F(CudaModelTest, DraftGraphsReplayTheEagerForwardsBitForBit) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> tokens = Prompt(24, 11);
  {
    auto eager = e.cuda->NewKvCache();
    auto graphed = e.cuda->NewKvCache();
    ASSERT_TRUE(eager.ok() && graphed.ok());
    std::vector<float> a, b;
    const auto forward = [&](bool graphs, DeviceKvCache& cache, const Batch& batch,
                             std::vector<float>& logits) {
      e.cuda->set_cuda_graphs(graphs);
      logits.assign(batch.num_logit_rows() * kVocab, 0.0f);
      return e.cuda->Forward(batch, cache, logits, ForwardMode::kDraft);
    };
    int32_t length = 0;
    for (int step = 0; step < 6; ++step) {  // 1 and 3 tokens in turn: each shape replays
      const int32_t rows = step % 2 == 0 ? 1 : 3;
      const Batch batch = Batch::Causal(std::span(tokens).subspan(length, rows), length);
      ASSERT_TRUE(forward(false, **eager, batch, a).ok());
      ASSERT_TRUE(forward(true, **graphed, batch, b).ok());
      EXPECT_EQ(a, b) << "step " << step;
      ASSERT_TRUE((*eager)->Commit(rows).ok());
      ASSERT_TRUE((*graphed)->Commit(rows).ok());
      length += rows;
    }
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      std::vector<float> eager_keys, eager_values, graph_keys, graph_values;
      ASSERT_TRUE((*eager)->CopyToHost(layer, 0, length, &eager_keys, &eager_values).ok());
      ASSERT_TRUE((*graphed)->CopyToHost(layer, 0, length, &graph_keys, &graph_values).ok());
      EXPECT_EQ(eager_keys, graph_keys) << "layer " << layer;
      EXPECT_EQ(eager_values, graph_values) << "layer " << layer;
    }
    auto tree = Batch::Tree(std::vector<int32_t>{5, 6, 7}, std::vector<int32_t>{-1, 0, -1}, length);
    ASSERT_TRUE(tree.ok());
    ASSERT_TRUE(forward(false, **eager, *tree, a).ok());
    ASSERT_TRUE(forward(true, **graphed, *tree, b).ok());
    EXPECT_EQ(a, b) << "tree";
    EXPECT_GT(e.cuda->graphs_captured(), 0);
    EXPECT_GT(e.cuda->graph_launches(), e.cuda->graphs_captured());  // shapes were replayed
  }
  auto eager_session = CudaSpeculativeSession::Create(*e.cuda, {});
  auto graph_session = CudaSpeculativeSession::Create(*e.cuda, {});
  ASSERT_TRUE(eager_session.ok() && graph_session.ok());
  ASSERT_TRUE(speculation::PrefillInChunks(**eager_session, std::span(tokens).first(20), 32).ok());
  ASSERT_TRUE(speculation::PrefillInChunks(**graph_session, std::span(tokens).first(20), 32).ok());
  const speculation::TreeShape shape{.nodes = 8, .expansions = 3, .max_depth = 4};
  speculation::SessionStep eager_step{.root = tokens[20], .shape = shape};
  speculation::SessionStep graph_step{.root = tokens[20], .shape = shape};
  e.cuda->set_cuda_graphs(false);
  ASSERT_TRUE((*eager_session)->Step(eager_step).ok()) << eager_step.status;
  e.cuda->set_cuda_graphs(true);
  ASSERT_TRUE((*graph_session)->Step(graph_step).ok()) << graph_step.status;
  EXPECT_EQ(eager_step.tree.tokens, graph_step.tree.tokens);
  EXPECT_EQ(eager_step.tree.parents, graph_step.tree.parents);
  EXPECT_EQ(eager_step.tree.logprobs, graph_step.tree.logprobs);
}

// A residual source without staging memory (as GrpcResidual): the CUDA backend copies the
// activations through its own pinned buffers and calls Accumulate.
class AccumulateOnlyResidual final : public model::ResidualSource {
 public:
  explicit AccumulateOnlyResidual(model::ResidualSource& inner) : inner_(inner) {}
  absl::Status Accumulate(model::LinearGroupId id, const quant::QuantizedActivations& x,
                          std::span<float* const> outputs, ThreadPool& pool) override {
    return inner_.Accumulate(id, x, outputs, pool);
  }

 private:
  model::ResidualSource& inner_;
};

// Verify forwards through the staged residual (activations copied by DMA into the source's
// registered memory, y copied out of it) give the bits of the copy path.
TEST_F(CudaModelTest, VerifyThroughResidualStagingEqualsTheCopyPath) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  const std::vector<int32_t> prompt = Prompt(12, 13);
  AccumulateOnlyResidual copy_only(*e.residual);
  std::vector<std::vector<float> > logits(2);
  for (int path = 0; path < 2; ++path) {
    e.cuda->SetResidualSource(path == 0 ? static_cast<model::ResidualSource*>(e.residual.get())
                                        : &copy_only);
    auto cache = e.cuda->NewKvCache();
    ASSERT_TRUE(cache.ok());
    std::vector<float> prefill(prompt.size() * kVocab), tree_logits(3 * kVocab);
    ASSERT_TRUE(
        e.cuda->Forward(Batch::Causal(prompt, 0), **cache, prefill, ForwardMode::kVerify).ok());
    ASSERT_TRUE((*cache)->Commit(static_cast<int64_t>(prompt.size())).ok());
    auto tree = Batch::Tree(std::vector<int32_t>{5, 6, 7}, std::vector<int32_t>{-1, 0, 0},
                            static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(tree.ok());
    ASSERT_TRUE(e.cuda->Forward(*tree, **cache, tree_logits, ForwardMode::kVerify).ok());
    logits[path] = prefill;
    logits[path].insert(logits[path].end(), tree_logits.begin(), tree_logits.end());
  }
  EXPECT_EQ(logits[0], logits[1]);
  e.cuda->SetResidualSource(e.residual.get());
  auto cache = e.cuda->NewKvCache();
  ASSERT_TRUE(cache.ok());
  std::vector<float> one(kVocab);
  ASSERT_TRUE(
      e.cuda->Forward(Batch::Causal(std::vector<int32_t>{3}, 0), **cache, one, ForwardMode::kVerify)
          .ok());
  EXPECT_TRUE(e.cuda->residual_staging());
  EXPECT_TRUE(e.cuda->residual_staging_registered());
}

// The cpu-residual channel's segment (POSIX shared memory, as the service creates it) can be
// registered for DMA, and copies into and out of it arrive: what the drafter's CUDA backend does
// with a RemoteResidual's staging.
TEST_F(CudaModelTest, SharedMemorySegmentRegistersForDma) {
  auto layout = shm::ComputeShmLayout(16, 4096, 14336);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint8_t fingerprint[32] = {1};
  const std::string name = "/bitsplit-cuda-test-" + std::to_string(getpid());
  auto segment = shm::ShmSegment::Create(name, *layout, 1, getpid(), getpid(), fingerprint);
  ASSERT_TRUE(segment.ok()) << segment.status();
  uint8_t* base = (*segment)->base();
  ASSERT_EQ(cudaHostRegister(base, (*segment)->size(), cudaHostRegisterDefault), cudaSuccess);
  const size_t n = 16 * 4096;
  std::vector<int8_t> pattern(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<int8_t>(i * 7 + 3);
  std::memcpy((*segment)->codes(), pattern.data(), n);
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, n), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, (*segment)->codes(), n, cudaMemcpyHostToDevice), cudaSuccess);
  std::memset((*segment)->codes(), 0, n);
  EXPECT_EQ(cudaMemcpy((*segment)->codes(), device, n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp((*segment)->codes(), pattern.data(), n), 0);
  cudaPointerAttributes attributes{};
  EXPECT_EQ(cudaPointerGetAttributes(&attributes, (*segment)->codes()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // page-locked: copies are DMA
  cudaFree(device);
  EXPECT_EQ(cudaHostUnregister(base), cudaSuccess);
}

TEST_F(CudaModelTest, RefusesBadInput) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  auto cache = e.cuda->NewKvCache();
  ASSERT_TRUE(cache.ok());
  const Batch good = Batch::Causal(std::vector<int32_t>{1, 2}, 0);
  EXPECT_EQ(e.cuda->Forward(good, **cache, ForwardMode::kReference).code(),
            absl::StatusCode::kFailedPrecondition);
  Batch b = good;
  b.tokens[1] = kVocab;
  EXPECT_EQ(e.cuda->Forward(b, **cache, ForwardMode::kDraft).code(),
            absl::StatusCode::kInvalidArgument);
  b = good;
  b.positions[0] = kContext;  // beyond the RoPE table of the plan
  EXPECT_THAT(std::string(e.cuda->Forward(b, **cache, ForwardMode::kDraft).message()),
              HasSubstr("outside [0, 256)"));
  b = good;
  b.attention_mask[3] = 0;
  EXPECT_EQ(e.cuda->Forward(b, **cache, ForwardMode::kDraft).code(),
            absl::StatusCode::kInvalidArgument);
  b = good;
  b.logit_rows = {2};
  EXPECT_EQ(e.cuda->Forward(b, **cache, ForwardMode::kDraft).code(),
            absl::StatusCode::kInvalidArgument);
  b = good;
  b.pending_prefix = 3;
  EXPECT_EQ(e.cuda->Forward(b, **cache, ForwardMode::kDraft).code(),
            absl::StatusCode::kInvalidArgument);
  const Batch big = Batch::Causal(Prompt(33, 1), 0);  // > max_batch_rows 32
  EXPECT_THAT(std::string(e.cuda->Forward(big, **cache, ForwardMode::kDraft).message()),
              HasSubstr("exceeds this drafter's largest forward of 32 tokens"));
  std::vector<float> small(kVocab);
  EXPECT_EQ(e.cuda->Forward(good, **cache, small, ForwardMode::kDraft).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was changed by the refusals.
  EXPECT_EQ((*cache)->committed_length(), 0);
  EXPECT_EQ((*cache)->pending_length(), 0);

  e.cuda->SetResidualSource(nullptr);
  EXPECT_EQ(e.cuda->Forward(good, **cache, ForwardMode::kVerify).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.cuda->Forward(good, **cache, ForwardMode::kDraft).ok());
  EXPECT_EQ(e.cuda->ChooseTargets({}, std::vector<int64_t>{1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      e.cuda->ChooseTargets({.temperature = -1.0f}, std::vector<int64_t>{1, 2}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.cuda->TopK(65).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cache)->CommitSlots(std::vector<int32_t>{1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cache)->CommitSlots(std::vector<int32_t>{5}).code(),
            absl::StatusCode::kInvalidArgument);

  // The plan has two sessions: a third cache is refused until one goes away.
  auto second = e.cuda->NewKvCache();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(e.cuda->NewKvCache().status().code(), absl::StatusCode::kResourceExhausted);
  second->reset();
  EXPECT_TRUE(e.cuda->NewKvCache().ok());
}

TEST_F(CudaModelTest, SessionRefusesBadSteps) {
  Engines e = Load(TinySplitModel(), SmallOptions());
  ASSERT_NE(e.cuda, nullptr);
  auto session = CudaSpeculativeSession::Create(*e.cuda, {});
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(speculation::PrefillInChunks(**session, Prompt(5, 2), 32).ok());
  auto code = [&](speculation::SessionStep step) {
    (void)(*session)->Step(step);
    return step.status.code();
  };
  EXPECT_EQ(code({.root = kVocab}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.root = 1, .shape = {.nodes = 32}}),  // > max_batch_rows - 1
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prefill = {-1}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*session)->committed_length(), 5);
  speculation::SessionStep with_logprobs{.root = 1,
                                         .shape = {.nodes = 2, .expansions = 2, .max_depth = 1},
                                         .top_logprobs = 3,
                                         .with_logprobs = true};
  ASSERT_TRUE((*session)->Step(with_logprobs).ok()) << with_logprobs.status;
  ASSERT_EQ(with_logprobs.choices.size(), 3u);
  for (const speculation::TargetChoice& c : with_logprobs.choices) {
    ASSERT_EQ(c.top_ids.size(), 3u);
    EXPECT_EQ(c.top_ids[0], c.token);  // greedy: the choice is the most likely token
    EXPECT_LE(c.logprob, 0.0f);
  }
}

TEST_F(CudaModelTest, TooSmallABudgetIsRefusedWithWhatFits) {
  auto files = model::SplitModelFiles::Open(TinySplitModel().base, TinySplitModel().residual);
  ASSERT_TRUE(files.ok());
  CudaModelOptions options = SmallOptions();
  options.vram_budget = 4ull << 20;  // below even the slabs' 2 MiB pages
  auto model = CudaModel::Create(**files, options);
  ASSERT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted) << model.status();
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("VRAM budget of 4.0 MiB"));
  options.vram_budget = 1ull << 50;
  EXPECT_EQ(CudaModel::Create(**files, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options = SmallOptions();
  options.device = 99;
  EXPECT_EQ(CudaModel::Create(**files, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = SmallOptions();
  auto ok = CudaModel::Create(**files, options);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_LE((*ok)->plan().total_bytes, (*ok)->plan().budget_bytes);
  EXPECT_EQ((*ok)->plan().sessions, 2);
  EXPECT_TRUE((*ok)->embedding_on_device());  // an F32 table
}

// SmolLM2 (real weights, b2_asym + r8 split) on the device and on the CPU with its K/V rounded
// to fp16 as the device stores them, teacher-forced on the CPU's greedy tokens for 32 steps.
//
// The engines sum RMSNorm, softmax and SiLU in different orders, and this quantized model
// amplifies last-bit differences (through the int8 activation codes of 30 layers) to logit
// differences of about 0.3-1. The yardstick is the CPU itself: the same CPU engine with exact f32
// K/V differs from its fp16-rounded self by as much. So: the device's logits are no further from
// the CPU's than that (NMSE summed over the steps, with a factor 2), every step's NMSE is far from
// that of a broken kernel (~1), and the device's greedy token is the CPU's at every step whose top
// two logits are at least kTie apart: the greedy sequences agree up to the first near-tie.
TEST_F(CudaModelTest, RealModelGreedyTokensMatchTheCpu) {
  const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
  CudaModelOptions options;
  options.context = 512;
  options.sessions = 1;
  options.max_batch_rows = 32;
  Engines e = Load(paths, options);
  ASSERT_NE(e.cuda, nullptr);
  const int64_t vocab = e.cpu->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 30, 2, 198};
  auto cpu_cache = e.cpu->NewKvCache(512, model::KvType::kF16);
  auto exact_cache = e.cpu->NewKvCache(512);
  auto cuda_cache = e.cuda->NewKvCache();
  ASSERT_TRUE(cpu_cache.ok() && exact_cache.ok() && cuda_cache.ok());
  constexpr float kTie = 0.05f;
  constexpr int kSteps = 32;
  std::vector<float> cpu(vocab), exact(vocab), cuda(vocab);
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  int decided = 0, first_tie = -1;
  double cuda_nmse_sum = 0.0, exact_nmse_sum = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    const int64_t length = cpu_cache->committed_length();
    Batch batch = Batch::Causal(std::span(tokens).subspan(length), static_cast<int32_t>(length));
    batch.logit_rows = {static_cast<int32_t>(batch.size()) - 1};
    ASSERT_TRUE(e.cpu->Forward(batch, *cpu_cache, cpu, ForwardMode::kVerify).ok());
    ASSERT_TRUE(e.cpu->Forward(batch, *exact_cache, exact, ForwardMode::kVerify).ok());
    ASSERT_TRUE(e.cuda->Forward(batch, **cuda_cache, cuda, ForwardMode::kVerify).ok());
    ASSERT_TRUE(cpu_cache->Commit(batch.size()).ok());
    ASSERT_TRUE(exact_cache->Commit(batch.size()).ok());
    ASSERT_TRUE((*cuda_cache)->Commit(batch.size()).ok());
    const auto top = [](const std::vector<float>& l) {
      return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    };
    const int32_t cpu_token = top(cpu), cuda_token = top(cuda);
    float second = -INFINITY, max_difference = 0.0f;
    for (int64_t i = 0; i < vocab; ++i) {
      if (i != cpu_token) second = std::max(second, cpu[i]);
      max_difference = std::max(max_difference, std::fabs(cpu[i] - cuda[i]));
    }
    const float margin = cpu[cpu_token] - second;
    const double cuda_nmse = Nmse(cuda, cpu), exact_nmse = Nmse(exact, cpu);
    cuda_nmse_sum += cuda_nmse;
    exact_nmse_sum += exact_nmse;
    std::printf(
        "step %2d: cpu %6d cuda %6d margin %.4f max |difference| %.4f NMSE %.3g (cpu with f32 "
        "K/V: %.3g)\n",
        step, cpu_token, cuda_token, margin, max_difference, cuda_nmse, exact_nmse);
    EXPECT_LT(cuda_nmse, 0.05) << "step " << step;
    if (margin >= kTie) {
      ++decided;
      EXPECT_EQ(cuda_token, cpu_token) << "step " << step << ": margin " << margin;
    } else if (first_tie < 0) {
      first_tie = step;
    }
    tokens.push_back(cpu_token);
  }
  std::printf(
      "%d of %d steps decided by >= %.2f; first near-tie at step %d; NMSE summed: cuda %.3g, "
      "cpu with f32 K/V %.3g\n",
      decided, kSteps, kTie, first_tie, cuda_nmse_sum, exact_nmse_sum);
  EXPECT_GE(decided, kSteps - 4);  // the prompt is not one long near-tie
  EXPECT_LE(cuda_nmse_sum, 2.0 * exact_nmse_sum);
  EXPECT_GT(exact_nmse_sum, 0.0);  // the yardstick measured something
}

#endif  // BITSPLIT_HAVE_CUDA

}  // namespace
}  // namespace bitsplit::cuda
