#include "services/gpu-drafter/session_table.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace bitsplit::drafter {

absl::Status SessionTable::FullError() const {
  // The client sees capacity, not the flag that sets it (the drafter's log names the flag).
  return absl::ResourceExhaustedError(
      absl::StrCat("all ", max_sessions_, " sessions are in use; retry when one finishes"));
}

absl::Status SessionTable::CheckRoom() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return FullError();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SessionTable::Add(std::shared_ptr<model::SpeculativeSession> session,
                                           uint64_t owner_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return FullError();
  const uint64_t id = next_id_++;
  sessions_.emplace(id, Entry{std::move(session), owner_id, Clock::now()});
  return id;
}

absl::StatusOr<std::shared_ptr<model::SpeculativeSession>> SessionTable::Find(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not open"));
  }
  it->second.last_used = Clock::now();
  return it->second.session;
}

absl::Status SessionTable::Remove(uint64_t id) {
  std::shared_ptr<model::SpeculativeSession> removed;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not open"));
  }
  removed = std::move(it->second.session);
  sessions_.erase(it);
  return absl::OkStatus();
}

int SessionTable::RemoveOwnedBy(uint64_t owner_id) {
  std::vector<std::shared_ptr<model::SpeculativeSession>> removed;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.owner_id == owner_id) {
      removed.push_back(std::move(it->second.session));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(removed.size());
}

int SessionTable::RemoveIdle(Clock::duration idle) {
  std::vector<std::shared_ptr<model::SpeculativeSession>> removed;
  const Clock::time_point cutoff = Clock::now() - idle;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    // use_count 1: no RPC holds it, and none can take it without this lock.
    if (it->second.last_used < cutoff && it->second.session.use_count() == 1) {
      removed.push_back(std::move(it->second.session));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(removed.size());
}

int SessionTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(sessions_.size());
}

}  // namespace bitsplit::drafter
