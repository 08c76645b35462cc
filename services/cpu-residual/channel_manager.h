#pragma once
// The shared-memory channels of attached clients (common/io/shm_channel.h): one segment and one
// serving thread per client, plus a housekeeping thread that refreshes every channel's heartbeat
// and reclaims the channels of clients that exited (a pidfd per client).
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/shm_channel.h"
#include "services/cpu-residual/residual_store.h"

namespace bitsplit::residual {

struct ChannelOptions {
  uint32_t max_rows = 256;                                        // the service maximum of T
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);  // serving threads
  // Every channel is a segment in /dev/shm (RAM; ~48 MB for SmolLM2 at T = 256) that lives as
  // long as its client, so both counts are bounded. A client needs one channel per link, and
  // briefly one more while it reattaches.
  size_t max_channels = 16;
  size_t max_channels_per_client = 4;
};

struct AttachResult {
  uint64_t channel_id = 0;
  std::string shm_name;
  uint64_t shm_bytes = 0;
  uint32_t max_rows = 0;
};

class ChannelManager {
 public:
  ChannelManager(ResidualStore& store, const ChannelOptions& options);
  ~ChannelManager();  // Shutdown()

  // Creates a channel for process `client_pid`, which must hold open the memfd named `pid_proof`
  // (shm::kAttachProofPrefix + 32 hex digits; see VerifyClientPid). INVALID_ARGUMENT for a pid
  // that is not a live process, a malformed proof or a bad max_rows (0: the service maximum);
  // PERMISSION_DENIED when the process does not hold the proof or its fds cannot be read;
  // RESOURCE_EXHAUSTED past max_channels or max_channels_per_client.
  absl::StatusOr<AttachResult> Attach(pid_t client_pid, const std::string& pid_proof,
                                      uint32_t max_rows);
  // NOT_FOUND for an unknown id.
  absl::Status Detach(uint64_t channel_id);
  size_t size() const;
  uint32_t max_rows() const { return options_.max_rows; }

  // Closes every channel (clients get UNAVAILABLE) and stops the threads. Idempotent.
  void Shutdown();

  // Removes /dev/shm segments of earlier service processes that no longer exist.
  static void RemoveStaleSegments();

  // OK when process `pid` (whose pidfd is `pidfd`) holds an open memfd named `proof`: found
  // among the links of /proc/<pid>/fd. The name is random and travels only in the Attach
  // request, so a caller can present it only for a process that it is (or that took its fd).
  // Reading another process's fd table needs ptrace read access (the same uid, or privilege),
  // so clients of another user are refused too. The pidfd, opened before the scan, catches a pid
  // reused during it.
  static absl::Status VerifyClientPid(pid_t pid, int pidfd, const std::string& proof);

 private:
  struct Channel;
  void Serve(Channel* channel);
  void Housekeeping();
  void Close(std::unique_ptr<Channel> channel);

  ResidualStore& store_;
  const ChannelOptions options_;
  const pid_t pid_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  std::atomic<bool> stopping_{false};
  std::thread housekeeper_;
};

}  // namespace bitsplit::residual
