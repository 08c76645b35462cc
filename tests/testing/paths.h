#pragma once
// Where tests find committed fixtures and the verified model files, and where they write.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace bitsplit::testing {

inline std::string SourcePath(const std::string& relative) {
  return std::string(BITSPLIT_SOURCE_DIR) + "/" + relative;
}

// Models live in models/ of the checkout (placed there by scripts/setup.sh) unless
// BITSPLIT_MODELS_DIR says otherwise.
inline std::string ModelPath(const std::string& file) {
  const char* dir = std::getenv("BITSPLIT_MODELS_DIR");
  return (dir && *dir ? std::string(dir) : SourcePath("models")) + "/" + file;
}

inline const char* kSmolLm2File = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline const char* kGemma3File = "gemma-3-270m-q4_k_m.gguf";

// A fresh temporary directory, removed at process exit. (Never destroyed itself, so that the exit
// handler can still read it.)
inline const std::filesystem::path& TestTempDir() {
  static const std::filesystem::path* const dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "bitsplit-test-XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(TestTempDir(), ignored);
    });
    return new std::filesystem::path(pattern);
  }();
  return *dir;
}

}  // namespace bitsplit::testing
