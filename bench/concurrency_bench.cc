// Concurrent streams through the running services (the coordinator's public Generate API): for
// each stream count N, N greedy requests of --tokens tokens start at once (prompt i of the
// prompt set for stream i) and the bench measures
//   * aggregate tokens/s: every stream's tokens over the wall time from the first request to
//     the last stream's end;
//   * per-token latency p50/p99 over all streams: each chunk's gap since the stream's previous
//     chunk, divided among its tokens (the first chunk, the time to first token, is left out);
//   * the drafter scheduler's generations per iteration, the residual bytes read per emitted
//     token (the residual file's size per verifier iteration) and residual round trips per
//     token (one per linear group per iteration), from the drafter's counters.
// bench/concurrency.sh starts the services (batched, and serialized with
// --max-batch-generations 1) and runs this once per setting.
//
// Prompt i is a chat (its user message) unless its id starts with code- or prose-, as in
// bench/e2e_speed.sh; a stream ends early at EOS.
//
//   concurrency_bench --server ADDR --drafter unix:PATH [--streams 1,2,4,8] [--tokens 64]
//                     [--speculation off|tree] [--prompts bench/prompts/prompts.jsonl]
//                     [--label NAME]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/model/linear_backend.h"
#include "common/rpc/drafter_client.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace bitsplit {
namespace {

using Clock = std::chrono::steady_clock;

struct StreamOutcome {
  bool ok = false;
  std::string error;
  int tokens = 0;
  std::vector<double> token_gaps_ms;  // one per token after the first chunk
};

// One entry of the prompt set: code and prose continue a plain prompt, the others are chats.
struct BenchPrompt {
  std::string text;
  bool chat = false;
};

StreamOutcome RunStream(const std::string& server, const BenchPrompt& prompt, int tokens,
                        bool tree) {
  StreamOutcome outcome;
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  if (prompt.chat) {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role("user");
    message->set_content(prompt.text);
  } else {
    request.set_prompt(prompt.text);
  }
  request.set_max_tokens(tokens);
  v1::SpeculationSettings& speculation = *request.mutable_speculation();
  if (tree) {
    speculation.set_mode(v1::SpeculationSettings::MODE_TREE);
    speculation.set_nodes(16);
    speculation.set_expansions_per_step(4);
    speculation.set_max_depth(8);
  } else {
    speculation.set_mode(v1::SpeculationSettings::MODE_OFF);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  bool first = true;
  Clock::time_point previous = Clock::now();
  while (reader->Read(&response)) {
    if (response.has_chunk() && response.chunk().token_ids_size() > 0) {
      const Clock::time_point now = Clock::now();
      const int count = response.chunk().token_ids_size();
      if (!first) {
        const double gap = std::chrono::duration<double, std::milli>(now - previous).count();
        for (int i = 0; i < count; ++i) outcome.token_gaps_ms.push_back(gap / count);
      }
      first = false;
      previous = now;
      outcome.tokens += count;
    }
  }
  const grpc::Status status = reader->Finish();
  outcome.ok = status.ok();
  outcome.error = status.error_message();
  return outcome;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t at = std::min(values.size() - 1, static_cast<size_t>(p * (values.size() - 1) + 0.5));
  return values[at];
}

int Run(int argc, char** argv) {
  CLI::App app("concurrent streams through the bitsplit services");
  std::string server, drafter_target, label = "batched", speculation = "off";
  std::string prompts_path = std::string(BITSPLIT_SOURCE_DIR) + "/bench/prompts/prompts.jsonl";
  std::vector<int> stream_counts = {1, 2, 4, 8};
  int tokens = 64;
  app.add_option("--server", server, "the coordinator")->required();
  app.add_option("--drafter", drafter_target, "the drafter (its scheduler counters)")->required();
  app.add_option("--streams", stream_counts, "stream counts")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per stream")->capture_default_str();
  app.add_option("--speculation", speculation, "off or tree (N=16 k=4 depth<=8)")
      ->check(CLI::IsMember({"off", "tree"}))
      ->capture_default_str();
  app.add_option("--prompts", prompts_path, "JSONL prompt set")->capture_default_str();
  app.add_option("--label", label, "the first column");
  CLI11_PARSE(app, argc, argv);

  std::vector<BenchPrompt> prompts;
  std::ifstream in(prompts_path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line);
    const std::string id = entry["id"];
    prompts.push_back(
        {.text = entry["prompt"], .chat = id.rfind("code-", 0) != 0 && id.rfind("prose-", 0) != 0});
  }
  if (prompts.empty()) {
    std::fprintf(stderr, "concurrency_bench: no prompts in %s\n", prompts_path.c_str());
    return 1;
  }
  auto drafter =
      rpc::DrafterClient::Connect(drafter_target, std::chrono::seconds(5), std::chrono::seconds(5));
  if (!drafter.ok()) {
    std::fprintf(stderr, "concurrency_bench: %s\n", drafter.status().ToString().c_str());
    return 1;
  }
  const bool tree = speculation == "tree";
  for (int n : stream_counts) {
    auto before = (*drafter)->GetInfo();
    const Clock::time_point start = Clock::now();
    std::vector<std::future<StreamOutcome>> running;
    for (int i = 0; i < n; ++i) {
      running.push_back(std::async(std::launch::async, RunStream, server,
                                   prompts[static_cast<size_t>(i) % prompts.size()], tokens, tree));
    }
    std::vector<double> gaps;
    int total_tokens = 0, failed = 0;
    for (auto& future : running) {
      const StreamOutcome outcome = future.get();
      if (!outcome.ok) {
        ++failed;
        std::fprintf(stderr, "concurrency_bench: a stream failed: %s\n", outcome.error.c_str());
      }
      total_tokens += outcome.tokens;
      gaps.insert(gaps.end(), outcome.token_gaps_ms.begin(), outcome.token_gaps_ms.end());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    auto after = (*drafter)->GetInfo();
    if (!before.ok() || !after.ok()) {
      std::fprintf(stderr, "concurrency_bench: drafter GetInfo: %s\n",
                   (!before.ok() ? before.status() : after.status()).ToString().c_str());
      return 1;
    }
    if (failed > 0 || total_tokens == 0) {
      std::fprintf(stderr, "concurrency_bench: %d of %d streams failed, %d tokens\n", failed, n,
                   total_tokens);
      return 1;
    }
    const double iterations =
        static_cast<double>(after->scheduler_iterations() - before->scheduler_iterations());
    const double batch =
        static_cast<double>(after->scheduler_steps() - before->scheduler_steps()) / iterations;
    const double groups = static_cast<double>(
        model::AllLinearGroups(model::LinearGroupLayout{.num_layers = after->layers()}).size());
    const double residual_mb_per_token =
        static_cast<double>(after->residual_bytes()) * iterations / total_tokens / 1e6;
    std::printf("| %s | %s | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f |\n", label.c_str(),
                speculation.c_str(), n, total_tokens / seconds, Percentile(gaps, 0.5),
                Percentile(gaps, 0.99), batch, residual_mb_per_token,
                groups * iterations / total_tokens);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) { return bitsplit::Run(argc, argv); }
