#pragma once
// The SmolLM2 split model the split-engine tests read.
//
// Under CTest it is quantized once per run by `bitsplit quantize` (the fixture test
// split_fixture.quantize_smollm2 in tests/CMakeLists.txt, which is also the command's end-to-end
// test) and found through BITSPLIT_SPLIT_FIXTURE. A test binary run by hand quantizes its own copy
// into a temporary directory instead (once per process, the same knobs), so it never reads files
// left over from an older build.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/model/split_quantizer.h"
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

inline const SplitModelPaths& SmolLm2SplitModel() {
  static const SplitModelPaths paths = [] {
    const char* prefix = std::getenv("BITSPLIT_SPLIT_FIXTURE");
    if (prefix != nullptr && *prefix != '\0') {
      return SplitModelPaths{model::SplitBasePath(prefix), model::SplitResidualPath(prefix)};
    }
    const std::string own = (TestTempDir() / "smollm2").string();
    SplitModelPaths own_paths{model::SplitBasePath(own), model::SplitResidualPath(own)};
    const auto summary =
        model::QuantizeSplitModel(ModelPath(kSmolLm2File), own_paths.base, own_paths.residual,
                                  {.quantization = SplitFixtureQuantization(), .num_threads = 2});
    EXPECT_TRUE(summary.ok()) << summary.status();
    return own_paths;
  }();
  return paths;
}

}  // namespace bitsplit::testing
