// End-to-end speculative generation: the three real processes (bitsplit-residual,
// bitsplit-drafter, bitsplit-coordinator, one thread each, unix sockets in a temporary directory)
// driven through the public bitsplit.v1.Generation API.
//
// The headline is the losslessness invariant of docs/design.md §3: for every prompt and sampling
// setting the streamed tokens are the same for a 16-node tree, an 8-node chain and no speculation,
// and equal to an independent plain decode of the same split model in this process (one token at
// a time, Sampler::Choose at the new token's index). Then the failure paths: bad requests, a
// cpu-residual that dies mid-stream, a client that goes away, a full queue, and the stop
// conditions (stop strings across tokens, stop token ids, EOS, max_tokens).
#include <signal.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/model/split_model.h"
#include "common/rpc/drafter_client.h"
#include "common/text/chat_template.h"
#include "common/text/streaming_detokenizer.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/generation_stack.h"
#include "tests/testing/paths.h"
#include "tests/testing/reflection_client.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using testing::GenerationStack;
using ::testing::HasSubstr;
using testing::kCoordinatorBinary;
using ::testing::Not;
using testing::Off;
using testing::Prompt;
using testing::ReadStream;
using testing::RequestFor;
using testing::ServiceProcess;
using ::testing::StartsWith;
using testing::StreamResult;
using testing::Tree;
using Clock = std::chrono::steady_clock;

constexpr int kServing = grpc::health::v1::HealthCheckResponse::SERVING;

// ---- Prompts -----------------------------------------------------------------------------------

// Long fixture texts are cut (at a line or word end) so that prefill stays cheap on one thread.
std::string Shortened(const std::string& text, size_t limit = 320) {
  if (text.size() <= limit) return text;
  const size_t cut = text.find_last_of("\n ", limit);
  return text.substr(0, cut == std::string::npos || cut == 0 ? limit : cut);
}

Prompt PromptFromJson(const nlohmann::json& entry, const std::string& fallback_name) {
  Prompt prompt;
  prompt.name = entry.value("name", entry.value("id", fallback_name));
  const nlohmann::json* messages = nullptr;
  if (entry.contains("messages")) messages = &entry["messages"];
  if (entry.contains("chat") && entry["chat"].is_array()) messages = &entry["chat"];
  if (messages != nullptr) {
    for (const auto& message : *messages) {
      prompt.messages.push_back(
          {message.at("role").get<std::string>(), message.at("content").get<std::string>()});
    }
  } else if (entry.contains("chat") && entry["chat"].is_string()) {
    prompt.messages.push_back({"user", entry["chat"].get<std::string>()});
  } else {
    prompt.text = Shortened(entry.value("prompt", entry.value("text", std::string())));
  }
  return prompt;
}

// Ten prompts: from the speculation bench's prompt set when it exists (bench/prompts/README.md:
// questions and how-tos are chat messages, code and prose raw prompts), taken round-robin over
// those kinds; else the logit-oracle prompts plus a few written here.
std::vector<Prompt> MatrixPrompts() {
  constexpr size_t kCount = 10;
  std::vector<Prompt> prompts;
  std::ifstream bench(testing::SourcePath("bench/prompts/prompts.jsonl"));
  std::map<std::string, std::vector<Prompt>> by_kind;
  std::string line;
  while (std::getline(bench, line)) {
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line);
    Prompt prompt = PromptFromJson(entry, "bench");
    const std::string kind = prompt.name.substr(0, prompt.name.find('-'));
    if ((kind == "question" || kind == "howto") && prompt.text) {
      prompt.messages = {{"user", *prompt.text}};
      prompt.text.reset();
    }
    by_kind[kind].push_back(std::move(prompt));
  }
  for (size_t round = 0; prompts.size() < kCount; ++round) {
    bool any = false;
    for (const char* kind : {"question", "code", "howto", "prose"}) {
      const std::vector<Prompt>& list = by_kind[kind];
      if (round < list.size() && prompts.size() < kCount) {
        prompts.push_back(list[round]);
        any = true;
      }
    }
    if (!any) break;
  }
  if (prompts.size() >= kCount) return prompts;
  prompts.clear();
  std::ifstream oracle(testing::SourcePath("tests/oracle/logit_prompts.json"));
  const nlohmann::json entries = nlohmann::json::parse(oracle);
  for (const auto& entry : entries) prompts.push_back(PromptFromJson(entry, "oracle"));
  prompts.push_back({"plain_story", "Once upon a time, in a small village by the sea,", {}});
  prompts.push_back(
      {"plain_code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.", {}});
  prompts.push_back({"chat_haiku", std::nullopt, {{"user", "Write a haiku about autumn rain."}}});
  prompts.push_back({"chat_list", std::nullopt, {{"user", "Name three primary colors."}}});
  prompts.resize(std::min(prompts.size(), kCount));
  return prompts;
}

// ---- Reflection ----------------------------------------------------------------------------

// The services a server lists through grpc.reflection.v1alpha.ServerReflection.
std::set<std::string> ReflectedServices(const std::string& target) {
  grpc::reflection::v1::ServerReflectionRequest request;
  request.set_list_services("*");
  const testing::ReflectionResult result = testing::ReflectionExchange(target, "v1alpha", request);
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  std::set<std::string> services;
  if (!result.response.has_value()) return services;
  for (const auto& service : result.response->list_services_response().service()) {
    services.insert(service.name());
  }
  return services;
}

// ---- The fixture: three services for the whole suite ------------------------------------------

class E2eGenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stack_ = new GenerationStack();
    // One generating request and one waiting: the queue test relies on these limits.
    ready_ = stack_->Start(testing::SmolLm2SplitModel(), (testing::TestTempDir() / "e2e").string(),
                           {.threads = 1,
                            .coordinator_args = {"--max-active", "1", "--max-queue", "1"},
                            .drafter_args = {}});
  }

  static void TearDownTestSuite() {
    delete stack_;
    stack_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(ready_) << "the services did not start (see the suite's first failure)";
    // A test that killed cpu-residual restarts it; a failure half-way must not break the next.
    ASSERT_TRUE(stack_->RestartStopped());
  }

  static std::string DrafterTarget() { return stack_->DrafterTarget(); }
  static std::string CoordinatorTarget() { return stack_->CoordinatorTarget(); }
  static std::unique_ptr<v1::Generation::Stub> Stub() { return stack_->Stub(); }
  static StreamResult Generate(const v1::GenerateRequest& request) {
    return stack_->Generate(request);
  }
  static std::vector<int32_t> ReferencePromptTokens(const Prompt& prompt) {
    return stack_->ReferencePromptTokens(prompt);
  }
  static std::vector<int32_t> PlainDecode(const std::vector<int32_t>& prompt,
                                          const model::SamplingParams& params, int max_tokens) {
    return stack_->PlainDecode(prompt, params, max_tokens);
  }
  static std::string Detokenize(const std::vector<int32_t>& tokens) {
    return stack_->Detokenize(tokens);
  }

  static int OpenDrafterSessions() {
    auto client = rpc::DrafterClient::Connect(DrafterTarget(), std::chrono::seconds(5),
                                              std::chrono::seconds(5));
    if (!client.ok()) return -1;
    auto info = (*client)->GetInfo();
    return info.ok() ? info->open_sessions() : -1;
  }
  // Polls until the drafter has no open session: true within `timeout`.
  static bool DrafterSessionsDrain(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (OpenDrafterSessions() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static inline GenerationStack* stack_ = nullptr;
  static inline bool ready_ = false;
};

// ---- Losslessness ------------------------------------------------------------------------------

TEST_F(E2eGenerationTest, SpeculationIsLosslessForEveryShapeAndSampling) {
  const std::vector<Prompt> prompts = MatrixPrompts();
  ASSERT_GE(prompts.size(), 10u);
  const std::string summary =
      testing::ExpectLosslessMatrix(*stack_, prompts,
                                    {{"greedy", {}},
                                     {"t0.8 seed 1", {.temperature = 0.8f, .seed = 1}},
                                     {"t0.8 seed 2", {.temperature = 0.8f, .seed = 2}},
                                     {"t0.8 seed 3", {.temperature = 0.8f, .seed = 3}}},
                                    {{"tree", Tree(16, 4, 8), "tree N=16 k=4 depth<=8"},
                                     {"chain", Tree(8, 1, 8), "tree N=8 k=1 depth<=8"},
                                     {"off", Off(), "off"}},
                                    /*max_tokens=*/16);
  std::printf("losslessness matrix: %s\n", summary.c_str());
  RecordProperty("matrix", summary);
}

TEST_F(E2eGenerationTest, AdaptiveDefaultIsLosslessAndNamesItsShape) {
  const Prompt prompt{"capital", "The capital of France is", {}};
  v1::GenerateRequest request = RequestFor(prompt);
  request.set_max_tokens(24);  // no speculation settings: the server's default (adaptive)
  const StreamResult result = Generate(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens, PlainDecode(ReferencePromptTokens(prompt), {}, 24));
  ASSERT_TRUE(result.complete.has_value());
  EXPECT_THAT(result.complete->speculation().shape(), StartsWith("adaptive: "));
}

// ---- Stop conditions ----------------------------------------------------------------------------

TEST_F(E2eGenerationTest, StopStringAcrossTokensEndsTheTextBeforeIt) {
  const Prompt prompt{"count", "Count from one to twenty: one, two, three,", {}};
  const std::vector<int32_t> reference = PlainDecode(ReferencePromptTokens(prompt), {}, 24);
  // A stop string made of the end of one token and the start of the next, whose first occurrence
  // in the text is at that boundary.
  const std::string full_text = Detokenize(reference);
  std::string stop;
  size_t boundary_token = 0;
  size_t stop_at = std::string::npos;
  for (size_t i = 3; i + 1 < reference.size() && stop.empty(); ++i) {
    const std::string left = Detokenize({reference[i]});
    const std::string right = Detokenize({reference[i + 1]});
    const size_t boundary = Detokenize({reference.begin(), reference.begin() + i + 1}).size();
    const size_t take_left = std::min<size_t>(2, left.size());
    const size_t take_right = std::min<size_t>(2, right.size());
    const std::string candidate =
        left.substr(left.size() - take_left) + right.substr(0, take_right);
    if (candidate.size() >= 3 && full_text.find(candidate) == boundary - take_left) {
      stop = candidate;
      boundary_token = i;
      stop_at = boundary - take_left;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no stop string spans two tokens in " << full_text;
  SCOPED_TRACE(absl::StrCat("stop \"", stop, "\" spanning token ", boundary_token, " in \"",
                            full_text, "\""));

  for (const auto& speculation : {Tree(16, 4, 8), Off()}) {
    v1::GenerateRequest request = RequestFor(prompt);
    request.set_max_tokens(24);
    request.add_stop(stop);
    request.add_stop("a stop string that never appears");
    *request.mutable_speculation() = speculation;
    const StreamResult result = Generate(request);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    ASSERT_TRUE(result.complete.has_value());
    EXPECT_EQ(result.complete->finish_reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(result.text, full_text.substr(0, stop_at));
    // The tokens are the prefix of the plain decode whose text begins before the stop string
    // (the last one may run into it), and usage counts exactly those.
    ASSERT_LE(result.tokens.size(), reference.size());
    EXPECT_TRUE(std::equal(result.tokens.begin(), result.tokens.end(), reference.begin()));
    ASSERT_FALSE(result.tokens.empty());
    EXPECT_GE(Detokenize(result.tokens).size(), stop_at);
    EXPECT_LT(Detokenize({result.tokens.begin(), result.tokens.end() - 1}).size(), stop_at);
    EXPECT_EQ(result.complete->usage().completion_tokens(), static_cast<int>(result.tokens.size()));
  }
}

TEST_F(E2eGenerationTest, StopTokenIdEndsTheStreamWithoutThatToken) {
  const Prompt prompt{"count", "Count from one to twenty: one, two, three,", {}};
  const std::vector<int32_t> reference = PlainDecode(ReferencePromptTokens(prompt), {}, 24);
  ASSERT_GT(reference.size(), 6u);
  const int32_t stop_id = reference[5];
  const size_t first = std::find(reference.begin(), reference.end(), stop_id) - reference.begin();
  v1::GenerateRequest request = RequestFor(prompt);
  request.set_max_tokens(24);
  request.add_stop_token_ids(stop_id);
  *request.mutable_speculation() = Tree(16, 4, 8);
  const StreamResult result = Generate(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(result.complete.has_value());
  EXPECT_EQ(result.complete->finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(result.tokens, std::vector<int32_t>(reference.begin(), reference.begin() + first));
  EXPECT_EQ(result.text, Detokenize(result.tokens));
}

TEST_F(E2eGenerationTest, EndOfGenerationGivesEosAndNoControlText) {
  const Prompt prompt{"chat", std::nullopt, {{"user", "What is the capital of France?"}}};
  const std::vector<int32_t> reference = PlainDecode(ReferencePromptTokens(prompt), {}, 64);
  ASSERT_LT(reference.size(), 64u) << "the reference decode did not end: " << Detokenize(reference);
  v1::GenerateRequest request = RequestFor(prompt);
  request.set_max_tokens(64);
  *request.mutable_speculation() = Tree(16, 4, 8);
  const StreamResult result = Generate(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(result.complete.has_value());
  EXPECT_EQ(result.complete->finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(result.tokens, reference);
  EXPECT_THAT(result.text, ::testing::Not(HasSubstr("<|im_end|>")));
  EXPECT_FALSE(result.text.empty());
}

TEST_F(E2eGenerationTest, MaxTokensGivesLengthWithExactlyThatManyTokens) {
  const Prompt prompt{"story", "Once upon a time, in a small village by the sea,", {}};
  for (const int max_tokens : {1, 2, 5, 9}) {
    SCOPED_TRACE(max_tokens);
    v1::GenerateRequest request = RequestFor(prompt);
    request.set_max_tokens(max_tokens);
    *request.mutable_speculation() = Tree(16, 4, 8);
    const StreamResult result = Generate(request);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    ASSERT_TRUE(result.complete.has_value());
    EXPECT_EQ(result.complete->finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(static_cast<int>(result.tokens.size()), max_tokens);
    EXPECT_EQ(result.complete->usage().completion_tokens(), max_tokens);
  }
}

TEST_F(E2eGenerationTest, LogprobsDescribeTheChosenTokens) {
  const Prompt prompt{"capital", "The capital of France is", {}};
  v1::GenerateRequest request = RequestFor(prompt);
  request.set_max_tokens(8);
  request.set_logprobs(3);
  *request.mutable_speculation() = Tree(16, 4, 8);
  const StreamResult result = Generate(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.logprobs.size(), result.tokens.size());
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    const v1::TokenLogprob& logprob = result.logprobs[i];
    EXPECT_EQ(logprob.token_id(), result.tokens[i]);
    ASSERT_EQ(logprob.top_ids_size(), 3);
    ASSERT_EQ(logprob.top_logprobs_size(), 3);
    // Greedy: the chosen token is the most probable one.
    EXPECT_EQ(logprob.top_ids(0), result.tokens[i]);
    EXPECT_FLOAT_EQ(logprob.top_logprobs(0), logprob.logprob());
    EXPECT_LE(logprob.logprob(), 0.0f);
    EXPECT_GE(logprob.top_logprobs(0), logprob.top_logprobs(1));
    EXPECT_GE(logprob.top_logprobs(1), logprob.top_logprobs(2));
  }
}

// ---- Bad input ---------------------------------------------------------------------------------

TEST_F(E2eGenerationTest, BadRequestsAreInvalidArgumentNamingTheProblem) {
  auto base = [] {
    v1::GenerateRequest request;
    request.set_prompt("Hello");
    request.set_max_tokens(4);
    return request;
  };
  const int32_t vocab = stack_->tokenizer().vocab_size();
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"no input", [](auto& r) { r.clear_input(); }, "no input"},
      {"empty prompt", [](auto& r) { r.set_prompt(""); }, "prompt is empty"},
      {"empty chat", [](auto& r) { r.mutable_chat(); }, "no messages"},
      {"bad role",
       [](auto& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("robot");
         m->set_content("hi");
       },
       "role \"robot\""},
      {"empty token ids", [](auto& r) { r.mutable_token_ids(); }, "token_ids is empty"},
      {"token id beyond the vocabulary",
       [vocab](auto& r) {
         r.mutable_token_ids()->add_ids(1);
         r.mutable_token_ids()->add_ids(vocab);
       },
       absl::StrCat("token_ids[1] = ", vocab, " is outside the vocabulary")},
      {"negative token id", [](auto& r) { r.mutable_token_ids()->add_ids(-3); },
       "token_ids[0] = -3"},
      {"prompt beyond the context",
       [](auto& r) {
         for (int i = 0; i < 2048; ++i) r.mutable_token_ids()->add_ids(42);
       },
       "does not fit the context of 2048"},
      {"prompt + max_tokens beyond the context",
       [](auto& r) {
         for (int i = 0; i < 2040; ++i) r.mutable_token_ids()->add_ids(42);
         r.set_max_tokens(100);
       },
       "exceeds the context of 2048 tokens"},
      {"negative max_tokens", [](auto& r) { r.set_max_tokens(-1); },
       "max_tokens must be in [1, 4096]"},
      {"max_tokens absurd", [](auto& r) { r.set_max_tokens(1 << 30); },
       "max_tokens must be in [1, 4096]"},
      {"negative temperature", [](auto& r) { r.set_temperature(-0.5f); }, "temperature"},
      {"NaN temperature",
       [](auto& r) { r.set_temperature(std::numeric_limits<float>::quiet_NaN()); }, "temperature"},
      {"top_p 0", [](auto& r) { r.set_top_p(0.0f); }, "top_p must be in (0, 1]"},
      {"top_p above 1", [](auto& r) { r.set_top_p(1.5f); }, "top_p must be in (0, 1]"},
      {"negative top_k", [](auto& r) { r.set_top_k(-1); }, "top_k must be >= 0"},
      {"logprobs above 20", [](auto& r) { r.set_logprobs(21); }, "logprobs must be in [0, 20]"},
      {"negative logprobs", [](auto& r) { r.set_logprobs(-1); }, "logprobs must be in [0, 20]"},
      {"empty stop string", [](auto& r) { r.add_stop(""); }, "stop"},
      {"too many stop strings",
       [](auto& r) {
         for (int i = 0; i < 17; ++i) r.add_stop(absl::StrCat("stop", i));
       },
       "stop"},
      {"stop token id beyond the vocabulary", [vocab](auto& r) { r.add_stop_token_ids(vocab); },
       "stop_token_ids[0]"},
      {"response prefix without a schema", [](auto& r) { r.set_response_prefix("<x>"); },
       "response_prefix and response_suffix frame a constrained document"},
      {"render token id beyond the vocabulary", [vocab](auto& r) { r.add_render_token_ids(vocab); },
       "render_token_ids[0]"},
      {"tree too large", [](auto& r) { *r.mutable_speculation() = Tree(1000, 4, 8); }, "nodes"},
      {"negative tree nodes", [](auto& r) { *r.mutable_speculation() = Tree(-1, 4, 8); }, "nodes"},
      {"zero expansions", [](auto& r) { *r.mutable_speculation() = Tree(16, 0, 8); }, "expansions"},
      {"zero depth", [](auto& r) { *r.mutable_speculation() = Tree(16, 4, 0); }, "depth"},
      {"unknown speculation mode",
       [](auto& r) {
         r.mutable_speculation()->set_mode(static_cast<v1::SpeculationSettings::Mode>(7));
       },
       "unknown mode 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest request = base();
    c.mutate(request);
    const StreamResult result = Generate(request);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << result.status.error_message();
    EXPECT_THAT(result.status.error_message(), HasSubstr(c.expected));
    EXPECT_TRUE(result.tokens.empty());
    EXPECT_FALSE(result.complete.has_value());
    ASSERT_TRUE(result.error.has_value());
    EXPECT_EQ(result.error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_EQ(result.error->message(), result.status.error_message());
  }
  // The service is unharmed.
  v1::GenerateRequest good = base();
  *good.mutable_speculation() = Off();
  EXPECT_TRUE(Generate(good).status.ok());
}

// ---- Tokenize, GetModelInfo, health, reflection ------------------------------------------------

TEST_F(E2eGenerationTest, TokenizeMatchesTheModelTokenizer) {
  auto stub = Stub();
  for (const bool parse_special : {false, true}) {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text("<|im_start|>user\nHello, wörld! 🙂<|im_end|>");
    request.set_parse_special(parse_special);
    v1::TokenizeResponse response;
    ASSERT_TRUE(stub->Tokenize(&context, request, &response).ok());
    const std::vector<int32_t> expected = stack_->tokenizer().Encode(request.text(), parse_special);
    EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
              expected);
    ASSERT_EQ(response.pieces_size(), response.token_ids_size());
  }
}

TEST_F(E2eGenerationTest, ModelInfoDescribesTheSplitModel) {
  auto files = model::SplitModelFiles::Open(testing::SmolLm2SplitModel().base, "");
  ASSERT_TRUE(files.ok()) << files.status();
  auto stub = Stub();
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.fingerprint(), (*files)->base().fingerprint_hex());
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.layers(), (*files)->config().num_layers);
  EXPECT_EQ(info.d_model(), (*files)->config().d_model);
  EXPECT_EQ(info.vocab_size(), (*files)->config().vocab_size);
  EXPECT_EQ(info.context_length(), 2048);  // the drafter's default --max-context
  EXPECT_THAT(info.base_format(), StartsWith("b2_asym/g64"));  // the fixture's knobs
  EXPECT_EQ(info.residual_format(), "r8/g32");
  EXPECT_THAT(info.chat_template(), HasSubstr("<|im_start|>"));
  EXPECT_FALSE(info.name().empty());
}

TEST_F(E2eGenerationTest, EveryServiceAnswersHealthAndReflection) {
  EXPECT_EQ(testing::HealthStatus(CoordinatorTarget(), "bitsplit.v1.Generation"), kServing);
  const std::set<std::string> coordinator = ReflectedServices(CoordinatorTarget());
  EXPECT_TRUE(coordinator.contains("bitsplit.v1.Generation")) << coordinator.size();
  EXPECT_TRUE(coordinator.contains("grpc.health.v1.Health"));
  EXPECT_TRUE(coordinator.contains("grpc.reflection.v1alpha.ServerReflection"));
  EXPECT_TRUE(ReflectedServices(DrafterTarget()).contains("bitsplit.internal.v1.Drafter"));
  EXPECT_TRUE(
      ReflectedServices(stack_->ResidualTarget()).contains("bitsplit.internal.v1.Residual"));
}

// ---- Failures while generating -----------------------------------------------------------------

TEST_F(E2eGenerationTest, DeadResidualGivesUnavailableAndTheNextRequestSucceedsAfterRestart) {
  const Prompt prompt{"story", "Once upon a time, in a small village by the sea,", {}};
  v1::GenerateRequest request = RequestFor(prompt);
  request.set_max_tokens(1500);
  *request.mutable_speculation() = Off();
  auto stub = Stub();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  auto reader = stub->Generate(&context, request);
  bool killed = false;
  const StreamResult result = ReadStream(*reader, [&](const StreamResult&) {
    if (!killed) stack_->residual.Kill(SIGKILL);
    killed = true;
  });
  ASSERT_TRUE(killed) << "no chunk arrived: " << result.status.error_message();
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << result.status.error_message();
  EXPECT_THAT(result.status.error_message(), HasSubstr("unavailable"));
  EXPECT_LT(static_cast<int>(result.tokens.size()), 1500);
  EXPECT_FALSE(result.complete.has_value());

  // The drafter and the coordinator stay up, and the failed request's session is gone.
  EXPECT_EQ(testing::HealthStatus(CoordinatorTarget()), kServing);
  EXPECT_EQ(testing::HealthStatus(DrafterTarget()), kServing);
  EXPECT_TRUE(DrafterSessionsDrain(std::chrono::seconds(5)));
  {
    grpc::ClientContext info_context;
    v1::ModelInfo info;
    EXPECT_TRUE(stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).ok());
  }
  // While cpu-residual is down, requests fail cleanly too.
  v1::GenerateRequest short_request = RequestFor(prompt);
  short_request.set_max_tokens(8);
  *short_request.mutable_speculation() = Tree(16, 4, 8);
  EXPECT_EQ(Generate(short_request).status.error_code(), grpc::StatusCode::UNAVAILABLE);

  ASSERT_TRUE(stack_->StartResidual());
  const StreamResult after = Generate(short_request);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, PlainDecode(ReferencePromptTokens(prompt), {}, 8));
}

TEST_F(E2eGenerationTest, ClientThatGoesAwayFreesItsSession) {
  v1::GenerateRequest request = RequestFor({"story", "Once upon a time,", {}});
  request.set_max_tokens(1500);
  *request.mutable_speculation() = Off();
  auto stub = Stub();
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  bool cancelled = false;
  const Clock::time_point start = Clock::now();
  const StreamResult result = ReadStream(*reader, [&](const StreamResult&) {
    if (!cancelled) {
      EXPECT_EQ(OpenDrafterSessions(), 1);
      context.TryCancel();
    }
    cancelled = true;
  });
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(DrafterSessionsDrain(std::chrono::seconds(3)))
      << "open sessions: " << OpenDrafterSessions();
  // Far sooner than the 1500 tokens would have taken.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  v1::GenerateRequest next = RequestFor({"story", "Once upon a time,", {}});
  next.set_max_tokens(4);
  EXPECT_TRUE(Generate(next).status.ok());
}

TEST_F(E2eGenerationTest, FullQueueRefusesWithResourceExhausted) {
  // --max-active 1 --max-queue 1: one request generates, one waits, the third is refused.
  struct Running {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
    std::future<StreamResult> result;
  };
  auto stub = Stub();
  v1::GenerateRequest request = RequestFor({"story", "Once upon a time,", {}});
  request.set_max_tokens(1500);
  *request.mutable_speculation() = Off();

  Running first, second;
  std::promise<void> first_chunk;
  first.reader = stub->Generate(&first.context, request);
  first.result = std::async(std::launch::async, [&] {
    bool signalled = false;
    return ReadStream(*first.reader, [&](const StreamResult&) {
      if (!signalled) first_chunk.set_value();
      signalled = true;
    });
  });
  ASSERT_EQ(first_chunk.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  second.reader = stub->Generate(&second.context, request);
  second.result = std::async(std::launch::async, [&] { return ReadStream(*second.reader); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it reach the queue

  const Clock::time_point refused_at = Clock::now();
  const StreamResult third = Generate(request);
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << third.status.error_message();
  EXPECT_THAT(third.status.error_message(), HasSubstr("busy: 1 requests running and 1 queued"));
  EXPECT_THAT(third.status.error_message(), Not(HasSubstr("--max")));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - refused_at).count(), 2.0);

  first.context.TryCancel();
  second.context.TryCancel();
  EXPECT_EQ(first.result.get().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(second.result.get().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(DrafterSessionsDrain(std::chrono::seconds(3)));
}

TEST_F(E2eGenerationTest, SigtermEndsRunningStreamsWithUnavailableAndExitsCleanly) {
  // Three rounds: the stream's last frames race the connection's close (a client that wrote to a
  // closed connection lost its status, 1 SIGTERM in 12-16 with the CPUs busy, before the
  // coordinator waited for its streams to finish and their clients to read them).
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // A coordinator of its own, so that the suite's keeps serving.
    const std::string socket = stack_->dir() + "/stopping.sock";
    ServiceProcess coordinator(kCoordinatorBinary);
    ASSERT_TRUE(
        coordinator.Start({"--model", testing::SmolLm2SplitModel().base, "--drafter",
                           DrafterTarget(), "--socket", socket, "--shutdown-grace-ms", "100"}));
    ASSERT_TRUE(coordinator.WaitServing("unix:" + socket)) << coordinator.Stderr();
    v1::GenerateRequest request = RequestFor({"story", "Once upon a time,", {}});
    request.set_max_tokens(1500);
    *request.mutable_speculation() = Off();
    auto stub = v1::Generation::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(1));
    auto reader = stub->Generate(&context, request);
    bool signalled = false;
    const StreamResult result = ReadStream(*reader, [&](const StreamResult&) {
      if (!signalled) coordinator.Signal(SIGTERM);
      signalled = true;
    });
    ASSERT_TRUE(signalled);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << result.status.error_message();
    EXPECT_THAT(result.status.error_message(), HasSubstr("shutting down"));
    ASSERT_TRUE(result.error.has_value());
    EXPECT_EQ(result.error->code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
    EXPECT_EQ(coordinator.Wait(std::chrono::seconds(15)), 0) << coordinator.Stderr();
    EXPECT_THAT(coordinator.Stderr(), HasSubstr("bitsplit-coordinator: stopped"));
    EXPECT_FALSE(std::filesystem::exists(socket));
    EXPECT_TRUE(DrafterSessionsDrain(std::chrono::seconds(3)));
  }
}

// ---- Start-up checks ---------------------------------------------------------------------------

TEST_F(E2eGenerationTest, CoordinatorRefusesADrafterOfAnotherModel) {
  // The same base file with another fingerprint in its header (bytes 16..47).
  const std::string forged = stack_->dir() + "/forged.base.bsplit";
  std::filesystem::copy_file(testing::SmolLm2SplitModel().base, forged,
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream file(forged, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(16);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(16);
    file.write(&byte, 1);
  }
  ServiceProcess coordinator(kCoordinatorBinary);
  ASSERT_TRUE(coordinator.Start({"--model", forged, "--drafter", DrafterTarget(), "--socket",
                                 stack_->dir() + "/forged.sock"}));
  EXPECT_EQ(coordinator.Wait(std::chrono::seconds(30)), 1);
  EXPECT_THAT(coordinator.Stderr(), HasSubstr("fingerprint"));
  EXPECT_THAT(coordinator.Stderr(), HasSubstr("same `bitsplit quantize` run"));
  std::filesystem::remove(forged);
}

// A --chat-template-file the engine cannot parse, or that fails on a one-message chat, stops the
// start with the file's name and the reason, before the drafter is contacted.
TEST_F(E2eGenerationTest, CoordinatorRefusesABadChatTemplateFile) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% for m in messages %}{{ m.content }", "line 1: unclosed tag"},
      {"{{ raise_exception('no chats here') }}", "no chats here"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = absl::StrCat(stack_->dir(), "/bad_template_", i, ".jinja");
    {
      std::ofstream out(path);
      out << cases[i].first;
    }
    ServiceProcess coordinator(kCoordinatorBinary);
    ASSERT_TRUE(
        coordinator.Start({"--model", testing::SmolLm2SplitModel().base, "--drafter",
                           "unix:" + stack_->dir() + "/no-drafter.sock", "--socket",
                           stack_->dir() + "/templated.sock", "--chat-template-file", path}));
    EXPECT_EQ(coordinator.Wait(std::chrono::seconds(30)), 1);
    EXPECT_THAT(coordinator.Stderr(), HasSubstr(path));
    EXPECT_THAT(coordinator.Stderr(), HasSubstr(cases[i].second));
    EXPECT_THAT(coordinator.Stderr(), Not(HasSubstr("cannot reach the drafter")));
  }
}

TEST_F(E2eGenerationTest, CoordinatorWithoutDrafterExitsWithAClearError) {
  ServiceProcess coordinator(kCoordinatorBinary);
  ASSERT_TRUE(
      coordinator.Start({"--model", testing::SmolLm2SplitModel().base, "--drafter",
                         "unix:" + stack_->dir() + "/no-drafter.sock", "--connect-timeout-ms",
                         "300", "--socket", stack_->dir() + "/lonely.sock"}));
  EXPECT_EQ(coordinator.Wait(std::chrono::seconds(30)), 1);
  EXPECT_THAT(coordinator.Stderr(), HasSubstr("cannot reach the drafter"));
}

}  // namespace
}  // namespace bitsplit
