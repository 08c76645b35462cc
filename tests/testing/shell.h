#pragma once
// Small helpers of the tests that run the CLI binary through the shell.
#include <fstream>
#include <iterator>
#include <string>

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

}  // namespace bitsplit::testing
