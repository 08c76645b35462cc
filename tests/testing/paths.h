#pragma once
// Where tests find committed fixtures and the verified model files.
#include <cstdlib>
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

}  // namespace bitsplit::testing
