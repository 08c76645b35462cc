#pragma once
// The open sessions of the drafter, by id, each with its owner (a lease id, 0 for none) and the
// time an RPC last used it. Ids are never reused, so a stale id is NOT_FOUND rather than another
// client's session. Thread safety: every method may be called concurrently.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/gpu-drafter/drafter_engine.h"

namespace bitsplit::drafter {

class SessionTable {
 public:
  using Clock = std::chrono::steady_clock;

  explicit SessionTable(int max_sessions) : max_sessions_(max_sessions) {}

  // RESOURCE_EXHAUSTED when max_sessions are open.
  absl::Status CheckRoom() const;
  // Adds `session` owned by `owner_id` (0: no owner) and returns its id; RESOURCE_EXHAUSTED when
  // max_sessions are open.
  absl::StatusOr<uint64_t> Add(std::shared_ptr<model::SpeculativeSession> session,
                               uint64_t owner_id);
  // NOT_FOUND for an id that is not open; marks the session used now. The session stays alive
  // while a caller holds it, also after Remove (an RPC in flight finishes on it).
  absl::StatusOr<std::shared_ptr<model::SpeculativeSession>> Find(uint64_t id);
  absl::Status Remove(uint64_t id);
  // Removes every session of `owner_id`; returns how many.
  int RemoveOwnedBy(uint64_t owner_id);
  // Removes the sessions that no caller holds and that were last used before now - `idle`;
  // returns how many.
  int RemoveIdle(Clock::duration idle);

  int size() const;
  int max_sessions() const { return max_sessions_; }

 private:
  struct Entry {
    std::shared_ptr<model::SpeculativeSession> session;
    uint64_t owner_id = 0;
    Clock::time_point last_used;
  };
  absl::Status FullError() const;

  const int max_sessions_;
  mutable std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> sessions_;
};

}  // namespace bitsplit::drafter
