#pragma once
// grpc.reflection.v1.ServerReflection over the generated descriptor pool, beside the v1alpha
// service that gRPC's reflection plugin provides: clients that speak only v1 (recent grpcurl,
// grpcui, Postman) describe the server through it.
//
// Thread safety: streams run concurrently; the service holds only immutable state.
#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace bitsplit::rpc {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the fully-qualified names that list_services reports.
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request (also for tests without a server).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace bitsplit::rpc
