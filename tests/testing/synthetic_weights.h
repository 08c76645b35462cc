#pragma once
// Rebuilds the random-weight GGUFs of tests/oracle/gen_qwen_logits_fixtures.py from the recipe
// its fixtures record, without Python. The values follow a counter-based rule that numpy and C++
// compute identically (integer hashing, then one float32 multiply and one float32 add):
//
//   seed = FNV-1a-64(architecture + "/" + tensor name)
//   k_i  = (splitmix64(seed + i) >> 40) - 2^23
//   w_i  = float32(offset) + float32(k_i) * float32(scale * 2^-23)
//
// The fixture also records the sha256 of every tensor's bytes; BuildSyntheticGguf checks them,
// so a test knows it runs exactly the tensors llama.cpp ran.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/sha256.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gguf_builder.h"
#include "tests/testing/paths.h"

namespace bitsplit::testing {

inline uint64_t Fnv1a64(const std::string& text) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

inline uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::vector<float> SyntheticValues(const std::string& architecture, const std::string& name,
                                          uint64_t count, double scale, double offset) {
  const uint64_t seed = Fnv1a64(architecture + "/" + name);
  const float step = static_cast<float>(scale * 0x1p-23);
  const float base = static_cast<float>(offset);
  std::vector<float> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t k = static_cast<int64_t>(SplitMix64(seed + i) >> 40) - (int64_t{1} << 23);
    const float scaled = static_cast<float>(k) * step;
    values[i] = offset != 0.0 ? base + scaled : scaled;
  }
  return values;
}

// The GGUF image of a fixture's model: its architecture metadata and F32 tensors (no tokenizer:
// the fixture holds token ids). Fails if a rebuilt tensor's sha256 differs from the fixture's.
inline absl::StatusOr<std::vector<uint8_t>> BuildSyntheticGguf(const nlohmann::json& fixture) {
  GgufBuilder builder;
  std::string architecture;
  for (const auto& entry : fixture["metadata"]) {
    const std::string key = entry["key"];
    const std::string type = entry["type"];
    if (type == "STRING") {
      builder.AddString(key, entry["value"].get<std::string>());
      if (key == "general.architecture") architecture = entry["value"].get<std::string>();
    } else if (type == "UINT32") {
      builder.AddUint32(key, entry["value"].get<uint32_t>());
    } else if (type == "FLOAT32") {
      builder.AddFloat32(key, entry["value"].get<float>());
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("metadata %s: type %s", key, type));
    }
  }
  for (const auto& tensor : fixture["tensors"]) {
    const std::string name = tensor["name"];
    const auto dims = tensor["dims"].get<std::vector<uint64_t>>();
    uint64_t count = 1;
    for (uint64_t d : dims) count *= d;
    const std::vector<float> values = SyntheticValues(
        architecture, name, count, tensor["scale"].get<double>(), tensor["offset"].get<double>());
    const std::string digest = Sha256Hex(Sha256Of(values.data(), values.size() * sizeof(float)));
    if (digest != tensor["sha256"].get<std::string>()) {
      return absl::DataLossError(absl::StrFormat("%s: rebuilt tensor sha256 %s, fixture %s", name,
                                                 digest, tensor["sha256"].get<std::string>()));
    }
    builder.AddF32Tensor(name, dims, values);
  }
  return builder.Build();
}

// The random-weight GGUF of a synthetic fixture (a path under the source tree), rebuilt from its
// recipe and checked tensor by tensor against the sha256 of what llama.cpp ran, in a temporary
// file that goes with the object.
class SyntheticModelFile {
 public:
  explicit SyntheticModelFile(const std::string& fixture_file)
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("bitsplit-", std::filesystem::path(fixture_file).stem().string(), "-",
                           getpid(), ".gguf")) {
    std::ifstream in(SourcePath(fixture_file));
    EXPECT_TRUE(in.good()) << "missing fixture " << fixture_file;
    if (!in.good()) return;
    fixture_ = nlohmann::json::parse(in);
    absl::StatusOr<std::vector<uint8_t>> image = BuildSyntheticGguf(fixture_);
    EXPECT_TRUE(image.ok()) << image.status();
    written_ = image.ok() && WriteFileBytes(path_.string(), *image);
  }
  ~SyntheticModelFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  SyntheticModelFile(const SyntheticModelFile&) = delete;
  SyntheticModelFile& operator=(const SyntheticModelFile&) = delete;

  bool ok() const { return written_; }
  const nlohmann::json& fixture() const { return fixture_; }
  std::string path() const { return path_.string(); }

 private:
  nlohmann::json fixture_;
  std::filesystem::path path_;
  bool written_ = false;
};

}  // namespace bitsplit::testing
