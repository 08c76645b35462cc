#pragma once
// One request/response exchange with a server's reflection service, grpc.reflection.v1 or
// v1alpha. The two versions' messages are the same on the wire, so the v1 messages compiled in
// proto/grpc/reflection/v1 serve for both; the method is called with raw bytes because Debian's
// gRPC ships no v1alpha stub.
//
// Thread safety: none needed (no shared state).
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/reflection/v1/reflection.pb.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::testing {

struct ReflectionResult {
  grpc::Status status;                                                     // of the whole call
  std::optional<grpc::reflection::v1::ServerReflectionResponse> response;  // the first one
};

// Sends `request` to grpc.reflection.<version>.ServerReflection at `target` and reads the
// answers to the end.
inline ReflectionResult ReflectionExchange(
    const std::string& target, const std::string& version,
    const grpc::reflection::v1::ServerReflectionRequest& request) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const std::string method =
      absl::StrCat("/grpc.reflection.", version, ".ServerReflection/ServerReflectionInfo");
  const grpc::internal::RpcMethod rpc_method(method.c_str(),
                                             grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), rpc_method, &context));
  grpc::Slice slice(request.SerializeAsString());
  ReflectionResult result;
  if (!stream->Write(grpc::ByteBuffer(&slice, 1))) {
    result.status = stream->Finish();
    return result;
  }
  stream->WritesDone();
  grpc::ByteBuffer response;
  if (stream->Read(&response)) {
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    result.response.emplace();
    if (!result.response->ParseFromString(bytes)) result.response.reset();
  }
  while (stream->Read(&response)) {
  }
  result.status = stream->Finish();
  return result;
}

}  // namespace bitsplit::testing
