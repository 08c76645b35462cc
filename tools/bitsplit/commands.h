#pragma once
// Subcommands of the `bitsplit` CLI. Each Add*Command registers its options on `app` and
// returns the subcommand plus the function that runs it once parsing succeeded.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string_view>

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

}  // namespace bitsplit::cli
