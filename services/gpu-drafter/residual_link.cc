#include "services/gpu-drafter/residual_link.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace bitsplit::drafter {

ResidualLink::~ResidualLink() { Drop(); }

void ResidualLink::Drop() {
  // The backend lets go of the source before the channel it reads is destroyed.
  if (session_ != nullptr) (void)backend_.SetResidualSource(nullptr);
  session_.reset();  // detaches (best effort: a service that is gone reclaims the channel)
  client_.reset();
}

absl::Status ResidualLink::Unavailable(const absl::Status& cause) const {
  return absl::UnavailableError(
      absl::StrCat("cpu-residual at ", options_.target, " is unavailable: ", cause.message()));
}

absl::Status ResidualLink::Ensure() {
  if (session_ != nullptr && session_->residual().healthy()) return absl::OkStatus();
  Drop();
  rpc::ResidualClientOptions client_options;
  client_options.rpc_timeout = options_.timeout;
  client_options.shm.timeout = options_.timeout;
  auto client = rpc::ResidualClient::Connect(options_.target, client_options, options_.timeout);
  if (!client.ok()) return Unavailable(client.status());
  auto info = (*client)->Info();
  if (!info.ok()) return Unavailable(info.status());
  auto session = (*client)->Attach(options_.fingerprint, options_.max_rows, &options_.shapes);
  if (!session.ok()) {
    const absl::Status& status = session.status();
    if (status.code() == absl::StatusCode::kUnavailable ||
        status.code() == absl::StatusCode::kDeadlineExceeded) {
      return Unavailable(status);
    }
    return absl::Status(status.code(), absl::StrCat("cpu-residual at ", options_.target,
                                                    " refused the base file (fingerprint ",
                                                    options_.fingerprint, "): ", status.message()));
  }
  if (absl::Status status = backend_.SetResidualSource(&(*session)->residual()); !status.ok()) {
    return status;
  }
  client_ = *std::move(client);
  session_ = *std::move(session);
  residual_format_ = info->quantization();
  residual_bytes_ = info->file_bytes();
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
  spdlog::warn("cpu-residual at {} failed: {}", options_.target, std::string(status.message()));
  Drop();
  return Unavailable(status);
}

uint64_t ResidualLink::wait_ns() const {
  return session_ != nullptr ? session_->residual().stats().wait_ns : 0;
}

}  // namespace bitsplit::drafter
