#include "common/rpc/health_probe.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/channel_options.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::rpc {

HealthProbe::HealthProbe(const std::string& target)
    : stub_(grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
          target, grpc::InsecureChannelCredentials(), PeerChannelArguments(1 << 20)))) {}

absl::Status HealthProbe::Check(const std::string& service,
                                std::chrono::milliseconds timeout) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub_->Check(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("health check failed: ", status.error_message()));
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "reports ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::rpc
