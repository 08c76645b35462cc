#include "common/rpc/reflection_v1.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace bitsplit::rpc {
namespace {

namespace reflection = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// `file` and every file it imports, each once, dependencies first (clients build their pool in
// the order received).
void AddFileWithDependencies(const FileDescriptor* file, std::set<std::string>& seen,
                             reflection::FileDescriptorResponse& out) {
  if (!seen.insert(file->name()).second) return;
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileWithDependencies(file->dependency(i), seen, out);
  }
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out.add_file_descriptor_proto(proto.SerializeAsString());
}

void SetError(reflection::ServerReflectionResponse& response, grpc::StatusCode code,
              const std::string& message) {
  response.mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response.mutable_error_response()->set_error_message(message);
}

class ReflectionReactor final
    : public grpc::ServerBidiReactor<reflection::ServerReflectionRequest,
                                     reflection::ServerReflectionResponse> {
 public:
  explicit ReflectionReactor(const ReflectionV1Service* service) : service_(service) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);  // the client is done asking
      return;
    }
    response_ = service_->Answer(request_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "writing the reflection response failed"));
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* const service_;
  reflection::ServerReflectionRequest request_;
  reflection::ServerReflectionResponse response_;
};

}  // namespace

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

grpc::ServerBidiReactor<reflection::ServerReflectionRequest, reflection::ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext* /*context*/) {
  return new ReflectionReactor(this);
}

reflection::ServerReflectionResponse ReflectionV1Service::Answer(
    const reflection::ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  reflection::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  std::set<std::string> seen;
  const FileDescriptor* file = nullptr;
  switch (request.message_request_case()) {
    case reflection::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      return response;
    case reflection::ServerReflectionRequest::kFileByFilename:
      file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no file ", request.file_by_filename()));
        return response;
      }
      break;
    case reflection::ServerReflectionRequest::kFileContainingSymbol:
      file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no symbol ", request.file_containing_symbol()));
        return response;
      }
      break;
    case reflection::ServerReflectionRequest::kFileContainingExtension: {
      const auto* type =
          pool->FindMessageTypeByName(request.file_containing_extension().containing_type());
      const auto* extension =
          type == nullptr ? nullptr
                          : pool->FindExtensionByNumber(
                                type, request.file_containing_extension().extension_number());
      if (extension == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND, "no such extension");
        return response;
      }
      file = extension->file();
      break;
    }
    case reflection::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no type ", request.all_extension_numbers_of_type()));
        return response;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
      return response;
    }
    case reflection::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(response, grpc::StatusCode::INVALID_ARGUMENT, "the request asks for nothing");
      return response;
  }
  AddFileWithDependencies(file, seen, *response.mutable_file_descriptor_response());
  return response;
}

}  // namespace bitsplit::rpc
