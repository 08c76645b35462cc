#include "services/gpu-drafter/residual_link.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {

ResidualLink::~ResidualLink() { DropSession(); }

void ResidualLink::DropSession() {
  // The backend lets go of the source before the channel it reads is destroyed.
  if (session_ != nullptr) (void)engine_.SetResidualSource(nullptr);
  // Detaches; for a service that has exited it removes the segment the service left instead.
  session_.reset();
  attached_rows_ = 0;
}

absl::Status ResidualLink::Unavailable(const absl::Status& cause) const {
  spdlog::warn("cpu-residual at {} is unavailable: {}", options_.target, cause.ToString());
  return absl::UnavailableError("the residual service is unavailable; retry shortly");
}

absl::Status ResidualLink::Refused(const absl::Status& cause) const {
  spdlog::warn("cpu-residual at {} refused the base file (fingerprint {}): {}", options_.target,
               options_.fingerprint, cause.ToString());
  switch (cause.code()) {
    case absl::StatusCode::kResourceExhausted:
      return absl::ResourceExhaustedError("the residual service is at capacity; retry later");
    case absl::StatusCode::kFailedPrecondition:
      return absl::FailedPreconditionError(
          "the residual service holds another model than the drafter (the server log has the "
          "detail)");
    default:
      return absl::InternalError(
          "the residual service refused the drafter (the server log has the detail)");
  }
}

absl::Status ResidualLink::Ensure() {
  if (session_ != nullptr && session_->residual().healthy()) return absl::OkStatus();
  if (session_ != nullptr) {
    spdlog::warn("cpu-residual at {} (pid {}) is gone; reattaching", options_.target,
                 session_->attach_response().server_pid());
  }
  DropSession();
  // A fresh channel each time: it tries to connect at once (a channel that failed waits out its
  // reconnect backoff first), so a service that is back is found on the first request, and one
  // that is still down fails that request at once. Only the first attach (startup) waits for
  // the service to come up.
  const bool fail_fast = tried_;
  tried_ = true;
  client_.reset();
  rpc::ResidualClientOptions client_options;
  client_options.rpc_timeout = options_.timeout;
  client_options.shm.timeout = options_.timeout;
  auto client =
      rpc::ResidualClient::Connect(options_.target, client_options, options_.timeout, fail_fast);
  if (!client.ok()) return Unavailable(client.status());
  client_ = *std::move(client);
  auto info = client_->Info();
  if (!info.ok()) return Unavailable(info.status());
  const int per_row = options_.request_rows_per_row;
  const int rows = std::min(options_.max_rows * per_row, static_cast<int>(info->max_rows()));
  if (rows < options_.min_rows * per_row) {
    const std::string message = absl::StrCat(
        "cpu-residual at ", options_.target, " carries at most ", info->max_rows(),
        " rows per request; the drafter needs ", options_.min_rows * per_row,
        per_row > 1
            ? absl::StrCat(" (", options_.min_rows, " tree nodes x ", per_row, " experts each)")
            : std::string(),
        " (raise its --max-rows)");
    spdlog::warn("{}", message);
    return absl::FailedPreconditionError(message);
  }
  auto session = client_->Attach(options_.fingerprint, rows, &options_.shapes);
  if (!session.ok()) {
    const absl::Status& status = session.status();
    if (status.code() == absl::StatusCode::kUnavailable ||
        status.code() == absl::StatusCode::kDeadlineExceeded) {
      return Unavailable(status);
    }
    return Refused(status);
  }
  if (absl::Status status = engine_.SetResidualSource(&(*session)->residual()); !status.ok()) {
    return status;
  }
  session_ = *std::move(session);
  attached_rows_ = rows / per_row;
  residual_format_ = info->quantization();
  residual_bytes_ = info->file_bytes();
  residual_mlocked_ = info->mlocked();
  spdlog::info("attached to cpu-residual at {} (pid {}, channel {})", options_.target,
               session_->attach_response().server_pid(), session_->channel_id());
  return absl::OkStatus();
}

absl::Status ResidualLink::OnForwardError(const absl::Status& status) {
  const bool residual_failed = session_ != nullptr && !session_->residual().healthy();
  if (!residual_failed && status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kDeadlineExceeded) {
    return status;
  }
  DropSession();
  return Unavailable(status);
}

uint64_t ResidualLink::wait_ns() const {
  return session_ != nullptr ? session_->residual().stats().wait_ns : 0;
}

}  // namespace bitsplit::drafter
