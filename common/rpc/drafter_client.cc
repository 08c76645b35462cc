#include "common/rpc/drafter_client.h"

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

DrafterClient::~DrafterClient() = default;

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
