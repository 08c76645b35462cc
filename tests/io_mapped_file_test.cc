#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/io/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_builder.h"

namespace bitsplit {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/io_mapped_file_test_" + std::to_string(::getpid()) + "_" + name;
}

TEST(MappedFileTest, MapsWholeFileReadOnly) {
  const std::string path = TempPath("data.bin");
  std::vector<uint8_t> bytes(10000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(testing::WriteFileBytes(path, bytes));

  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->path(), path);
  ASSERT_EQ((*mapped)->size(), bytes.size());
  EXPECT_EQ(std::memcmp((*mapped)->data(), bytes.data(), bytes.size()), 0);
  ::unlink(path.c_str());
  // The mapping outlives the directory entry.
  EXPECT_EQ((*mapped)->data()[9999], bytes[9999]);
}

TEST(MappedFileTest, MissingFileIsNotFoundAndNamesPathAndReason) {
  const std::string path = TempPath("does_not_exist.gguf");
  auto mapped = MappedFile::Open(path);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(mapped.status().message()),
              AllOf(HasSubstr(path), HasSubstr(std::strerror(ENOENT))));
}

TEST(MappedFileTest, PathThroughAFileIsNotFound) {
  const std::string file = TempPath("plain");
  ASSERT_TRUE(testing::WriteFileBytes(file, {1, 2, 3}));
  auto mapped = MappedFile::Open(file + "/child");
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(mapped.status().message()), HasSubstr(file + "/child"));
  ::unlink(file.c_str());
}

TEST(MappedFileTest, DirectoryIsInvalidArgument) {
  const std::string dir = TempPath("dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  auto mapped = MappedFile::Open(dir);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mapped.status().message()),
              AllOf(HasSubstr(dir), HasSubstr("directory")));
  ::rmdir(dir.c_str());
}

TEST(MappedFileTest, EmptyFileIsInvalidArgument) {
  const std::string path = TempPath("empty");
  ASSERT_TRUE(testing::WriteFileBytes(path, {}));
  auto mapped = MappedFile::Open(path);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mapped.status().message()), AllOf(HasSubstr(path), HasSubstr("empty")));
  ::unlink(path.c_str());
}

TEST(MappedFileTest, NonRegularFileIsInvalidArgument) {
  auto mapped = MappedFile::Open("/dev/null");
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mapped.status().message()),
              AllOf(HasSubstr("/dev/null"), HasSubstr("not a regular file")));
}

TEST(MappedFileTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root: file permissions do not apply";
  }
  const std::string path = TempPath("secret");
  ASSERT_TRUE(testing::WriteFileBytes(path, {1, 2, 3}));
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  auto mapped = MappedFile::Open(path);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(mapped.status().message()),
              AllOf(HasSubstr(path), HasSubstr(std::strerror(EACCES))));
  ::unlink(path.c_str());
}

// Every page of the mapping is resident afterwards (mincore), also after the file's pages were
// dropped from the page cache; progress goes up in twentieths to exactly the size.
TEST(MappedFileTest, PrefaultPagesMakesEveryPageResidentWithProgress) {
  const std::string path = TempPath("prefault.bin");
  std::vector<uint8_t> bytes((1 << 20) + 123);  // not a whole number of pages
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(testing::WriteFileBytes(path, bytes));
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const size_t size = (*mapped)->size();
  ThreadPool pool(3);
  std::vector<uint64_t> reported;
  PrefaultPages((*mapped)->data(), size, pool, [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, size);
    reported.push_back(done);
  });
  ASSERT_EQ(reported.size(), 20u);
  EXPECT_TRUE(std::is_sorted(reported.begin(), reported.end()));
  EXPECT_EQ(reported.back(), size);
  const size_t pages = (size + 4095) / 4096;
  std::vector<unsigned char> resident(pages);
  ASSERT_EQ(::mincore(const_cast<uint8_t*>((*mapped)->data()), size, resident.data()), 0);
  for (size_t page = 0; page < pages; ++page) ASSERT_TRUE(resident[page] & 1) << "page " << page;
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace bitsplit
