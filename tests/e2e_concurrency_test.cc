// Continuous batching through the three real processes (docs/design.md §3): many streams at
// once, each with its own sampling and speculation settings, are batched by the drafter's
// scheduler into shared forwards, and every stream's tokens still equal its own plain decoding
// (the in-process verifier, one token at a time: the solo non-speculative output). Streams that
// are cancelled, refused or run to their context's end leave the others unchanged, and a
// residual service or drafter that dies gives every running stream UNAVAILABLE.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/rpc/drafter_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/generation_stack.h"
#include "tests/testing/paths.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using testing::GenerationStack;
using ::testing::HasSubstr;
using testing::Off;
using testing::Prompt;
using testing::ReadStream;
using testing::RequestFor;
using testing::StreamResult;
using testing::Tree;
using Clock = std::chrono::steady_clock;

constexpr int kMaxContext = 96;  // the drafter's --max-context: small, so one stream reaches it

// One stream of a concurrent run and what it must produce.
struct StreamSpec {
  std::string name;
  Prompt prompt;
  model::SamplingParams sampling;
  v1::SpeculationSettings speculation;
  int max_tokens = 24;
};

v1::GenerateRequest RequestOf(const StreamSpec& spec) {
  v1::GenerateRequest request = RequestFor(spec.prompt);
  request.set_max_tokens(spec.max_tokens);
  if (spec.sampling.temperature > 0) {
    request.set_temperature(spec.sampling.temperature);
    request.set_seed(spec.sampling.seed);
  }
  *request.mutable_speculation() = spec.speculation;
  return request;
}

// Greedy and T=0.8 with different seeds; tree, chain and off; different prompts.
std::vector<StreamSpec> MixedStreams() {
  const model::SamplingParams greedy;
  return {
      {"tree greedy", {"capital", "The capital of France is", {}}, greedy, Tree(16, 4, 8)},
      {"off t0.8 s1", {"story", "Once upon a time,", {}}, {.temperature = 0.8f, .seed = 1}, Off()},
      {"chain t0.8 s2",
       {"recipe", "To bake bread you need", {}},
       {.temperature = 0.8f, .seed = 2},
       Tree(8, 1, 8)},
      {"off greedy", {"science", "Water boils at", {}}, greedy, Off()},
      {"tree t0.8 s3",
       {"chat", std::nullopt, {{"user", "What is the tallest mountain?"}}},
       {.temperature = 0.8f, .seed = 3},
       Tree(16, 4, 8)},
      {"chain greedy", {"list", "Three colors are red,", {}}, greedy, Tree(8, 1, 8)},
      {"off t0.8 s4", {"poem", "The sea at night", {}}, {.temperature = 0.8f, .seed = 4}, Off()},
      {"tree greedy 2", {"math", "Two plus two equals", {}}, greedy, Tree(16, 4, 8)},
  };
}

class E2eConcurrencyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stack_ = new GenerationStack();
    ready_ = stack_->Start(
        testing::SmolLm2SplitModel(), (testing::TestTempDir() / "e2e_concurrency").string(),
        {.threads = 1,
         .coordinator_args = {"--max-active", "12", "--max-queue", "4"},
         .drafter_args = {"--max-sessions", "12", "--max-context", std::to_string(kMaxContext)}});
  }
  static void TearDownTestSuite() {
    delete stack_;
    stack_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(ready_) << "the services did not start (see the suite's first failure)";
    ASSERT_TRUE(stack_->RestartStopped());  // after a test that killed one
  }

  static std::vector<int32_t> Expected(const StreamSpec& spec) {
    return stack_->PlainDecode(stack_->ReferencePromptTokens(spec.prompt), spec.sampling,
                               spec.max_tokens);
  }
  // Every stream started at once; the results in the same order.
  static std::vector<StreamResult> RunConcurrently(const std::vector<StreamSpec>& specs) {
    std::vector<std::future<StreamResult>> running;
    for (const StreamSpec& spec : specs) {
      running.push_back(std::async(std::launch::async, [request = RequestOf(spec)] {
        return stack_->Generate(request, std::chrono::minutes(3));
      }));
    }
    std::vector<StreamResult> results;
    for (auto& result : running) results.push_back(result.get());
    return results;
  }
  // The drafter's scheduler counters: iterations run and generation steps in them.
  static std::pair<int64_t, int64_t> SchedulerCounters() {
    auto client = rpc::DrafterClient::Connect(stack_->DrafterTarget(), std::chrono::seconds(5),
                                              std::chrono::seconds(5));
    if (!client.ok()) return {-1, -1};
    auto info = (*client)->GetInfo();
    if (!info.ok()) return {-1, -1};
    return {info->scheduler_iterations(), info->scheduler_steps()};
  }

  static inline GenerationStack* stack_ = nullptr;
  static inline bool ready_ = false;
};

TEST_F(E2eConcurrencyTest, EveryConcurrentStreamEqualsItsSoloPlainDecoding) {
  const std::vector<StreamSpec> all = MixedStreams();
  std::vector<std::vector<int32_t>> expected;
  for (const StreamSpec& spec : all) expected.push_back(Expected(spec));
  for (size_t n : {1u, 2u, 4u, 8u}) {
    const std::vector<StreamSpec> specs(all.begin(), all.begin() + static_cast<ptrdiff_t>(n));
    const auto [iterations_before, steps_before] = SchedulerCounters();
    const Clock::time_point start = Clock::now();
    const std::vector<StreamResult> results = RunConcurrently(specs);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const auto [iterations_after, steps_after] = SchedulerCounters();
    int tokens = 0;
    for (size_t i = 0; i < n; ++i) {
      SCOPED_TRACE(absl::StrFormat("%d streams: %s", n, specs[i].name));
      ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
      EXPECT_EQ(results[i].tokens, expected[i]);
      EXPECT_EQ(results[i].text, stack_->Detokenize(expected[i]));
      tokens += static_cast<int>(results[i].tokens.size());
    }
    const double batch =
        static_cast<double>(steps_after - steps_before) /
        static_cast<double>(std::max<int64_t>(1, iterations_after - iterations_before));
    // Batched for real: with several streams an iteration carries several generations' steps.
    if (n >= 4) {
      EXPECT_GT(batch, 1.5) << "generations per iteration";
    }
    std::printf(
        "%zu streams: %d tokens in %.2f s (%.1f tokens/s), %.2f generations per iteration\n", n,
        tokens, seconds, tokens / seconds, batch);
  }
}

TEST_F(E2eConcurrencyTest, CancelledRefusedAndContextBoundStreamsLeaveTheOthersUnchanged) {
  std::vector<StreamSpec> others = MixedStreams();
  others.resize(3);
  for (StreamSpec& spec : others) spec.max_tokens = 40;
  std::vector<std::vector<int32_t>> expected;
  for (const StreamSpec& spec : others) expected.push_back(Expected(spec));
  // The stream that runs to the end of its context: prompt + max_tokens = the context.
  StreamSpec bounded{
      "context-bound", {"river", "The longest river in the world", {}}, {}, Tree(16, 4, 8)};
  bounded.max_tokens =
      kMaxContext - static_cast<int>(stack_->ReferencePromptTokens(bounded.prompt).size());
  const std::vector<int32_t> bounded_expected = Expected(bounded);

  std::vector<std::future<StreamResult>> running;
  for (const StreamSpec& spec : others) {
    running.push_back(std::async(std::launch::async, [request = RequestOf(spec)] {
      return stack_->Generate(request, std::chrono::minutes(3));
    }));
  }
  std::future<StreamResult> bounded_run =
      std::async(std::launch::async, [request = RequestOf(bounded)] {
        return stack_->Generate(request, std::chrono::minutes(3));
      });
  // A stream cancelled after its first chunk, while the others run.
  {
    v1::GenerateRequest request = RequestOf(others[1]);
    request.set_max_tokens(60);
    auto stub = stack_->Stub();
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, request);
    bool cancelled = false;
    const StreamResult result = ReadStream(*reader, [&](const StreamResult&) {
      if (!cancelled) context.TryCancel();
      cancelled = true;
    });
    EXPECT_TRUE(cancelled);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::CANCELLED);
  }
  // A request refused by validation.
  {
    v1::GenerateRequest request = RequestOf(others[0]);
    request.set_top_p(2.0f);
    const StreamResult refused = stack_->Generate(request);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  for (size_t i = 0; i < running.size(); ++i) {
    SCOPED_TRACE(others[i].name);
    const StreamResult result = running[i].get();
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.tokens, expected[i]);
  }
  const StreamResult bounded_result = bounded_run.get();
  ASSERT_TRUE(bounded_result.status.ok()) << bounded_result.status.error_message();
  EXPECT_EQ(bounded_result.tokens, bounded_expected);
  ASSERT_TRUE(bounded_result.complete.has_value());
  if (static_cast<int>(bounded_expected.size()) == bounded.max_tokens) {
    EXPECT_EQ(bounded_result.complete->finish_reason(), v1::FINISH_REASON_LENGTH);
  }
}

// Several streams running when a service dies: each gets UNAVAILABLE, and once the service is
// back a new request succeeds with the right tokens.
TEST_F(E2eConcurrencyTest, ADeadResidualOrDrafterFailsEveryRunningStreamAndTheStackRecovers) {
  for (const bool kill_drafter : {false, true}) {
    SCOPED_TRACE(kill_drafter ? "drafter killed" : "cpu-residual killed");
    std::vector<StreamSpec> specs = MixedStreams();
    specs.resize(4);
    for (StreamSpec& spec : specs) spec.max_tokens = kMaxContext - 40;
    std::vector<std::future<StreamResult>> running;
    std::promise<void> first_chunk;
    std::atomic<bool> signalled{false};
    for (size_t i = 0; i < specs.size(); ++i) {
      running.push_back(std::async(std::launch::async, [&, i, request = RequestOf(specs[i])] {
        auto stub = stack_->Stub();
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
        auto reader = stub->Generate(&context, request);
        return ReadStream(*reader, [&](const StreamResult&) {
          if (i == 0 && !signalled.exchange(true)) first_chunk.set_value();
        });
      }));
    }
    ASSERT_EQ(first_chunk.get_future().wait_for(std::chrono::seconds(60)),
              std::future_status::ready);
    (kill_drafter ? stack_->drafter : stack_->residual).Kill(SIGKILL);
    for (size_t i = 0; i < running.size(); ++i) {
      const StreamResult result = running[i].get();
      EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << specs[i].name << ": " << result.status.error_message();
      EXPECT_THAT(result.status.error_message(), HasSubstr("unavailable"));
    }
    ASSERT_TRUE(kill_drafter ? stack_->StartDrafter() : stack_->StartResidual());
    StreamSpec next = specs[0];
    next.max_tokens = 8;
    StreamResult after;
    for (int attempt = 0; attempt < 50; ++attempt) {  // the coordinator reconnects
      after = stack_->Generate(RequestOf(next));
      if (after.status.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(after.status.ok()) << after.status.error_message();
    EXPECT_EQ(after.tokens, Expected(next));
  }
}

}  // namespace
}  // namespace bitsplit
