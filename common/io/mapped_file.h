#pragma once
// Read-only memory mapping of a whole file.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/util/thread_pool.h"

namespace bitsplit {

class MappedFile {
 public:
  // NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT (directory, empty file) with the path.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads one byte of every 4 KiB page of [data, data + size) on the pool's workers, so that the
// mapped weights are in RAM before the first request needs them (a first verify over 10 GB of
// cold weights otherwise pays its page faults: ~15 s). `progress(done, size)` is called on the
// calling thread after each twentieth of the range, and once at the end.
void PrefaultPages(const uint8_t* data, uint64_t size, ThreadPool& pool,
                   const std::function<void(uint64_t done, uint64_t size)>& progress);

}  // namespace bitsplit
