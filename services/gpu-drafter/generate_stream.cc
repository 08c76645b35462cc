#include "services/gpu-drafter/generate_stream.h"

#include <string>
#include <utility>

namespace bitsplit::drafter {
namespace v1 = bitsplit::internal::v1;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

bool GenerateStream::Send(v1::GenerateEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cancelled_ || ending_) return false;
    outbox_.push_back(std::move(event));
  }
  Pump();
  return true;
}

void GenerateStream::End(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ending_) return;
    ending_ = true;
    if (!cancelled_) status_ = ToGrpcStatus(status);
  }
  Pump();
}

bool GenerateStream::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

void GenerateStream::WriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    writing_ = false;
    outbox_.pop_front();
    if (!ok) CancelLocked();
  }
  Pump();
}

void GenerateStream::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CancelLocked();
  }
  Pump();
}

void GenerateStream::CancelLocked() {
  cancelled_ = true;
  status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the generation");
}

void GenerateStream::Pump() {
  const v1::GenerateEvent* next = nullptr;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (writing_ || finished_) return;
    if (!outbox_.empty() && !cancelled_) {
      writing_ = true;
      next = &outbox_.front();  // a deque keeps it in place while more are queued
    } else if (ending_ || cancelled_) {
      finished_ = true;
      status = status_;
    } else {
      return;
    }
  }
  // The reactor lives until OnDone, which comes only after Finish and the last write.
  if (next != nullptr) {
    reactor_->StartWrite(next);
  } else {
    reactor_->Finish(status);
  }
}

}  // namespace bitsplit::drafter
