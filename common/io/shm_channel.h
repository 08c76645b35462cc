#pragma once
// The residual shared-memory channel: one POSIX shared-memory segment per client attached to the
// cpu-residual service (services/cpu-residual), carrying one request at a time. Byte layout and
// protocol: docs/formats.md, "Residual shared-memory channel".
//
//   offset 0      ShmHeader       written by the service at creation, read-only afterwards
//   offset 128    ShmRequest      written by the client (one cache line)
//   offset 192    ShmResponse     written by the service (one cache line)
//   offset 256    message         char[256], NUL-terminated error text of the last response
//   offset 4096   codes           int8  [T][cols]                (capacity max_rows * max_cols)
//   codes_offset + ...  scales    f32   [T][block_stride(cols)]  (capacity max_rows *
//   max_block_stride)
//                       sums      f32   [T][block_stride(cols)]
//                       outputs   f32   matrix 0 [T][rows_0], then matrix 1 [T][rows_1], ...
//                       segments  ShmExpertSegment [T]  (an expert group's rows per expert)
//
// Signalling: two 32-bit sequence numbers used as futex words (shared, not private futexes).
// The client writes the request, then stores request.seq = previous + 1 (release) and wakes the
// service if it sleeps; the service answers with response.seq = request.seq (release) and wakes
// the client if it sleeps. Both sides spin briefly before sleeping, announce the sleep in their
// *_waiting word (seq_cst) and re-check, so no wake-up is lost. Waits are sliced (<= 10 ms) so
// that a dead peer is noticed: the client checks the service's pid, state and heartbeat; the
// service learns of dead clients through a pidfd (services/cpu-residual).
//
// Everything the service reads from the segment is validated before use; the client validates
// the response sizes. This layer knows nothing about models: the request's layer and group are
// opaque integers here.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bitsplit::shm {

inline constexpr char kShmMagic[8] = {'B', 'S', 'R', 'E', 'S', 'C', 'H', '\0'};
inline constexpr uint32_t kShmVersion = 2;
inline constexpr uint64_t kShmHeaderBytes = 4096;
inline constexpr uint32_t kShmMaxOutputs = 3;  // matrices per group
inline constexpr size_t kShmMessageBytes = 256;
// An attaching client proves its pid by holding open a memfd named this prefix + 32 random hex
// digits while it sends the name in its Attach request (services/cpu-residual, channel_manager.h).
inline constexpr char kAttachProofPrefix[] = "bitsplit-attach-";

// ShmResponse.server_state.
inline constexpr uint32_t kServerServing = 1;
inline constexpr uint32_t kServerClosed = 2;  // the channel was detached or the service stops

struct ShmHeader {
  char magic[8];              // kShmMagic
  uint32_t version;           // kShmVersion
  uint32_t header_bytes;      // kShmHeaderBytes: where the data areas start
  uint64_t segment_bytes;     // size of the whole segment
  uint32_t max_rows;          // largest T
  uint32_t max_cols;          // widest group input
  uint32_t max_outputs;       // widest group output (sum of its matrices' rows)
  uint32_t max_block_stride;  // BlockStride(max_cols)
  uint64_t codes_offset;      // int8 [max_rows * max_cols]
  uint64_t scales_offset;     // f32 [max_rows * max_block_stride]
  uint64_t sums_offset;       // f32 [max_rows * max_block_stride]
  uint64_t outputs_offset;    // f32 [max_rows * max_outputs]
  uint64_t channel_id;
  int32_t server_pid;
  int32_t client_pid;
  uint8_t fingerprint[32];   // of the residual file the service holds
  uint64_t segments_offset;  // ShmExpertSegment [max_rows]
};
static_assert(sizeof(ShmHeader) == 128);
static_assert(offsetof(ShmHeader, codes_offset) == 40 && offsetof(ShmHeader, channel_id) == 72 &&
              offsetof(ShmHeader, fingerprint) == 88);

// The rows [first_row, first_row + count) of an expert group's request that go to `expert`.
struct ShmExpertSegment {
  int32_t expert;
  uint32_t first_row;
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(ShmExpertSegment) == 16);

struct alignas(64) ShmRequest {
  uint32_t seq;             // futex word: the client increments it to submit
  uint32_t client_waiting;  // 1 while the client sleeps (or is about to) on response.seq
  int32_t layer;            // -1: the output head
  uint32_t group;           // LinearGroup (0 qkv, 1 attn_output, 2 gate_up, 3 down, 4 head;
                            // the service refuses the expert groups 5 and 6)
  uint32_t rows;            // T, 1..max_rows
  uint32_t cols;            // the group's input width, a multiple of 32, <= max_cols
  uint32_t num_segments;    // an expert group's segments (in the segment table), else 0
  uint32_t reserved[9];
};
static_assert(sizeof(ShmRequest) == 64);

struct alignas(64) ShmResponse {
  uint32_t seq;             // futex word: = request.seq once the response is complete
  uint32_t server_waiting;  // 1 while the service sleeps (or is about to) on request.seq
  uint32_t server_state;    // kServerServing / kServerClosed
  uint32_t status_code;     // absl::StatusCode of this response (0: OK)
  uint64_t heartbeat_ns;    // CLOCK_MONOTONIC of the service, refreshed every 100 ms
  uint64_t compute_ns;      // the kernels
  uint64_t server_ns;       // request seen to response published
  uint32_t num_outputs;     // matrices in the group (OK responses)
  uint32_t output_rows[kShmMaxOutputs];
  uint32_t reserved[2];
};
static_assert(sizeof(ShmResponse) == 64);

inline constexpr uint64_t kShmRequestOffset = 128;
inline constexpr uint64_t kShmResponseOffset = 192;
inline constexpr uint64_t kShmMessageOffset = 256;

// Floats per row of QuantizedActivations::scales / sums for `cols` inputs: cols / 32 rounded up
// to a multiple of 8 (split_matmul.h).
constexpr uint64_t BlockStride(uint64_t cols) { return (cols / 32 + 7) / 8 * 8; }

// Offsets and size of a segment with the given capacities.
struct ShmLayout {
  uint32_t max_rows = 0;
  uint32_t max_cols = 0;
  uint32_t max_outputs = 0;
  uint32_t max_block_stride = 0;
  uint64_t codes_offset = 0;
  uint64_t scales_offset = 0;
  uint64_t sums_offset = 0;
  uint64_t outputs_offset = 0;
  uint64_t segments_offset = 0;
  uint64_t segment_bytes = 0;
};
// INVALID_ARGUMENT when a capacity is zero, cols is not a multiple of 32 or the segment would
// exceed 4 GiB.
absl::StatusOr<ShmLayout> ComputeShmLayout(uint32_t max_rows, uint32_t max_cols,
                                           uint32_t max_outputs);

// The header a segment of `layout` carries (magic, version, capacities, offsets); the channel's
// identity (ids, pids, fingerprint) is left zero for the creator to fill in.
ShmHeader HeaderForLayout(const ShmLayout& layout);

// CLOCK_MONOTONIC in nanoseconds (the clock of heartbeat_ns; shared by all processes).
uint64_t MonotonicNanos();

// Futex operations on a 32-bit word in shared memory.
// Sleeps while *word == expected, at most `timeout` (returns early on wake-ups, signals and
// when the value differs).
void FutexWait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout);
void FutexWakeAll(uint32_t* word);

// A mapped segment. The creator (the service) unlinks the name when it is destroyed.
class ShmSegment {
 public:
  // Creates `name` (O_EXCL, mode 0660 regardless of umask), sizes and maps it, and writes the
  // header; the response starts as kServerServing with seq 0.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name,
                                                            const ShmLayout& layout,
                                                            uint64_t channel_id, pid_t server_pid,
                                                            pid_t client_pid,
                                                            const uint8_t fingerprint[32]);
  // Opens and maps an existing segment and checks its header (magic, version, offsets and sizes
  // against the object's size). `expected_bytes` (0: any) must match.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name,
                                                          uint64_t expected_bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  // A copy of the header taken when the segment was created or opened (the live header is in
  // writable shared memory, so it is not trusted after that).
  const ShmHeader& header() const { return header_; }
  ShmRequest* request() const { return reinterpret_cast<ShmRequest*>(base_ + kShmRequestOffset); }
  ShmResponse* response() const {
    return reinterpret_cast<ShmResponse*>(base_ + kShmResponseOffset);
  }
  char* message() const { return reinterpret_cast<char*>(base_ + kShmMessageOffset); }
  int8_t* codes() const { return reinterpret_cast<int8_t*>(base_ + header_.codes_offset); }
  float* scales() const { return reinterpret_cast<float*>(base_ + header_.scales_offset); }
  float* sums() const { return reinterpret_cast<float*>(base_ + header_.sums_offset); }
  float* outputs() const { return reinterpret_cast<float*>(base_ + header_.outputs_offset); }
  ShmExpertSegment* segments() const {
    return reinterpret_cast<ShmExpertSegment*>(base_ + header_.segments_offset);
  }

  // Removes the name now (the mapping stays); idempotent.
  void Unlink();
  // Removes the name if it still names this segment (not an object created since under the same
  // name); for a non-owner, which Unlink does not serve. Returns whether it removed it.
  bool UnlinkIfSame() const;

 private:
  ShmSegment() = default;
  std::string name_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  ShmHeader header_{};
  bool owner_ = false;
  bool unlinked_ = false;
  dev_t device_ = 0;  // of the object when it was opened (Open only)
  ino_t inode_ = 0;
};

// Atomic views of the shared words (std::atomic_ref: the layout stays plain data).
inline std::atomic_ref<uint32_t> Word(uint32_t& word) { return std::atomic_ref<uint32_t>(word); }
inline std::atomic_ref<uint64_t> Word64(uint64_t& word) { return std::atomic_ref<uint64_t>(word); }

// ---- Client end --------------------------------------------------------------------------------

struct ShmClientOptions {
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);    // one request, end to end
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);  // busy, before yielding
  // Then polling between sched_yield calls, before sleeping on the futex: a futex wake-up costs
  // 5-30 us on a VM (0.8 ms per SmolLM2 residual pass, whose groups mostly outlast the busy
  // spin). Only where a core is free for it: a polling thread stays runnable, so it takes CPU
  // time from kernel threads that need every core (ResidualClient sets 0 then).
  std::chrono::nanoseconds yield_spin = std::chrono::milliseconds(2);
  std::chrono::nanoseconds liveness_timeout = std::chrono::seconds(2);  // stale heartbeat: dead
};

// The result of one round trip (besides the outputs in the segment).
struct ShmCallInfo {
  uint32_t num_outputs = 0;
  uint32_t output_rows[kShmMaxOutputs] = {0, 0, 0};
  uint64_t compute_ns = 0;
  uint64_t server_ns = 0;
  uint64_t round_trip_ns = 0;
};

// One client's end of a channel. Thread safety: one call at a time.
class ShmChannelClient {
 public:
  // Maps segment `name` created by the service with pid `server_pid`.
  static absl::StatusOr<std::unique_ptr<ShmChannelClient>> Open(const std::string& name,
                                                                uint64_t expected_bytes,
                                                                pid_t server_pid,
                                                                const ShmClientOptions& options);
  ~ShmChannelClient();

  const ShmHeader& header() const { return segment_->header(); }
  // Where the caller writes the request's activations before Call, and reads the outputs after.
  int8_t* codes() const { return segment_->codes(); }
  float* scales() const { return segment_->scales(); }
  float* sums() const { return segment_->sums(); }
  const float* outputs() const { return segment_->outputs(); }
  ShmExpertSegment* segments() const { return segment_->segments(); }
  // The whole mapped segment (page-aligned: it holds the four areas above).
  std::span<std::byte> memory() const {
    return std::span<std::byte>(reinterpret_cast<std::byte*>(segment_->base()), segment_->size());
  }

  // Submits {layer, group, rows, cols} and waits for the response. Returns the service's status
  // for the request, or UNAVAILABLE when the service died, closed the channel or stopped
  // heart-beating, DEADLINE_EXCEEDED after options.timeout. After UNAVAILABLE or
  // DEADLINE_EXCEEDED the channel is broken: every later call fails with UNAVAILABLE (reattach).
  // Validates the response's output sizes against the capacities.
  // An expert group's request carries `num_segments` segments, written to segments() first.
  absl::Status Call(int32_t layer, uint32_t group, uint32_t rows, uint32_t cols, ShmCallInfo* info,
                    uint32_t num_segments = 0);
  // Call in two halves, so the caller can work while the service computes: Post submits the
  // request (activations already written) and returns at once; Wait waits for its response, with
  // Call's errors. Exactly one Wait per successful Post.
  absl::Status Post(int32_t layer, uint32_t group, uint32_t rows, uint32_t cols,
                    uint32_t num_segments = 0);
  absl::Status Wait(ShmCallInfo* info);
  bool in_flight() const { return in_flight_; }

  // False once the service is known to be gone (or the channel broken).
  bool Healthy() const { return !broken_ && !ServiceExited(); }
  // True once the service's process has exited (its pidfd says so; false where there is none).
  // May be called from any thread, like the two below.
  bool ServiceExited() const;
  // The service's pidfd (readable once it exits), or -1 where pidfd_open is unavailable.
  int service_pidfd() const { return server_pidfd_; }
  // A killed service leaves its segment in /dev/shm: once the service has exited (pidfd, so not
  // a process that reused its pid), removes the segment's name if it still names this segment.
  // Returns whether it removed it.
  bool UnlinkIfServiceExited() const;

 private:
  ShmChannelClient() = default;
  absl::Status CheckService() const;

  std::unique_ptr<ShmSegment> segment_;
  pid_t server_pid_ = 0;
  int server_pidfd_ = -1;  // -1 when pidfd_open is unavailable: kill(pid, 0) instead
  ShmClientOptions options_;
  uint32_t seq_ = 0;
  bool broken_ = false;
  // The posted request, between Post and Wait.
  bool in_flight_ = false;
  uint64_t posted_at_ = 0;
  struct Posted {
    int32_t layer;
    uint32_t group;
    uint32_t rows;
  } posted_{};
};

// ---- Service end -------------------------------------------------------------------------------

// A request as read (once) from the segment; nothing in it is validated yet.
struct ShmRequestCopy {
  uint32_t seq = 0;
  int32_t layer = 0;
  uint32_t group = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t num_segments = 0;
};

// A request whose sizes DecodeRequest checked against the segment: views of its T x cols codes,
// T x block_stride scales and sums, and the T x max_outputs floats of room for its outputs.
struct ShmRequestView {
  uint32_t seq = 0;
  int32_t layer = 0;   // opaque here: the service checks it against its model
  uint32_t group = 0;  // likewise
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint64_t block_stride = 0;  // BlockStride(cols)
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  const float* sums = nullptr;
  float* outputs = nullptr;
  uint64_t output_capacity = 0;  // floats at `outputs`: rows * header.max_outputs
  // An expert group's segments, still in shared memory (the service copies them once).
  const ShmExpertSegment* segments = nullptr;
  uint32_t num_segments = 0;
};

// Checks a request copied out of the segment at `base` (`segment_bytes` long, laid out by
// `header`, the service's own copy) and returns its views: rows in [1, min(max_rows,
// header.max_rows)], cols a positive multiple of 32 at most header.max_cols, num_segments at most
// rows, and every area inside the segment and inside its own capacity. INVALID_ARGUMENT naming the
// field and its bound otherwise. Pure: it reads nothing but its arguments.
absl::StatusOr<ShmRequestView> DecodeRequest(const ShmHeader& header, uint8_t* base,
                                             uint64_t segment_bytes, const ShmRequestCopy& request,
                                             uint32_t max_rows);

// OK when `header` describes a segment of exactly `segment_bytes` with the layout
// ComputeShmLayout gives its capacities (what ShmSegment::Open requires of a mapped header).
absl::Status CheckShmHeader(const ShmHeader& header, uint64_t segment_bytes);

// Waits for the next request after `last_seq`: spins for `spin`, then sleeps on the futex in
// slices of at most `slice`. Returns the request, or nullopt-like false when `slice` expired
// with nothing new (the caller checks its stop flag and calls again).
bool WaitForRequest(ShmSegment& segment, uint32_t last_seq, std::chrono::nanoseconds spin,
                    std::chrono::nanoseconds slice, ShmRequestCopy* request);

// Publishes the response to request `seq`: status (and message when not OK), output sizes and
// timings, then response.seq = seq and a wake-up if the client sleeps.
void PublishResponse(ShmSegment& segment, uint32_t seq, const absl::Status& status,
                     uint32_t num_outputs, const uint32_t* output_rows, uint64_t compute_ns,
                     uint64_t server_ns);

// Marks the channel closed and wakes a sleeping client (it then gets UNAVAILABLE).
void CloseChannel(ShmSegment& segment);

}  // namespace bitsplit::shm
