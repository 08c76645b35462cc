#include "common/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace bitsplit {
namespace {

// Maps the errno of a failed open/stat/mmap to the status code callers can act on: a missing
// file and a permission problem are the user's to fix and deserve their own codes.
absl::Status ErrnoStatus(int error_number, const std::string& path, absl::string_view action) {
  std::string message = absl::StrCat(path, ": cannot ", action, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:  // a path component is not a directory: the file cannot exist
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EISDIR:
      return absl::InvalidArgumentError(message);
    default:
      return absl::ErrnoToStatus(error_number, message);
  }
}

// Closes the descriptor on every return path; the mapping stays valid after close.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path, "open");
  FdCloser closer(fd);

  struct stat info;
  if (::fstat(fd, &info) != 0) return ErrnoStatus(errno, path, "stat");
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  // Pipes and devices have no stable size to map.
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is not a regular file"));
  }
  if (info.st_size == 0) {
    // mmap of length 0 fails with EINVAL; say what is actually wrong instead.
    return absl::InvalidArgumentError(absl::StrCat(path, ": file is empty"));
  }
  const size_t size = static_cast<size_t>(info.st_size);

  // MAP_PRIVATE: the mapping never writes back, and a later truncation of the file by someone
  // else cannot be turned into writes to it.
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) return ErrnoStatus(errno, path, "mmap");
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(address), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void PrefaultPages(const uint8_t* data, uint64_t size, ThreadPool& pool,
                   const std::function<void(uint64_t done, uint64_t size)>& progress) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kSteps = 20;
  const uint64_t pages = (size + kPage - 1) / kPage;
  for (uint64_t step = 0; step < kSteps; ++step) {
    const uint64_t first = pages * step / kSteps, last = pages * (step + 1) / kSteps;
    pool.RunOnEveryWorker([&](int worker) {
      const uint64_t n = static_cast<uint64_t>(pool.num_threads());
      const uint64_t begin = first + (last - first) * static_cast<uint64_t>(worker) / n;
      const uint64_t end = first + (last - first) * static_cast<uint64_t>(worker + 1) / n;
      // A volatile read is never optimized away, so nothing needs to keep its value.
      for (uint64_t page = begin; page < end; ++page) {
        (void)*reinterpret_cast<const volatile uint8_t*>(data + page * kPage);
      }
    });
    if (progress) progress(std::min(last * kPage, size), size);
  }
}

}  // namespace bitsplit
