// bitsplit: command-line front end. Bad arguments print one line and exit with status 2.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>

#include "tools/bitsplit/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"bitsplit: run LLMs split into a 2-bit GPU draft and an exact CPU residual"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("--verbose", verbose, "log details to stderr");
  std::vector<bitsplit::cli::Command> commands = {
      bitsplit::cli::AddGenerateCommand(app), bitsplit::cli::AddQuantizeCommand(app),
      bitsplit::cli::AddEvalCommand(app),     bitsplit::cli::AddChatCommand(app),
      bitsplit::cli::AddTokenizeCommand(app), bitsplit::cli::AddPlanCommand(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "bitsplit: error: %s (see --help)\n", e.what());
    return bitsplit::cli::kExitBadInput;
  }
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  for (const auto& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return bitsplit::cli::kExitBadInput;
}
