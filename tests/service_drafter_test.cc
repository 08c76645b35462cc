// The gpu-drafter service as a process (services/gpu-drafter), in front of a real cpu-residual
// process, both on unix sockets in a temporary directory, driven through its Generate stream
// (common/rpc/drafter_client.h). The expectation is independent of the service: the SmolLM2
// split model loaded in this process (LlamaModel::LoadSplit(base, residual), the residual mapped
// here) decoding one token at a time with Sampler::Choose. Generation through the service, with
// any tree shape, must give exactly those tokens (docs/design.md §3, the losslessness invariant).
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bitsplit/internal/v1/drafter.grpc.pb.h"
#include "common/io/split_file.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/rpc/drafter_client.h"
#include "common/speculation/tree.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

namespace v1 = bitsplit::internal::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::HealthStatus;
using testing::ServiceProcess;

const char kResidualBinary[] = BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual";
const char kDrafterBinary[] = BITSPLIT_BINARY_DIR "/services/gpu-drafter/bitsplit-drafter";
constexpr int kMaxTreeNodes = 16;
constexpr int kMaxContext = 256;
constexpr int kResidualTimeoutMs = 3000;

// The prompt the decodes continue (a text, so that the continuation is not a degenerate loop).
const std::vector<int32_t>& Prompt() {
  static const std::vector<int32_t>* const prompt = [] {
    auto model = model::LlamaModel::LoadSplit(testing::SmolLm2SplitModel().base, "", 1);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return new std::vector<int32_t>{1, 2, 3};
    auto tokenizer = text::Tokenizer::FromGguf((*model)->gguf_metadata());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    if (!tokenizer.ok()) return new std::vector<int32_t>{1, 2, 3};
    return new std::vector<int32_t>(
        (*tokenizer)->Encode("Once upon a time, in a small village by the sea,", false));
  }();
  return *prompt;
}

bool SameSampling(const model::SamplingParams& a, const model::SamplingParams& b) {
  return std::tie(a.temperature, a.top_k, a.top_p, a.seed) ==
         std::tie(b.temperature, b.top_k, b.top_p, b.seed);
}

// The verifier's own non-speculative output after Prompt() over an f16 KV cache (the drafter's
// default --kv-type): one token per forward (Batch::Causal), the choice for sequence index i made
// with Sampler::Choose at position i. Computed once per
// sampling configuration and process.
std::vector<int32_t> PlainDecode(const model::SamplingParams& params, int tokens) {
  static auto* cache = new std::vector<std::pair<model::SamplingParams, std::vector<int32_t>>>();
  for (const auto& [p, result] : *cache) {
    if (SameSampling(p, params) && static_cast<int>(result.size()) >= tokens) {
      return std::vector<int32_t>(result.begin(), result.begin() + tokens);
    }
  }
  const testing::SplitModelPaths& paths = testing::SmolLm2SplitModel();
  auto model = model::LlamaModel::LoadSplit(paths.base, paths.residual, 1);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto cache_or = (*model)->NewKvCache(kMaxContext, model::KvType::kF16);
  EXPECT_TRUE(cache_or.ok());
  model::KvCache& kv = *cache_or;
  const int64_t vocab = (*model)->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  model::Sampler sampler;
  std::vector<int32_t> sequence = Prompt();
  std::vector<int32_t> output;
  // The prompt runs one token at a time too; its last logits choose the first new token.
  for (size_t i = 0; i + 1 < Prompt().size(); ++i) {
    const int32_t token = Prompt()[i];
    EXPECT_TRUE((*model)
                    ->Forward(model::Batch::Causal({&token, 1}, static_cast<int32_t>(i)), kv,
                              std::span<float>(logits), model::ForwardMode::kVerify)
                    .ok());
    EXPECT_TRUE(kv.Commit(1).ok());
  }
  while (static_cast<int>(output.size()) < tokens) {
    const int32_t token = sequence.back();
    const int32_t position = static_cast<int32_t>(sequence.size() - 1);
    const absl::Status status =
        (*model)->Forward(model::Batch::Causal({&token, 1}, position), kv, std::span<float>(logits),
                          model::ForwardMode::kVerify);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(kv.Commit(1).ok());
    const int32_t next = sampler.Choose(logits, params, static_cast<int64_t>(sequence.size()));
    sequence.push_back(next);
    output.push_back(next);
  }
  cache->emplace_back(params, output);
  return output;
}

v1::SamplingParams ToProto(const model::SamplingParams& params) {
  v1::SamplingParams proto;
  proto.set_temperature(params.temperature);
  proto.set_top_k(params.top_k);
  proto.set_top_p(params.top_p);
  proto.set_seed(params.seed);
  return proto;
}

// One Generate stream read to its end.
struct GenerateOutcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  std::vector<v1::NodeChoice> choices;  // one per token
  int prefill_events = 0;
  int step_events = 0;
  bool context_full = false;
  std::vector<v1::StepReport> steps;
  int cached = 0;  // prompt tokens the prefix cache held
};

GenerateOutcome RunGenerate(rpc::DrafterClient& client, const v1::GenerateRequest& request) {
  GenerateOutcome outcome;
  std::unique_ptr<rpc::DrafterClient::GenerateCall> call = client.Generate(request);
  v1::GenerateEvent event;
  while (call->Read(&event)) {
    outcome.tokens.insert(outcome.tokens.end(), event.tokens().begin(), event.tokens().end());
    outcome.choices.insert(outcome.choices.end(), event.choices().begin(), event.choices().end());
    if (event.has_step()) {
      ++outcome.step_events;
      outcome.steps.push_back(event.step());
      EXPECT_EQ(event.tokens_size(), event.choices_size());
    } else if (!event.context_full()) {
      ++outcome.prefill_events;
    }
    outcome.context_full = outcome.context_full || event.context_full();
    outcome.cached += event.cached();
  }
  outcome.status = call->Finish();
  return outcome;
}

// Prompt() and max_tokens; a tree of `nodes` (k 4, depth 8) unless 0 (off).
v1::GenerateRequest GenerateRequestFor(int max_tokens, int nodes = 0,
                                       const model::SamplingParams& sampling = {}) {
  v1::GenerateRequest request;
  request.mutable_prompt()->Add(Prompt().begin(), Prompt().end());
  request.set_max_tokens(max_tokens);
  *request.mutable_sampling() = ToProto(sampling);
  if (nodes > 0) {
    request.set_nodes(nodes);
    request.set_expansions(4);
    request.set_max_depth(8);
  }
  return request;
}

// ---- Fixture -----------------------------------------------------------------------------------

class DrafterServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The expectations are the cpu engine's: with no device visible, --backend auto (the default)
    // picks the cpu backend on every machine, also a CUDA build's on a GPU host.
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char pattern[] = "/tmp/bitsplit-drafter-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = new std::string(pattern);
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(*dir_, ignored);
    delete dir_;
  }

  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    residual_socket_ = *dir_ + "/" + test + ".residual.sock";
    drafter_socket_ = *dir_ + "/" + test + ".drafter.sock";
    paths_ = testing::SmolLm2SplitModel();
    ASSERT_TRUE(std::filesystem::exists(paths_.base)) << paths_.base;
  }

  std::string residual_target() const { return "unix:" + residual_socket_; }
  std::string drafter_target() const { return "unix:" + drafter_socket_; }

  void StartResidual(ServiceProcess& residual) {
    ASSERT_TRUE(residual.Start(
        {paths_.residual, "--socket", residual_socket_, "--threads", "1", "--max-rows", "64"}));
    ASSERT_TRUE(residual.WaitServing(residual_target())) << residual.Stderr();
  }

  std::vector<std::string> DrafterArgs(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {paths_.base,
                                     "--residual-socket",
                                     residual_target(),
                                     "--socket",
                                     drafter_socket_,
                                     "--threads",
                                     "1",
                                     "--max-sessions",
                                     "2",
                                     "--max-context",
                                     std::to_string(kMaxContext),
                                     "--max-tree-nodes",
                                     std::to_string(kMaxTreeNodes),
                                     "--residual-timeout-ms",
                                     std::to_string(kResidualTimeoutMs)};
    // An --max-sessions in `extra` replaces the default (the flag takes one value).
    auto own = std::find(extra.begin(), extra.end(), "--max-sessions");
    if (own != extra.end() && own + 1 != extra.end()) {
      *(std::find(args.begin(), args.end(), "--max-sessions") + 1) = *(own + 1);
      extra.erase(own, own + 2);
    }
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  void StartDrafter(ServiceProcess& drafter, std::vector<std::string> extra = {}) {
    ASSERT_TRUE(drafter.Start(DrafterArgs(std::move(extra))));
    ASSERT_TRUE(drafter.WaitServing(drafter_target())) << drafter.Stderr();
  }

  // Both services; the client connected to the drafter.
  void StartBoth(ServiceProcess& residual, ServiceProcess& drafter,
                 std::vector<std::string> drafter_extra = {}) {
    ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
    ASSERT_NO_FATAL_FAILURE(StartDrafter(drafter, std::move(drafter_extra)));
    auto client =
        rpc::DrafterClient::Connect(drafter_target(), milliseconds(5000), milliseconds(60000));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  int OpenSessions() {
    auto info = client_->GetInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->open_sessions() : -1;
  }
  // Whether the drafter reports `count` open sessions within `timeout`.
  bool WaitForOpenSessions(int count, milliseconds timeout = milliseconds(5000)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (OpenSessions() == count) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

  // `count` generations that hold a session each: admitted (each sent its first event) and far
  // from done (they run until the context is full). Cancel a call to free its session.
  std::vector<std::unique_ptr<rpc::DrafterClient::GenerateCall>> HoldSessions(int count) {
    std::vector<std::unique_ptr<rpc::DrafterClient::GenerateCall>> calls;
    for (int i = 0; i < count; ++i) {
      calls.push_back(client_->Generate(GenerateRequestFor(1 << 20)));
      v1::GenerateEvent first;
      EXPECT_TRUE(calls.back()->Read(&first)) << calls.back()->Finish();
    }
    return calls;
  }
  static void Release(std::vector<std::unique_ptr<rpc::DrafterClient::GenerateCall>>& calls) {
    for (auto& call : calls) {
      call->Cancel();
      EXPECT_EQ(call->Finish().code(), absl::StatusCode::kCancelled);
    }
    calls.clear();
  }
  // Whether the drafter's readiness reports `status` within two of its 500 ms probe periods.
  bool WaitForReadiness(int status) {
    const auto deadline = Clock::now() + milliseconds(1500);
    while (Clock::now() < deadline) {
      if (HealthStatus(drafter_target(), "readiness") == status) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  static inline std::string* dir_ = nullptr;
  testing::SplitModelPaths paths_;
  std::string residual_socket_;
  std::string drafter_socket_;
  std::unique_ptr<rpc::DrafterClient> client_;
};

// ---- (1) generation through the service equals plain decoding -----------------------------------

TEST_F(DrafterServiceTest, GreedyGenerateEqualsPlainDecodeAndInfoDescribesIt) {
  constexpr int kTokens = 16;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kTokens));
  // A continuation that loops over a token or two would make the comparison weak.
  ASSERT_GE(std::set<int32_t>(expected.begin(), expected.end()).size(), 8u)
      << ::testing::PrintToString(expected);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  const GenerateOutcome run = RunGenerate(*client_, GenerateRequestFor(kTokens));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, expected);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->residual(), "shm " + residual_target());
  EXPECT_EQ(info->max_context(), kMaxContext);
  EXPECT_EQ(info->max_tree_nodes(), kMaxTreeNodes);
  EXPECT_EQ(info->max_sessions(), 2);
  EXPECT_EQ(info->open_sessions(), 0);  // the stream ended: its session is closed
  EXPECT_EQ(info->vocab_size(), 49152);
  EXPECT_EQ(info->layers(), 30);
  EXPECT_EQ(info->fingerprint().size(), 64u);
  EXPECT_EQ(info->base_bytes(), std::filesystem::file_size(paths_.base));
  EXPECT_EQ(info->residual_bytes(), std::filesystem::file_size(paths_.residual));
  EXPECT_FALSE(info->residual_format().empty());
  EXPECT_EQ(info->vram_plan(), "");  // the cpu backend has no VRAM plan
  EXPECT_EQ(info->vram_budget_bytes(), 0u);
  // One step event per token (off), every one a forward of its own: the counters say so.
  EXPECT_EQ(info->scheduler_iterations(), info->verify_forwards());
  EXPECT_EQ(info->verify_rows(), static_cast<int64_t>(Prompt().size() - 1) + kTokens);
  EXPECT_FALSE(info->has_residual_stats());  // only when asked for
  auto with_stats = client_->GetInfo(milliseconds(5000), /*include_residual_stats=*/true);
  ASSERT_TRUE(with_stats.ok()) << with_stats.status();
  ASSERT_TRUE(with_stats->has_residual_stats());
  EXPECT_EQ(
      with_stats->residual_stats().weight_bytes_read(),
      with_stats->residual_stats().weight_bytes() * static_cast<uint64_t>(info->verify_forwards()));
  // The socket is owner/group only.
  struct stat st;
  ASSERT_EQ(stat(drafter_socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

// --residual-file: the residual computed in the drafter process; the same tokens, no cpu-residual.
TEST_F(DrafterServiceTest, InProcessResidualFileGivesTheSameTokens) {
  constexpr int kTokens = 6;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  ServiceProcess drafter(kDrafterBinary);
  std::vector<std::string> args = DrafterArgs({"--residual-file", paths_.residual});
  args.erase(args.begin() + 1, args.begin() + 3);  // no --residual-socket
  ASSERT_TRUE(drafter.Start(args));
  ASSERT_TRUE(drafter.WaitServing(drafter_target())) << drafter.Stderr();
  auto client =
      rpc::DrafterClient::Connect(drafter_target(), milliseconds(5000), milliseconds(60000));
  ASSERT_TRUE(client.ok()) << client.status();
  client_ = *std::move(client);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->residual(), "in-process");
  EXPECT_EQ(info->residual_bytes(), std::filesystem::file_size(paths_.residual));
  const GenerateOutcome run = RunGenerate(*client_, GenerateRequestFor(kTokens, 6));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, expected);
}

// ---- (2) speculation through the service is lossless -------------------------------------------

// Every shape (trees, a chain, off), greedy and sampled: the tokens of plain decoding, and step
// reports that describe trees of the asked shape.
TEST_F(DrafterServiceTest, SpeculationIsLosslessAndStepsReportTheirTrees) {
  constexpr int kTokens = 8;
  const model::SamplingParams greedy;
  const model::SamplingParams sampled{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7};
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  struct Case {
    int nodes, expansions, max_depth;
    model::SamplingParams sampling;
  };
  for (const Case& c : {Case{6, 2, 3, greedy}, Case{4, 1, 8, greedy}, Case{0, 1, 1, greedy},
                        Case{6, 3, 4, sampled}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.nodes << " k=" << c.expansions << " depth="
                                      << c.max_depth << " T=" << c.sampling.temperature);
    v1::GenerateRequest request = GenerateRequestFor(kTokens, 0, c.sampling);
    request.set_nodes(c.nodes);
    request.set_expansions(c.expansions);
    request.set_max_depth(c.max_depth);
    const GenerateOutcome run = RunGenerate(*client_, request);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.tokens, PlainDecode(c.sampling, kTokens));
    for (const v1::StepReport& step : run.steps) {
      EXPECT_EQ(step.tree_nodes(), c.nodes + 1);  // the model always has the candidates
      EXPECT_LE(step.tree_depth(), c.nodes == 0 ? 0 : c.max_depth);
      if (c.expansions == 1) {
        EXPECT_EQ(step.tree_depth(), step.tree_nodes() - 1);  // a chain
      }
      EXPECT_LE(step.accepted_depth(), step.tree_depth());
      EXPECT_EQ(step.draft_forwards() > 0, c.nodes > 0);
      EXPECT_GT(step.verify_ns(), 0);
      EXPECT_EQ(step.batch_rows(), step.tree_nodes());  // alone in its iterations
      EXPECT_EQ(step.batch_generations(), 1);
    }
  }
}

// Log-probabilities of every emitted token: greedy emits the most likely token, listed first
// among its alternatives, which come in descending order.
TEST_F(DrafterServiceTest, LogprobsComeWithEveryToken) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  v1::GenerateRequest request = GenerateRequestFor(6, 6);
  request.set_logprobs(3);
  const GenerateOutcome run = RunGenerate(*client_, request);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, PlainDecode({}, 6));
  ASSERT_EQ(run.choices.size(), run.tokens.size());
  for (size_t i = 0; i < run.choices.size(); ++i) {
    const v1::NodeChoice& choice = run.choices[i];
    EXPECT_EQ(choice.token(), run.tokens[i]);
    ASSERT_EQ(choice.top_ids_size(), 3);
    ASSERT_EQ(choice.top_logprobs_size(), 3);
    EXPECT_EQ(choice.top_ids(0), choice.token());
    EXPECT_FLOAT_EQ(choice.top_logprobs(0), choice.logprob());
    EXPECT_LE(choice.logprob(), 0.0f);
    EXPECT_GE(choice.top_logprobs(0), choice.top_logprobs(1));
    EXPECT_GE(choice.top_logprobs(1), choice.top_logprobs(2));
  }
}

TEST_F(DrafterServiceTest, GenerateEqualsPlainDecodeAndEndsWhereAsked) {
  constexpr int kTokens = 12;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  // Prefill in chunks of 5 rows: the prompt takes several iterations.
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter, {"--prefill-rows", "5"}));
  for (int nodes : {0, 15}) {
    SCOPED_TRACE(nodes == 0 ? "off" : "tree");
    // The whole prompt prefilled, not the first run's session reused.
    v1::GenerateRequest request = GenerateRequestFor(kTokens, nodes);
    request.set_skip_prefix_cache(true);
    const GenerateOutcome run = RunGenerate(*client_, request);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.tokens, expected);
    EXPECT_EQ(run.cached, 0);
    EXPECT_EQ(run.prefill_events, static_cast<int>((Prompt().size() - 1 + 4) / 5));
    ASSERT_FALSE(run.steps.empty());
    EXPECT_GT(run.steps.back().verify_ns(), 0);
    if (nodes == 0) {
      EXPECT_EQ(run.steps.back().tree_nodes(), 1);
      EXPECT_EQ(run.step_events, kTokens);
    } else {
      EXPECT_GE(run.steps.back().tree_nodes(), 2);
    }
  }
  // An end token ends the stream right after it is emitted.
  v1::GenerateRequest ending = GenerateRequestFor(kTokens);
  ending.add_end_token_ids(expected[4]);
  const size_t first = static_cast<size_t>(
      std::find(expected.begin(), expected.end(), expected[4]) - expected.begin());
  const GenerateOutcome ended = RunGenerate(*client_, ending);
  ASSERT_TRUE(ended.status.ok()) << ended.status;
  EXPECT_EQ(ended.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + first + 1));
  // A context that holds 3 tokens beyond the prompt: the stream says so after 4 (the last,
  // the bonus of the final step, needs no slot).
  v1::GenerateRequest bounded = GenerateRequestFor(100, 15);
  bounded.set_context(static_cast<int32_t>(Prompt().size()) + 3);
  const GenerateOutcome full = RunGenerate(*client_, bounded);
  ASSERT_TRUE(full.status.ok()) << full.status;
  EXPECT_TRUE(full.context_full);
  EXPECT_EQ(full.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 4));
  EXPECT_EQ(OpenSessions(), 0);  // every stream's session is closed
}

TEST_F(DrafterServiceTest, BadGenerateRequestsAreRefusedNamingTheField) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no prompt", [](v1::GenerateRequest& r) { r.clear_prompt(); }, "at least one token"},
      {"token", [](v1::GenerateRequest& r) { r.set_prompt(0, -1); }, "prompt token 0"},
      {"context", [](v1::GenerateRequest& r) { r.set_context(kMaxContext + 1); }, "context"},
      {"prompt beyond the context", [](v1::GenerateRequest& r) { r.set_context(3); }, "do not fit"},
      {"max_tokens", [](v1::GenerateRequest& r) { r.set_max_tokens(0); }, "max_tokens"},
      {"end token", [](v1::GenerateRequest& r) { r.add_end_token_ids(1 << 30); }, "end token"},
      {"negative context", [](v1::GenerateRequest& r) { r.set_context(-1); }, "context"},
      {"temperature", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); },
       "temperature"},
      {"NaN temperature",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
       },
       "temperature"},
      {"top_k", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(-2); }, "top_k"},
      {"top_p", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {"logprobs", [](v1::GenerateRequest& r) { r.set_logprobs(99); }, "logprobs"},
      {"negative logprobs", [](v1::GenerateRequest& r) { r.set_logprobs(-1); }, "logprobs"},
      {"tree", [](v1::GenerateRequest& r) { r.set_nodes(kMaxTreeNodes); }, "nodes"},
      {"negative tree", [](v1::GenerateRequest& r) { r.set_nodes(-1); }, "nodes"},
      {"expansions", [](v1::GenerateRequest& r) { r.set_expansions(0); }, "expansions"},
      {"depth", [](v1::GenerateRequest& r) { r.set_max_depth(0); }, "depth"},
      {"schema and json_object",
       [](v1::GenerateRequest& r) {
         r.set_json_object(true);
         r.set_response_schema(R"({"type": "object"})");
       },
       "exclude each other"},
      {"schema", [](v1::GenerateRequest& r) { r.set_response_schema("{"); }, "response_schema"},
      {"frame without a document", [](v1::GenerateRequest& r) { r.add_response_prefix_tokens(1); },
       "need response_schema"},
      {"frame token",
       [](v1::GenerateRequest& r) {
         r.set_json_object(true);
         r.add_response_suffix_tokens(1 << 30);
       },
       "response prefix/suffix token"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest request = GenerateRequestFor(4, 4);
    c.change(request);
    const GenerateOutcome refused = RunGenerate(*client_, request);
    EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
    EXPECT_THAT(std::string(refused.status.message()), ::testing::HasSubstr(c.message));
  }
  // Still serving: a good request gets the plain decode's tokens.
  EXPECT_EQ(HealthStatus(drafter_target()), grpc::health::v1::HealthCheckResponse::SERVING);
  const GenerateOutcome served = RunGenerate(*client_, GenerateRequestFor(4, 4));
  EXPECT_TRUE(served.status.ok()) << served.status;
  EXPECT_EQ(served.tokens, PlainDecode({}, 4));
  EXPECT_EQ(OpenSessions(), 0);
}

// ---- (3) sessions live as long as their streams ------------------------------------------------

// --max-sessions 2: two running generations take both sessions, a third is RESOURCE_EXHAUSTED
// (readiness says so too); a cancelled stream frees its session at once.
TEST_F(DrafterServiceTest, SessionLimitAndACancelledStreamFreesItsSession) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  auto held = HoldSessions(2);
  EXPECT_EQ(OpenSessions(), 2);
  const GenerateOutcome full = RunGenerate(*client_, GenerateRequestFor(4));
  EXPECT_EQ(full.status.code(), absl::StatusCode::kResourceExhausted) << full.status;
  EXPECT_THAT(std::string(full.status.message()), ::testing::HasSubstr("sessions are in use"));
  EXPECT_TRUE(WaitForReadiness(grpc::health::v1::HealthCheckResponse::NOT_SERVING));
  held[0]->Cancel();
  EXPECT_EQ(held[0]->Finish().code(), absl::StatusCode::kCancelled);
  const auto cancelled = Clock::now();
  EXPECT_TRUE(WaitForOpenSessions(1));
  EXPECT_LT(Clock::now() - cancelled, milliseconds(1000));
  const GenerateOutcome served = RunGenerate(*client_, GenerateRequestFor(4, 4));
  EXPECT_TRUE(served.status.ok()) << served.status;
  EXPECT_EQ(served.tokens, PlainDecode({}, 4));
  held.erase(held.begin());
  Release(held);
  EXPECT_TRUE(WaitForOpenSessions(0));
  EXPECT_TRUE(WaitForReadiness(grpc::health::v1::HealthCheckResponse::SERVING));
}

// The prefix cache: a request whose prompt begins with what a finished generation committed takes
// that session (its first event says how many prompt tokens it held) and emits exactly what a
// fresh session does; kept sessions live only in the session slots no generation uses, the least
// recently used evicted first.
TEST_F(DrafterServiceTest, PrefixCacheReusesFinishedSessionsExactly) {
  constexpr int kTokens = 10;
  const model::SamplingParams sampled{.temperature = 0.8f, .seed = 7};
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter, {"--prefill-rows", "5"}));  // 2 sessions
  const GenerateOutcome first = RunGenerate(*client_, GenerateRequestFor(kTokens, 15, sampled));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.cached, 0);
  ASSERT_EQ(first.tokens.size(), static_cast<size_t>(kTokens));

  // The next turn: the prompt, the answer, then more text. The first session committed the
  // prompt and every emitted token but the last (the root of a step never run).
  std::vector<int32_t> next_turn = Prompt();
  next_turn.insert(next_turn.end(), first.tokens.begin(), first.tokens.end());
  next_turn.insert(next_turn.end(), Prompt().begin(), Prompt().begin() + 6);
  v1::GenerateRequest next = GenerateRequestFor(kTokens, 15, sampled);
  next.mutable_prompt()->Assign(next_turn.begin(), next_turn.end());
  const GenerateOutcome reused = RunGenerate(*client_, next);
  ASSERT_TRUE(reused.status.ok()) << reused.status;
  EXPECT_EQ(reused.cached, static_cast<int>(Prompt().size()) + kTokens - 1);
  next.set_skip_prefix_cache(true);
  const GenerateOutcome fresh = RunGenerate(*client_, next);
  ASSERT_TRUE(fresh.status.ok()) << fresh.status;
  EXPECT_EQ(fresh.cached, 0);
  EXPECT_EQ(reused.tokens, fresh.tokens);
  // The same prompt once more, greedy: cut back to all but the prompt's last token.
  v1::GenerateRequest again = GenerateRequestFor(kTokens, 6);
  again.mutable_prompt()->Assign(next_turn.begin(), next_turn.end());
  const GenerateOutcome repeated = RunGenerate(*client_, again);
  ASSERT_TRUE(repeated.status.ok()) << repeated.status;
  EXPECT_EQ(repeated.cached, static_cast<int>(next_turn.size()) - 1);
  again.set_skip_prefix_cache(true);
  EXPECT_EQ(RunGenerate(*client_, again).tokens, repeated.tokens);

  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->prefix_cache());
  EXPECT_EQ(info->cached_sessions(), 2);  // both slots, none in use
  EXPECT_EQ(info->prefix_lookups(), 3);   // the skipping requests did not look
  EXPECT_EQ(info->prefix_hits(), 2);
  EXPECT_EQ(info->prefix_cached_tokens(), reused.cached + repeated.cached);
  // The fourth generation's new session found both slots kept: the least recent went.
  EXPECT_EQ(info->prefix_evictions(), 1);

  // Generations in both slots evict every kept session; they share no prefix with them.
  std::vector<std::unique_ptr<rpc::DrafterClient::GenerateCall>> held;
  for (int i = 0; i < 2; ++i) {
    v1::GenerateRequest unrelated = GenerateRequestFor(1 << 20);
    unrelated.mutable_prompt()->Assign(Prompt().rbegin(), Prompt().rend());
    ASSERT_NE(unrelated.prompt(0), Prompt()[0]);
    held.push_back(client_->Generate(unrelated));
    v1::GenerateEvent event;
    EXPECT_TRUE(held.back()->Read(&event)) << held.back()->Finish();
  }
  info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->cached_sessions(), 0);
  EXPECT_EQ(info->prefix_evictions(), 3);
  Release(held);
  EXPECT_TRUE(WaitForOpenSessions(0));
  const GenerateOutcome after = RunGenerate(*client_, next);
  EXPECT_EQ(after.cached, 0);  // the request skips the cache; nothing of it was kept anyway
  EXPECT_EQ(after.tokens, fresh.tokens);
}

TEST_F(DrafterServiceTest, NoPrefixCacheKeepsNothing) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter, {"--no-prefix-cache"}));
  const GenerateOutcome first = RunGenerate(*client_, GenerateRequestFor(4));
  const GenerateOutcome second = RunGenerate(*client_, GenerateRequestFor(4));
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.cached, 0);
  EXPECT_EQ(second.tokens, first.tokens);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->prefix_cache());
  EXPECT_EQ(info->cached_sessions(), 0);
  EXPECT_EQ(info->prefix_lookups(), 0);
}

// Two generations with different sampling and shapes, from two threads at once: batched into
// shared forwards, each emits exactly its own plain decoding.
TEST_F(DrafterServiceTest, ConcurrentGenerationsEachEqualPlainDecode) {
  constexpr int kTokens = 10;
  const model::SamplingParams greedy;
  const model::SamplingParams sampled{.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 3};
  const std::vector<int32_t> expected_greedy = PlainDecode(greedy, kTokens);
  const std::vector<int32_t> expected_sampled = PlainDecode(sampled, kTokens);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  GenerateOutcome other;
  std::thread thread(
      [&] { other = RunGenerate(*client_, GenerateRequestFor(kTokens, 0, sampled)); });
  const GenerateOutcome mine = RunGenerate(*client_, GenerateRequestFor(kTokens, 6, greedy));
  thread.join();
  ASSERT_TRUE(mine.status.ok()) << mine.status;
  ASSERT_TRUE(other.status.ok()) << other.status;
  EXPECT_EQ(mine.tokens, expected_greedy);
  EXPECT_EQ(other.tokens, expected_sampled);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  // Batched: fewer iterations than generation steps.
  EXPECT_LT(info->scheduler_iterations(), info->scheduler_steps());
}

// ---- (5) cpu-residual dies and comes back ------------------------------------------------------

TEST_F(DrafterServiceTest, ResidualKilledGivesUnavailableThenRestartRecovers) {
  const std::vector<int32_t> expected = PlainDecode({}, 3);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  // A long generation: the residual dies under it after its first step.
  std::unique_ptr<rpc::DrafterClient::GenerateCall> call =
      client_->Generate(GenerateRequestFor(1 << 20));
  v1::GenerateEvent event;
  while (call->Read(&event) && !event.has_step()) {
  }
  ASSERT_TRUE(event.has_step());
  EXPECT_EQ(event.tokens(0), expected[0]);
  residual.Kill(SIGKILL);
  const auto start = Clock::now();
  while (call->Read(&event)) {
  }
  const absl::Status failed = call->Finish();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  // What the client can act on, not the residual's socket path (the drafter logs that).
  EXPECT_NE(failed.message().find("the residual service is unavailable; retry shortly"),
            std::string::npos)
      << failed;
  EXPECT_EQ(failed.message().find(residual_target()), std::string::npos);
  EXPECT_LT(Clock::now() - start, milliseconds(kResidualTimeoutMs + 2000));
  // The drafter stays up, its session closed with the stream.
  EXPECT_TRUE(drafter.running());
  EXPECT_EQ(OpenSessions(), 0);
  EXPECT_EQ(HealthStatus(drafter_target()), grpc::health::v1::HealthCheckResponse::SERVING);
  // While cpu-residual is down every generation is UNAVAILABLE at once (the reattach fails).
  const GenerateOutcome refused = RunGenerate(*client_, GenerateRequestFor(3));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_TRUE(refused.tokens.empty());

  // Restarted: the next generation reattaches and succeeds.
  ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
  const GenerateOutcome recovered = RunGenerate(*client_, GenerateRequestFor(3, 6));
  ASSERT_TRUE(recovered.status.ok()) << recovered.status;
  EXPECT_EQ(recovered.tokens, expected);
}

// ---- (6) a residual of another quantize run ----------------------------------------------------

TEST_F(DrafterServiceTest, WrongFingerprintRefusesToStart) {
  // The base file of "another quantize run": the fixture's base with other fingerprint bytes (the
  // fingerprint identifies the run; nothing else in the file checks it, docs/formats.md).
  const std::string other_base = *dir_ + "/other.base.bsplit";
  std::filesystem::copy_file(paths_.base, other_base,
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream file(other_base, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(16);  // SplitFileHeader::fingerprint
    const std::string other(32, '\x5a');
    file.write(other.data(), static_cast<std::streamsize>(other.size()));
  }
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
  std::vector<std::string> args = DrafterArgs();
  args[0] = other_base;
  ASSERT_TRUE(drafter.Start(args));
  EXPECT_EQ(drafter.Wait(milliseconds(30000)), 1) << drafter.Stderr();
  const std::string message = drafter.Stderr();
  EXPECT_NE(message.find("bitsplit-drafter: error:"), std::string::npos) << message;
  EXPECT_NE(message.find("5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"),
            std::string::npos)
      << message;
  // ... and the residual's.
  auto residual_file =
      SplitFile::Open(paths_.residual, SplitFileKind::kResidual, model::SplitFormatRowSizeOracle());
  ASSERT_TRUE(residual_file.ok()) << residual_file.status();
  EXPECT_NE(message.find((*residual_file)->fingerprint_hex()), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(drafter_socket_));
  EXPECT_TRUE(residual.running());
}

// ---- (7) start-up and shutdown -----------------------------------------------------------------

TEST_F(DrafterServiceTest, CudaBackendWithoutADeviceIsRefusedAndShutdownIsGraceful) {
  ServiceProcess cuda(kDrafterBinary);
  ASSERT_TRUE(cuda.Start(DrafterArgs({"--backend", "cuda"})));
#ifdef BITSPLIT_HAVE_CUDA
  // Built with CUDA, no device visible (SetUpTestSuite hides them): it cannot start.
  EXPECT_EQ(cuda.Wait(milliseconds(30000)), 1) << cuda.Stderr();
  EXPECT_NE(cuda.Stderr().find("bitsplit-drafter: error: --backend cuda: no CUDA device is "
                               "visible (CUDA_VISIBLE_DEVICES=\"\")"),
            std::string::npos)
      << cuda.Stderr();
#else
  EXPECT_EQ(cuda.Wait(milliseconds(30000)), 2) << cuda.Stderr();
  EXPECT_NE(cuda.Stderr().find("bitsplit-drafter: error: this build has no CUDA backend"),
            std::string::npos)
      << cuda.Stderr();
#endif
  EXPECT_FALSE(std::filesystem::exists(drafter_socket_));

  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter, {"--shutdown-grace-ms", "1500"}));
  EXPECT_TRUE(drafter.WaitForLine("bitsplit-drafter: serving"));
  EXPECT_NE(drafter.Stderr().find("on " + drafter_target()), std::string::npos) << drafter.Stderr();
  EXPECT_EQ(HealthStatus(drafter_target(), "bitsplit.internal.v1.Drafter"),
            grpc::health::v1::HealthCheckResponse::SERVING);
  drafter.Signal(SIGTERM);
  int health = -1;
  const auto deadline = Clock::now() + milliseconds(1200);
  while (Clock::now() < deadline) {
    health = HealthStatus(drafter_target(), "bitsplit.internal.v1.Drafter");
    if (health == grpc::health::v1::HealthCheckResponse::NOT_SERVING) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(health, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(drafter.Wait(milliseconds(15000)), 0) << drafter.Stderr();
  EXPECT_FALSE(std::filesystem::exists(drafter_socket_));
  EXPECT_TRUE(residual.running());
}

// --backend auto without a visible device is the cpu backend, which has no VRAM plan (and says
// that it ignores --vram-budget).
TEST_F(DrafterServiceTest, AutoBackendWithoutADevicePicksCpu) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(
      StartBoth(residual, drafter, {"--backend", "auto", "--vram-budget", "1GiB"}));
  EXPECT_TRUE(drafter.WaitForLine("bitsplit-drafter: serving"));
  EXPECT_NE(drafter.Stderr().find(", backend cpu, "), std::string::npos) << drafter.Stderr();
  EXPECT_NE(drafter.Stderr().find("--vram-budget is ignored on the cpu backend"), std::string::npos)
      << drafter.Stderr();
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->vram_plan(), "");
  EXPECT_EQ(info->vram_budget_bytes(), 0u);
  // It serves: the first greedy token is the plain decode's.
  const GenerateOutcome run = RunGenerate(*client_, GenerateRequestFor(1));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, PlainDecode({}, 1));
}

// --max-sessions auto on the cpu backend: as many sessions as --ram-budget holds KV caches of
// --max-context tokens (f32 keys and values of every layer, an i32 position per slot), at most
// --max-batch-rows; a budget without room for one is a start-up error that says so.
TEST_F(DrafterServiceTest, AutoSessionsFollowTheRamBudget) {
  auto model = model::LlamaModel::LoadSplit(paths_.base, "", 1);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& config = (*model)->config();
  // Keys and values of every layer and a position per slot, in f16 (the default), f32 and q8_0
  // (34 bytes per 32 values).
  const uint64_t values_per_slot = 2ull * config.num_layers * config.KvDim(0);
  const uint64_t session_bytes = values_per_slot * kMaxContext * 2 + 4ull * kMaxContext;
  const uint64_t f32_session_bytes = values_per_slot * kMaxContext * 4 + 4ull * kMaxContext;
  const uint64_t q8_session_bytes = values_per_slot / 32 * 34 * kMaxContext + 4ull * kMaxContext;
  auto args_with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--max-sessions", "auto"});
    return DrafterArgs(std::move(extra));
  };
  // The sessions a drafter with `extra` flags serves.
  auto served_sessions = [&](std::vector<std::string> extra) -> int {
    ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
    extra.insert(extra.end(), {"--max-sessions", "auto"});
    StartBoth(residual, drafter, std::move(extra));
    if (::testing::Test::HasFatalFailure()) return -1;
    auto info = client_->GetInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return -1;
    auto held = HoldSessions(info->max_sessions());
    EXPECT_EQ(OpenSessions(), info->max_sessions());
    EXPECT_EQ(RunGenerate(*client_, GenerateRequestFor(1)).status.code(),
              absl::StatusCode::kResourceExhausted);
    Release(held);
    return info->max_sessions();
  };
  const uint64_t budget = 3 * session_bytes + session_bytes / 2;
  EXPECT_EQ(served_sessions({"--ram-budget", std::to_string(budget)}), 3);
  EXPECT_EQ(served_sessions({"--ram-budget", std::to_string(budget), "--kv-type", "f32"}),
            static_cast<int>(budget / f32_session_bytes));  // 1
  EXPECT_EQ(served_sessions({"--ram-budget", std::to_string(budget), "--kv-type", "q8_0"}),
            static_cast<int>(budget / q8_session_bytes));  // 6
  EXPECT_EQ(served_sessions({"--ram-budget", "64GiB", "--max-batch-rows", "20"}),
            20);  // the batch-row bound
  {
    // The drafter attaches to the residual before it sizes its sessions.
    ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
    ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
    ASSERT_TRUE(drafter.Start(args_with({"--ram-budget", std::to_string(session_bytes - 1)})));
    EXPECT_EQ(drafter.Wait(milliseconds(60000)), 1) << drafter.Stderr();
    EXPECT_NE(drafter.Stderr().find("bitsplit-drafter: error: --max-sessions auto: a session of " +
                                    std::to_string(kMaxContext) + " tokens holds"),
              std::string::npos)
        << drafter.Stderr();
    EXPECT_NE(drafter.Stderr().find("lower --max-context or set --max-sessions"), std::string::npos)
        << drafter.Stderr();
  }
  {
    // auto: MemAvailable less the weights that must stay resident and are not locked: the
    // drafter's base and the residual (cpu-residual runs without --mlock here).
    ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
    ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
    ASSERT_TRUE(drafter.Start(args_with({"--verbose"})));
    ASSERT_TRUE(drafter.WaitServing(drafter_target())) << drafter.Stderr();
    const uint64_t weights =
        std::filesystem::file_size(paths_.base) + std::filesystem::file_size(paths_.residual);
    EXPECT_NE(drafter.Stderr().find(" less " + model::FormatBytes(weights) +
                                    " of unlocked weights; see --ram-budget)"),
              std::string::npos)
        << drafter.Stderr();
    // The residual said it is not locked, and both faulted their weights in with progress.
    EXPECT_NE(residual.Stderr().find("is not locked in RAM (no --mlock)"), std::string::npos)
        << residual.Stderr();
    for (auto [name, process] : {std::pair{"residual", &residual}, {"drafter", &drafter}}) {
      const std::string log = process->Stderr();
      const size_t loading = log.find(std::string("bitsplit-") + name + ": loading ");
      ASSERT_NE(loading, std::string::npos) << log;
      EXPECT_NE(log.find(": 100% (", loading), std::string::npos) << log;
    }
  }
}

// Bad --backend / --vram-budget / --kv-type values are command-line errors (exit 2), before any
// file is read.
TEST_F(DrafterServiceTest, BadBackendFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::string bad_budget = " is neither auto nor a positive size";
  std::vector<Case> cases = {
      {{"--backend", "gpu"}, "unknown --backend \"gpu\" (expected auto, cpu or cuda)"},
      {{"--vram-budget", "0"}, "--vram-budget \"0\"" + bad_budget},
      {{"--vram-budget=-5"}, "--vram-budget \"-5\"" + bad_budget},
      {{"--vram-budget", "12XB"}, "--vram-budget \"12XB\"" + bad_budget},
      {{"--vram-budget", "GiB"}, "--vram-budget \"GiB\"" + bad_budget},
      {{"--vram-budget", "99999999999GiB"}, "--vram-budget \"99999999999GiB\"" + bad_budget},
      {{"--ram-budget", "0"}, "--ram-budget \"0\"" + bad_budget},
      {{"--max-sessions", "0"}, "--max-sessions \"0\" is neither auto nor at least 1"},
      {{"--max-sessions", "many"}, "--max-sessions \"many\" is neither auto nor at least 1"},
      {{"--max-batch-rows", "8"}, "--max-batch-rows 8 is outside [--max-tree-nodes 16, 4096]"},
      {{"--prefill-rows", "0"}, "--prefill-rows 0 must be at least 1"},
      {{"--kv-type", "q4_0"},
       "--kv-type: unknown KV cache type \"q4_0\"; expected f32, f16 or q8_0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.flags));
    ServiceProcess drafter(kDrafterBinary);
    std::vector<std::string> args = DrafterArgs(c.flags);
    args[0] = *dir_ + "/no-such.base.bsplit";  // never opened
    ASSERT_TRUE(drafter.Start(args));
    EXPECT_EQ(drafter.Wait(milliseconds(30000)), 2) << drafter.Stderr();
    EXPECT_NE(drafter.Stderr().find("bitsplit-drafter: error: " + c.message), std::string::npos)
        << drafter.Stderr();
  }
  EXPECT_FALSE(std::filesystem::exists(drafter_socket_));
}

}  // namespace
}  // namespace bitsplit
