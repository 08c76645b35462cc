#pragma once
// bitsplit.internal.v1.Residual over gRPC's callback API. The handlers do validation and
// bookkeeping only; the math is in ResidualStore. absl::Status is mapped to grpc::Status in one
// place (ToGrpcStatus).
#include "absl/status/status.h"
#include "bitsplit/internal/v1/residual.grpc.pb.h"
#include "services/cpu-residual/channel_manager.h"
#include "services/cpu-residual/residual_store.h"

namespace bitsplit::residual {

grpc::Status ToGrpcStatus(const absl::Status& status);

class ResidualServiceImpl final : public bitsplit::internal::v1::Residual::CallbackService {
 public:
  ResidualServiceImpl(ResidualStore& store, ChannelManager& channels)
      : store_(store), channels_(channels) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const bitsplit::internal::v1::InfoRequest* request,
                                 bitsplit::internal::v1::InfoResponse* response) override;
  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const bitsplit::internal::v1::AttachRequest* request,
                                   bitsplit::internal::v1::AttachResponse* response) override;
  grpc::ServerUnaryReactor* Detach(grpc::CallbackServerContext* context,
                                   const bitsplit::internal::v1::DetachRequest* request,
                                   bitsplit::internal::v1::DetachResponse* response) override;
  grpc::ServerUnaryReactor* MatMul(grpc::CallbackServerContext* context,
                                   const bitsplit::internal::v1::MatMulRequest* request,
                                   bitsplit::internal::v1::MatMulResponse* response) override;

 private:
  absl::Status DoInfo(bitsplit::internal::v1::InfoResponse* response);
  absl::Status DoAttach(const bitsplit::internal::v1::AttachRequest& request,
                        bitsplit::internal::v1::AttachResponse* response);
  absl::Status DoMatMul(const bitsplit::internal::v1::MatMulRequest& request,
                        bitsplit::internal::v1::MatMulResponse* response);

  ResidualStore& store_;
  ChannelManager& channels_;
};

}  // namespace bitsplit::residual
