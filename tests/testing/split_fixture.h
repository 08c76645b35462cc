#pragma once
// The SmolLM2 and gemma-3-270m split models the split-engine tests read.
//
// Under CTest they are quantized once per run by `bitsplit quantize` (the fixture tests
// split_fixture.quantize_* in tests/CMakeLists.txt, which are also the command's end-to-end
// tests) into the directory BITSPLIT_SPLIT_FIXTURES names. A test binary run by hand quantizes
// its own copy into a temporary directory instead (once per process, the same knobs), so it never
// reads files left over from an older build (with the built CLI, which tests/CMakeLists.txt makes
// every such test depend on).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/model/split_model.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"

namespace bitsplit::testing {

// What the fixture was quantized with; tests check the files say the same. Keep in sync with
// the quantize command line in tests/CMakeLists.txt.
inline model::SplitQuantization SplitFixtureQuantization() {
  model::SplitQuantization q;
  q.base_format = quant::SplitFormat::kB2Asym;
  q.base_group = 64;
  q.residual_format = quant::SplitFormat::kR8;
  q.residual_group = 32;
  q.rotation = {.block = 64, .seed = 1};
  return q;
}

struct SplitModelPaths {
  std::string base;
  std::string residual;
};

// The split model `name` (the CTest fixture's prefix) of `source_file` under models/.
inline SplitModelPaths SplitModelOf(const std::string& name, const std::string& source_file) {
  const char* dir = std::getenv("BITSPLIT_SPLIT_FIXTURES");
  if (dir != nullptr && *dir != '\0') {
    const std::string prefix = (std::filesystem::path(dir) / name).string();
    return SplitModelPaths{model::SplitBasePath(prefix), model::SplitResidualPath(prefix)};
  }
  const std::string own = (TestTempDir() / name).string();
  // The knobs of SplitFixtureQuantization().
  const std::string command = std::string(BITSPLIT_BINARY_DIR "/tools/bitsplit/bitsplit") +
                              " quantize '" + ModelPath(source_file) + "' -o '" + own +
                              "' --base-bits 2 --base-format asym --residual-bits 8 --group 64"
                              " --residual-group 32 --rotate --rotate-block 64 --seed 1"
                              " --threads 2 >/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return SplitModelPaths{model::SplitBasePath(own), model::SplitResidualPath(own)};
}

inline const SplitModelPaths& SmolLm2SplitModel() {
  static const SplitModelPaths paths = SplitModelOf("smollm2_split", kSmolLm2File);
  return paths;
}

inline const SplitModelPaths& Gemma3SplitModel() {
  static const SplitModelPaths paths = SplitModelOf("gemma3_split", kGemma3File);
  return paths;
}

}  // namespace bitsplit::testing
