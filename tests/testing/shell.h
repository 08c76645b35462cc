#pragma once
// Small helpers of the tests that run the CLI binary through the shell.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace bitsplit::testing {

// The whole file (empty when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `arg` as one single-quoted shell word.
inline std::string ShellQuote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `binary` with `args` through the shell, stderr through `err_path`, stdin from
// `stdin_path` when it is not empty (else inherited).
inline CommandResult RunCapturing(const std::string& binary, const std::vector<std::string>& args,
                                  const std::string& err_path, const std::string& stdin_path = "") {
  std::string command = ShellQuote(binary);
  for (const std::string& arg : args) command += " " + ShellQuote(arg);
  if (!stdin_path.empty()) command += " <" + ShellQuote(stdin_path);
  command += " 2>" + ShellQuote(err_path);
  CommandResult result;
  std::FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  return result;
}

}  // namespace bitsplit::testing
