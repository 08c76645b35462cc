#include "common/io/shm_channel.h"

#include <emmintrin.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::shm {
namespace {

constexpr uint64_t kAlign = 64;
constexpr uint64_t kPage = 4096;

std::string ErrnoText(int error) { return std::strerror(error); }

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

ShmHeader HeaderForLayout(const ShmLayout& layout) {
  ShmHeader header{};
  std::memcpy(header.magic, kShmMagic, sizeof(kShmMagic));
  header.version = kShmVersion;
  header.header_bytes = static_cast<uint32_t>(kShmHeaderBytes);
  header.segment_bytes = layout.segment_bytes;
  header.max_rows = layout.max_rows;
  header.max_cols = layout.max_cols;
  header.max_outputs = layout.max_outputs;
  header.max_block_stride = layout.max_block_stride;
  header.codes_offset = layout.codes_offset;
  header.scales_offset = layout.scales_offset;
  header.sums_offset = layout.sums_offset;
  header.outputs_offset = layout.outputs_offset;
  header.segments_offset = layout.segments_offset;
  return header;
}

absl::StatusOr<ShmLayout> ComputeShmLayout(uint32_t max_rows, uint32_t max_cols,
                                           uint32_t max_outputs) {
  if (max_rows == 0 || max_cols == 0 || max_outputs == 0 || max_cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad shared-memory capacities: max_rows ",
                                                   max_rows, ", max_cols ", max_cols,
                                                   ", max_outputs ", max_outputs));
  }
  ShmLayout layout;
  layout.max_rows = max_rows;
  layout.max_cols = max_cols;
  layout.max_outputs = max_outputs;
  layout.max_block_stride = static_cast<uint32_t>(BlockStride(max_cols));
  // In 128 bits: with 32-bit capacities the sums of the area sizes overflow 64 bits, and a
  // wrapped layout would pass the size check below (the client checks a header it maps this way).
  const unsigned __int128 rows = max_rows;
  const unsigned __int128 stride_bytes = rows * layout.max_block_stride * sizeof(float);
  const auto align_up = [](unsigned __int128 value, uint64_t alignment) {
    return (value + alignment - 1) / alignment * alignment;
  };
  const unsigned __int128 codes = kShmHeaderBytes;
  const unsigned __int128 scales = align_up(codes + rows * max_cols, kAlign);
  const unsigned __int128 sums = align_up(scales + stride_bytes, kAlign);
  const unsigned __int128 outputs = align_up(sums + stride_bytes, kAlign);
  const unsigned __int128 segments = align_up(outputs + rows * max_outputs * sizeof(float), kAlign);
  const unsigned __int128 segment = align_up(segments + rows * sizeof(ShmExpertSegment), kPage);
  if (segment > (uint64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory segment of more than 4 GiB is too large (max_rows ", max_rows,
                     ", max_cols ", max_cols, ", max_outputs ", max_outputs, ")"));
  }
  layout.codes_offset = static_cast<uint64_t>(codes);
  layout.scales_offset = static_cast<uint64_t>(scales);
  layout.sums_offset = static_cast<uint64_t>(sums);
  layout.outputs_offset = static_cast<uint64_t>(outputs);
  layout.segments_offset = static_cast<uint64_t>(segments);
  layout.segment_bytes = static_cast<uint64_t>(segment);
  if (layout.segment_bytes > (uint64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory segment of ", layout.segment_bytes,
                     " bytes is too large (max_rows ", max_rows, ")"));
  }
  return layout;
}

uint64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void FutexWait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  const int64_t ns = std::max<int64_t>(timeout.count(), 0);
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// ---- ShmSegment --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               const ShmLayout& layout,
                                                               uint64_t channel_id,
                                                               pid_t server_pid, pid_t client_pid,
                                                               const uint8_t fingerprint[32]) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0660);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("shm_open(", name, ", O_CREAT|O_EXCL) failed: ", ErrnoText(errno)));
  }
  std::unique_ptr<ShmSegment> segment(new ShmSegment());
  segment->name_ = name;
  segment->owner_ = true;
  // The umask may have cleared group bits: set the mode explicitly.
  if (fchmod(fd, 0660) != 0 || ftruncate(fd, static_cast<off_t>(layout.segment_bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("sizing shared memory ", name, " to ",
                                            layout.segment_bytes,
                                            " bytes failed: ", ErrnoText(error)));
  }
  void* base =
      mmap(nullptr, layout.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::InternalError(
        absl::StrCat("mmap of shared memory ", name, " failed: ", ErrnoText(map_error)));
  }
  segment->base_ = static_cast<uint8_t*>(base);
  segment->size_ = layout.segment_bytes;
  ShmHeader& header = segment->header_;
  header = HeaderForLayout(layout);
  header.channel_id = channel_id;
  header.server_pid = server_pid;
  header.client_pid = client_pid;
  std::memcpy(header.fingerprint, fingerprint, 32);
  std::memcpy(segment->base_, &header, sizeof(header));
  ShmResponse* response = segment->response();
  response->heartbeat_ns = MonotonicNanos();
  Word(response->server_state).store(kServerServing, std::memory_order_release);
  return segment;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name,
                                                             uint64_t expected_bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("shm_open(", name, ") failed: ", ErrnoText(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of ", name, " failed: ", ErrnoText(error)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kShmHeaderBytes || (expected_bytes != 0 && size != expected_bytes)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " has ", size, " bytes, expected ", expected_bytes));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap of shared memory ", name, " failed: ", ErrnoText(map_error)));
  }
  std::unique_ptr<ShmSegment> segment(new ShmSegment());
  segment->name_ = name;
  segment->base_ = static_cast<uint8_t*>(base);
  segment->size_ = size;
  segment->device_ = st.st_dev;
  segment->inode_ = st.st_ino;
  ShmHeader& h = segment->header_;
  std::memcpy(&h, base, sizeof(h));
  if (!CheckShmHeader(h, size).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory ", name, " is not a residual channel of layout version ", kShmVersion));
  }
  return segment;
}

absl::Status CheckShmHeader(const ShmHeader& h, uint64_t segment_bytes) {
  absl::StatusOr<ShmLayout> layout = ComputeShmLayout(h.max_rows, h.max_cols, h.max_outputs);
  if (std::memcmp(h.magic, kShmMagic, sizeof(kShmMagic)) != 0 || h.version != kShmVersion ||
      h.header_bytes != kShmHeaderBytes || h.segment_bytes != segment_bytes || !layout.ok() ||
      layout->segment_bytes != segment_bytes || layout->codes_offset != h.codes_offset ||
      layout->scales_offset != h.scales_offset || layout->sums_offset != h.sums_offset ||
      layout->outputs_offset != h.outputs_offset || layout->segments_offset != h.segments_offset ||
      layout->max_block_stride != h.max_block_stride) {
    return absl::FailedPreconditionError(
        absl::StrCat("not a residual channel header of layout version ", kShmVersion));
  }
  return absl::OkStatus();
}

namespace {

// Checks that area [offset, offset + count * element_bytes) starts at or after `floor`, ends at
// or before `ceiling` and is aligned for its elements; returns its end.
absl::StatusOr<uint64_t> CheckArea(const char* what, uint64_t offset, uint64_t count,
                                   uint64_t element_bytes, uint64_t floor, uint64_t ceiling) {
  uint64_t bytes = 0;
  uint64_t end = 0;
  if (__builtin_mul_overflow(count, element_bytes, &bytes) ||
      __builtin_add_overflow(offset, bytes, &end) || offset < floor || end > ceiling ||
      offset % element_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " area [", offset, ", +", count, " x ",
                                                   element_bytes, " bytes) is outside [", floor,
                                                   ", ", ceiling, ") or misaligned"));
  }
  return end;
}

}  // namespace

absl::StatusOr<ShmRequestView> DecodeRequest(const ShmHeader& header, uint8_t* base,
                                             uint64_t segment_bytes, const ShmRequestCopy& request,
                                             uint32_t max_rows) {
  const uint32_t row_limit = std::min(max_rows, header.max_rows);
  if (request.rows < 1 || request.rows > row_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows (T) ", request.rows, " is out of range [1, ", row_limit, "]"));
  }
  if (request.cols == 0 || request.cols % 32 != 0 || request.cols > header.max_cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cols ", request.cols, " is not a positive multiple of 32 at most ", header.max_cols));
  }
  ShmRequestView view;
  view.seq = request.seq;
  view.layer = request.layer;
  view.group = request.group;
  view.rows = request.rows;
  view.cols = request.cols;
  view.block_stride = BlockStride(request.cols);
  const uint64_t rows = request.rows;
  if (view.block_stride > header.max_block_stride) {
    return absl::InvalidArgumentError(absl::StrCat("block stride ", view.block_stride, " of cols ",
                                                   request.cols, " exceeds the segment's ",
                                                   header.max_block_stride));
  }
  // Each area must fit before the next one starts (the capacities fix those starts), so the
  // views can neither overlap nor leave the segment, whatever the header says.
  BITSPLIT_ASSIGN_OR_RETURN(
      const uint64_t codes_end,
      CheckArea("codes", header.codes_offset, rows * request.cols, 1, kShmHeaderBytes,
                std::min(header.scales_offset, segment_bytes)));
  BITSPLIT_ASSIGN_OR_RETURN(
      const uint64_t scales_end,
      CheckArea("scales", header.scales_offset, rows * view.block_stride, sizeof(float), codes_end,
                std::min(header.sums_offset, segment_bytes)));
  BITSPLIT_ASSIGN_OR_RETURN(
      const uint64_t sums_end,
      CheckArea("sums", header.sums_offset, rows * view.block_stride, sizeof(float), scales_end,
                std::min(header.outputs_offset, segment_bytes)));
  view.output_capacity = rows * header.max_outputs;
  BITSPLIT_ASSIGN_OR_RETURN(
      const uint64_t outputs_end,
      CheckArea("outputs", header.outputs_offset, view.output_capacity, sizeof(float), sums_end,
                std::min(header.segments_offset, segment_bytes)));
  if (request.num_segments > request.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_segments ", request.num_segments, " exceeds the request's ", request.rows, " rows"));
  }
  BITSPLIT_RETURN_IF_ERROR(CheckArea("segments", header.segments_offset, request.num_segments,
                                     sizeof(ShmExpertSegment), outputs_end, segment_bytes)
                               .status());
  view.num_segments = request.num_segments;
  view.segments = reinterpret_cast<const ShmExpertSegment*>(base + header.segments_offset);
  view.codes = reinterpret_cast<const int8_t*>(base + header.codes_offset);
  view.scales = reinterpret_cast<const float*>(base + header.scales_offset);
  view.sums = reinterpret_cast<const float*>(base + header.sums_offset);
  view.outputs = reinterpret_cast<float*>(base + header.outputs_offset);
  return view;
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_) Unlink();
}

void ShmSegment::Unlink() {
  if (unlinked_) return;
  unlinked_ = true;
  shm_unlink(name_.c_str());
}

bool ShmSegment::UnlinkIfSame() const {
  const int fd = shm_open(name_.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;  // already gone
  struct stat st;
  // While this segment is mapped its inode cannot be reused, so an equal one is this object.
  const bool same = fstat(fd, &st) == 0 && st.st_dev == device_ && st.st_ino == inode_;
  close(fd);
  return same && shm_unlink(name_.c_str()) == 0;
}

// ---- Client end --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmChannelClient>> ShmChannelClient::Open(
    const std::string& name, uint64_t expected_bytes, pid_t server_pid,
    const ShmClientOptions& options) {
  std::unique_ptr<ShmChannelClient> client(new ShmChannelClient());
  auto segment = ShmSegment::Open(name, expected_bytes);
  if (!segment.ok()) return segment.status();
  client->segment_ = *std::move(segment);
  if (client->segment_->header().server_pid != server_pid) {
    return absl::FailedPreconditionError(absl::StrCat("shared memory ", name, " belongs to pid ",
                                                      client->segment_->header().server_pid,
                                                      ", not the service (pid ", server_pid, ")"));
  }
  client->server_pid_ = server_pid;
  client->server_pidfd_ = PidfdOpen(server_pid);
  client->options_ = options;
  client->seq_ = Word(client->segment_->request()->seq).load(std::memory_order_acquire);
  return client;
}

ShmChannelClient::~ShmChannelClient() {
  if (server_pidfd_ >= 0) close(server_pidfd_);
}

bool ShmChannelClient::ServiceExited() const {
  if (server_pidfd_ < 0) return false;
  pollfd pfd{server_pidfd_, POLLIN, 0};
  return poll(&pfd, 1, 0) > 0;  // readable: the process exited
}

bool ShmChannelClient::UnlinkIfServiceExited() const {
  return ServiceExited() && segment_->UnlinkIfSame();
}

absl::Status ShmChannelClient::CheckService() const {
  ShmResponse* response = segment_->response();
  if (Word(response->server_state).load(std::memory_order_acquire) != kServerServing) {
    return absl::UnavailableError("residual service closed the channel");
  }
  bool alive = true;
  if (server_pidfd_ >= 0) {
    pollfd pfd{server_pidfd_, POLLIN, 0};
    alive = poll(&pfd, 1, 0) == 0;  // readable: the process exited
  } else {
    alive = kill(server_pid_, 0) == 0 || errno == EPERM;
  }
  if (!alive) {
    return absl::UnavailableError(
        absl::StrCat("residual service (pid ", server_pid_, ") has exited"));
  }
  const uint64_t heartbeat = Word64(response->heartbeat_ns).load(std::memory_order_acquire);
  const uint64_t now = MonotonicNanos();
  const auto limit = static_cast<uint64_t>(options_.liveness_timeout.count());
  if (now > heartbeat && now - heartbeat > limit) {
    return absl::UnavailableError(absl::StrCat("residual service (pid ", server_pid_,
                                               ") stopped heart-beating ",
                                               (now - heartbeat) / 1'000'000, " ms ago"));
  }
  return absl::OkStatus();
}

absl::Status ShmChannelClient::Call(int32_t layer, uint32_t group, uint32_t rows, uint32_t cols,
                                    ShmCallInfo* info, uint32_t num_segments) {
  BITSPLIT_RETURN_IF_ERROR(Post(layer, group, rows, cols, num_segments));
  return Wait(info);
}

absl::Status ShmChannelClient::Post(int32_t layer, uint32_t group, uint32_t rows, uint32_t cols,
                                    uint32_t num_segments) {
  if (broken_) {
    return absl::UnavailableError("residual channel is broken after an earlier failure; reattach");
  }
  BITSPLIT_CHECK(!in_flight_);
  posted_at_ = MonotonicNanos();
  ShmRequest* request = segment_->request();
  ShmResponse* response = segment_->response();
  if (absl::Status status = CheckService(); !status.ok()) {
    broken_ = true;
    return status;
  }
  request->layer = layer;
  request->group = group;
  request->rows = rows;
  request->cols = cols;
  request->num_segments = num_segments;
  posted_ = {layer, group, rows};
  const uint32_t seq = ++seq_;
  Word(request->seq).store(seq, std::memory_order_seq_cst);
  if (Word(response->server_waiting).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&request->seq);
  }
  in_flight_ = true;
  return absl::OkStatus();
}

absl::Status ShmChannelClient::Wait(ShmCallInfo* info) {
  BITSPLIT_CHECK(in_flight_);
  in_flight_ = false;
  const uint64_t start = posted_at_;
  const uint32_t seq = seq_;
  const auto [layer, group, rows] = posted_;
  ShmRequest* request = segment_->request();
  ShmResponse* response = segment_->response();
  const uint64_t spin_ns = static_cast<uint64_t>(options_.spin.count());
  const uint64_t deadline = start + static_cast<uint64_t>(options_.timeout.count());
  const std::chrono::nanoseconds slice = std::chrono::milliseconds(10);
  auto done = [&] { return Word(response->seq).load(std::memory_order_acquire) == seq; };
  bool ok = false;
  for (uint64_t now = MonotonicNanos(); now - start < spin_ns; now = MonotonicNanos()) {
    if (done()) {
      ok = true;
      break;
    }
    _mm_pause();
  }
  const uint64_t yield_ns = spin_ns + static_cast<uint64_t>(options_.yield_spin.count());
  for (uint64_t now = MonotonicNanos(); !ok && now - start < yield_ns; now = MonotonicNanos()) {
    if (done()) {
      ok = true;
      break;
    }
    sched_yield();
  }
  while (!ok) {
    if (done()) {
      ok = true;
      break;
    }
    if (absl::Status status = CheckService(); !status.ok()) {
      broken_ = true;
      return status;
    }
    const uint64_t now = MonotonicNanos();
    if (now >= deadline) {
      broken_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("residual request (layer ", layer, ", group ", group, ", T ", rows,
                       ") got no response within ", options_.timeout.count() / 1'000'000, " ms"));
    }
    const uint32_t observed = Word(response->seq).load(std::memory_order_seq_cst);
    Word(request->client_waiting).store(1, std::memory_order_seq_cst);
    if (!done()) {
      FutexWait(&response->seq, observed,
                std::min(slice, std::chrono::nanoseconds(static_cast<int64_t>(deadline - now))));
    }
    Word(request->client_waiting).store(0, std::memory_order_relaxed);
  }

  // The response: copy the fields once, then validate them.
  const uint32_t code = response->status_code;
  if (code != 0) {
    char message[kShmMessageBytes];
    std::memcpy(message, segment_->message(), sizeof(message));
    message[sizeof(message) - 1] = '\0';
    if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::InternalError(absl::StrCat("bad status code ", code, " from residual service"));
    }
    return absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  ShmCallInfo result;
  result.num_outputs = response->num_outputs;
  uint64_t total = 0;
  if (result.num_outputs == 0 || result.num_outputs > kShmMaxOutputs) {
    broken_ = true;
    return absl::InternalError(
        absl::StrCat("residual service answered with ", result.num_outputs, " outputs"));
  }
  for (uint32_t i = 0; i < result.num_outputs; ++i) {
    result.output_rows[i] = response->output_rows[i];
    total += result.output_rows[i];
  }
  if (total == 0 || total > segment_->header().max_outputs) {
    broken_ = true;
    return absl::InternalError(absl::StrCat("residual service answered with ", total,
                                            " output columns, capacity ",
                                            segment_->header().max_outputs));
  }
  result.compute_ns = response->compute_ns;
  result.server_ns = response->server_ns;
  result.round_trip_ns = MonotonicNanos() - start;
  if (info != nullptr) *info = result;
  return absl::OkStatus();
}

// ---- Service end -------------------------------------------------------------------------------

bool WaitForRequest(ShmSegment& segment, uint32_t last_seq, std::chrono::nanoseconds spin,
                    std::chrono::nanoseconds slice, ShmRequestCopy* out) {
  ShmRequest* request = segment.request();
  ShmResponse* response = segment.response();
  auto take = [&](uint32_t seq) {
    out->seq = seq;
    out->layer = request->layer;
    out->group = request->group;
    out->rows = request->rows;
    out->cols = request->cols;
    out->num_segments = request->num_segments;
    return true;
  };
  const uint64_t start = MonotonicNanos();
  const uint64_t spin_ns = static_cast<uint64_t>(spin.count());
  uint32_t seq = Word(request->seq).load(std::memory_order_acquire);
  if (seq != last_seq) return take(seq);
  while (MonotonicNanos() - start < spin_ns) {
    _mm_pause();
    seq = Word(request->seq).load(std::memory_order_acquire);
    if (seq != last_seq) return take(seq);
  }
  Word(response->server_waiting).store(1, std::memory_order_seq_cst);
  seq = Word(request->seq).load(std::memory_order_seq_cst);
  if (seq == last_seq) FutexWait(&request->seq, last_seq, slice);
  Word(response->server_waiting).store(0, std::memory_order_relaxed);
  seq = Word(request->seq).load(std::memory_order_acquire);
  if (seq != last_seq) return take(seq);
  return false;
}

void PublishResponse(ShmSegment& segment, uint32_t seq, const absl::Status& status,
                     uint32_t num_outputs, const uint32_t* output_rows, uint64_t compute_ns,
                     uint64_t server_ns) {
  ShmResponse* response = segment.response();
  response->status_code = static_cast<uint32_t>(status.code());
  if (!status.ok()) {
    const size_t n = std::min(status.message().size(), kShmMessageBytes - 1);
    std::memcpy(segment.message(), status.message().data(), n);
    segment.message()[n] = '\0';
    num_outputs = 0;
  }
  response->num_outputs = num_outputs;
  for (uint32_t i = 0; i < kShmMaxOutputs; ++i) {
    response->output_rows[i] = i < num_outputs ? output_rows[i] : 0;
  }
  response->compute_ns = compute_ns;
  response->server_ns = server_ns;
  Word(response->seq).store(seq, std::memory_order_seq_cst);
  if (Word(segment.request()->client_waiting).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&response->seq);
  }
}

void CloseChannel(ShmSegment& segment) {
  Word(segment.response()->server_state).store(kServerClosed, std::memory_order_seq_cst);
  FutexWakeAll(&segment.response()->seq);
}

}  // namespace bitsplit::shm
