#pragma once
// The open sessions of the drafter, by id. Ids are never reused, so a stale id is NOT_FOUND
// rather than another client's session. Thread safety: every method may be called concurrently.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/gpu-drafter/drafter_backend.h"

namespace bitsplit::drafter {

class SessionTable {
 public:
  explicit SessionTable(int max_sessions) : max_sessions_(max_sessions) {}

  // RESOURCE_EXHAUSTED when max_sessions are open.
  absl::Status CheckRoom() const;
  // Adds `session` and returns its id; RESOURCE_EXHAUSTED when max_sessions are open.
  absl::StatusOr<uint64_t> Add(std::shared_ptr<BackendSession> session);
  // NOT_FOUND for an id that is not open. The session stays alive while a caller holds it,
  // also after Remove (an RPC in flight finishes on it).
  absl::StatusOr<std::shared_ptr<BackendSession>> Find(uint64_t id) const;
  absl::Status Remove(uint64_t id);

  int size() const;
  int max_sessions() const { return max_sessions_; }

 private:
  absl::Status FullError() const;

  const int max_sessions_;
  mutable std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<BackendSession>> sessions_;
};

}  // namespace bitsplit::drafter
