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

absl::StatusOr<v1::DrafterInfo> DrafterClient::GetInfo() {
  v1::DrafterInfoRequest request;
  v1::DrafterInfo response;
  const grpc::Status status = stub_->GetInfo(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
}

absl::StatusOr<v1::OpenSessionResponse> DrafterClient::OpenSession(int32_t context) {
  v1::OpenSessionRequest request;
  request.set_context(context);
  v1::OpenSessionResponse response;
  const grpc::Status status = stub_->OpenSession(Context().get(), request, &response);
  if (!status.ok()) return FromDrafterStatus(status);
  return response;
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

}  // namespace bitsplit::rpc
