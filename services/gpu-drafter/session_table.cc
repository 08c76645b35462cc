#include "services/gpu-drafter/session_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace bitsplit::drafter {

absl::Status SessionTable::FullError() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("all ", max_sessions_, " sessions are open (--max-sessions); close one first"));
}

absl::Status SessionTable::CheckRoom() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return FullError();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SessionTable::Add(std::shared_ptr<BackendSession> session) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return FullError();
  const uint64_t id = next_id_++;
  sessions_.emplace(id, std::move(session));
  return id;
}

absl::StatusOr<std::shared_ptr<BackendSession>> SessionTable::Find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not open"));
  }
  return it->second;
}

absl::Status SessionTable::Remove(uint64_t id) {
  std::shared_ptr<BackendSession> removed;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not open"));
  }
  removed = std::move(it->second);
  sessions_.erase(it);
  return absl::OkStatus();
}

int SessionTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(sessions_.size());
}

}  // namespace bitsplit::drafter
