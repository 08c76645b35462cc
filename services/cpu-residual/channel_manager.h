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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/shm_channel.h"
#include "services/cpu-residual/residual_store.h"

namespace bitsplit::residual {

struct ChannelOptions {
  uint32_t max_rows = 256;                                        // the service maximum of T
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);  // serving threads
  size_t max_channels = 64;
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

  // Creates a channel for process `client_pid`. INVALID_ARGUMENT for a pid that is not a live
  // process or a bad max_rows (0: the service maximum), RESOURCE_EXHAUSTED past max_channels.
  absl::StatusOr<AttachResult> Attach(pid_t client_pid, uint32_t max_rows);
  // NOT_FOUND for an unknown id.
  absl::Status Detach(uint64_t channel_id);
  size_t size() const;
  uint32_t max_rows() const { return options_.max_rows; }

  // Closes every channel (clients get UNAVAILABLE) and stops the threads. Idempotent.
  void Shutdown();

  // Removes /dev/shm segments of earlier service processes that no longer exist.
  static void RemoveStaleSegments();

 private:
  struct Channel;
  void Serve(Channel* channel);
  void Housekeeping();
  void Close(std::unique_ptr<Channel> channel);

  ResidualStore& store_;
  const ChannelOptions options_;
  const pid_t pid_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::unique_ptr<Channel>> channels_;  // guarded by mutex_
  uint64_t next_id_ = 1;                                   // guarded by mutex_
  std::atomic<bool> stopping_{false};
  std::thread housekeeper_;
};

}  // namespace bitsplit::residual
