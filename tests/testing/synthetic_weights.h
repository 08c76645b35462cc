#pragma once
// Rebuilds the random-weight GGUFs of tests/oracle/gen_synthetic_logits_fixtures.py from the recipe
// its fixtures record, without Python. The values follow a counter-based rule that numpy and C++
// compute identically (integer hashing, then one float32 multiply and one float32 add):
//
//   seed = FNV-1a-64(architecture + "/" + tensor name), or the record's seed_name where it has one
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
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/gguf.h"
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

// The MXFP4 bytes of a `count`-element tensor (tests/oracle/gen_synthetic_logits_fixtures.py's
// synthetic_mxfp4): block b's E8M0 scale 121 + (splitmix64(seed + b) >> 63), then its 16 code
// bytes splitmix64(seed + blocks + 16 b + j) >> 56.
inline std::vector<uint8_t> SyntheticMxfp4(const std::string& architecture, const std::string& name,
                                           uint64_t count) {
  const uint64_t seed = Fnv1a64(architecture + "/" + name);
  const uint64_t blocks = count / 32;
  std::vector<uint8_t> bytes(blocks * 17);
  for (uint64_t b = 0; b < blocks; ++b) {
    bytes[b * 17] = static_cast<uint8_t>(121 + (SplitMix64(seed + b) >> 63));
    for (uint64_t j = 0; j < 16; ++j) {
      bytes[b * 17 + 1 + j] = static_cast<uint8_t>(SplitMix64(seed + blocks + b * 16 + j) >> 56);
    }
  }
  return bytes;
}

// Adds metadata entry `key` = `value` (the scalar and array types tokenizer metadata uses).
inline absl::Status AddMetadataValue(GgufBuilder& builder, const std::string& key,
                                     const gguf::Value& value) {
  using gguf::ValueType;
  if (const auto* array = std::get_if<gguf::Array>(&value.data); array != nullptr) {
    std::vector<std::string> strings;
    std::vector<int64_t> integers;
    std::vector<double> reals;
    for (const gguf::Value& element : array->elements) {
      if (const auto* s = std::get_if<std::string>(&element.data)) strings.push_back(*s);
      if (const auto* i = std::get_if<int64_t>(&element.data)) integers.push_back(*i);
      if (const auto* u = std::get_if<uint64_t>(&element.data)) {
        integers.push_back(static_cast<int64_t>(*u));
      }
      if (const auto* d = std::get_if<double>(&element.data)) reals.push_back(*d);
    }
    switch (array->element_type) {
      case ValueType::kString:
        builder.AddStringArray(key, strings);
        return absl::OkStatus();
      case ValueType::kInt32:
      case ValueType::kUint32:
        builder.AddArray(key, array->element_type, integers);
        return absl::OkStatus();
      case ValueType::kFloat32:
        builder.AddArray(key, array->element_type, reals);
        return absl::OkStatus();
      default:
        return absl::UnimplementedError(absl::StrFormat("metadata %s: array type", key));
    }
  }
  switch (value.type) {
    case ValueType::kString:
      builder.AddString(key, std::get<std::string>(value.data));
      return absl::OkStatus();
    case ValueType::kUint32:
      builder.AddUint32(key, static_cast<uint32_t>(std::get<uint64_t>(value.data)));
      return absl::OkStatus();
    case ValueType::kInt32:
      builder.AddInt32(key, static_cast<int32_t>(std::get<int64_t>(value.data)));
      return absl::OkStatus();
    case ValueType::kBool:
      builder.AddBool(key, std::get<bool>(value.data));
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(absl::StrFormat("metadata %s: type", key));
  }
}

// The chat template a served synthetic model gets: plain ChatML (a random model has no chat
// format of its own).
inline constexpr char kPlainChatMlTemplate[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The GGUF image of a fixture's model: its architecture metadata and F32 tensors. A tensor with
// "values" has those instead of the recipe's. Fails if a rebuilt tensor's sha256 differs from the
// fixture's. Without `tokenizer` the image has no tokenizer (the fixture holds token ids); with
// it, every tokenizer.* entry of that file (the vocabulary the fixture's token ids come from) is
// added, its chat template replaced by kPlainChatMlTemplate, so that the model can be served.
inline absl::StatusOr<std::vector<uint8_t>> BuildSyntheticGguf(
    const nlohmann::json& fixture, const gguf::File* tokenizer = nullptr) {
  GgufBuilder builder;
  if (tokenizer != nullptr) {
    for (const gguf::MetadataEntry& entry : tokenizer->metadata()) {
      if (entry.key.rfind("tokenizer.", 0) != 0 || entry.key == "tokenizer.chat_template") {
        continue;
      }
      absl::Status added = AddMetadataValue(builder, entry.key, entry.value);
      if (!added.ok()) return added;
    }
    builder.AddString("tokenizer.chat_template", kPlainChatMlTemplate);
  }
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
    } else if (type == "BOOL") {
      builder.AddBool(key, entry["value"].get<bool>());
    } else if (type == "ARRAY_UINT32") {
      builder.AddUint32Array(key, entry["value"].get<std::vector<uint32_t>>());
    } else if (type == "ARRAY_BOOL") {
      std::vector<uint8_t> flags;
      for (const bool flag : entry["value"].get<std::vector<bool>>()) flags.push_back(flag);
      builder.AddArray(key, gguf::ValueType::kBool, flags);
    } else {
      return absl::InvalidArgumentError(absl::StrFormat("metadata %s: type %s", key, type));
    }
  }
  for (const auto& tensor : fixture["tensors"]) {
    const std::string name = tensor["name"];
    const auto dims = tensor["dims"].get<std::vector<uint64_t>>();
    uint64_t count = 1;
    for (uint64_t d : dims) count *= d;
    if (tensor.value("format", "") == "MXFP4") {
      std::vector<uint8_t> bytes = SyntheticMxfp4(architecture, name, count);
      const std::string digest = Sha256Hex(Sha256Of(bytes.data(), bytes.size()));
      if (digest != tensor["sha256"].get<std::string>()) {
        return absl::DataLossError(absl::StrFormat("%s: rebuilt tensor sha256 %s, fixture %s", name,
                                                   digest, tensor["sha256"].get<std::string>()));
      }
      builder.AddTensor(name, GgmlType::kMXFP4, dims, std::move(bytes));
      continue;
    }
    // A tensor of set values (e.g. gemma4's RoPE frequency factors) lists them.
    const std::vector<float> values =
        tensor.contains("values")
            ? tensor["values"].get<std::vector<float>>()
            : SyntheticValues(architecture, tensor.value("seed_name", name), count,
                              tensor["scale"].get<double>(), tensor["offset"].get<double>());
    if (values.size() != count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %d values for %d elements", name, values.size(), count));
    }
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
  // `tokenizer` (nullable): a GGUF whose tokenizer.* metadata the model gets (BuildSyntheticGguf).
  explicit SyntheticModelFile(const std::string& fixture_file,
                              const gguf::File* tokenizer = nullptr)
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("bitsplit-", std::filesystem::path(fixture_file).stem().string(), "-",
                           getpid(), tokenizer != nullptr ? "-tokenizer" : "", ".gguf")) {
    std::ifstream in(SourcePath(fixture_file));
    EXPECT_TRUE(in.good()) << "missing fixture " << fixture_file;
    if (!in.good()) return;
    fixture_ = nlohmann::json::parse(in);
    absl::StatusOr<std::vector<uint8_t>> image = BuildSyntheticGguf(fixture_, tokenizer);
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
