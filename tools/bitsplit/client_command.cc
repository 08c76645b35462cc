// The coordinator's command-line client: `bitsplit chat --server ADDR MESSAGE` and the remote
// path of `bitsplit generate --server ADDR`. Text goes to stdout as chunks arrive; one stats
// line goes to stderr at the end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

v1::SpeculationSettings::Mode ModeFromName(const std::string& name) {
  if (name == "off") return v1::SpeculationSettings::MODE_OFF;
  if (name == "tree") return v1::SpeculationSettings::MODE_TREE;
  return v1::SpeculationSettings::MODE_ADAPTIVE;
}

v1::GenerateRequest BuildRequest(const RemoteGenerateOptions& options) {
  v1::GenerateRequest request;
  if (options.chat) {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role("user");
    message->set_content(*options.chat);
  } else {
    request.set_prompt(options.prompt.value_or(""));
  }
  request.set_max_tokens(options.max_tokens);
  request.set_temperature(options.sampling.temperature);
  request.set_top_k(options.sampling.top_k);
  request.set_top_p(options.sampling.top_p);
  request.set_seed(options.sampling.seed);
  for (const std::string& stop : options.stop) request.add_stop(stop);
  v1::SpeculationSettings& speculation = *request.mutable_speculation();
  if (options.speculation) speculation.set_mode(ModeFromName(*options.speculation));
  if (options.nodes) speculation.set_nodes(*options.nodes);
  if (options.expansions) speculation.set_expansions_per_step(*options.expansions);
  if (options.max_depth) speculation.set_max_depth(*options.max_depth);
  return request;
}

std::string_view FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

// "[prompt 25 tokens | 120 tokens, 14.2 tok/s | spec tree N=16 k=4 depth<=8: 31 verify steps,
//   3.87 tokens/verify, depth acceptance 0.81 0.66 0.52 | ttft 85 ms | finish: eos]"
std::string StatsLine(const v1::GenerateComplete& complete) {
  const v1::SpeculationStats& spec = complete.speculation();
  std::string depth;
  if (spec.acceptance_by_depth_size() > 0) {
    depth = absl::StrCat(
        ", depth acceptance ",
        absl::StrJoin(spec.acceptance_by_depth(), " ", [](std::string* out, double rate) {
          absl::StrAppend(out, absl::StrFormat("%.2f", rate));
        }));
  }
  return absl::StrFormat(
      "[prompt %d tokens | %d tokens, %.1f tok/s | spec %s: %d verify steps, %.2f tokens/verify%s "
      "| ttft %.0f ms | finish: %s]",
      complete.usage().prompt_tokens(), complete.usage().completion_tokens(),
      spec.tokens_per_second(), spec.shape(), spec.verify_steps(), spec.mean_accepted_per_verify(),
      depth, spec.time_to_first_token_ns() / 1e6, FinishName(complete.finish_reason()));
}

}  // namespace

void AddRemoteSpeculationOptions(CLI::App* sub, RemoteGenerateOptions& options) {
  sub->add_option("--speculation", options.speculation,
                  "adaptive, tree or off (default: the server's)")
      ->check(CLI::IsMember({"adaptive", "tree", "off"}));
  sub->add_option("--nodes", options.nodes, "draft tree nodes beyond the root");
  sub->add_option("--expansions", options.expansions,
                  "frontier nodes expanded per draft forward (1: a chain)");
  sub->add_option("--max-depth", options.max_depth, "draft tree depth cap");
  sub->add_option("--stop", options.stop, "stop string (repeatable); not part of the output")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

int RunRemoteGenerate(std::string_view command, const RemoteGenerateOptions& options) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  {
    // A cheap call first, so that an unreachable server is reported as such.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo info;
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (!status.ok()) {
      return ReportError(
          command, kExitFailure,
          absl::StrFormat("cannot reach the coordinator at %s: %s: %s", options.server,
                          CodeName(status.error_code()), status.error_message()));
    }
  }
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, BuildRequest(options));
  v1::GenerateResponse response;
  std::optional<v1::GenerateComplete> complete;
  bool wrote_text = false;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      const std::string& text = response.chunk().text();
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      wrote_text = wrote_text || !text.empty();
    } else if (response.has_complete()) {
      complete = response.complete();
    }
  }
  const grpc::Status status = reader->Finish();
  if (wrote_text) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!status.ok()) {
    const int exit_code =
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput : kExitFailure;
    return ReportError(command, exit_code,
                       absl::StrCat(CodeName(status.error_code()), ": ", status.error_message()));
  }
  if (!complete) {
    return ReportError(command, kExitFailure, "the stream ended without a completion message");
  }
  std::fprintf(stderr, "%s\n", StatsLine(*complete).c_str());
  return kExitOk;
}

Command AddChatCommand(CLI::App& app) {
  auto options = std::make_shared<RemoteGenerateOptions>();
  options->chat.emplace();
  CLI::App* sub =
      app.add_subcommand("chat", "one chat turn against a running bitsplit-coordinator");
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("message", *options->chat, "the user message")->required();
  sub->add_option("--server,-s", options->server,
                  "the coordinator: HOST:PORT or unix:/path/to/socket")
      ->required();
  sub->add_option("-n,--max-tokens", options->max_tokens, "tokens to generate at most")
      ->capture_default_str();
  AddSamplingOptions(sub, options->sampling);
  AddRemoteSpeculationOptions(sub, *options);
  return {sub, [options] { return RunRemoteGenerate("chat", *options); }};
}

}  // namespace bitsplit::cli
