#include "services/coordinator/generation_service.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/streaming_detokenizer.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "services/coordinator/drafter_stream.h"
#include "spdlog/spdlog.h"

namespace bitsplit::coordinator {
namespace {

// The one place where this service's absl::Status becomes a grpc::Status.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// Parses a request that came as bytes; INVALID_ARGUMENT naming the message type otherwise.
template <typename Message>
absl::StatusOr<Message> ParseRequest(const grpc::ByteBuffer& bytes) {
  grpc::ByteBuffer consumed(bytes);  // Deserialize takes the buffer; this copy shares its slices
  Message message;
  if (grpc::SerializationTraits<Message>::Deserialize(&consumed, &message).ok()) return message;
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", Message::descriptor()->full_name(),
                   ": malformed protobuf, or a string field that is not valid UTF-8"));
}

template <typename Message>
void Serialize(const Message& message, grpc::ByteBuffer* out) {
  out->Clear();  // the previous write's buffer (gRPC serializes into an empty one only)
  bool own_buffer = false;
  const grpc::Status status =
      grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
  if (!status.ok()) spdlog::error("serializing a response: {}", status.error_message());
}

}  // namespace

// One Generate stream, and the queue's job for it. Owned by gRPC: deleted in OnDone, which gRPC
// calls only after Finish, so whoever calls Finish (through FinishWith / FinishNow) must not
// touch the reactor afterwards.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                              public GenerationJob {
 public:
  GenerateReactor(GenerationServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), arrival_(std::chrono::steady_clock::now()) {}

  // ChunkSink: one write in flight at a time.
  bool Send(const v1::GenerateChunk& chunk) override {
    std::unique_lock lock(mutex_);
    write_done_.wait(lock, [this] { return !write_in_flight_ || cancelled_; });
    if (cancelled_ || write_failed_) return false;
    v1::GenerateResponse response;
    *response.mutable_chunk() = chunk;
    Serialize(response, &response_);
    write_in_flight_ = true;
    lock.unlock();  // OnWriteDone takes the lock (and may run on another thread at once).
    StartWrite(&response_);
    return true;
  }
  bool Cancelled() const override {
    std::lock_guard lock(mutex_);
    return cancelled_ || stop_requested_ || context_->IsCancelled();
  }

  // GenerationJob.
  const GenerationPlan& plan() const override { return plan_; }
  std::chrono::steady_clock::time_point arrival() const override { return arrival_; }
  Api api() const override { return Api::kGrpc; }
  void RequestStop() override {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
    write_done_.notify_all();
  }
  bool stop_requested() const override {
    std::lock_guard lock(mutex_);
    return stop_requested_;
  }
  void Finish(absl::StatusOr<v1::GenerateComplete> result) override {
    if (result.ok()) {
      v1::GenerateResponse last;
      *last.mutable_complete() = *std::move(result);
      FinishWith(std::move(last), grpc::Status::OK);
    } else {
      FinishWithError(ToGrpcStatus(result.status()));
    }
  }

  // Sends `last` (the complete or error event) and then finishes with `status`; a client that is
  // gone gets the status alone. Waits for an earlier write. The caller's last touch.
  void FinishWith(v1::GenerateResponse last, const grpc::Status& status) {
    std::unique_lock lock(mutex_);
    write_done_.wait(lock, [this] { return !write_in_flight_; });
    if (cancelled_ || write_failed_) {
      lock.unlock();
      grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(status);
      return;
    }
    Serialize(last, &response_);
    finish_after_write_ = status;
    write_in_flight_ = true;
    lock.unlock();
    StartWrite(&response_);
  }
  void FinishWithError(const grpc::Status& status) {
    v1::GenerateResponse error;
    error.mutable_error()->set_code(static_cast<int>(status.error_code()));
    error.mutable_error()->set_message(status.error_message());
    FinishWith(std::move(error), status);
  }
  // Finishes a stream that never wrote (a queued request whose client left).
  void FinishNow(const grpc::Status& status) {
    grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(status);
  }

  void set_plan(GenerationPlan plan) { plan_ = std::move(plan); }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      std::lock_guard lock(mutex_);
      write_in_flight_ = false;
      if (!ok) write_failed_ = true;
      finish = std::exchange(finish_after_write_, std::nullopt);
      write_done_.notify_all();
    }
    if (finish) grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(*finish);
  }
  void OnCancel() override {
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
      write_done_.notify_all();
    }
    service_->OnCancelled(this);
  }
  void OnDone() override {
    service_->OnStreamDone();
    delete this;
  }

 private:
  GenerationServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const std::chrono::steady_clock::time_point arrival_;
  GenerationPlan plan_;

  mutable std::mutex mutex_;
  std::condition_variable write_done_;
  grpc::ByteBuffer response_;  // the write in flight; untouched until OnWriteDone
  bool write_in_flight_ = false;
  bool write_failed_ = false;
  bool cancelled_ = false;
  bool stop_requested_ = false;
  std::optional<grpc::Status> finish_after_write_;
};

GenerationServiceImpl::GenerationServiceImpl(const GenerationServiceOptions& options,
                                             RequestQueue& queue, CoordinatorMetrics& metrics,
                                             const text::Tokenizer& tokenizer,
                                             const text::ChatTemplate* chat_template)
    : options_(options),
      queue_(queue),
      metrics_(metrics),
      tokenizer_(tokenizer),
      chat_template_(chat_template) {}

bool GenerationServiceImpl::WaitForStreamsToFinish(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return streams_finished_.wait_until(lock, deadline, [this] { return open_streams_ == 0; });
}

void GenerationServiceImpl::OnStreamDone() {
  std::lock_guard lock(mutex_);
  if (--open_streams_ == 0) streams_finished_.notify_all();
}

void GenerationServiceImpl::OnCancelled(GenerateReactor* reactor) {
  if (queue_.Withdraw(reactor)) reactor->FinishNow(grpc::Status::CANCELLED);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationServiceImpl::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  auto* reactor = new GenerateReactor(this, context);
  {
    std::lock_guard lock(mutex_);
    ++open_streams_;
  }
  // Bad input is refused before it can take a queue slot.
  absl::StatusOr<v1::GenerateRequest> request = ParseRequest<v1::GenerateRequest>(*request_bytes);
  absl::StatusOr<GenerationPlan> plan =
      request.ok() ? ValidateRequest(*request, tokenizer_, chat_template_, options_.limits)
                   : absl::StatusOr<GenerationPlan>(request.status());
  if (!plan.ok()) {
    spdlog::debug("Generate refused: {}", plan.status().ToString());
    metrics_.RecordRefused(Api::kGrpc, plan.status());
    reactor->FinishWithError(ToGrpcStatus(plan.status()));
    return reactor;
  }
  reactor->set_plan(*std::move(plan));
  if (absl::Status admitted = queue_.Submit(reactor); !admitted.ok()) {
    reactor->FinishWithError(ToGrpcStatus(admitted));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Tokenize(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request_bytes,
                                                          grpc::ByteBuffer* response_bytes) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::TokenizeRequest> request = ParseRequest<v1::TokenizeRequest>(*request_bytes);
  if (!request.ok()) {
    reactor->Finish(ToGrpcStatus(request.status()));
    return reactor;
  }
  // No text longer than the longest prompt the context holds is worth tokenizing.
  const int64_t longest_prompt_bytes =
      static_cast<int64_t>(options_.limits.context_length) * options_.limits.max_token_bytes;
  if (static_cast<int64_t>(request->text().size()) > longest_prompt_bytes) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("the text (%d bytes) is longer than any prompt the context of %d tokens "
                        "can hold (at most %d bytes)",
                        request->text().size(), options_.limits.context_length,
                        longest_prompt_bytes)));
    return reactor;
  }
  v1::TokenizeResponse response;
  const std::vector<int32_t> ids = tokenizer_.Encode(request->text(), request->parse_special());
  for (const int32_t id : ids) {
    response.add_token_ids(id);
    absl::StatusOr<std::string_view> piece =
        tokenizer_.TokenToPiece(id, /*render_special=*/request->parse_special());
    // A byte-level token may hold part of a character; proto strings must be valid UTF-8.
    response.add_pieces(piece.ok() ? text::ReplaceInvalidUtf8(*piece) : std::string());
  }
  Serialize(response, response_bytes);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::GetModelInfo(
    grpc::CallbackServerContext* context, const v1::GetModelInfoRequest* request,
    v1::ModelInfo* response) {
  *response = options_.model_info;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace bitsplit::coordinator
