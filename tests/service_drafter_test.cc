// The gpu-drafter service as a process (services/gpu-drafter), in front of a real cpu-residual
// process, both on unix sockets in a temporary directory, driven through
// common/rpc/drafter_client.h. The expectation is independent of the service: the SmolLM2 split
// model loaded in this process (LlamaModel::LoadSplit(base, residual), the residual mapped here)
// decoding one token at a time with Sampler::Choose. Speculation through the service must give
// exactly those tokens (docs/design.md §3, the losslessness invariant).
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
#include "common/model/speculation.h"
#include "common/model/split_model.h"
#include "common/rpc/drafter_client.h"
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

// The verifier's own non-speculative output after Prompt(): one token per forward (Batch::Causal),
// the choice for sequence index i made with Sampler::Choose at position i. Computed once per
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
  auto cache_or = (*model)->NewKvCache(kMaxContext);
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

  // A session holding Prompt() minus its last token (the first root).
  uint64_t OpenAndPrefill(int32_t context = 64) {
    auto opened = client_->OpenSession(context);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return 0;
    EXPECT_EQ(opened->context(), context);
    v1::PrefillRequest prefill;
    prefill.set_session_id(opened->session_id());
    prefill.mutable_tokens()->Add(Prompt().begin(), Prompt().end() - 1);
    auto prefilled = client_->Prefill(prefill);
    EXPECT_TRUE(prefilled.ok()) << prefilled.status();
    if (prefilled.ok()) {
      EXPECT_EQ(prefilled->committed_length(), static_cast<int32_t>(Prompt().size() - 1));
      EXPECT_GT(prefilled->elapsed_ns(), 0);
    }
    return opened->session_id();
  }

  // `count` plain steps from the end of the prompt (its last token is the first root).
  absl::StatusOr<std::vector<int32_t>> DecodePlain(uint64_t session, int count) {
    std::vector<int32_t> tokens;
    int32_t root = Prompt().back();
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<int32_t> token = Step(session, root);
      if (!token.ok()) return token.status();
      tokens.push_back(*token);
      root = *token;
    }
    return tokens;
  }

  // One plain step: Verify of the root alone, Commit{0}. The target's choice, or the status.
  absl::StatusOr<int32_t> Step(uint64_t session, int32_t root,
                               const model::SamplingParams& params = {}) {
    v1::VerifyRequest verify;
    verify.set_session_id(session);
    verify.add_tokens(root);
    verify.add_parents(-1);
    *verify.mutable_sampling() = ToProto(params);
    auto verified = client_->Verify(verify);
    if (!verified.ok()) return verified.status();
    if (verified->choices_size() != 1) return absl::InternalError("not one choice");
    v1::CommitRequest commit;
    commit.set_session_id(session);
    commit.add_nodes(0);
    auto committed = client_->Commit(commit);
    if (!committed.ok()) return committed.status();
    return verified->choices(0).token();
  }

  absl::StatusCode VerifyCode(uint64_t session, std::vector<int32_t> tokens,
                              std::vector<int32_t> parents, v1::SamplingParams sampling = {},
                              int logprobs = 0) {
    v1::VerifyRequest request;
    request.set_session_id(session);
    request.mutable_tokens()->Add(tokens.begin(), tokens.end());
    request.mutable_parents()->Add(parents.begin(), parents.end());
    *request.mutable_sampling() = sampling;
    request.set_logprobs(logprobs);
    return client_->Verify(request).status().code();
  }

  int OpenSessions() {
    auto info = client_->GetInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->open_sessions() : -1;
  }

  // Speculation through the service: Draft, Verify, WalkTree, Commit until `count` tokens are
  // emitted; checks every tree. Returns the emitted tokens.
  // `verify_steps` (optional) counts the Verify calls.
  std::vector<int32_t> Speculate(uint64_t session, const model::SamplingParams& params, int nodes,
                                 int expansions, int max_depth, int count,
                                 int* verify_steps = nullptr) {
    std::vector<int32_t> emitted;
    int32_t root = Prompt().back();
    int32_t committed = static_cast<int32_t>(Prompt().size() - 1);
    while (static_cast<int>(emitted.size()) < count) {
      v1::DraftRequest draft;
      draft.set_session_id(session);
      draft.set_root_token(root);
      draft.set_nodes(nodes);
      draft.set_expansions(expansions);
      draft.set_max_depth(max_depth);
      auto tree = client_->Draft(draft);
      EXPECT_TRUE(tree.ok()) << tree.status();
      if (!tree.ok()) break;
      // The requested size (the model always has more than `expansions` candidates), valid
      // parents, the depth cap, a chain for expansions = 1.
      EXPECT_EQ(tree->tokens_size(), nodes + 1);
      EXPECT_EQ(tree->parents_size(), tree->tokens_size());
      EXPECT_EQ(tree->logprobs_size(), tree->tokens_size());
      EXPECT_EQ(tree->tokens(0), root);
      EXPECT_EQ(tree->parents(0), -1);
      EXPECT_EQ(tree->logprobs(0), 0.0f);
      EXPECT_GE(tree->draft_forwards(), nodes > 0 ? 1 : 0);
      std::vector<int32_t> depth(static_cast<size_t>(tree->tokens_size()), 0);
      for (int i = 1; i < tree->tokens_size(); ++i) {
        const int32_t parent = tree->parents(i);
        if (parent < 0 || parent >= i) {
          ADD_FAILURE() << "node " << i << " has parent " << parent;
          return emitted;
        }
        depth[i] = depth[parent] + 1;
        EXPECT_LE(depth[i], max_depth);
        // Cumulative log-probabilities only fall along a path.
        EXPECT_LE(tree->logprobs(i), tree->logprobs(parent));
        if (expansions == 1) {
          EXPECT_EQ(parent, i - 1);
        }
      }
      v1::VerifyRequest verify;
      verify.set_session_id(session);
      *verify.mutable_tokens() = tree->tokens();
      *verify.mutable_parents() = tree->parents();
      *verify.mutable_sampling() = ToProto(params);
      auto verified = client_->Verify(verify);
      EXPECT_TRUE(verified.ok()) << verified.status();
      if (!verified.ok()) break;
      EXPECT_EQ(verified->choices_size(), tree->tokens_size());
      EXPECT_GT(verified->elapsed_ns(), 0);
      EXPECT_GT(verified->residual_wait_ns(), 0);  // the residual is remote
      EXPECT_LE(verified->residual_wait_ns(), verified->elapsed_ns());
      std::vector<int32_t> targets;
      for (const v1::NodeChoice& choice : verified->choices()) targets.push_back(choice.token());
      const std::vector<int32_t> tokens(tree->tokens().begin(), tree->tokens().end());
      const std::vector<int32_t> parents(tree->parents().begin(), tree->parents().end());
      const model::WalkResult walk = model::WalkTree(tokens, parents, targets);
      v1::CommitRequest commit;
      commit.set_session_id(session);
      commit.mutable_nodes()->Add(walk.path.begin(), walk.path.end());
      auto committed_response = client_->Commit(commit);
      EXPECT_TRUE(committed_response.ok()) << committed_response.status();
      if (!committed_response.ok()) break;
      committed += static_cast<int32_t>(walk.path.size());
      EXPECT_EQ(committed_response->committed_length(), committed);
      emitted.insert(emitted.end(), walk.tokens.begin(), walk.tokens.end());
      root = walk.tokens.back();
      if (verify_steps != nullptr) ++*verify_steps;
    }
    emitted.resize(std::min<size_t>(emitted.size(), static_cast<size_t>(count)));
    return emitted;
  }

  static inline std::string* dir_ = nullptr;
  testing::SplitModelPaths paths_;
  std::string residual_socket_;
  std::string drafter_socket_;
  std::unique_ptr<rpc::DrafterClient> client_;
};

// ---- (1) plain decoding through the service ----------------------------------------------------

TEST_F(DrafterServiceTest, GreedyDecodeEqualsInProcessPlainDecode) {
  constexpr int kTokens = 16;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kTokens));
  // A continuation that loops over a token or two would make the comparison weak.
  ASSERT_GE(std::set<int32_t>(expected.begin(), expected.end()).size(), 8u)
      << ::testing::PrintToString(expected);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  const uint64_t session = OpenAndPrefill();
  auto got = DecodePlain(session, kTokens);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->residual(), "shm " + residual_target());
  EXPECT_EQ(info->draft_model(), "base");
  EXPECT_EQ(info->draft_kv(), "shared");
  EXPECT_EQ(info->max_context(), kMaxContext);
  EXPECT_EQ(info->max_tree_nodes(), kMaxTreeNodes);
  EXPECT_EQ(info->max_sessions(), 2);
  EXPECT_EQ(info->open_sessions(), 1);
  EXPECT_EQ(info->vocab_size(), 49152);
  EXPECT_EQ(info->layers(), 30);
  EXPECT_EQ(info->fingerprint().size(), 64u);
  EXPECT_EQ(info->base_bytes(), std::filesystem::file_size(paths_.base));
  EXPECT_EQ(info->residual_bytes(), std::filesystem::file_size(paths_.residual));
  EXPECT_FALSE(info->residual_format().empty());
  EXPECT_EQ(info->vram_plan(), "");  // the cpu backend has no VRAM plan
  EXPECT_EQ(info->vram_budget_bytes(), 0u);
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
  const uint64_t session = OpenAndPrefill();
  auto got = DecodePlain(session, kTokens);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
}

// ---- (2) speculation through the service is lossless -------------------------------------------

TEST_F(DrafterServiceTest, DraftedTreesAreValidAndSpeculationIsLossless) {
  constexpr int kTokens = 8;
  const model::SamplingParams greedy;
  const model::SamplingParams sampled{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7};
  const std::vector<int32_t> expected_greedy = PlainDecode(greedy, kTokens);
  const std::vector<int32_t> expected_sampled = PlainDecode(sampled, kTokens);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  struct Shape {
    int nodes, expansions, max_depth;
  };
  for (const Shape shape : {Shape{6, 2, 3}, Shape{4, 1, 8}, Shape{0, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << shape.nodes << " k=" << shape.expansions
                                      << " depth=" << shape.max_depth);
    const uint64_t session = OpenAndPrefill();
    EXPECT_EQ(Speculate(session, greedy, shape.nodes, shape.expansions, shape.max_depth, kTokens),
              expected_greedy);
    ASSERT_TRUE(client_->CloseSession(session).ok());
  }
  const uint64_t session = OpenAndPrefill();
  EXPECT_EQ(Speculate(session, sampled, 6, 3, 4, kTokens), expected_sampled);
}

// The ablation: a separate GGUF drafts (here the split model's own source, which agrees with the
// verifier almost always, so that multi-node paths are accepted and committed), reading the
// verifier's KV or its own.
TEST_F(DrafterServiceTest, SeparateDraftModelIsLosslessWithSharedAndOwnKv) {
  constexpr int kTokens = 12;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  const std::string draft_model = testing::ModelPath(testing::kSmolLm2File);
  for (const std::string kv : {"shared", "own"}) {
    SCOPED_TRACE(kv);
    ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
    ASSERT_NO_FATAL_FAILURE(
        StartBoth(residual, drafter, {"--draft-model", draft_model, "--draft-kv", kv}));
    auto info = client_->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->draft_model(), draft_model);
    EXPECT_EQ(info->draft_kv(), kv);
    const uint64_t session = OpenAndPrefill();
    int verify_steps = 0;
    EXPECT_EQ(Speculate(session, {}, 6, 2, 4, kTokens, &verify_steps), expected);
    EXPECT_LT(verify_steps, kTokens) << "no drafted token was ever accepted";
  }
}

// ---- (3) bad input -----------------------------------------------------------------------------

TEST_F(DrafterServiceTest, BadInputGetsClearErrorsAndTheServiceKeepsServing) {
  const std::vector<int32_t> expected = PlainDecode({}, 2);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  const uint64_t session = OpenAndPrefill();
  const int32_t root = Prompt().back();
  constexpr int32_t kVocab = 49152;
  using Code = absl::StatusCode;

  // Unknown sessions.
  constexpr uint64_t kUnknown = 987654321;
  {
    v1::PrefillRequest prefill;
    prefill.set_session_id(kUnknown);
    prefill.add_tokens(1);
    const absl::Status status = client_->Prefill(prefill).status();
    EXPECT_EQ(status.code(), Code::kNotFound) << status;
    EXPECT_NE(status.message().find("987654321"), std::string::npos) << status;
    v1::DraftRequest draft;
    draft.set_session_id(kUnknown);
    draft.set_root_token(root);
    EXPECT_EQ(client_->Draft(draft).status().code(), Code::kNotFound);
    EXPECT_EQ(VerifyCode(kUnknown, {root}, {-1}), Code::kNotFound);
    v1::CommitRequest commit;
    commit.set_session_id(kUnknown);
    commit.add_nodes(0);
    EXPECT_EQ(client_->Commit(commit).status().code(), Code::kNotFound);
    EXPECT_EQ(client_->CloseSession(kUnknown).code(), Code::kNotFound);
  }
  // Prefill: empty, tokens outside the vocabulary.
  for (const std::vector<int32_t>& tokens :
       {std::vector<int32_t>{}, std::vector<int32_t>{1, -1}, std::vector<int32_t>{kVocab}}) {
    v1::PrefillRequest prefill;
    prefill.set_session_id(session);
    prefill.mutable_tokens()->Add(tokens.begin(), tokens.end());
    const absl::Status status = client_->Prefill(prefill).status();
    EXPECT_EQ(status.code(), Code::kInvalidArgument) << status;
  }
  // Draft: root outside the vocabulary, a tree above --max-tree-nodes, bad expansions / depth.
  struct BadDraft {
    int32_t root, nodes, expansions, max_depth;
  };
  for (const BadDraft& bad :
       {BadDraft{kVocab, 2, 1, 2}, BadDraft{-3, 2, 1, 2}, BadDraft{root, kMaxTreeNodes, 2, 4},
        BadDraft{root, -1, 1, 1}, BadDraft{root, 2, 0, 2}, BadDraft{root, 2, 1, 0}}) {
    v1::DraftRequest draft;
    draft.set_session_id(session);
    draft.set_root_token(bad.root);
    draft.set_nodes(bad.nodes);
    draft.set_expansions(bad.expansions);
    draft.set_max_depth(bad.max_depth);
    const absl::Status status = client_->Draft(draft).status();
    EXPECT_EQ(status.code(), Code::kInvalidArgument)
        << status << " root " << bad.root << " nodes " << bad.nodes;
  }
  // Verify: bad trees.
  EXPECT_EQ(VerifyCode(session, {}, {}), Code::kInvalidArgument);                   // empty
  EXPECT_EQ(VerifyCode(session, {root, 5}, {-1}), Code::kInvalidArgument);          // lengths
  EXPECT_EQ(VerifyCode(session, {root, 5}, {0, 0}), Code::kInvalidArgument);        // root parent
  EXPECT_EQ(VerifyCode(session, {root, 5}, {-1, 1}), Code::kInvalidArgument);       // parent >= i
  EXPECT_EQ(VerifyCode(session, {root, 5}, {-1, -1}), Code::kInvalidArgument);      // second root
  EXPECT_EQ(VerifyCode(session, {root, kVocab}, {-1, 0}), Code::kInvalidArgument);  // token
  {
    std::vector<int32_t> tokens(kMaxTreeNodes + 1, root), parents(kMaxTreeNodes + 1, 0);
    parents[0] = -1;
    EXPECT_EQ(VerifyCode(session, tokens, parents), Code::kInvalidArgument);  // too large
  }
  // Verify: bad sampling and logprobs.
  {
    v1::SamplingParams sampling;
    sampling.set_temperature(-1.0f);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, sampling), Code::kInvalidArgument);
    sampling.set_temperature(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, sampling), Code::kInvalidArgument);
    sampling = {};
    sampling.set_top_k(-2);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, sampling), Code::kInvalidArgument);
    sampling = {};
    sampling.set_top_p(1.5f);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, sampling), Code::kInvalidArgument);
    sampling.set_top_p(-0.5f);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, sampling), Code::kInvalidArgument);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, {}, -1), Code::kInvalidArgument);
    EXPECT_EQ(VerifyCode(session, {root}, {-1}, {}, 100000), Code::kInvalidArgument);
  }
  // Commit without a Verify; a bad path after one.
  {
    v1::CommitRequest commit;
    commit.set_session_id(session);
    commit.add_nodes(0);
    const absl::Status status = client_->Commit(commit).status();
    EXPECT_EQ(status.code(), Code::kFailedPrecondition) << status;
    ASSERT_EQ(VerifyCode(session, {root, 5, 6}, {-1, 0, 0}), Code::kOk);
    for (const std::vector<int32_t>& path :
         {std::vector<int32_t>{1}, std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{0, 7}}) {
      commit.clear_nodes();
      commit.mutable_nodes()->Add(path.begin(), path.end());
      EXPECT_EQ(client_->Commit(commit).status().code(), Code::kInvalidArgument)
          << "path of " << path.size();
    }
  }
  // OpenSession: contexts outside [0, max].
  EXPECT_EQ(client_->OpenSession(-1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client_->OpenSession(kMaxContext + 1).status().code(), Code::kInvalidArgument);
  // A full context: RESOURCE_EXHAUSTED from the session, nothing committed.
  {
    auto small = client_->OpenSession(8);
    ASSERT_TRUE(small.ok()) << small.status();
    v1::PrefillRequest prefill;
    prefill.set_session_id(small->session_id());
    const std::vector<int32_t> nine(9, Prompt()[0]);
    prefill.mutable_tokens()->Add(nine.begin(), nine.end());
    EXPECT_EQ(client_->Prefill(prefill).status().code(), Code::kResourceExhausted);
    prefill.mutable_tokens()->RemoveLast();  // 8: fits exactly
    auto prefilled = client_->Prefill(prefill);
    ASSERT_TRUE(prefilled.ok()) << prefilled.status();
    EXPECT_EQ(prefilled->committed_length(), 8);
    EXPECT_EQ(VerifyCode(small->session_id(), {root}, {-1}), Code::kResourceExhausted);
    ASSERT_TRUE(client_->CloseSession(small->session_id()).ok());
  }
  // Still serving, and the session's state is intact: it continues the plain decode.
  EXPECT_EQ(HealthStatus(drafter_target()), grpc::health::v1::HealthCheckResponse::SERVING);
  auto first = Step(session, root);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, expected[0]);
  auto second = Step(session, *first);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, expected[1]);
  EXPECT_EQ(OpenSessions(), 1);
  EXPECT_TRUE(drafter.running());
}

// ---- (4) the session limit ---------------------------------------------------------------------

TEST_F(DrafterServiceTest, SessionLimitAndCloseFreesASlot) {
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  EXPECT_EQ(OpenSessions(), 0);
  auto a = client_->OpenSession(0);  // 0: the maximum
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->context(), kMaxContext);
  auto b = client_->OpenSession(32);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->session_id(), b->session_id());
  EXPECT_EQ(OpenSessions(), 2);
  const absl::Status full = client_->OpenSession(32).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(OpenSessions(), 2);
  ASSERT_TRUE(client_->CloseSession(a->session_id()).ok());
  EXPECT_EQ(OpenSessions(), 1);
  EXPECT_EQ(client_->CloseSession(a->session_id()).code(), absl::StatusCode::kNotFound);
  auto c = client_->OpenSession(32);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->session_id(), a->session_id());  // ids are not reused
  EXPECT_EQ(OpenSessions(), 2);
  // The closed session is gone for every RPC.
  v1::PrefillRequest prefill;
  prefill.set_session_id(a->session_id());
  prefill.add_tokens(1);
  EXPECT_EQ(client_->Prefill(prefill).status().code(), absl::StatusCode::kNotFound);
}

// Two sessions driven from two threads at once: the engine runs one forward at a time, and
// neither session disturbs the other.
TEST_F(DrafterServiceTest, ConcurrentSessionsEachEqualPlainDecode) {
  constexpr int kTokens = 8;
  const model::SamplingParams greedy;
  const model::SamplingParams sampled{.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 3};
  const std::vector<int32_t> expected_greedy = PlainDecode(greedy, kTokens);
  const std::vector<int32_t> expected_sampled = PlainDecode(sampled, kTokens);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  const uint64_t a = OpenAndPrefill();
  const uint64_t b = OpenAndPrefill();
  auto decode = [&](uint64_t session, const model::SamplingParams& params) {
    std::vector<int32_t> got;
    int32_t root = Prompt().back();
    for (int i = 0; i < kTokens; ++i) {
      auto token = Step(session, root, params);
      if (!token.ok()) {
        ADD_FAILURE() << token.status();
        break;
      }
      got.push_back(*token);
      root = *token;
    }
    return got;
  };
  std::vector<int32_t> got_sampled;
  std::thread other([&] { got_sampled = decode(b, sampled); });
  const std::vector<int32_t> got_greedy = decode(a, greedy);
  other.join();
  EXPECT_EQ(got_greedy, expected_greedy);
  EXPECT_EQ(got_sampled, expected_sampled);
}

// ---- Generate: the drafter runs the whole generation -----------------------------------------

struct GenerateOutcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  int prefill_events = 0;
  int step_events = 0;
  bool context_full = false;
  v1::StepReport last_step;
};

GenerateOutcome RunGenerate(rpc::DrafterClient& client, const v1::GenerateRequest& request) {
  GenerateOutcome outcome;
  std::unique_ptr<rpc::DrafterClient::GenerateCall> call = client.Generate(request);
  v1::GenerateEvent event;
  while (call->Read(&event)) {
    outcome.tokens.insert(outcome.tokens.end(), event.tokens().begin(), event.tokens().end());
    if (event.has_step()) {
      ++outcome.step_events;
      outcome.last_step = event.step();
      EXPECT_EQ(event.tokens_size(), event.choices_size());
    } else if (!event.context_full()) {
      ++outcome.prefill_events;
    }
    outcome.context_full = outcome.context_full || event.context_full();
  }
  outcome.status = call->Finish();
  return outcome;
}

v1::GenerateRequest GenerateRequestFor(int max_tokens, int nodes = 0) {
  v1::GenerateRequest request;
  request.mutable_prompt()->Add(Prompt().begin(), Prompt().end());
  request.set_max_tokens(max_tokens);
  if (nodes > 0) {
    request.set_nodes(nodes);
    request.set_expansions(4);
    request.set_max_depth(8);
  }
  return request;
}

TEST_F(DrafterServiceTest, GenerateEqualsPlainDecodeAndEndsWhereAsked) {
  constexpr int kTokens = 12;
  const std::vector<int32_t> expected = PlainDecode({}, kTokens);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  // Prefill in chunks of 5 rows: the prompt takes several iterations.
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter, {"--prefill-rows", "5"}));
  for (int nodes : {0, 15}) {
    SCOPED_TRACE(nodes == 0 ? "off" : "tree");
    const GenerateOutcome run = RunGenerate(*client_, GenerateRequestFor(kTokens, nodes));
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.tokens, expected);
    EXPECT_EQ(run.prefill_events, static_cast<int>((Prompt().size() - 1 + 4) / 5));
    EXPECT_GT(run.last_step.verify_ns(), 0);
    if (nodes == 0) {
      EXPECT_EQ(run.last_step.tree_nodes(), 1);
      EXPECT_EQ(run.step_events, kTokens);
    } else {
      EXPECT_GE(run.last_step.tree_nodes(), 2);
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
      {"temperature", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); },
       "temperature"},
      {"logprobs", [](v1::GenerateRequest& r) { r.set_logprobs(99); }, "logprobs"},
      {"tree", [](v1::GenerateRequest& r) { r.set_nodes(kMaxTreeNodes); }, "nodes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest request = GenerateRequestFor(4, 4);
    c.change(request);
    const GenerateOutcome refused = RunGenerate(*client_, request);
    EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
    EXPECT_THAT(std::string(refused.status.message()), ::testing::HasSubstr(c.message));
  }
  // Every session taken (--max-sessions 2): RESOURCE_EXHAUSTED, and a free one serves again.
  auto a = client_->OpenSession(32);
  auto b = client_->OpenSession(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(RunGenerate(*client_, GenerateRequestFor(4)).status.code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(client_->CloseSession(a->session_id()).ok());
  const GenerateOutcome served = RunGenerate(*client_, GenerateRequestFor(4));
  EXPECT_TRUE(served.status.ok()) << served.status;
  EXPECT_EQ(served.tokens, PlainDecode({}, 4));
}

// ---- (5) cpu-residual dies and comes back ------------------------------------------------------

TEST_F(DrafterServiceTest, ResidualKilledGivesUnavailableThenRestartRecovers) {
  const std::vector<int32_t> expected = PlainDecode({}, 3);
  ServiceProcess residual(kResidualBinary), drafter(kDrafterBinary);
  ASSERT_NO_FATAL_FAILURE(StartBoth(residual, drafter));
  const uint64_t session = OpenAndPrefill();
  auto first = Step(session, Prompt().back());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, expected[0]);

  residual.Kill(SIGKILL);
  const auto start = Clock::now();
  auto failed = Step(session, *first);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  // What the client can act on, not the residual's socket path (the drafter logs that).
  EXPECT_NE(failed.status().message().find("the residual service is unavailable; retry shortly"),
            std::string::npos)
      << failed.status();
  EXPECT_EQ(failed.status().message().find(residual_target()), std::string::npos);
  EXPECT_LT(Clock::now() - start, milliseconds(kResidualTimeoutMs + 2000));
  // The failed Verify left nothing to commit.
  v1::CommitRequest commit;
  commit.set_session_id(session);
  commit.add_nodes(0);
  EXPECT_EQ(client_->Commit(commit).status().code(), absl::StatusCode::kFailedPrecondition);
  // The drafter stays up and answers what needs no residual.
  EXPECT_TRUE(drafter.running());
  EXPECT_EQ(OpenSessions(), 1);
  EXPECT_EQ(HealthStatus(drafter_target()), grpc::health::v1::HealthCheckResponse::SERVING);
  // While cpu-residual is down every verifier request is UNAVAILABLE (the reattach fails).
  v1::PrefillRequest prefill;
  prefill.set_session_id(session);
  prefill.add_tokens(1);
  EXPECT_EQ(client_->Prefill(prefill).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_->OpenSession(16).status().code(), absl::StatusCode::kUnavailable);

  // Restarted: the next requests reattach and succeed; the session kept its committed state.
  ASSERT_NO_FATAL_FAILURE(StartResidual(residual));
  auto second = Step(session, *first);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, expected[1]);
  auto third = Step(session, *second);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, expected[2]);
  auto another = client_->OpenSession(16);
  EXPECT_TRUE(another.ok()) << another.status();
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
  // It serves: a session's first greedy token is the plain decode's.
  const uint64_t session = OpenAndPrefill();
  auto token = Step(session, Prompt().back());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, PlainDecode({}, 1)[0]);
}

// --max-sessions auto on the cpu backend: as many sessions as --ram-budget holds KV caches of
// --max-context tokens (f32 keys and values of every layer, an i32 position per slot), at most
// --max-batch-rows; a budget without room for one is a start-up error that says so.
TEST_F(DrafterServiceTest, AutoSessionsFollowTheRamBudget) {
  auto model = model::LlamaModel::LoadSplit(paths_.base, "", 1);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& config = (*model)->config();
  const uint64_t session_bytes =
      2ull * config.num_layers * config.kv_dim() * kMaxContext * 4 + 4ull * kMaxContext;
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
    int opened = 0;
    while (opened <= info->max_sessions() && client_->OpenSession(0).ok()) ++opened;
    EXPECT_EQ(opened, info->max_sessions());  // the next one is RESOURCE_EXHAUSTED
    return info->max_sessions();
  };
  EXPECT_EQ(
      served_sessions({"--ram-budget", std::to_string(3 * session_bytes + session_bytes / 2)}), 3);
  EXPECT_EQ(served_sessions({"--ram-budget", "64GiB", "--max-batch-rows", "20"}),
            20);  // the batch-row bound
  {
    ServiceProcess drafter(kDrafterBinary);
    ASSERT_TRUE(drafter.Start(args_with({"--ram-budget", std::to_string(session_bytes - 1)})));
    EXPECT_EQ(drafter.Wait(milliseconds(60000)), 1) << drafter.Stderr();
    EXPECT_NE(drafter.Stderr().find("bitsplit-drafter: error: --max-sessions auto: a session of " +
                                    std::to_string(kMaxContext) + " tokens holds"),
              std::string::npos)
        << drafter.Stderr();
    EXPECT_NE(drafter.Stderr().find("lower --max-context or set --max-sessions"), std::string::npos)
        << drafter.Stderr();
  }
}

// Bad --backend / --vram-budget combinations are command-line errors (exit 2), before any file
// is read.
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
#ifdef BITSPLIT_HAVE_CUDA
      {{"--backend", "cuda", "--draft-kv", "own"},
       "--draft-model and --draft-kv own need --backend cpu"},
#else
      {{"--backend", "cuda", "--draft-kv", "own"}, "this build has no CUDA backend"},
#endif
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
