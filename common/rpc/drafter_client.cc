#include "common/rpc/drafter_client.h"

#include <condition_variable>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/channel_options.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::rpc {
namespace v1 = bitsplit::internal::v1;
namespace {

absl::Status FromDrafterStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("drafter: ", status.error_message()));
}

}  // namespace

// The Lease stream: reads the one grant, then keeps a read pending so that OnDone reports the
// stream's end. Destroying it cancels the stream and waits for OnDone.
class DrafterClient::Lease final : public grpc::ClientReadReactor<v1::LeaseGrant> {
 public:
  explicit Lease(v1::Drafter::Stub& stub) {
    stub.async()->Lease(&context_, &request_, this);
    StartRead(&grant_);
    StartCall();
  }
  ~Lease() override {
    context_.TryCancel();
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return done_; });
  }

  // The owner id once granted; the stream's status if it ended first or DEADLINE_EXCEEDED.
  absl::StatusOr<uint64_t> WaitGranted(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, timeout, [this] { return owner_id_ != 0 || done_; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("drafter: no lease granted within ", timeout.count(), " ms"));
    }
    if (done_) return FromDrafterStatus(ended_);
    return owner_id_;
  }
  bool live() {
    std::lock_guard lock(mutex_);
    return !done_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending; OnDone follows
    {
      std::lock_guard lock(mutex_);
      owner_id_ = grant_.owner_id();
    }
    changed_.notify_all();
    StartRead(&grant_);
  }
  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      ended_ =
          status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the lease ended") : status;
    }
    changed_.notify_all();
  }

 private:
  grpc::ClientContext context_;
  v1::LeaseRequest request_;
  v1::LeaseGrant grant_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t owner_id_ ABSL_GUARDED_BY(mutex_) = 0;
  bool done_ ABSL_GUARDED_BY(mutex_) = false;
  grpc::Status ended_ ABSL_GUARDED_BY(mutex_);
};

DrafterClient::~DrafterClient() = default;

absl::StatusOr<uint64_t> DrafterClient::LiveLease() {
  std::lock_guard lock(lease_mutex_);
  if (lease_ == nullptr || !lease_->live()) lease_ = std::make_unique<Lease>(*stub_);
  absl::StatusOr<uint64_t> owner_id = lease_->WaitGranted(rpc_timeout_);
  if (!owner_id.ok()) lease_.reset();
  return owner_id;
}

void DrafterClient::DropLease(uint64_t owner_id) {
  std::lock_guard lock(lease_mutex_);
  if (lease_ != nullptr &&
      lease_->WaitGranted(std::chrono::milliseconds(0)).value_or(0) == owner_id) {
    lease_.reset();
  }
}

absl::StatusOr<std::unique_ptr<DrafterClient>> DrafterClient::Connect(
    const std::string& target, std::chrono::milliseconds connect_timeout,
    std::chrono::milliseconds rpc_timeout) {
  std::unique_ptr<DrafterClient> client(new DrafterClient());
  client->target_ = target;
  client->rpc_timeout_ = rpc_timeout;
  client->channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                               PeerChannelArguments(64 << 20));
  if (!client->channel_->WaitForConnected(std::chrono::system_clock::now() + connect_timeout)) {
    return absl::UnavailableError(absl::StrCat("drafter at ", target, " is not reachable within ",
                                               connect_timeout.count(), " ms"));
  }
  client->stub_ = v1::Drafter::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> DrafterClient::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + rpc_timeout_);
  return context;
}

absl::StatusOr<v1::DrafterInfo> DrafterClient::GetInfo() { return GetInfo(rpc_timeout_); }

absl::StatusOr<v1::DrafterInfo> DrafterClient::GetInfo(std::chrono::milliseconds timeout,
                                                       bool include_residual_stats) {
  v1::DrafterInfoRequest request;
  request.set_include_residual_stats(include_residual_stats);
  v1::DrafterInfo response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status status = stub_->GetInfo(&context, request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

absl::StatusOr<v1::OpenSessionResponse> DrafterClient::OpenSession(int32_t context) {
  // A second try only when the lease ended between LiveLease and OpenSession (NOT_FOUND).
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<uint64_t> owner_id = LiveLease();
    if (!owner_id.ok()) return owner_id.status();
    v1::OpenSessionRequest request;
    request.set_context(context);
    request.set_owner_id(*owner_id);
    v1::OpenSessionResponse response;
    const grpc::Status status = stub_->OpenSession(Context().get(), request, &response);
    if (status.ok()) return response;
    if (status.error_code() != grpc::StatusCode::NOT_FOUND || attempt > 0) {
      return FromDrafterStatus(status);
    }
    DropLease(*owner_id);
  }
}

absl::Status DrafterClient::CloseSession(uint64_t session_id) {
  v1::CloseSessionRequest request;
  request.set_session_id(session_id);
  v1::CloseSessionResponse response;
  return FromDrafterStatus(stub_->CloseSession(Context().get(), request, &response));
}

absl::StatusOr<v1::PrefillResponse> DrafterClient::Prefill(const v1::PrefillRequest& request) {
  v1::PrefillResponse response;
  const grpc::Status status = stub_->Prefill(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

absl::StatusOr<v1::DraftResponse> DrafterClient::Draft(const v1::DraftRequest& request) {
  v1::DraftResponse response;
  const grpc::Status status = stub_->Draft(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

absl::StatusOr<v1::VerifyResponse> DrafterClient::Verify(const v1::VerifyRequest& request) {
  v1::VerifyResponse response;
  const grpc::Status status = stub_->Verify(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

absl::StatusOr<v1::CommitResponse> DrafterClient::Commit(const v1::CommitRequest& request) {
  v1::CommitResponse response;
  const grpc::Status status = stub_->Commit(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

std::unique_ptr<DrafterClient::GenerateCall> DrafterClient::Generate(
    const v1::GenerateRequest& request) {
  auto call = std::make_unique<GenerateCall>();
  call->event_timeout_ = rpc_timeout_;
  call->reader_ = stub_->PrepareAsyncGenerate(&call->context_, request, &call->queue_);
  return call;
}

DrafterClient::GenerateCall::~GenerateCall() {
  queue_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) {
  }
}

bool DrafterClient::GenerateCall::Await() {
  void* tag = nullptr;
  bool ok = false;
  const auto deadline = std::chrono::system_clock::now() + event_timeout_;
  switch (queue_.AsyncNext(&tag, &ok, deadline)) {
    case grpc::CompletionQueue::GOT_EVENT:
      return ok;
    case grpc::CompletionQueue::TIMEOUT:
      timed_out_ = true;
      context_.TryCancel();
      (void)queue_.Next(&tag, &ok);  // the cancelled operation comes back
      return false;
    case grpc::CompletionQueue::SHUTDOWN:
      break;
  }
  return false;
}

bool DrafterClient::GenerateCall::Start() {
  if (started_) return true;
  started_ = true;
  reader_->StartCall(this);
  if (!Await()) ended_ = true;
  return !ended_;
}

bool DrafterClient::GenerateCall::Read(v1::GenerateEvent* event) {
  if (ended_ || !Start()) return false;
  reader_->Read(event, this);
  if (!Await()) ended_ = true;
  return !ended_;
}

absl::Status DrafterClient::GenerateCall::Finish() {
  (void)Start();
  grpc::Status status;
  reader_->Finish(&status, this);
  void* tag = nullptr;
  bool ok = false;
  (void)queue_.Next(&tag, &ok);  // Finish always completes
  if (timed_out_) {
    return absl::DeadlineExceededError(
        absl::StrCat("drafter: no Generate event within ", event_timeout_.count(), " ms"));
  }
  return FromDrafterStatus(status);
}

}  // namespace bitsplit::rpc
