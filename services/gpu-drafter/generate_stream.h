#pragma once
// The write side of one Generate call, shared by its reactor (gRPC's threads) and its generation
// (the scheduler thread): events queue here and go out one write at a time; the call finishes
// once the queue is drained after End, or at once when the client is gone. StartWrite and
// Finish are called without the lock held (gRPC may run a reaction inline).
//
// Thread safety: every method may be called concurrently.
#include <deque>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "bitsplit/internal/v1/drafter.grpc.pb.h"

namespace bitsplit::drafter {

// Maps a status to gRPC (the one place of this service).
grpc::Status ToGrpcStatus(const absl::Status& status);

class GenerateStream {
 public:
  explicit GenerateStream(grpc::ServerWriteReactor<internal::v1::GenerateEvent>* reactor)
      : reactor_(reactor) {}

  // Queues an event; false once the client is gone (the event is dropped).
  bool Send(internal::v1::GenerateEvent event);
  // Ends the call with `status` once the queued events are written (the first End counts).
  void End(const absl::Status& status);
  // The client cancelled the call, its connection closed, or a write failed.
  bool cancelled() const;

  // The reactor's callbacks.
  void WriteDone(bool ok);
  void Cancel();

 private:
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Starts the next write, or finishes the call when nothing is left to write.
  void Pump();

  grpc::ServerWriteReactor<internal::v1::GenerateEvent>* const reactor_;
  mutable std::mutex mutex_;
  std::deque<internal::v1::GenerateEvent> outbox_ ABSL_GUARDED_BY(mutex_);
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  bool ending_ ABSL_GUARDED_BY(mutex_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mutex_);
};

// The reactor of one Generate call. Owned by gRPC: deleted in OnDone, after Finish; the stream
// it shares with the scheduler lives on while either holds it.
class GenerateReactor final : public grpc::ServerWriteReactor<internal::v1::GenerateEvent> {
 public:
  GenerateReactor() : stream_(std::make_shared<GenerateStream>(this)) {}
  const std::shared_ptr<GenerateStream>& stream() const { return stream_; }

  void OnWriteDone(bool ok) override { stream_->WriteDone(ok); }
  void OnCancel() override { stream_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<GenerateStream> stream_;
};

}  // namespace bitsplit::drafter
