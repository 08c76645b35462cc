#include "services/cpu-residual/residual_service.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace bitsplit::residual {
namespace v1 = bitsplit::internal::v1;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

template <typename Fn>
grpc::ServerUnaryReactor* Respond(grpc::CallbackServerContext* context, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(fn()));
  return reactor;
}

uint64_t NowNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

grpc::ServerUnaryReactor* ResidualServiceImpl::Info(grpc::CallbackServerContext* context,
                                                    const v1::InfoRequest*,
                                                    v1::InfoResponse* response) {
  return Respond(context, [&] { return DoInfo(response); });
}

grpc::ServerUnaryReactor* ResidualServiceImpl::Attach(grpc::CallbackServerContext* context,
                                                      const v1::AttachRequest* request,
                                                      v1::AttachResponse* response) {
  return Respond(context, [&] { return DoAttach(*request, response); });
}

grpc::ServerUnaryReactor* ResidualServiceImpl::Detach(grpc::CallbackServerContext* context,
                                                      const v1::DetachRequest* request,
                                                      v1::DetachResponse*) {
  return Respond(context, [&] { return channels_.Detach(request->channel_id()); });
}

grpc::ServerUnaryReactor* ResidualServiceImpl::MatMul(grpc::CallbackServerContext* context,
                                                      const v1::MatMulRequest* request,
                                                      v1::MatMulResponse* response) {
  return Respond(context, [&] { return DoMatMul(*request, response); });
}

absl::Status ResidualServiceImpl::DoInfo(v1::InfoResponse* response) {
  const SplitFile& file = store_.file();
  response->set_fingerprint(file.fingerprint_hex());
  response->set_path(file.name());
  response->set_file_bytes(file.image_size());
  response->set_weight_bytes(store_.weight_bytes());
  response->set_num_layers(store_.num_layers());
  response->set_num_experts(store_.shapes().num_experts);
  response->set_dense_ffn(store_.shapes().layout.dense_ffn);
  response->set_quantization(store_.quantization());
  for (const model::ResidualGroup& group : store_.groups()) {
    v1::GroupInfo* info = response->add_groups();
    info->set_layer(group.id.layer);
    info->set_group(static_cast<v1::MatrixGroup>(static_cast<int>(group.id.group) + 1));
    for (size_t i = 0; i < group.matrices.size(); ++i) {
      const auto& m = group.matrices[i];
      v1::MatrixInfo* matrix = info->add_matrices();
      matrix->set_name(group.names[i]);
      matrix->set_rows(m.rows);
      matrix->set_cols(m.cols);
      matrix->set_format(model::SplitFormatName(m.format));
      matrix->set_group_size(m.group);
      matrix->set_bytes(static_cast<uint64_t>(m.rows) * m.row_stride);
    }
  }
  response->set_threads(store_.threads());
  response->set_max_rows(static_cast<int32_t>(channels_.max_rows()));
  response->set_mlocked(store_.mlocked());
  response->set_huge_pages(store_.huge_pages());
  response->set_pid(static_cast<int32_t>(getpid()));
  response->set_attached_clients(static_cast<uint32_t>(channels_.size()));
  response->set_shm_layout_version(shm::kShmVersion);
  const ResidualStore::Counters counters = store_.counters();
  response->set_requests_served(counters.requests);
  response->set_rows_served(counters.rows);
  response->set_weight_bytes_read(counters.weight_bytes_read);
  response->set_compute_ns(counters.compute_ns);
  return absl::OkStatus();
}

absl::Status ResidualServiceImpl::DoAttach(const v1::AttachRequest& request,
                                           v1::AttachResponse* response) {
  const std::string expected = store_.file().fingerprint_hex();
  if (request.fingerprint().empty()) {
    return absl::InvalidArgumentError("fingerprint is required (the residual the client expects)");
  }
  if (request.fingerprint() != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("fingerprint ", request.fingerprint(), " does not match the residual ",
                     store_.file().name(), " (fingerprint ", expected, ")"));
  }
  if (request.max_rows() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_rows ", request.max_rows(), " < 0"));
  }
  BITSPLIT_ASSIGN_OR_RETURN(AttachResult result,
                            channels_.Attach(request.client_pid(), request.pid_proof(),
                                             static_cast<uint32_t>(request.max_rows())));
  response->set_channel_id(result.channel_id);
  response->set_shm_name(result.shm_name);
  response->set_shm_bytes(result.shm_bytes);
  response->set_server_pid(static_cast<int32_t>(getpid()));
  response->set_max_rows(static_cast<int32_t>(result.max_rows));
  response->set_layout_version(shm::kShmVersion);
  return absl::OkStatus();
}

absl::Status ResidualServiceImpl::DoMatMul(const v1::MatMulRequest& request,
                                           v1::MatMulResponse* response) {
  const uint64_t start = NowNanos();
  const int64_t group_value = static_cast<int64_t>(request.group()) - 1;
  BITSPLIT_ASSIGN_OR_RETURN(const model::ResidualGroup* group,
                            store_.Validate(request.layer(), group_value, request.rows(),
                                            request.cols(), channels_.max_rows()));
  if (model::IsExpertGroup(group->id.group)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model::LinearGroupIdString(group->id),
                     ": the expert groups are served on the shared-memory channel only (a "
                     "request must carry each row's expert)"));
  }
  const int64_t rows = request.rows(), cols = request.cols();
  const int64_t stride = static_cast<int64_t>(shm::BlockStride(static_cast<uint64_t>(cols)));
  const uint64_t scale_bytes = static_cast<uint64_t>(rows * stride) * sizeof(float);
  if (request.codes().size() != static_cast<uint64_t>(rows * cols) ||
      request.scales().size() != scale_bytes || request.sums().size() != scale_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation sizes (codes ", request.codes().size(), ", scales ", request.scales().size(),
        ", sums ", request.sums().size(), " bytes) do not match T = ", rows, ", cols = ", cols,
        " (expected ", rows * cols, ", ", scale_bytes, ", ", scale_bytes, ")"));
  }
  model::QuantizedActivations x;
  model::CopyActivations(rows, cols, stride, request.codes().data(), request.scales().data(),
                         request.sums().data(), &x);
  std::vector<float> y(static_cast<size_t>(rows * group->total_rows));
  const uint64_t compute_ns = store_.Compute(*group, x, y.data());
  const float* p = y.data();
  for (const auto& m : group->matrices) {
    const size_t n = static_cast<size_t>(rows * m.rows);
    response->add_outputs()->assign(reinterpret_cast<const char*>(p), n * sizeof(float));
    response->add_output_rows(m.rows);
    p += n;
  }
  response->set_compute_ns(compute_ns);
  response->set_server_ns(NowNanos() - start);
  return absl::OkStatus();
}

}  // namespace bitsplit::residual
