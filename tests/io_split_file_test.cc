#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/split_file.h"
#include "common/util/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace bitsplit {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kImageName[] = "synthetic.bsplit";
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// Stand-in for the quant layer's split formats: id 0 packs 2-bit codes, id 1 8-bit codes, each
// group with an fp16 scale. The reader must use whatever the oracle says.
absl::StatusOr<uint64_t> FakeRowBytes(uint32_t id, uint32_t group, int64_t cols) {
  if (id > 1) return absl::InvalidArgumentError(absl::StrCat("unknown split format ", id));
  if (group == 0 || group % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group size ", group, " is not a positive multiple of 32"));
  }
  if (cols % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(cols, " columns are not a multiple of the group size ", group));
  }
  const uint64_t bits = id == 0 ? 2 : 8;
  return static_cast<uint64_t>(cols) / group * (2 + group * bits / 8);
}
const RowSizeOracle kOracle = FakeRowBytes;

constexpr uint32_t kTwoBit = SplitTensorFormat(0);
constexpr uint32_t kEightBit = SplitTensorFormat(1);

SplitFingerprint MakeFingerprint(uint8_t seed) {
  SplitFingerprint fingerprint;
  for (size_t i = 0; i < fingerprint.size(); ++i) {
    fingerprint[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  }
  return fingerprint;
}

// Deterministic, tensor-specific bytes, so a misplaced tensor is noticed.
std::vector<uint8_t> PatternBytes(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 8));
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// A byte-level image builder, independent of SplitFileWriter, that writes exactly what it is
// told: the default output is a valid file (the test WriterMatchesBuilder checks that it is the
// writer's output byte for byte), and every field can be overridden to make malformed ones.

template <typename T>
void AppendScalar(std::vector<uint8_t>* out, T value) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &value, sizeof(T));
}

template <typename T>
void PatchAt(std::vector<uint8_t>* image, size_t at, T value) {
  std::memcpy(image->data() + at, &value, sizeof(T));
}

uint64_t AlignUp(uint64_t value) { return (value + 63) / 64 * 64; }

struct RawTensor {
  std::string name;
  uint32_t format = 0;
  uint32_t group_size = 0;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // written at the tensor's offset
  std::optional<uint32_t> name_length;
  std::optional<uint32_t> n_dims;
  std::optional<uint64_t> offset;     // default: packed, aligned
  std::optional<uint64_t> num_bytes;  // default: data.size()
};

struct EntryLayout {
  size_t start;  // u32 name length
  size_t format_at;
  size_t group_at;
  size_t n_dims_at;
  size_t dims_at;
  size_t offset_at;
  size_t num_bytes_at;
};

struct ImageLayout {
  // The header (magic 0, version 8, kind 12, fingerprint 16) is fixed; the metadata's length
  // sits at 48 and the metadata follows at 56.
  static constexpr size_t kMetadataLengthAt = 48;
  size_t tensor_count_at = 0;
  std::vector<EntryLayout> entries;
  size_t entries_end = 0;
  size_t data_offset = 0;
  std::vector<uint64_t> offsets;  // relative offsets written
};

struct SplitImageBuilder {
  std::string magic = std::string(kSplitFileMagic, sizeof(kSplitFileMagic));
  uint32_t version = kSplitFileVersion;
  uint32_t kind = static_cast<uint32_t>(SplitFileKind::kBase);
  SplitFingerprint fingerprint = MakeFingerprint(1);
  std::string metadata = "{}";
  std::optional<uint64_t> metadata_length;
  std::optional<uint64_t> tensor_count;
  std::deque<RawTensor> tensors;

  // A tensor with its exact data size (when the shape is valid) of pattern bytes.
  RawTensor& AddTensor(std::string name, uint32_t format, uint32_t group,
                       std::vector<int64_t> dims) {
    auto size = ComputeSplitTensorSize(format, group, dims, kOracle);
    RawTensor& tensor = tensors.emplace_back();
    tensor.data =
        PatternBytes(size.ok() ? size->num_bytes : 0, static_cast<uint8_t>(tensors.size() * 37));
    tensor.name = std::move(name);
    tensor.format = format;
    tensor.group_size = group;
    tensor.dims = std::move(dims);
    return tensor;
  }

  std::vector<uint8_t> Build(ImageLayout* layout_out = nullptr) const {
    ImageLayout layout;
    std::vector<uint8_t> out(magic.begin(), magic.end());
    AppendScalar(&out, version);
    AppendScalar(&out, kind);
    out.insert(out.end(), fingerprint.begin(), fingerprint.end());
    AppendScalar<uint64_t>(&out, metadata_length.value_or(metadata.size()));
    out.insert(out.end(), metadata.begin(), metadata.end());
    layout.tensor_count_at = out.size();
    AppendScalar<uint64_t>(&out, tensor_count.value_or(tensors.size()));
    uint64_t next = 0;
    for (const RawTensor& t : tensors) {
      const uint64_t offset = t.offset.value_or(AlignUp(next));
      layout.offsets.push_back(offset);
      next = std::max(next, offset + t.data.size());
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const RawTensor& t = tensors[i];
      EntryLayout at;
      at.start = out.size();
      AppendScalar<uint32_t>(&out, t.name_length.value_or(static_cast<uint32_t>(t.name.size())));
      out.insert(out.end(), t.name.begin(), t.name.end());
      at.format_at = out.size();
      AppendScalar(&out, t.format);
      at.group_at = out.size();
      AppendScalar(&out, t.group_size);
      at.n_dims_at = out.size();
      AppendScalar<uint32_t>(&out, t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      at.dims_at = out.size();
      for (int64_t d : t.dims) AppendScalar(&out, d);
      at.offset_at = out.size();
      AppendScalar(&out, layout.offsets[i]);
      at.num_bytes_at = out.size();
      AppendScalar<uint64_t>(&out, t.num_bytes.value_or(t.data.size()));
      layout.entries.push_back(at);
    }
    layout.entries_end = out.size();
    layout.data_offset = AlignUp(out.size());
    out.resize(layout.data_offset);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const RawTensor& t = tensors[i];
      const size_t at = layout.data_offset + layout.offsets[i];
      if (out.size() < at + t.data.size()) out.resize(at + t.data.size());
      if (!t.data.empty()) std::memcpy(out.data() + at, t.data.data(), t.data.size());
    }
    if (layout_out) *layout_out = std::move(layout);
    return out;
  }
};

nlohmann::json SmallMetadata() {
  return nlohmann::json{
      {"config", {{"architecture", "llama"}, {"block_count", 1}, {"rope_theta", 10000.0}}},
      {"quantization", {{"base_bits", 2}, {"residual_bits", 8}, {"group", 32}}},
      {"tokenizer",
       {{"tokens", {"<s>", "</s>", "h\u00e9llo"}},
        {"merges", {"h e"}},
        {"token_types", {3, 3, 1}},
        {"pre", "smollm"},
        {"bos_id", 0},
        {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}}}};
}

// Four tensors: two ggml (Q8_0 with a 204-byte size that is not a multiple of 64, F32), two
// split formats (one three-dimensional), so every padding case appears.
SplitImageBuilder SmallSplit() {
  SplitImageBuilder b;
  b.metadata = SmallMetadata().dump();
  b.AddTensor("token_embd.weight", GgmlTensorFormat(GgmlType::kQ8_0), 0, {64, 3});
  b.AddTensor("output_norm.weight", GgmlTensorFormat(GgmlType::kF32), 0, {5});
  b.AddTensor("blk.0.attn_q.weight", kTwoBit, 32, {64, 4});
  b.AddTensor("blk.0.ffn_up.weight", kEightBit, 64, {128, 2, 2});
  return b;
}

absl::StatusOr<std::unique_ptr<SplitFile>> ParseImage(
    const std::vector<uint8_t>& image,
    std::optional<SplitFileKind> expected_kind = SplitFileKind::kBase) {
  return SplitFile::Parse(image.data(), image.size(), kImageName, expected_kind, kOracle);
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/io_split_file_test_" + name;
}

bool FileExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

bool WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(file);
}

// Writes the SmallSplit() content through SplitFileWriter, tensors interleaved and in chunks.
absl::Status WriteSmallSplit(const std::string& path, SplitFileKind kind,
                             const SplitFingerprint& fingerprint) {
  const SplitImageBuilder b = SmallSplit();
  BITSPLIT_ASSIGN_OR_RETURN(
      std::unique_ptr<SplitFileWriter> writer,
      SplitFileWriter::Create(path, kind, fingerprint, SmallMetadata(), kOracle));
  for (const RawTensor& t : b.tensors) {
    BITSPLIT_ASSIGN_OR_RETURN(uint64_t size,
                              writer->DeclareTensor(t.name, t.format, t.group_size, t.dims));
    if (size != t.data.size()) return absl::InternalError("declared size differs");
  }
  // Last tensor first, its first half; then the others in 7-byte chunks; then the rest.
  const RawTensor& last = b.tensors.back();
  const size_t half = last.data.size() / 2;
  BITSPLIT_RETURN_IF_ERROR(writer->WriteTensorData(last.name, last.data.data(), half));
  for (size_t i = 0; i + 1 < b.tensors.size(); ++i) {
    const RawTensor& t = b.tensors[i];
    for (size_t at = 0; at < t.data.size(); at += 7) {
      BITSPLIT_RETURN_IF_ERROR(writer->WriteTensorData(t.name, t.data.data() + at,
                                                       std::min<size_t>(7, t.data.size() - at)));
    }
  }
  BITSPLIT_RETURN_IF_ERROR(
      writer->WriteTensorData(last.name, last.data.data() + half, last.data.size() - half));
  return writer->Finish();
}

// ---------------------------------------------------------------------------------------------
// Formats and fingerprints

TEST(SplitFormatTest, NamespacesAreDisjoint) {
  EXPECT_TRUE(IsGgmlTensorFormat(GgmlTensorFormat(GgmlType::kQ8_0)));
  EXPECT_FALSE(IsSplitTensorFormat(GgmlTensorFormat(GgmlType::kQ8_0)));
  EXPECT_EQ(SplitTensorFormat(6), 0x10006u);
  EXPECT_TRUE(IsSplitTensorFormat(SplitTensorFormat(6)));
  EXPECT_FALSE(IsGgmlTensorFormat(SplitTensorFormat(0)));
  EXPECT_EQ(SplitFormatIdOf(SplitTensorFormat(kMaxSplitFormatId)), kMaxSplitFormatId);
  EXPECT_FALSE(IsSplitTensorFormat(0x20000));
  EXPECT_FALSE(IsGgmlTensorFormat(0x20000));
  EXPECT_EQ(TensorFormatName(GgmlTensorFormat(GgmlType::kQ4_1)), "Q4_1");
  EXPECT_EQ(TensorFormatName(SplitTensorFormat(7)), "split format 7");
  EXPECT_EQ(TensorFormatName(0x20001), "format 0x20001");
}

TEST(SplitFormatTest, ComputesSizesLikeTheReader) {
  auto q8 = ComputeSplitTensorSize(GgmlTensorFormat(GgmlType::kQ8_0), 0, {64, 3}, nullptr);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(q8->row_bytes, 68u);
  EXPECT_EQ(q8->num_bytes, 204u);
  EXPECT_EQ(q8->num_elements, 192);
  auto split = ComputeSplitTensorSize(kEightBit, 64, {128, 2, 2}, kOracle);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->row_bytes, 132u);
  EXPECT_EQ(split->num_bytes, 528u);
  // The oracle is consulted only for split formats.
  auto no_oracle = ComputeSplitTensorSize(kTwoBit, 32, {64}, nullptr);
  EXPECT_EQ(no_oracle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_oracle.status().message()), HasSubstr("needs a row-size oracle"));
  auto zero_row = ComputeSplitTensorSize(
      kTwoBit, 32, {64}, [](uint32_t, uint32_t, int64_t) { return absl::StatusOr<uint64_t>(0); });
  EXPECT_THAT(std::string(zero_row.status().message()), HasSubstr("the row-size oracle says 0"));
}

TEST(SplitFingerprintTest, HexRoundTripAndErrors) {
  const SplitFingerprint fingerprint = MakeFingerprint(3);
  const std::string hex = SplitFingerprintToHex(fingerprint);
  EXPECT_EQ(hex.size(), 64u);
  EXPECT_EQ(hex.substr(0, 6), "5d646b");  // 93, 100, 107
  auto parsed = SplitFingerprintFromHex(hex);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, fingerprint);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(*SplitFingerprintFromHex(upper), fingerprint);
  EXPECT_THAT(std::string(SplitFingerprintFromHex("abc").status().message()),
              HasSubstr("has 3 characters, expected 64 hex digits"));
  EXPECT_THAT(std::string(SplitFingerprintFromHex(std::string(63, '0') + "g").status().message()),
              HasSubstr("non-hex character at 63"));
}

// ---------------------------------------------------------------------------------------------
// Valid files

TEST(SplitFileTest, ParsesABuiltImage) {
  ImageLayout layout;
  const SplitImageBuilder b = SmallSplit();
  const std::vector<uint8_t> image = b.Build(&layout);
  auto file = ParseImage(image);
  ASSERT_TRUE(file.ok()) << file.status();
  const SplitFile& f = **file;

  EXPECT_EQ(f.name(), kImageName);
  EXPECT_EQ(f.version(), 1u);
  EXPECT_EQ(f.kind(), SplitFileKind::kBase);
  EXPECT_EQ(f.fingerprint(), MakeFingerprint(1));
  EXPECT_EQ(f.metadata(), SmallMetadata());
  EXPECT_EQ(f.metadata_text(), SmallMetadata().dump());
  EXPECT_EQ(f.data_offset(), layout.data_offset);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.image_data(), image.data());
  EXPECT_EQ(f.image_size(), image.size());
  ASSERT_EQ(f.tensors().size(), 4u);

  const SplitTensor& embd = f.tensors()[0];
  EXPECT_EQ(embd.name, "token_embd.weight");
  EXPECT_EQ(embd.format, GgmlTensorFormat(GgmlType::kQ8_0));
  EXPECT_EQ(embd.group_size, 0u);
  EXPECT_THAT(embd.dims, ElementsAre(64, 3));
  EXPECT_EQ(embd.cols(), 64);
  EXPECT_EQ(embd.rows(), 3);
  EXPECT_EQ(embd.num_elements, 192);
  EXPECT_EQ(embd.row_bytes, 68u);
  EXPECT_EQ(embd.num_bytes, 204u);
  EXPECT_EQ(embd.offset, 0u);
  EXPECT_EQ(embd.data, image.data() + f.data_offset());

  const SplitTensor* norm = f.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->offset, 256u);  // 204 aligned up
  EXPECT_EQ(norm->num_bytes, 20u);
  const SplitTensor* up = f.FindTensor("blk.0.ffn_up.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->format, kEightBit);
  EXPECT_EQ(up->group_size, 64u);
  EXPECT_THAT(up->dims, ElementsAre(128, 2, 2));
  EXPECT_EQ(up->rows(), 4);
  EXPECT_EQ(up->row_bytes, 132u);
  EXPECT_EQ(up->data + up->num_bytes, image.data() + image.size());  // no trailing bytes
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const SplitTensor& t = f.tensors()[i];
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.num_bytes), b.tensors[i].data) << t.name;
  }
  EXPECT_EQ(f.FindTensor("missing"), nullptr);
  auto missing = f.GetTensor("missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(missing.status().message()),
            "synthetic.bsplit: base split file has no tensor 'missing'");
  EXPECT_EQ(*f.GetTensor("output_norm.weight"), norm);
}

TEST(SplitFileTest, AcceptsAFileWithoutTensors) {
  SplitImageBuilder b;
  const std::vector<uint8_t> image = b.Build();
  EXPECT_EQ(image.size(), 128u);  // 56 + "{}" + count 0 = 66, padded
  auto file = ParseImage(image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_EQ((*file)->data_offset(), 128u);
  EXPECT_TRUE((*file)->metadata().is_object());
}

TEST(SplitFileTest, GgmlOnlyFilesNeedNoOracle) {
  SplitImageBuilder b;
  b.AddTensor("output_norm.weight", GgmlTensorFormat(GgmlType::kF32), 0, {5});
  const std::vector<uint8_t> image = b.Build();
  auto file = SplitFile::Parse(image.data(), image.size(), kImageName, std::nullopt, nullptr);
  ASSERT_TRUE(file.ok()) << file.status();

  const std::vector<uint8_t> small = SmallSplit().Build();
  auto needs_oracle =
      SplitFile::Parse(small.data(), small.size(), kImageName, std::nullopt, nullptr);
  EXPECT_EQ(needs_oracle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(needs_oracle.status().message()),
              AllOf(StartsWith(kImageName),
                    HasSubstr("tensor entry 2 of 4 (tensor 'blk.0.attn_q.weight'): split format 0 "
                              "needs a row-size oracle")));
}

// ---------------------------------------------------------------------------------------------
// Writer

TEST(SplitFileWriterTest, RoundTripThroughTheFileSystem) {
  const std::string path = TempPath("round_trip.bsplit");
  ::unlink(path.c_str());
  ASSERT_TRUE(WriteSmallSplit(path, SplitFileKind::kResidual, MakeFingerprint(9)).ok());
  EXPECT_FALSE(FileExists(path + ".tmp"));

  auto file = SplitFile::Open(path, SplitFileKind::kResidual, kOracle);
  ASSERT_TRUE(file.ok()) << file.status();
  const SplitFile& f = **file;
  EXPECT_EQ(f.name(), path);
  EXPECT_EQ(f.kind(), SplitFileKind::kResidual);
  EXPECT_EQ(f.fingerprint(), MakeFingerprint(9));
  EXPECT_EQ(f.fingerprint_hex(), SplitFingerprintToHex(MakeFingerprint(9)));
  EXPECT_EQ(f.metadata(), SmallMetadata());
  EXPECT_EQ(f.metadata()["tokenizer"]["tokens"][2], "h\u00e9llo");
  const SplitImageBuilder expected = SmallSplit();
  ASSERT_EQ(f.tensors().size(), expected.tensors.size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const SplitTensor& t = f.tensors()[i];
    const RawTensor& e = expected.tensors[i];
    EXPECT_EQ(t.name, e.name);
    EXPECT_EQ(t.format, e.format);
    EXPECT_EQ(t.group_size, e.group_size);
    EXPECT_EQ(t.dims, e.dims);
    // mmap is page-aligned, so file offsets that are multiples of 64 give aligned pointers.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.num_bytes), e.data) << t.name;
  }
  ::unlink(path.c_str());
}

TEST(SplitFileWriterTest, WriterMatchesBuilder) {
  const std::string path = TempPath("matches_builder.bsplit");
  ASSERT_TRUE(WriteSmallSplit(path, SplitFileKind::kBase, MakeFingerprint(1)).ok());
  EXPECT_EQ(ReadFileBytes(path), SmallSplit().Build());
  ::unlink(path.c_str());
}

TEST(SplitFileWriterTest, WritesAFileWithoutTensors) {
  const std::string path = TempPath("empty.bsplit");
  auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                        nlohmann::json::object(), nullptr);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(ReadFileBytes(path), SplitImageBuilder().Build());
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  ::unlink(path.c_str());
}

TEST(SplitFileWriterTest, ReplacesAnExistingFileOnlyOnFinish) {
  const std::string path = TempPath("replace.bsplit");
  ASSERT_TRUE(WriteFileBytes(path, {1, 2, 3}));
  {
    auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                          SmallMetadata(), kOracle);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ((*writer)->temp_path(), path + ".tmp");
    ASSERT_TRUE((*writer)->DeclareTensor("t", GgmlTensorFormat(GgmlType::kF32), 0, {2}).ok());
    const float values[2] = {1, 2};
    ASSERT_TRUE((*writer)->WriteTensorData("t", values, sizeof(values)).ok());
    EXPECT_TRUE(FileExists(path + ".tmp"));
    EXPECT_EQ(ReadFileBytes(path), (std::vector<uint8_t>{1, 2, 3}));  // untouched so far
    // Dropped unfinished: the old file stays, the temporary goes.
  }
  EXPECT_FALSE(FileExists(path + ".tmp"));
  EXPECT_EQ(ReadFileBytes(path), (std::vector<uint8_t>{1, 2, 3}));

  ASSERT_TRUE(WriteSmallSplit(path, SplitFileKind::kBase, MakeFingerprint(1)).ok());
  EXPECT_EQ(ReadFileBytes(path), SmallSplit().Build());
  ::unlink(path.c_str());
}

TEST(SplitFileWriterTest, RefusesWhatTheReaderWouldRefuse) {
  const std::string path = TempPath("refuses.bsplit");
  auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                        SmallMetadata(), kOracle);
  ASSERT_TRUE(writer.ok()) << writer.status();
  SplitFileWriter& w = **writer;
  const uint32_t f32 = GgmlTensorFormat(GgmlType::kF32);

  auto status_of = [](const auto& result) { return result.status(); };
  auto expect_error = [&](const absl::Status& status, absl::StatusCode code,
                          const std::string& message) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), AllOf(StartsWith(path), HasSubstr(message)));
  };
  expect_error(status_of(w.DeclareTensor("", f32, 0, {2})), absl::StatusCode::kInvalidArgument,
               "tensor name '' has 0 bytes, expected 1 to 256");
  expect_error(status_of(w.DeclareTensor(std::string(257, 'x'), f32, 0, {2})),
               absl::StatusCode::kInvalidArgument, "has 257 bytes");
  expect_error(status_of(w.DeclareTensor("q", GgmlTensorFormat(GgmlType::kQ8_0), 0, {48})),
               absl::StatusCode::kInvalidArgument,
               "tensor 'q': row size 48 (dimension 0) is not a multiple of the Q8_0 block size 32");
  expect_error(status_of(w.DeclareTensor("s", kTwoBit, 48, {96})),
               absl::StatusCode::kInvalidArgument, "group size 48 is not a positive multiple");
  expect_error(status_of(w.DeclareTensor("d", f32, 0, {1, 1, 1, 1, 1})),
               absl::StatusCode::kInvalidArgument, "5 dimensions, expected 1 to 4");
  expect_error(status_of(w.DeclareTensor("z", f32, 0, {0})), absl::StatusCode::kInvalidArgument,
               "dimension 0 is 0, expected a positive size");
  expect_error(status_of(w.DeclareTensor("u", 0x30000, 0, {1})), absl::StatusCode::kInvalidArgument,
               "unknown tensor format 0x30000");

  ASSERT_EQ(*w.DeclareTensor("a", f32, 0, {4}), 16u);
  ASSERT_EQ(*w.DeclareTensor("b", kTwoBit, 32, {64, 2}), 40u);
  expect_error(status_of(w.DeclareTensor("a", f32, 0, {4})), absl::StatusCode::kInvalidArgument,
               "tensor 'a' is already declared");

  const std::vector<uint8_t> bytes(64, 0x5A);
  expect_error(w.WriteTensorData("nope", bytes.data(), 1), absl::StatusCode::kNotFound,
               "no tensor 'nope' was declared");
  expect_error(w.WriteTensorData("a", bytes.data(), 17), absl::StatusCode::kInvalidArgument,
               "tensor 'a': writing 17 more bytes after 0 would pass its size of 16 bytes");
  ASSERT_TRUE(w.WriteTensorData("a", bytes.data(), 10).ok());
  expect_error(w.WriteTensorData("a", bytes.data(), 7), absl::StatusCode::kInvalidArgument,
               "writing 7 more bytes after 10");
  expect_error(status_of(w.DeclareTensor("late", f32, 0, {1})),
               absl::StatusCode::kFailedPrecondition,
               "cannot declare tensor 'late' after tensor data writing has begun");
  ASSERT_TRUE(w.WriteTensorData("a", bytes.data(), 6).ok());
  expect_error(w.Finish(), absl::StatusCode::kFailedPrecondition,
               "tensor 'b' is incomplete: 0 of 40 bytes written");
  EXPECT_FALSE(FileExists(path));
  ASSERT_TRUE(w.WriteTensorData("b", bytes.data(), 40).ok());
  ASSERT_TRUE(w.Finish().ok());
  expect_error(w.WriteTensorData("a", bytes.data(), 0), absl::StatusCode::kFailedPrecondition,
               "already finished");
  auto file = SplitFile::Open(path, SplitFileKind::kBase, kOracle);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors()[1].offset, 64u);
  ::unlink(path.c_str());
}

TEST(SplitFileWriterTest, RefusesBadMetadataAndPaths) {
  const std::string path = TempPath("bad_metadata.bsplit");
  auto not_object = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                            nlohmann::json::array({1, 2}), nullptr);
  EXPECT_EQ(not_object.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_object.status().message()),
              AllOf(StartsWith(path), HasSubstr("metadata is a JSON array, expected an object")));

  nlohmann::json bad_utf8 = {{"tokens", {std::string("\xff\xfe")}}};
  auto invalid =
      SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1), bad_utf8, nullptr);
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invalid.status().message()),
              AllOf(StartsWith(path), HasSubstr("invalid UTF-8"),
                    HasSubstr("encode byte strings that are not UTF-8")));

  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < kSplitFileMaxMetadataDepth; ++i) deep = nlohmann::json::array({deep});
  auto too_deep = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                          {{"deep", deep}}, nullptr);
  EXPECT_THAT(std::string(too_deep.status().message()),
              HasSubstr(": metadata: JSON nests deeper than 64 levels"));
  EXPECT_FALSE(FileExists(path + ".tmp"));

  auto no_directory =
      SplitFileWriter::Create(TempPath("missing_dir/x.bsplit"), SplitFileKind::kBase,
                              MakeFingerprint(1), nlohmann::json::object(), nullptr);
  EXPECT_EQ(no_directory.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_directory.status().message()),
              HasSubstr("x.bsplit.tmp: cannot create"));

  auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, MakeFingerprint(1),
                                        nlohmann::json::object(), nullptr);
  ASSERT_TRUE(writer.ok());
  auto split_without_oracle = (*writer)->DeclareTensor("s", kTwoBit, 32, {32});
  EXPECT_EQ(split_without_oracle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(split_without_oracle.status().message()),
              HasSubstr("tensor 's': split format 0 needs a row-size oracle"));
}

// ---------------------------------------------------------------------------------------------
// Kinds and pairing

TEST(SplitFileOpenTest, WrongKindIsRefusedWithThePath) {
  const std::string path = TempPath("kind.bsplit");
  ASSERT_TRUE(WriteSmallSplit(path, SplitFileKind::kResidual, MakeFingerprint(1)).ok());
  auto as_base = SplitFile::Open(path, SplitFileKind::kBase, kOracle);
  EXPECT_EQ(as_base.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(as_base.status().message()),
            path + ": is a residual split file, expected a base split file");
  EXPECT_TRUE(SplitFile::Open(path, std::nullopt, kOracle).ok());
  ::unlink(path.c_str());
}

TEST(SplitFileOpenTest, MissingAndForeignFilesNameThePath) {
  const std::string path = TempPath("foreign.bsplit");
  auto missing = SplitFile::Open(path + ".missing", std::nullopt, kOracle);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(path + ".missing"));

  std::vector<uint8_t> gguf = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_TRUE(WriteFileBytes(path, gguf));
  auto foreign = SplitFile::Open(path, std::nullopt, kOracle);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(foreign.status().message()),
            path +
                ": this is a GGUF file, not a bitsplit split file (make one with `bitsplit "
                "quantize`)");
  ::unlink(path.c_str());
}

TEST(SplitPairTest, AcceptsMatchingFilesAndRefusesOthers) {
  const std::string base_path = TempPath("pair_base.bsplit");
  const std::string residual_path = TempPath("pair_residual.bsplit");
  const std::string other_path = TempPath("pair_other.bsplit");
  ASSERT_TRUE(WriteSmallSplit(base_path, SplitFileKind::kBase, MakeFingerprint(5)).ok());
  ASSERT_TRUE(WriteSmallSplit(residual_path, SplitFileKind::kResidual, MakeFingerprint(5)).ok());
  ASSERT_TRUE(WriteSmallSplit(other_path, SplitFileKind::kResidual, MakeFingerprint(6)).ok());
  auto base = SplitFile::Open(base_path, SplitFileKind::kBase, kOracle);
  auto residual = SplitFile::Open(residual_path, SplitFileKind::kResidual, kOracle);
  auto other = SplitFile::Open(other_path, SplitFileKind::kResidual, kOracle);
  ASSERT_TRUE(base.ok() && residual.ok() && other.ok());

  EXPECT_TRUE(CheckSplitPair(**base, **residual).ok());

  const absl::Status mismatch = CheckSplitPair(**base, **other);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.message()),
              AllOf(HasSubstr("do not belong together"), HasSubstr(base_path),
                    HasSubstr(other_path), HasSubstr(SplitFingerprintToHex(MakeFingerprint(5))),
                    HasSubstr(SplitFingerprintToHex(MakeFingerprint(6)))));

  const absl::Status swapped = CheckSplitPair(**residual, **base);
  EXPECT_EQ(swapped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(swapped.message()),
            residual_path + ": is a residual split file, but it was given as the base file");
  const absl::Status two_bases = CheckSplitPair(**base, **base);
  EXPECT_EQ(std::string(two_bases.message()),
            base_path + ": is a base split file, but it was given as the residual file");
  for (const std::string& p : {base_path, residual_path, other_path}) ::unlink(p.c_str());
}

// ---------------------------------------------------------------------------------------------
// Corruptions: each case builds a malformed image; parsing (expecting a base file) must fail
// with the expected code and a message that starts with the image name and says what is wrong.

struct CorruptionCase {
  std::string name;
  std::function<std::vector<uint8_t>()> make_image;
  std::string expected_message;
  absl::StatusCode expected_code = absl::StatusCode::kInvalidArgument;
};

using Image = std::vector<uint8_t>;

// Builds SmallSplit(), lets `edit` change the builder, then `patch` the bytes.
Image Mutated(const std::function<void(SplitImageBuilder&)>& edit,
              const std::function<void(Image&, const ImageLayout&)>& patch = {}) {
  SplitImageBuilder b = SmallSplit();
  if (edit) edit(b);
  ImageLayout layout;
  Image image = b.Build(&layout);
  if (patch) patch(image, layout);
  return image;
}

Image WithMetadata(std::string text) {
  return Mutated([&](SplitImageBuilder& b) { b.metadata = std::move(text); });
}

std::vector<CorruptionCase> CorruptionCases() {
  ImageLayout layout;
  const Image full = SmallSplit().Build(&layout);
  const size_t metadata_bytes = SmallMetadata().dump().size();
  const std::string past_end_message =
      absl::StrCat("tensor 'blk.0.ffn_up.weight': data [", layout.data_offset + layout.offsets[3],
                   ", ", full.size(), ") extends past end of file (size ", full.size() - 1, ")");
  std::string deep = "{\"a\":" + std::string(kSplitFileMaxMetadataDepth, '[') +
                     std::string(kSplitFileMaxMetadataDepth, ']') + "}";
  // A string full of brackets is not nesting.
  std::string brackets_in_string = "{\"a\":\"" + std::string(200, '[') + "\", \"b\": [}";
  const size_t padding_at = layout.entries_end;
  const size_t count_zero_padding_at = layout.tensor_count_at + 8;

  return {
      // Fixed header.
      {"Empty", [] { return Image{}; }, "truncated: magic needs 8 bytes at offset 0 but only 0"},
      {"TooShortForMagic",
       [] {
         return Image{'B', 'S', 'P'};
       },
       "truncated: magic needs 8 bytes at offset 0 but only 3 remain (file size 3)"},
      {"BadMagic", [] { return Mutated([](SplitImageBuilder& b) { b.magic[5] = 'X'; }); },
       "bad magic 'BSPLIX\\x00\\x00', expected 'BSPLIT\\x00\\x00': not a bitsplit split file"},
      {"GgufFile",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.magic = std::string("GGUF\3\0\0\0", 8); });
       },
       "this is a GGUF file, not a bitsplit split file"},
      {"Version0", [] { return Mutated([](SplitImageBuilder& b) { b.version = 0; }); },
       "unsupported split file version 0 (this build reads version 1)"},
      {"VersionTooNew", [] { return Mutated([](SplitImageBuilder& b) { b.version = 2; }); },
       "unsupported split file version 2"},
      {"BigEndianFile",
       [] { return Mutated([](SplitImageBuilder& b) { b.version = 0x01000000; }); },
       "version field reads 16777216 (1 byte-swapped): a big-endian file"},
      {"KindZero", [] { return Mutated([](SplitImageBuilder& b) { b.kind = 0; }); },
       "unknown file kind 0 (expected 1 = base or 2 = residual)"},
      {"KindHuge", [] { return Mutated([](SplitImageBuilder& b) { b.kind = 0xFFFFFFFF; }); },
       "unknown file kind 4294967295"},
      {"ResidualWhereBaseExpected",
       [] { return Mutated([](SplitImageBuilder& b) { b.kind = 2; }); },
       "is a residual split file, expected a base split file",
       absl::StatusCode::kFailedPrecondition},
      {"TruncatedInFingerprint", [full] { return Image(full.begin(), full.begin() + 30); },
       "truncated: fingerprint needs 32 bytes at offset 16 but only 14 remain"},
      // Metadata.
      {"MetadataLengthPastEnd",
       [] { return Mutated([](SplitImageBuilder& b) { b.metadata_length = 1ull << 40; }); },
       "metadata length 1099511627776 at offset 48 runs past end of file"},
      {"MetadataLengthMaxU64",
       [] { return Mutated([](SplitImageBuilder& b) { b.metadata_length = kU64Max; }); },
       "metadata length 18446744073709551615 at offset 48 runs past end of file"},
      {"MetadataLengthTooShort",
       [metadata_bytes] {
         return Mutated([&](SplitImageBuilder& b) { b.metadata_length = metadata_bytes - 1; });
       },
       absl::StrCat("metadata (", metadata_bytes - 1, " bytes at offset 56): not valid JSON")},
      {"MetadataNotJson", [] { return WithMetadata("{config: 1}"); },
       "metadata (11 bytes at offset 56): not valid JSON: parse error at line 1, column 2"},
      {"MetadataEmpty", [] { return WithMetadata(""); },
       "metadata (0 bytes at offset 56): not valid JSON"},
      {"MetadataTrailingGarbage", [] { return WithMetadata("{} {}"); },
       "not valid JSON: parse error at line 1, column 4"},
      {"MetadataInvalidUtf8", [] { return WithMetadata("{\"a\": \"\xff\"}"); },
       "ill-formed UTF-8 byte; last read: '\"\\xff'"},
      {"MetadataNotAnObject", [] { return WithMetadata("[1, 2]"); },
       "metadata (6 bytes at offset 56): is a JSON array, expected an object"},
      {"MetadataTooDeep", [deep] { return WithMetadata(deep); },
       "JSON nests deeper than 64 levels (at byte 68 of the text)"},
      {"MetadataBracketsInStringsDoNotNest",
       [brackets_in_string] { return WithMetadata(brackets_in_string); }, "not valid JSON"},
      // Tensor count and entries.
      {"HugeTensorCount",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensor_count = kU64Max; }); },
       "tensor count 18446744073709551615 is impossible"},
      {"TensorCountBeyondFile",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensor_count = 1000; }); },
       "tensor count 1000 is impossible: the remaining"},
      {"TensorCountZeroWithEntries",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensor_count = 0; }); },
       absl::StrCat("header padding byte at offset ", count_zero_padding_at,
                    " is 0x11, expected 0")},  // the first name length, 17
      {"EmptyName",
       [] {
         return Mutated([](SplitImageBuilder& b) {
           b.tensors[1].name.clear();
           b.tensors[1].name_length = 0;
         });
       },
       "tensor entry 1 of 4: empty tensor name at offset"},
      {"NameOverLimit",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.tensors[1].name = std::string(257, 'n'); });
       },
       "tensor entry 1 of 4: name length 257 at offset"},
      {"NameLengthPastEnd",
       [] {
         return Mutated({}, [](Image& image, const ImageLayout& layout) {
           image.resize(layout.entries[3].start + 4 + 10);
         });
       },
       "tensor entry 3 of 4: truncated: name needs 19 bytes"},
      {"DimCountZero",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].n_dims = 0; }); },
       "tensor entry 1 of 4 (tensor 'output_norm.weight'): dimension count 0 at offset"},
      {"DimCountHuge",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].n_dims = 0xFFFFFFFF; }); },
       "dimension count 4294967295 at offset"},
      {"DimCountFive",
       [] { return Mutated([](SplitImageBuilder& b) {
              b.tensors[1].dims = {5, 1, 1, 1, 1};
            }); },
       "dimension count 5 at offset"},
      {"DimZero", [] { return Mutated([](SplitImageBuilder& b) {
                         b.tensors[1].dims = {5, 0};
                       }); },
       "(tensor 'output_norm.weight'): dimension 1 is 0, expected a positive size"},
      {"DimNegative",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].dims = {-5}; }); },
       "dimension 0 is -5, expected a positive size"},
      {"DimsProductOverflows",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.tensors[1].dims = {1ll << 32, 1ll << 31}; });
       },
       "element count (product of dimensions [4294967296, 2147483648]) overflows int64"},
      {"ByteSizeOverflows",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.tensors[1].dims = {1ll << 31, 1ll << 31}; });
       },
       "byte size of 2147483648 rows of 8589934592 bytes overflows"},
      {"UnknownGgmlType",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].format = 4; }); },
       "(tensor 'output_norm.weight'): unknown ggml type id 4"},
      {"UnknownFormatNamespace",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].format = 0x20000; }); },
       "unknown tensor format 0x20000 (neither a ggml type id below 0x10000 nor a split format"},
      {"GroupSizeForGgmlFormat",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[0].group_size = 32; }); },
       "group size 32 given for ggml format Q8_0, expected 0"},
      {"RowNotMultipleOfGgmlBlock",
       [] { return Mutated([](SplitImageBuilder& b) {
              b.tensors[0].dims = {48, 3};
            }); },
       "(tensor 'token_embd.weight'): row size 48 (dimension 0) is not a multiple of the Q8_0 "
       "block size 32"},
      {"UnknownSplitFormat",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.tensors[2].format = SplitTensorFormat(9); });
       },
       "(tensor 'blk.0.attn_q.weight'): split format 9, group size 32, 64 columns: unknown split "
       "format 9"},
      {"SplitGroupRefusedByOracle",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[2].group_size = 48; }); },
       "split format 0, group size 48, 64 columns: group size 48 is not a positive multiple of 32"},
      {"SplitColsNotMultipleOfGroup",
       [] { return Mutated([](SplitImageBuilder& b) {
              b.tensors[3].dims = {96, 2, 2};
            }); },
       "96 columns are not a multiple of the group size 64"},
      {"DataSizeDoesNotMatchShape",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[2].num_bytes = 81; }); },
       "(tensor 'blk.0.attn_q.weight'): data size 81 does not match its shape: 4 rows of 20 bytes "
       "(split format 0, group size 32, dims [64, 4]) are 80 bytes"},
      {"DataSizeHuge",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].num_bytes = kU64Max; }); },
       "data size 18446744073709551615 does not match its shape: 1 rows of 20 bytes"},
      {"DuplicateName",
       [] {
         return Mutated([](SplitImageBuilder& b) { b.tensors[2].name = "token_embd.weight"; });
       },
       "tensor entry 2 of 4 (tensor 'token_embd.weight'): duplicate tensor name, first used by "
       "tensor entry 0"},
      {"TruncatedInEntry",
       [] {
         return Mutated({}, [](Image& image, const ImageLayout& layout) {
           image.resize(layout.entries[3].dims_at + 12);
         });
       },
       "tensor entry 3 of 4 (tensor 'blk.0.ffn_up.weight'): truncated: dimension 1 needs 8 bytes"},
      // Placement of the data.
      {"OffsetNotAligned",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].offset = 257; }); },
       "(tensor 'output_norm.weight'): data offset 257 is not a multiple of the alignment 64"},
      {"FirstOffsetNotZero",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[0].offset = 64; }); },
       "(tensor 'token_embd.weight'): data offset 64 leaves a gap: expected 0"},
      {"OffsetsOutOfOrder",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[2].offset = 0; }); },
       "(tensor 'blk.0.attn_q.weight'): data offset 0 is before the offset 256 of the preceding "
       "tensor 'output_norm.weight'"},
      {"OverlappingTensors",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].offset = 192; }); },
       "(tensor 'output_norm.weight'): data at offset 192 overlaps tensor 'token_embd.weight' "
       "data [0, 204)"},
      {"GapBetweenTensors",
       [] { return Mutated([](SplitImageBuilder& b) { b.tensors[1].offset = 320; }); },
       "(tensor 'output_norm.weight'): data offset 320 leaves a gap: expected 256"},
      {"OffsetFarPastEnd",
       [] {
         return Mutated({}, [](Image& image, const ImageLayout& layout) {
           PatchAt<uint64_t>(&image, layout.entries[3].offset_at, 1ull << 62);
         });
       },
       absl::StrCat("data offset 4611686018427387904 leaves a gap: expected ", layout.offsets[3])},
      {"HeaderPaddingNotZero",
       [padding_at] {
         return Mutated({}, [&](Image& image, const ImageLayout&) { image[padding_at] = 0xFF; });
       },
       absl::StrCat("header padding byte at offset ", padding_at, " is 0xff, expected 0")},
      {"DataPastEndOfFile", [full] { return Image(full.begin(), full.end() - 1); },
       past_end_message},
      {"TrailingBytes",
       [full] {
         Image image = full;
         image.push_back(0);
         return image;
       },
       absl::StrCat("1 trailing bytes after the end of the tensor data at offset ", full.size(),
                    " (file size ", full.size() + 1, ")")},
      // Names from the file are escaped in messages.
      {"ControlBytesInNamesAreEscaped",
       [] {
         return Mutated([](SplitImageBuilder& b) {
           b.tensors[1].name = std::string("bad\n\x01name", 9);
           b.tensors[1].format = 99;
         });
       },
       "(tensor 'bad\\n\\x01name'): unknown ggml type id 99"},
  };
}

class SplitFileCorruptionTest : public ::testing::TestWithParam<CorruptionCase> {};

TEST_P(SplitFileCorruptionTest, RejectedWithSpecificMessage) {
  const CorruptionCase& c = GetParam();
  const Image image = c.make_image();
  // An exact-size heap copy, so that a sanitizer build catches any read past the end.
  const Image exact(image.begin(), image.end());
  auto file = ParseImage(exact);
  ASSERT_FALSE(file.ok()) << "accepted a corrupt image";
  EXPECT_EQ(file.status().code(), c.expected_code) << file.status();
  EXPECT_THAT(std::string(file.status().message()),
              AllOf(StartsWith(std::string(kImageName) + ": "), HasSubstr(c.expected_message)));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, SplitFileCorruptionTest, ::testing::ValuesIn(CorruptionCases()),
                         [](const ::testing::TestParamInfo<CorruptionCase>& info) {
                           return info.param.name;
                         });

// Every strict prefix of a valid image is rejected cleanly, with a message that fits where the
// cut is. The file ends exactly at the end of its last tensor, so even a one-byte cut is an
// error.
TEST(SplitFileTruncationTest, EveryPrefixIsRejected) {
  ImageLayout layout;
  const Image image = SmallSplit().Build(&layout);
  ASSERT_TRUE(ParseImage(image).ok());
  for (size_t cut = 0; cut < image.size(); ++cut) {
    const Image prefix(image.begin(), image.begin() + cut);
    auto file = ParseImage(prefix);
    ASSERT_FALSE(file.ok()) << "accepted a prefix of " << cut << " bytes";
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    const std::string message(file.status().message());
    ASSERT_THAT(message, StartsWith(std::string(kImageName) + ": ")) << cut;
    if (cut < ImageLayout::kMetadataLengthAt + 8) {
      ASSERT_THAT(message, HasSubstr("truncated")) << "cut " << cut << ": " << message;
    } else if (cut < layout.tensor_count_at) {
      ASSERT_THAT(message, HasSubstr("metadata length")) << "cut " << cut << ": " << message;
      ASSERT_THAT(message, HasSubstr("runs past end of file")) << "cut " << cut;
    } else if (cut < layout.data_offset) {
      ASSERT_THAT(message, AnyOf(HasSubstr("truncated"), HasSubstr("is impossible")))
          << "cut " << cut << ": " << message;
    } else {
      ASSERT_THAT(message, HasSubstr("extends past end of file"))
          << "cut " << cut << ": " << message;
    }
  }
}

// Random byte edits (and cuts) of a valid image: whatever the outcome, no crash, and an accepted
// image only exposes tensor data inside itself. Run under ASan/UBSan to check reads too.
TEST(SplitFileFuzzTest, RandomByteEditsNeverEscapeTheImage) {
  const Image original = SmallSplit().Build();
  std::mt19937 rng(4321);
  int accepted = 0;
  for (int iteration = 0; iteration < 10000; ++iteration) {
    Image image = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % image.size();
      const uint32_t kind = rng() % 4;
      image[at] = kind == 0   ? 0
                  : kind == 1 ? 0xFF
                  : kind == 2 ? static_cast<uint8_t>(image[at] ^ (1u << (rng() % 8)))
                              : static_cast<uint8_t>(rng());
    }
    if (rng() % 8 == 0) image.resize(rng() % image.size());
    const Image exact(image.begin(), image.end());
    auto file = ParseImage(exact, std::nullopt);
    if (!file.ok()) {
      ASSERT_THAT(std::string(file.status().message()), StartsWith(kImageName));
      continue;
    }
    ++accepted;
    for (const SplitTensor& t : (*file)->tensors()) {
      ASSERT_GE(t.data, exact.data());
      ASSERT_LE(t.data + t.num_bytes, exact.data() + exact.size());
      ASSERT_EQ(t.num_bytes, t.row_bytes * static_cast<uint64_t>(t.rows()));
    }
  }
  EXPECT_GT(accepted, 0);  // edits of tensor data bytes (and fingerprint bytes) are harmless
}

}  // namespace
}  // namespace bitsplit
