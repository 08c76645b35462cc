// Acceptance test of the reference forward pass against llama.cpp.
//
// The fixture (tests/oracle/gen_logits_fixtures.py) holds, for several prompts, llama.cpp's
// greedy continuation (48 tokens; 16 for the random-weight qwen models) and, at every evaluated
// position, its top-K logits and the log-sum-exp of its full distribution. llama.cpp ran an F32
// copy of the same quantized file (SmolLM2 Q4_1, gemma-3-270m Q4_K_M) with an f32 KV cache, so the
// two engines see identical weights and differ by f32 rounding only. We run the quantized file
// itself: our kernels dequantize weights to f32 and never quantize activations, so they compute the
// same function.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/llama_model.h"
#include "common/ops/softmax.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/synthetic_weights.h"

namespace bitsplit::model {
namespace {

constexpr int kChunkTokens = 64;
constexpr int kThreads = 2;

struct PositionStats {
  double kl_partition = 0;  // KL over {top-K tokens, rest}: a lower bound of the full KL
  double kl_estimate = 0;   // top-K terms plus a sampled estimate of the tail's contribution
  double max_abs_logit_diff = 0;
};

// Compares our logits at one position with the oracle's record. See the test for the maths.
PositionStats ComparePosition(const nlohmann::json& record, const float* ours, int64_t vocab) {
  const auto& ids = record["ids"];
  const auto& values = record["values"];
  const double oracle_lse = record["logsumexp"].get<double>();
  const double our_lse = ops::LogSumExp(ours, vocab);
  PositionStats stats;
  double oracle_top_mass = 0;
  double our_top_mass = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i].get<int64_t>();
    const double oracle_logp = values[i].get<double>() - oracle_lse;
    const double our_logp = static_cast<double>(ours[id]) - our_lse;
    const double p = std::exp(oracle_logp);
    oracle_top_mass += p;
    our_top_mass += std::exp(our_logp);
    stats.kl_partition += p * (oracle_logp - our_logp);
    stats.max_abs_logit_diff =
        std::max(stats.max_abs_logit_diff,
                 std::abs(static_cast<double>(ours[id]) - values[i].get<double>()));
  }
  stats.kl_estimate = stats.kl_partition;
  // The tail bucket. Masses are formed as 1 - top mass; double precision keeps them accurate
  // down to ~1e-15, far below anything that matters at the 1e-5 nats scale.
  const double oracle_tail = std::max(0.0, 1.0 - oracle_top_mass);
  const double our_tail = std::max(1e-300, 1.0 - our_top_mass);
  if (oracle_tail > 0) stats.kl_partition += oracle_tail * std::log(oracle_tail / our_tail);
  // Unbiased tail estimate: the fixture samples tail tokens s ~ p(s | tail), so
  // E[log p_s - log q_s] * p_tail is the tail's exact contribution to KL(p || q).
  if (record.contains("tail_ids") && !record["tail_ids"].empty()) {
    const auto& tail_ids = record["tail_ids"];
    const auto& tail_values = record["tail_values"];
    double sum = 0;
    for (size_t s = 0; s < tail_ids.size(); ++s) {
      const double oracle_logp = tail_values[s].get<double>() - oracle_lse;
      const double our_logp = static_cast<double>(ours[tail_ids[s].get<int64_t>()]) - our_lse;
      sum += oracle_logp - our_logp;
    }
    stats.kl_estimate += record["tail_mass"].get<double>() * sum / tail_ids.size();
  }
  return stats;
}

// Runs `tokens` causally in chunks (committing each) and hands every row's logits to `visit`
// (position, logits[vocab]) as its chunk completes.
void TeacherForcedLogits(LlamaModel& model, const std::vector<int32_t>& tokens,
                         const std::function<void(size_t, const float*)>& visit) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(static_cast<int64_t>(tokens.size()));
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<float> logits(kChunkTokens * vocab);
  for (size_t start = 0; start < tokens.size(); start += kChunkTokens) {
    const size_t count = std::min<size_t>(kChunkTokens, tokens.size() - start);
    const Batch batch =
        Batch::Causal(std::span(tokens).subspan(start, count), static_cast<int32_t>(start));
    const absl::Status status = model.Forward(batch, *cache, logits);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(cache->Commit(static_cast<int64_t>(count)).ok());
    for (size_t r = 0; r < count; ++r) visit(start + r, logits.data() + r * vocab);
  }
}

// Greedy decoding: prefill the prompt (last row's logits only), then one token at a time.
std::vector<int32_t> GreedyDecode(LlamaModel& model, const std::vector<int32_t>& prompt,
                                  int steps) {
  const int64_t vocab = model.config().vocab_size;
  auto cache = model.NewKvCache(static_cast<int64_t>(prompt.size()) + steps);
  EXPECT_TRUE(cache.ok()) << cache.status();
  std::vector<float> logits(vocab);
  Batch batch = Batch::Causal(prompt, 0);
  batch.logit_rows = {static_cast<int32_t>(prompt.size()) - 1};
  std::vector<int32_t> generated;
  for (int step = 0; step < steps; ++step) {
    const absl::Status status = model.Forward(batch, *cache, logits);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(cache->Commit(batch.size()).ok());
    const int32_t next = static_cast<int32_t>(ops::ArgMax(logits.data(), vocab));
    generated.push_back(next);
    const std::vector<int32_t> one = {next};
    batch = Batch::Causal(one, static_cast<int32_t>(cache->committed_length()));
  }
  return generated;
}

// Holds our reference forward on `model_path` to the F32 oracle `fixture`: argmax at every
// position that is not a near-tie (oracle top-2 margin below `near_tie_margin`, where f32
// rounding may flip the order), mean KL <= 1e-5 nats, and greedy continuations identical up to
// the first near-tie of the oracle's continuation.
// `min_positions` is the floor of compared positions for the fixture.
void ExpectMatchesF32Oracle(const nlohmann::json& fixture, const std::string& model_path,
                            double near_tie_margin, int64_t min_positions) {
  const std::string model_file = std::filesystem::path(model_path).filename().string();
  auto loaded = LlamaModel::Load(model_path, kThreads);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LlamaModel& model = **loaded;
  const int64_t vocab = model.config().vocab_size;

  int64_t positions = 0, compared = 0, agreed = 0, near_ties = 0;
  double kl_partition_sum = 0, kl_estimate_sum = 0, kl_partition_max = 0, max_logit_diff = 0;
  int greedy_cases_matched = 0;
  for (const auto& test_case : fixture["cases"]) {
    const std::string name = test_case["name"];
    const auto prompt = test_case["tokens"].get<std::vector<int32_t>>();
    const auto continuation = test_case["continuation"].get<std::vector<int32_t>>();
    std::vector<int32_t> sequence = prompt;
    sequence.insert(sequence.end(), continuation.begin(), continuation.end() - 1);
    const auto& records = test_case["logits"];
    ASSERT_EQ(records.size(), sequence.size()) << name;

    TeacherForcedLogits(model, sequence, [&](size_t p, const float* ours) {
      const auto& record = records[p];
      const PositionStats stats = ComparePosition(record, ours, vocab);
      kl_partition_sum += stats.kl_partition;
      kl_estimate_sum += stats.kl_estimate;
      kl_partition_max = std::max(kl_partition_max, stats.kl_partition);
      max_logit_diff = std::max(max_logit_diff, stats.max_abs_logit_diff);
      ++positions;
      const auto& values = record["values"];
      if (values[0].get<double>() - values[1].get<double>() < near_tie_margin) {
        ++near_ties;
        return;
      }
      ++compared;
      const int64_t our_argmax = ops::ArgMax(ours, vocab);
      if (our_argmax == record["ids"][0].get<int64_t>()) {
        ++agreed;
      } else {
        ADD_FAILURE() << name << " position " << p << ": our argmax " << our_argmax
                      << ", llama.cpp " << record["ids"][0];
      }
    });

    const std::vector<int32_t> greedy =
        GreedyDecode(model, prompt, static_cast<int>(continuation.size()));
    if (greedy == continuation) {
      ++greedy_cases_matched;
    } else {
      // Step k's choice is made from the logits at position prompt + k - 1.
      size_t k = 0;
      while (k < greedy.size() && greedy[k] == continuation[k]) ++k;
      const auto& values = records[prompt.size() + k - 1]["values"];
      const double margin = values[0].get<double>() - values[1].get<double>();
      EXPECT_LT(margin, near_tie_margin)
          << name << ": greedy continuation differs at step " << k << ", not at a near-tie";
      std::printf(
          "oracle %s: greedy continuation leaves llama.cpp's at step %zu, a near-tie "
          "(top-2 margin %.2e)\n",
          name.c_str(), k, margin);
    }
  }

  const double kl_partition_mean = kl_partition_sum / positions;
  const double kl_estimate_mean = kl_estimate_sum / positions;
  std::printf(
      "oracle %s: %lld positions, argmax agreement %lld/%lld (%lld near-ties skipped)\n"
      "oracle: mean KL(llama.cpp || ours) over {top-%d, rest} = %.3e nats (max %.3e); "
      "with sampled tail = %.3e nats\n"
      "oracle: max |logit difference| over top-%d = %.3e\n"
      "oracle: greedy %zu-token continuations identical in %d/%zu cases (near-tie margin %.0e)\n",
      model_file.c_str(), static_cast<long long>(positions), static_cast<long long>(agreed),
      static_cast<long long>(compared), static_cast<long long>(near_ties),
      fixture["top_k"].get<int>(), kl_partition_mean, kl_partition_max, kl_estimate_mean,
      fixture["top_k"].get<int>(), max_logit_diff, fixture["cases"][0]["continuation"].size(),
      greedy_cases_matched, fixture["cases"].size(), near_tie_margin);

  EXPECT_GE(compared, min_positions);
  EXPECT_EQ(agreed, compared);
  // The partition KL is a lower bound of the full KL (data-processing inequality: merging
  // outcomes never increases divergence); the sampled-tail figure estimates the rest and is
  // held to the same bound.
  EXPECT_LE(kl_partition_mean, 1e-5);
  EXPECT_LE(kl_estimate_mean, 1e-5);
}

nlohmann::json ReadFixture(const std::string& fixture_file) {
  std::ifstream in(testing::SourcePath(fixture_file));
  EXPECT_TRUE(in.good()) << "missing fixture " << fixture_file;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

TEST(OracleLogitsTest, MatchesLlamaCppOnF32Smollm2) {
  ExpectMatchesF32Oracle(ReadFixture("tests/fixtures/oracle/smollm2_f32_logits.json"),
                         testing::ModelPath(testing::kSmolLm2File), /*near_tie_margin=*/1e-4,
                         /*min_positions=*/1000);
}

// gemma3: GeGLU, QK-norm, post-norms, NEOX RoPE with local and global bases, and prompts past
// 600 and 1,200 tokens, so the local layers' 512-token window is crossed. The oracle is llama.cpp
// built with GGML_GELU_FP16 undefined (scripts/oracle-env.sh --exact-gelu): its CPU GELU is then
// the f32 formula, as its CUDA and Metal backends and ops::GeluTanhMul compute it. Every other op
// is llama.cpp as released, so this holds our gemma3 arithmetic to the ordinary near-tie margin.
TEST(OracleLogitsTest, MatchesLlamaCppOnF32Gemma3) {
  ExpectMatchesF32Oracle(ReadFixture("tests/fixtures/oracle/gemma3_f32_exact_gelu_logits.json"),
                         testing::ModelPath(testing::kGemma3File), /*near_tie_margin=*/1e-4,
                         /*min_positions=*/1000);
}

// qwen2 (q/k/v biases), qwen3 (QK-norm, explicit head width) and qwen3moe (qwen3's attention, a
// mixture of 16 experts with 4 used in every layer): small random-weight models (d 256, 4 query /
// 2 KV heads of 64, 2 or 3 layers, tied head over the real 152,064-token qwen2 vocabulary).
// Random weights prove the arithmetic of the families, not any model's quality.
void ExpectMatchesSyntheticOracle(const std::string& fixture_file) {
  const testing::SyntheticModelFile model(fixture_file);
  ASSERT_TRUE(model.ok());
  ExpectMatchesF32Oracle(model.fixture(), model.path(), /*near_tie_margin=*/1e-4,
                         /*min_positions=*/500);
}

TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticQwen2) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/qwen2_synthetic_logits.json");
}

TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticQwen3) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/qwen3_synthetic_logits.json");
}

TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticQwen3Moe) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/qwen3moe_synthetic_logits.json");
}

// gemma4 (the 31B's layer kinds at d 256): local layers of 4 heads over 2 KV heads of 64 with a
// 32-token window, global layers of 4 heads over 1 KV head of 128 with proportional RoPE (a
// quarter of the pairs turn; the rest have frequency factor 1e30), one global layer without
// attn_v (its values are its keys' projection), the weightless value norm, layer output scales,
// attention scale 1 and the final soft-cap at 30. Against the exact-GELU llama.cpp, as gemma3.
TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticGemma4) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/gemma4_synthetic_logits.json");
}

// gemma4's MoE layers (26B-A4B's at d 256): the dense FFN (width 256) beside 16 experts of width
// 64 with 4 used, their gate and up fused in one tensor as the converter writes them, the router
// on RMSNorm(h) / sqrt(d) * its input scale, per-expert output scales and the three extra norms;
// the attention as above.
TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticGemma4Moe) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/gemma4moe_synthetic_logits.json");
}

// gpt-oss (gpt-oss-20b's layer at d 256): local layers with a 32-token window alternating with
// global ones, 4 heads over 2 KV heads of 64 with q/k/v/o biases and a learned sink per head,
// YaRN RoPE (factor 32 over 4096 original tokens) on every layer, and 16 experts of width 128 in
// MXFP4 with 4 used, routed top-k-then-softmax by a biased router, each expert matrix biased and
// the clamped SwiGLU between.
TEST(OracleLogitsTest, MatchesLlamaCppOnSyntheticGptOss) {
  ExpectMatchesSyntheticOracle("tests/fixtures/oracle/gpt-oss_synthetic_logits.json");
}

// A mixture-of-experts row routes on its own hidden state and its experts are added in the order
// chosen, so its logits are bit-identical whether it runs alone, in a causal batch, as a node of
// a tree beside other branches, or on another thread count.
TEST(OracleLogitsTest, Qwen3MoeRowsAreBatchInvariant) {
  const testing::SyntheticModelFile file("tests/fixtures/oracle/qwen3moe_synthetic_logits.json");
  ASSERT_TRUE(file.ok());
  auto two_threads = LlamaModel::Load(file.path(), 2);
  auto one_thread = LlamaModel::Load(file.path(), 1);
  ASSERT_TRUE(two_threads.ok()) << two_threads.status();
  ASSERT_TRUE(one_thread.ok()) << one_thread.status();
  const std::vector<int32_t> all = file.fixture()["cases"][0]["tokens"];
  ASSERT_GE(all.size(), 40u);
  const std::vector<int32_t> tokens(all.begin(), all.begin() + 40);
  const int64_t vocab = (*two_threads)->config().vocab_size;
  const int64_t n = static_cast<int64_t>(tokens.size());

  // The whole prompt as one causal batch.
  auto cache = (*two_threads)->NewKvCache(n + 4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> batched(static_cast<size_t>(n * vocab));
  ASSERT_TRUE((*two_threads)->Forward(Batch::Causal(tokens, 0), *cache, batched).ok());
  // One token at a time, on one thread.
  auto single_cache = (*one_thread)->NewKvCache(n + 4);
  ASSERT_TRUE(single_cache.ok());
  std::vector<float> single(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t> one = {tokens[static_cast<size_t>(t)]};
    ASSERT_TRUE((*one_thread)
                    ->Forward(Batch::Causal(one, static_cast<int32_t>(t)), *single_cache, single)
                    .ok());
    ASSERT_TRUE(single_cache->Commit(1).ok());
    ASSERT_EQ(0, std::memcmp(single.data(), batched.data() + t * vocab, vocab * sizeof(float)))
        << "position " << t;
  }
  // A tree over the committed prompt: two branches of two tokens; each node equals its path run
  // as a chain.
  ASSERT_TRUE(cache->Commit(n).ok());
  const std::vector<int32_t> tree_tokens = {tokens[1], tokens[2], tokens[3], tokens[4]};
  auto tree = Batch::Tree(tree_tokens, std::vector<int32_t>{-1, 0, -1, 2}, static_cast<int32_t>(n));
  ASSERT_TRUE(tree.ok());
  std::vector<float> tree_logits(static_cast<size_t>(4 * vocab));
  ASSERT_TRUE((*two_threads)->Forward(*tree, *cache, tree_logits).ok());
  for (const int branch : {0, 2}) {
    const std::vector<int32_t> chain = {tree_tokens[branch], tree_tokens[branch + 1]};
    std::vector<float> chain_logits(static_cast<size_t>(2 * vocab));
    ASSERT_TRUE((*two_threads)
                    ->Forward(Batch::Causal(chain, static_cast<int32_t>(n)), *cache, chain_logits)
                    .ok());
    EXPECT_EQ(0, std::memcmp(chain_logits.data(), tree_logits.data() + branch * vocab,
                             2 * vocab * sizeof(float)))
        << "branch at node " << branch;
  }
}

// For information: llama.cpp on the original Q4_1 file quantizes activations to Q8_1 inside its
// matmuls, so it computes a slightly different function from ours (f32 activations). The
// numbers are printed for the record; the bounds only catch a gross regression.
TEST(OracleLogitsTest, ReportsAgreementWithLlamaCppOnQ4_1) {
  std::ifstream in(testing::SourcePath("tests/fixtures/oracle/smollm2_q4_1_logits.json"));
  ASSERT_TRUE(in.good()) << "missing fixture tests/fixtures/oracle/smollm2_q4_1_logits.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  auto loaded = LlamaModel::Load(testing::ModelPath(testing::kSmolLm2File), kThreads);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LlamaModel& model = **loaded;
  const int64_t vocab = model.config().vocab_size;
  int64_t positions = 0, agreed = 0;
  double kl_sum = 0;
  for (const auto& test_case : fixture["cases"]) {
    std::vector<int32_t> sequence = test_case["tokens"].get<std::vector<int32_t>>();
    const auto continuation = test_case["continuation"].get<std::vector<int32_t>>();
    sequence.insert(sequence.end(), continuation.begin(), continuation.end() - 1);
    const auto& records = test_case["logits"];
    ASSERT_EQ(records.size(), sequence.size());
    TeacherForcedLogits(model, sequence, [&](size_t p, const float* ours) {
      kl_sum += ComparePosition(records[p], ours, vocab).kl_partition;
      agreed += ops::ArgMax(ours, vocab) == records[p]["ids"][0].get<int64_t>();
      ++positions;
    });
  }
  const double kl_mean = kl_sum / positions;
  std::printf(
      "q4_1 (information): %lld positions, argmax agreement %.2f%%, mean KL(llama.cpp Q4_1 || "
      "ours) over {top-%d, rest} = %.3e nats\n",
      static_cast<long long>(positions), 100.0 * agreed / positions, fixture["top_k"].get<int>(),
      kl_mean);
  EXPECT_GE(positions, 1000);
  EXPECT_GE(static_cast<double>(agreed) / positions, 0.9);
  EXPECT_LE(kl_mean, 0.05);
}

}  // namespace
}  // namespace bitsplit::model
