#pragma once
// The three real processes (bitsplit-residual, bitsplit-drafter on the CPU backend,
// bitsplit-coordinator; unix sockets in a test directory) on one split model, the same model in
// this process as the reference decoder, and the losslessness matrix the end-to-end tests run
// through the public bitsplit.v1.Generation API (the losslessness invariant of
// docs/design.md §3: the streamed tokens equal plain decoding with the verifier for every tree
// shape and sampling setting).
//
// Thread safety: none; one test thread drives a stack.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/io/gguf.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/text/chat_template.h"
#include "common/text/streaming_detokenizer.h"
#include "common/text/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit::testing {

inline constexpr char kResidualBinary[] =
    BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual";
inline constexpr char kDrafterBinary[] =
    BITSPLIT_BINARY_DIR "/services/gpu-drafter/bitsplit-drafter";
inline constexpr char kCoordinatorBinary[] =
    BITSPLIT_BINARY_DIR "/services/coordinator/bitsplit-coordinator";

struct Prompt {
  std::string name;
  std::optional<std::string> text;          // a plain prompt, or
  std::vector<text::ChatMessage> messages;  // a chat
};

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<v1::TokenLogprob> logprobs;
  int chunks = 0;
  std::optional<v1::GenerateComplete> complete;
  std::optional<v1::GenerateError> error;
};

inline StreamResult ReadStream(grpc::ClientReader<v1::GenerateResponse>& reader,
                               const std::function<void(const StreamResult&)>& on_chunk = {}) {
  StreamResult result;
  v1::GenerateResponse response;
  while (reader.Read(&response)) {
    if (response.has_chunk()) {
      ++result.chunks;
      result.tokens.insert(result.tokens.end(), response.chunk().token_ids().begin(),
                           response.chunk().token_ids().end());
      result.text += response.chunk().text();
      result.logprobs.insert(result.logprobs.end(), response.chunk().logprobs().begin(),
                             response.chunk().logprobs().end());
      if (on_chunk) on_chunk(result);
    } else if (response.has_complete()) {
      EXPECT_FALSE(result.complete.has_value()) << "two complete messages";
      result.complete = response.complete();
    } else if (response.has_error()) {
      result.error = response.error();
    }
  }
  result.status = reader.Finish();
  return result;
}

inline v1::SpeculationSettings Tree(int nodes, int expansions, int depth) {
  v1::SpeculationSettings settings;
  settings.set_mode(v1::SpeculationSettings::MODE_TREE);
  settings.set_nodes(nodes);
  settings.set_expansions_per_step(expansions);
  settings.set_max_depth(depth);
  return settings;
}

inline v1::SpeculationSettings Off() {
  v1::SpeculationSettings settings;
  settings.set_mode(v1::SpeculationSettings::MODE_OFF);
  return settings;
}

inline v1::GenerateRequest RequestFor(const Prompt& prompt) {
  v1::GenerateRequest request;
  if (prompt.text) {
    request.set_prompt(*prompt.text);
  } else {
    for (const text::ChatMessage& message : prompt.messages) {
      v1::ChatMessage* m = request.mutable_chat()->add_messages();
      m->set_role(message.role);
      m->set_content(message.content);
    }
  }
  return request;
}

class GenerationStack {
 public:
  struct Options {
    int threads = 1;                            // per service, and for the reference decoder
    std::vector<std::string> coordinator_args;  // e.g. --max-active / --max-queue
    std::vector<std::string> drafter_args;      // e.g. --max-sessions
    // The drafter's --kv-type; the reference decoder's cache has the same type.
    model::KvType kv_type = model::KvType::kF16;
  };

  GenerationStack()
      : residual(kResidualBinary), drafter(kDrafterBinary), coordinator(kCoordinatorBinary) {}
  ~GenerationStack() { KillAll(); }

  // Starts the three services on `model` with sockets under `dir` and loads the reference.
  // On failure: a test failure naming the service and its stderr, and false.
  bool Start(const SplitModelPaths& model, const std::string& dir, Options options) {
    model_paths_ = model;
    options_ = std::move(options);
    std::filesystem::create_directories(dir);
    dir_ = dir;
    if (!StartResidual()) return false;
    if (!StartDrafter()) return false;
    std::vector<std::string> args = {"--model",       model.base, "--drafter",
                                     DrafterTarget(), "--socket", dir_ + "/coordinator.sock"};
    args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
    if (!coordinator.Start(args) ||
        !coordinator.WaitServing(CoordinatorTarget(), std::chrono::seconds(60))) {
      ADD_FAILURE() << "bitsplit-coordinator did not start:\n" << coordinator.Stderr();
      return false;
    }
    auto loaded = model::LlamaModel::LoadSplit(model.base, model.residual, options_.threads);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return false;
    }
    model_ = std::move(*loaded);
    auto tokenizer = text::Tokenizer::FromGguf(model_->gguf_metadata());
    if (!tokenizer.ok()) {
      ADD_FAILURE() << tokenizer.status();
      return false;
    }
    auto chat_template =
        text::ChatTemplate::FromGgufOrArchitecture(model_->gguf_metadata(), **tokenizer);
    if (!chat_template.ok()) {
      ADD_FAILURE() << chat_template.status();
      return false;
    }
    tokenizer_ = std::move(*tokenizer);
    chat_template_ = chat_template->chat_template;
    return true;
  }

  bool StartDrafter() {
    // The CPU backend: its verifier is bit for bit the in-process reference decode's.
    std::vector<std::string> args = {model_paths_.base,
                                     "--residual-socket",
                                     ResidualTarget(),
                                     "--socket",
                                     dir_ + "/drafter.sock",
                                     "--threads",
                                     std::to_string(options_.threads),
                                     "--backend",
                                     "cpu",
                                     "--kv-type",
                                     std::string(model::KvTypeName(options_.kv_type))};
    args.insert(args.end(), options_.drafter_args.begin(), options_.drafter_args.end());
    if (!drafter.Start(args) || !drafter.WaitServing(DrafterTarget(), std::chrono::seconds(120))) {
      ADD_FAILURE() << "bitsplit-drafter did not start:\n" << drafter.Stderr();
      return false;
    }
    return true;
  }

  bool StartResidual() {
    if (!residual.Start({model_paths_.residual, "--socket", dir_ + "/residual.sock", "--threads",
                         std::to_string(options_.threads)}) ||
        !residual.WaitServing(ResidualTarget(), std::chrono::seconds(60))) {
      ADD_FAILURE() << "bitsplit-residual did not start:\n" << residual.Stderr();
      return false;
    }
    return true;
  }

  // Restarts cpu-residual and the drafter where a test killed them; false (with a test failure
  // naming the service) when one does not come back.
  bool RestartStopped() {
    if (!residual.running() && !StartResidual()) return false;
    return drafter.running() || StartDrafter();
  }

  // Coordinator first, so that it never sees its drafter disappear.
  void KillAll() {
    for (ServiceProcess* process : {&coordinator, &drafter, &residual}) process->Kill(SIGKILL);
  }

  const std::string& dir() const { return dir_; }
  std::string ResidualTarget() const { return "unix:" + dir_ + "/residual.sock"; }
  std::string DrafterTarget() const { return "unix:" + dir_ + "/drafter.sock"; }
  std::string CoordinatorTarget() const { return "unix:" + dir_ + "/coordinator.sock"; }

  std::unique_ptr<v1::Generation::Stub> Stub() const {
    return v1::Generation::NewStub(
        grpc::CreateChannel(CoordinatorTarget(), grpc::InsecureChannelCredentials()));
  }

  StreamResult Generate(const v1::GenerateRequest& request,
                        std::chrono::seconds deadline = std::chrono::minutes(2)) const {
    auto stub = Stub();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    auto reader = stub->Generate(&context, request);
    return ReadStream(*reader);
  }

  // The prompt tokens as the documented tokenization gives them (independently of the
  // coordinator's code): plain text without special tokens, chat through the model's template
  // with special tokens; BOS first when the tokenizer asks for it.
  std::vector<int32_t> ReferencePromptTokens(const Prompt& prompt) const {
    std::vector<int32_t> tokens;
    if (prompt.text) {
      tokens = tokenizer_->Encode(*prompt.text, false);
    } else {
      const absl::StatusOr<std::string> rendered = chat_template_->Render(prompt.messages, true);
      EXPECT_TRUE(rendered.ok()) << rendered.status();
      tokens = tokenizer_->Encode(rendered.value_or(""), true);
    }
    if (tokenizer_->add_bos() && tokenizer_->bos_id() >= 0) {
      tokens.insert(tokens.begin(), tokenizer_->bos_id());
    }
    return tokens;
  }

  // Plain decoding with the split model's verifier (base + residual in process) over a KV cache of
  // the drafter's type: prefill, then
  // one token at a time; the token for sequence index p is Sampler::Choose(logits, params, p).
  // Stops after `max_tokens` tokens or before an end-of-generation token.
  std::vector<int32_t> PlainDecode(const std::vector<int32_t>& prompt,
                                   const model::SamplingParams& params, int max_tokens) const {
    const int64_t vocab = model_->config().vocab_size;
    auto cache =
        model_->NewKvCache(static_cast<int64_t>(prompt.size()) + max_tokens + 1, options_.kv_type);
    EXPECT_TRUE(cache.ok()) << cache.status();
    std::vector<float> logits(vocab);
    model::Batch prefill = model::Batch::Causal(prompt, 0);
    prefill.logit_rows = {static_cast<int32_t>(prompt.size()) - 1};
    EXPECT_TRUE(model_->Forward(prefill, *cache, logits.data(), model::ForwardMode::kVerify).ok());
    EXPECT_TRUE(cache->Commit(static_cast<int64_t>(prompt.size())).ok());
    model::Sampler sampler;
    std::vector<int32_t> out;
    for (int64_t position = static_cast<int64_t>(prompt.size());
         static_cast<int>(out.size()) < max_tokens; ++position) {
      const int32_t token = sampler.Choose(logits, params, position);
      if (tokenizer_->IsEndOfGeneration(token)) break;
      out.push_back(token);
      if (static_cast<int>(out.size()) == max_tokens) break;
      const int32_t single[1] = {token};
      model::Batch step = model::Batch::Causal(single, static_cast<int32_t>(position));
      EXPECT_TRUE(model_->Forward(step, *cache, logits.data(), model::ForwardMode::kVerify).ok());
      EXPECT_TRUE(cache->Commit(1).ok());
    }
    return out;
  }

  std::string Detokenize(const std::vector<int32_t>& tokens) const {
    auto bytes = tokenizer_->Decode(tokens);
    EXPECT_TRUE(bytes.ok());
    return text::ReplaceInvalidUtf8(bytes.value_or(""));
  }

  model::LlamaModel& model() const { return *model_; }
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }

  ServiceProcess residual;
  ServiceProcess drafter;
  ServiceProcess coordinator;

 private:
  SplitModelPaths model_paths_;
  Options options_;
  std::string dir_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<text::ChatTemplate> chat_template_;
};

struct MatrixSampling {
  std::string name;
  model::SamplingParams params;
};

struct MatrixShape {
  std::string name;  // "tree", "chain" or "off"
  v1::SpeculationSettings settings;
  std::string expected_shape;  // as SpeculationStats.shape names it
};

// What one row of the matrix streamed, for assertions about how much a row exercised.
struct MatrixRow {
  std::string prompt;  // Prompt::name
  std::string sampling;
  std::string shape;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int64_t verify_steps = 0;
};

// Every prompt x sampling x shape through the coordinator: each stream must equal the in-process
// plain decode (tokens, text, usage, finish reason) with consistent speculation stats, and the
// tree and chain rows (where `shapes` has them) must have accepted drafted tokens (else the
// equalities prove nothing).
// Returns a one-line summary with the timings and tokens per verify step; `rows` (nullable)
// receives every completed row.
inline std::string ExpectLosslessMatrix(const GenerationStack& stack,
                                        const std::vector<Prompt>& prompts,
                                        const std::vector<MatrixSampling>& samplings,
                                        const std::vector<MatrixShape>& shapes, int max_tokens,
                                        std::vector<MatrixRow>* rows_out = nullptr) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  int64_t tree_tokens = 0, tree_verify_steps = 0;
  int64_t chain_tokens = 0, chain_verify_steps = 0;
  int rows = 0;
  std::map<std::string, double> seconds_by_shape;
  double reference_seconds = 0;
  size_t longest_prompt = 0;
  for (const Prompt& prompt : prompts) {
    const std::vector<int32_t> prompt_tokens = stack.ReferencePromptTokens(prompt);
    longest_prompt = std::max(longest_prompt, prompt_tokens.size());
    for (const MatrixSampling& sampling : samplings) {
      const Clock::time_point reference_start = Clock::now();
      const std::vector<int32_t> expected =
          stack.PlainDecode(prompt_tokens, sampling.params, max_tokens);
      reference_seconds += std::chrono::duration<double>(Clock::now() - reference_start).count();
      for (const MatrixShape& shape : shapes) {
        SCOPED_TRACE(absl::StrCat(prompt.name, " / ", sampling.name, " / ", shape.name));
        v1::GenerateRequest request = RequestFor(prompt);
        request.set_max_tokens(max_tokens);
        if (sampling.params.temperature > 0) {
          request.set_temperature(sampling.params.temperature);
          request.set_seed(sampling.params.seed);
        }
        *request.mutable_speculation() = shape.settings;
        const Clock::time_point row_start = Clock::now();
        const StreamResult result = stack.Generate(request, std::chrono::minutes(5));
        seconds_by_shape[shape.name] +=
            std::chrono::duration<double>(Clock::now() - row_start).count();
        EXPECT_TRUE(result.status.ok()) << result.status.error_message();
        if (!result.complete.has_value()) {
          ADD_FAILURE() << "no complete message";
          continue;
        }
        ++rows;
        EXPECT_EQ(result.tokens, expected);
        EXPECT_EQ(result.text, stack.Detokenize(expected));
        const v1::GenerateComplete& complete = *result.complete;
        EXPECT_EQ(complete.usage().prompt_tokens(), static_cast<int>(prompt_tokens.size()));
        EXPECT_EQ(complete.usage().completion_tokens(), static_cast<int>(expected.size()));
        EXPECT_EQ(complete.finish_reason(), static_cast<int>(expected.size()) == max_tokens
                                                ? v1::FINISH_REASON_LENGTH
                                                : v1::FINISH_REASON_EOS);
        const v1::SpeculationStats& stats = complete.speculation();
        if (rows_out != nullptr) {
          rows_out->push_back({prompt.name, sampling.name, shape.name,
                               complete.usage().prompt_tokens(),
                               complete.usage().completion_tokens(), stats.verify_steps()});
        }
        EXPECT_EQ(stats.shape(), shape.expected_shape);
        // Every verify step yields at least one token (the bonus) and one chunk at most.
        EXPECT_GE(stats.verify_steps(), 1);
        EXPECT_LE(result.chunks, stats.verify_steps());
        EXPECT_GE(stats.mean_accepted_per_verify() * stats.verify_steps() + 1e-9,
                  complete.usage().completion_tokens());
        if (shape.name == "off") {
          EXPECT_DOUBLE_EQ(stats.mean_accepted_per_verify(), 1.0);
          EXPECT_EQ(stats.acceptance_by_depth_size(), 0);
          EXPECT_EQ(stats.draft_ns(), 0);
        } else {
          EXPECT_GT(stats.draft_ns(), 0);
          EXPECT_LE(stats.acceptance_by_depth_size(), shape.settings.max_depth());
          for (double rate : stats.acceptance_by_depth()) {
            EXPECT_GE(rate, 0.0);
            EXPECT_LE(rate, 1.0);
          }
          int64_t& tokens = shape.name == "tree" ? tree_tokens : chain_tokens;
          int64_t& steps = shape.name == "tree" ? tree_verify_steps : chain_verify_steps;
          tokens += std::llround(stats.mean_accepted_per_verify() * stats.verify_steps());
          steps += stats.verify_steps();
        }
        EXPECT_GT(stats.verify_ns(), 0);
        if (!expected.empty()) {
          EXPECT_GT(stats.time_to_first_token_ns(), 0);
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // The equalities above only mean something if drafted tokens were accepted: some verify steps
  // of each speculative shape that ran must have yielded more than the bonus token.
  auto ran = [&](const char* name) {
    return std::any_of(shapes.begin(), shapes.end(),
                       [&](const MatrixShape& shape) { return shape.name == name; });
  };
  if (ran("tree")) {
    EXPECT_GT(tree_tokens, tree_verify_steps);
  }
  if (ran("chain")) {
    EXPECT_GT(chain_tokens, chain_verify_steps);
  }
  return absl::StrFormat(
      "%d rows (%d prompts up to %d tokens x %d samplings x %d shapes, %d tokens each at most) in "
      "%.1f s (tree %.1f s, chain %.1f s, off %.1f s, in-process reference %.1f s); "
      "tokens/verify: tree %.2f, chain %.2f",
      rows, prompts.size(), longest_prompt, samplings.size(), shapes.size(), max_tokens, seconds,
      seconds_by_shape["tree"], seconds_by_shape["chain"], seconds_by_shape["off"],
      reference_seconds,
      tree_verify_steps > 0 ? static_cast<double>(tree_tokens) / tree_verify_steps : 0.0,
      chain_verify_steps > 0 ? static_cast<double>(chain_tokens) / chain_verify_steps : 0.0);
}

}  // namespace bitsplit::testing
