#include "common/rpc/residual_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/channel_options.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "grpcpp/grpcpp.h"

namespace bitsplit::rpc {
namespace v1 = bitsplit::internal::v1;
using model::LinearGroup;
using model::LinearGroupId;

namespace {

// The proof that an Attach comes from this process (shm::kAttachProofPrefix): a memfd with a
// random name, held open until the call returns.
class AttachProof {
 public:
  static absl::StatusOr<AttachProof> Create() {
    uint8_t random[16];
    if (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
      return absl::InternalError(absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    AttachProof proof;
    proof.name_ = shm::kAttachProofPrefix;
    for (uint8_t byte : random) proof.name_ += absl::StrFormat("%02x", byte);
    proof.fd_ = memfd_create(proof.name_.c_str(), MFD_CLOEXEC);
    if (proof.fd_ < 0) {
      return absl::InternalError(absl::StrCat("memfd_create failed: ", std::strerror(errno)));
    }
    return proof;
  }
  AttachProof(AttachProof&& other) noexcept
      : name_(std::move(other.name_)), fd_(std::exchange(other.fd_, -1)) {}
  AttachProof& operator=(AttachProof&&) = delete;
  ~AttachProof() {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& name() const { return name_; }

 private:
  AttachProof() = default;
  std::string name_;
  int fd_ = -1;
};

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("residual service: ", status.error_message()));
}

absl::StatusOr<model::ResidualShapes> ShapesFromInfo(const v1::InfoResponse& info) {
  model::ResidualShapes shapes;
  auto bad = [](const std::string& detail) {
    return absl::InvalidArgumentError(absl::StrCat("residual service Info: ", detail));
  };
  if (info.num_layers() <= 0 || info.num_experts() < 0 ||
      (!info.dense_ffn() && info.num_experts() == 0)) {
    return bad(absl::StrCat(info.num_layers(), " layers, ", info.num_experts(),
                            " experts, dense FFN ", info.dense_ffn() ? "yes" : "no"));
  }
  shapes.layout = {.num_layers = info.num_layers(),
                   .dense_ffn = info.dense_ffn(),
                   .experts = info.num_experts() > 0};
  shapes.num_experts = info.num_experts();
  const std::vector<LinearGroupId> ids = model::AllLinearGroups(shapes.layout);
  if (static_cast<size_t>(info.groups_size()) != ids.size()) {
    return bad(absl::StrCat(info.groups_size(), " groups for ", info.num_layers(), " layers of ",
                            ids.size() / info.num_layers(), " groups"));
  }
  for (int i = 0; i < info.groups_size(); ++i) {
    const v1::GroupInfo& g = info.groups(i);
    const LinearGroupId id = ids[static_cast<size_t>(i)];
    // q|k|v, or q|k where a layer's values are its keys (gemma4); the experts' gate|up may be
    // one fused matrix.
    int fewest = 1, most = 1;
    switch (id.group) {
      case LinearGroup::kQkv:
        fewest = 2, most = 3;
        break;
      case LinearGroup::kGateUp:
        fewest = most = 2;
        break;
      case LinearGroup::kExpertGateUp:
        fewest = 1, most = 2;
        break;
      default:
        break;
    }
    if (g.layer() != id.layer || static_cast<int>(g.group()) != static_cast<int>(id.group) + 1 ||
        g.matrices_size() < fewest || g.matrices_size() > most) {
      return bad(absl::StrCat("group ", i, " is layer ", g.layer(), " group ", g.group(), " with ",
                              g.matrices_size(), " matrices"));
    }
    model::ResidualGroupShape shape;
    shape.cols = g.matrices(0).cols();
    for (const v1::MatrixInfo& m : g.matrices()) {
      const bool whole_experts =
          !model::IsExpertGroup(id.group) || m.rows() % info.num_experts() == 0;
      if (m.cols() != shape.cols || m.cols() <= 0 || m.cols() % 32 != 0 || m.rows() <= 0 ||
          !whole_experts) {
        return bad(
            absl::StrCat("matrix ", m.name(), " has shape [", m.rows(), ", ", m.cols(), "]"));
      }
      shape.rows.push_back(m.rows());
    }
    shapes.groups.push_back(std::move(shape));
  }
  return shapes;
}

absl::StatusOr<std::unique_ptr<ResidualClient>> ResidualClient::Connect(
    const std::string& target, const ResidualClientOptions& options,
    std::chrono::milliseconds connect_timeout, bool fail_fast) {
  std::unique_ptr<ResidualClient> client(new ResidualClient());
  client->options_ = options;
  client->channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                               PeerChannelArguments(256 << 20));
  const auto deadline = std::chrono::system_clock::now() + connect_timeout;
  grpc_connectivity_state state = client->channel_->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (fail_fast && state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      return absl::UnavailableError(
          absl::StrCat("residual service at ", target, " refused the connection"));
    }
    if (!client->channel_->WaitForStateChange(state, deadline)) {
      return absl::UnavailableError(absl::StrCat("residual service at ", target,
                                                 " is not reachable within ",
                                                 connect_timeout.count(), " ms"));
    }
    state = client->channel_->GetState(/*try_to_connect=*/true);
  }
  client->stub_ = v1::Residual::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> ResidualClient::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  return context;
}

absl::StatusOr<v1::InfoResponse> ResidualClient::Info() {
  v1::InfoResponse response;
  BITSPLIT_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Info(Context().get(), v1::InfoRequest(), &response)));
  return response;
}

absl::StatusOr<std::unique_ptr<ResidualChannel>> ResidualClient::Attach(
    const std::string& fingerprint_hex, int max_rows, const model::ResidualShapes* expected) {
  BITSPLIT_ASSIGN_OR_RETURN(v1::InfoResponse info, Info());
  BITSPLIT_ASSIGN_OR_RETURN(model::ResidualShapes shapes, ShapesFromInfo(info));
  if (expected != nullptr && !(shapes == *expected)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the residual service's shapes (", shapes.layout.num_layers, " layers, widest input ",
        shapes.max_cols(), ", widest output ", shapes.max_outputs(), ") differ from the model's (",
        expected->layout.num_layers, " layers, widest input ", expected->max_cols(),
        ", widest output ", expected->max_outputs(), ")"));
  }
  v1::AttachRequest request;
  request.set_fingerprint(fingerprint_hex);
  request.set_client_pid(static_cast<int32_t>(getpid()));
  request.set_max_rows(max_rows);
  BITSPLIT_ASSIGN_OR_RETURN(AttachProof proof, AttachProof::Create());
  request.set_pid_proof(proof.name());
  std::unique_ptr<ResidualChannel> session(new ResidualChannel());
  session->stub_ = stub_;
  session->rpc_timeout_ = options_.rpc_timeout;
  BITSPLIT_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Attach(Context().get(), request, &session->attach_)));
  session->channel_id_ = session->attach_.channel_id();
  // Spin or poll (yielding) for a response only where a CPU is left over for it: either, on a
  // core the service's kernel threads need, slows them (a 2-thread service on 2 cores: shm pass
  // 1.04-1.35x in-process polling; at T = 4 on the 1B-class residual 1.27-1.29x with the 50 us
  // busy spin and 1.16-1.21x sleeping at once), while sleeping costs a futex wake-up per request
  // (5-50 us on a VM).
  shm::ShmClientOptions shm_options = options_.shm;
  if (info.threads() >= static_cast<int>(AllowedCpus().size())) {
    shm_options.spin = std::chrono::nanoseconds(0);
    shm_options.yield_spin = std::chrono::nanoseconds(0);
  }
  auto channel =
      shm::ShmChannelClient::Open(session->attach_.shm_name(), session->attach_.shm_bytes(),
                                  session->attach_.server_pid(), shm_options);
  if (!channel.ok()) return channel.status();  // the session's destructor detaches
  session->residual_ = std::make_unique<model::RemoteResidual>(*std::move(channel),
                                                               std::move(shapes), info.threads());
  session->StartWatcher();
  return session;
}

absl::Status ResidualClient::Detach(uint64_t channel_id) {
  v1::DetachRequest request;
  request.set_channel_id(channel_id);
  v1::DetachResponse response;
  return FromGrpcStatus(stub_->Detach(Context().get(), request, &response));
}

absl::StatusOr<v1::MatMulResponse> ResidualClient::MatMul(const v1::MatMulRequest& request) {
  v1::MatMulResponse response;
  BITSPLIT_RETURN_IF_ERROR(FromGrpcStatus(stub_->MatMul(Context().get(), request, &response)));
  return response;
}

ResidualChannel::~ResidualChannel() {
  (void)Detach();
  StopWatcher();
}

void ResidualChannel::StartWatcher() {
  const int pidfd = residual_->channel().service_pidfd();
  if (pidfd < 0) return;  // no pidfd: nothing tells a dead service from a reused pid
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return;
  const shm::ShmChannelClient* channel = &residual_->channel();
  watcher_ = std::thread([this, channel, pidfd] {
    pollfd fds[2] = {{pidfd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    while (poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    if ((fds[0].revents & POLLIN) != 0)
      unlinked_dead_segment_.store(channel->UnlinkIfServiceExited());
  });
}

void ResidualChannel::StopWatcher() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    watcher_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  stop_fd_ = -1;
}

absl::Status ResidualChannel::Detach() {
  if (detached_ || channel_id_ == 0) return absl::OkStatus();
  detached_ = true;
  StopWatcher();  // before the channel it watches goes
  const bool service_gone = residual_ != nullptr && residual_->channel().ServiceExited();
  if (service_gone) (void)residual_->channel().UnlinkIfServiceExited();
  residual_.reset();  // unmaps
  // A service that has exited has nothing left to detach (and cannot reclaim its segment
  // itself: the name was removed above).
  if (service_gone) return absl::OkStatus();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + rpc_timeout_);
  v1::DetachRequest request;
  request.set_channel_id(channel_id_);
  v1::DetachResponse response;
  return FromGrpcStatus(stub_->Detach(&context, request, &response));
}

absl::Status GrpcResidual::Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                                      std::span<float* const> outputs, ThreadPool& pool) {
  const model::ResidualGroupShape* shape = shapes_.Find(id);
  if (shape == nullptr || outputs.size() != shape->rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC residual: no group ",
                                                   model::LinearGroupIdString(id), " with ",
                                                   outputs.size(), " outputs"));
  }
  request_.set_layer(id.layer);
  request_.set_group(static_cast<v1::MatrixGroup>(static_cast<int>(id.group) + 1));
  request_.set_rows(static_cast<int32_t>(x.rows));
  request_.set_cols(static_cast<int32_t>(x.cols));
  const size_t scale_bytes = static_cast<size_t>(x.rows * x.block_stride) * sizeof(float);
  request_.set_codes(x.codes.data(), static_cast<size_t>(x.rows * x.cols));
  request_.set_scales(x.scales.data(), scale_bytes);
  request_.set_sums(x.sums.data(), scale_bytes);
  BITSPLIT_ASSIGN_OR_RETURN(v1::MatMulResponse response, client_.MatMul(request_));
  if (response.outputs_size() != static_cast<int>(outputs.size())) {
    return absl::InternalError("residual service answered with the wrong number of outputs");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& bytes = response.outputs(static_cast<int>(i));
    const size_t n = static_cast<size_t>(x.rows * shape->rows[i]);
    if (bytes.size() != n * sizeof(float)) {
      return absl::InternalError("residual service answered with an output of the wrong size");
    }
    float* out = outputs[i];
    const char* in = bytes.data();
    for (size_t j = 0; j < n; ++j) {
      float v;
      std::memcpy(&v, in + j * sizeof(float), sizeof(float));
      out[j] += v;
    }
  }
  (void)pool;
  return absl::OkStatus();
}

}  // namespace bitsplit::rpc
