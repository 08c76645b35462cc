#pragma once
// Subcommands of the `bitsplit` CLI. Each Add*Command registers its options on `app` and
// returns the subcommand plus the function that runs it once parsing succeeded.
#include <CLI/CLI.hpp>
#include <functional>

namespace bitsplit::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the work itself failed after a good start
inline constexpr int kExitBadInput = 2;  // bad arguments, missing or malformed files

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command AddGenerateCommand(CLI::App& app);
Command AddQuantizeCommand(CLI::App& app);
Command AddEvalCommand(CLI::App& app);

}  // namespace bitsplit::cli
