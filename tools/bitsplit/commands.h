#pragma once
// Subcommands of the `bitsplit` CLI. Each Add*Command registers its options on `app` and
// returns the subcommand plus the function that runs it once parsing succeeded.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/sampler.h"

namespace bitsplit::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the work itself failed after a good start
inline constexpr int kExitBadInput = 2;  // bad arguments, missing or malformed files

// Prints "bitsplit <command>: error: <message>" as one line on stderr and returns `exit_code`:
// every subcommand reports failures this way.
inline int ReportError(std::string_view command, int exit_code, std::string_view message) {
  std::fprintf(stderr, "bitsplit %.*s: error: %.*s\n", static_cast<int>(command.size()),
               command.data(), static_cast<int>(message.size()), message.data());
  return exit_code;
}

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command AddGenerateCommand(CLI::App& app);
Command AddQuantizeCommand(CLI::App& app);
Command AddEvalCommand(CLI::App& app);
// `bitsplit chat --server ADDR MESSAGE`: one chat turn against a running coordinator.
Command AddChatCommand(CLI::App& app);
// `bitsplit tokenize --model FILE [--text T] [--special] [--json] [--no-bos]`: token ids of a text
// (standard input without --text), printed like llama.cpp's llama-tokenize.
Command AddTokenizeCommand(CLI::App& app);
// `bitsplit plan MODEL.gguf --vram SIZE --ram SIZE [--context N] [--sessions K]`: the offload
// plan and projected speed from the GGUF's shapes alone (plan_command.cc).
Command AddPlanCommand(CLI::App& app);

// A generation served by bitsplit-coordinator (client_command.cc): `bitsplit chat` and
// `bitsplit generate --server`.
struct RemoteGenerateOptions {
  std::string server;  // gRPC target: "localhost:50051", "unix:/run/bitsplit/coordinator.sock"
  std::optional<std::string> prompt;  // exactly one of prompt and chat
  std::optional<std::string> chat;
  int max_tokens = 128;
  model::SamplingParams sampling;
  std::optional<std::string> speculation;  // adaptive | tree | off (unset: the server's default)
  std::optional<int32_t> nodes;
  std::optional<int32_t> expansions;
  std::optional<int32_t> max_depth;
  std::vector<std::string> stop;
};
// Registers --temperature, --top-k, --top-p and --seed on `sub` (local and remote generation).
inline void AddSamplingOptions(CLI::App* sub, model::SamplingParams& sampling) {
  sub->add_option("--temperature", sampling.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-k", sampling.top_k, "0 = off")->capture_default_str();
  sub->add_option("--top-p", sampling.top_p, "nucleus mass, 1 = off")->capture_default_str();
  sub->add_option("--seed", sampling.seed, "sampling seed")->capture_default_str();
}
// Registers --speculation, --nodes, --expansions, --max-depth and --stop on `sub`.
void AddRemoteSpeculationOptions(CLI::App* sub, RemoteGenerateOptions& options);
// Streams the completion to stdout and a stats line to stderr. Exit codes: kExitBadInput when the
// server refused the request as invalid, kExitFailure for anything else (unreachable server,
// generation failed).
int RunRemoteGenerate(std::string_view command, const RemoteGenerateOptions& options);

}  // namespace bitsplit::cli
