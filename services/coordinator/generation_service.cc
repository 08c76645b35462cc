#include "services/coordinator/generation_service.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/streaming_detokenizer.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "services/coordinator/speculation_loop.h"
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

// One Generate stream. Owned by gRPC: deleted in OnDone, which gRPC calls only after Finish, so
// whoever calls Finish (through FinishWith / FinishNow) must not touch the reactor afterwards.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public ChunkSink {
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

  // Asks a running generation to stop at its next step (server shutdown).
  void RequestStop() {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
    write_done_.notify_all();
  }
  bool stop_requested() const {
    std::lock_guard lock(mutex_);
    return stop_requested_;
  }

  // Sends `last` (the complete or error event) and then finishes with `status`; a client that is
  // gone gets the status alone. Waits for an earlier write. The caller's last touch.
  void FinishWith(v1::GenerateResponse last, const grpc::Status& status) {
    std::unique_lock lock(mutex_);
    write_done_.wait(lock, [this] { return !write_in_flight_; });
    if (cancelled_ || write_failed_) {
      lock.unlock();
      Finish(status);
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
  // Finishes a stream that never wrote (queued or refused).
  void FinishNow(const grpc::Status& status) { Finish(status); }

  void set_plan(GenerationPlan plan) { plan_ = std::move(plan); }
  const GenerationPlan& plan() const { return plan_; }
  std::chrono::steady_clock::time_point arrival() const { return arrival_; }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      std::lock_guard lock(mutex_);
      write_in_flight_ = false;
      if (!ok) write_failed_ = true;
      finish = std::exchange(finish_after_write_, std::nullopt);
      write_done_.notify_all();
    }
    if (finish) Finish(*finish);
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
                                             rpc::DrafterClient& drafter,
                                             const text::Tokenizer& tokenizer,
                                             const text::ChatTemplate* chat_template)
    : options_(options), drafter_(drafter), tokenizer_(tokenizer), chat_template_(chat_template) {
  for (int i = 0; i < std::max(1, options_.max_active); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

GenerationServiceImpl::~GenerationServiceImpl() {
  Shutdown();
  for (std::thread& worker : workers_) worker.join();
}

void GenerationServiceImpl::Shutdown() {
  std::deque<GenerateReactor*> queued;
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    queued.swap(queue_);
    // A running reactor stays alive while it is in running_ (its worker removes it before the
    // final Finish, under this lock).
    for (GenerateReactor* reactor : running_) reactor->RequestStop();
  }
  work_available_.notify_all();
  for (GenerateReactor* reactor : queued) {
    reactor->FinishWithError(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
  }
}

bool GenerationServiceImpl::WaitForStreamsToFinish(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return streams_finished_.wait_until(lock, deadline, [this] { return open_streams_ == 0; });
}

absl::Status GenerationServiceImpl::CheckCapacity(int drafter_open_sessions,
                                                  int drafter_max_sessions) {
  std::lock_guard lock(mutex_);
  if (shutting_down_) return absl::UnavailableError("shutting down");
  const size_t capacity = static_cast<size_t>(options_.max_active + options_.max_queue);
  if (queue_.size() + running_.size() >= capacity) {
    return absl::ResourceExhaustedError(absl::StrFormat("the queue is full (%d running, %d queued)",
                                                        running_.size(), queue_.size()));
  }
  // Sessions this coordinator holds come back when its requests finish; sessions held by others
  // (another coordinator) may not.
  if (drafter_open_sessions >= drafter_max_sessions && running_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("all %d drafter sessions are held by other clients", drafter_max_sessions));
  }
  return absl::OkStatus();
}

void GenerationServiceImpl::OnStreamDone() {
  std::lock_guard lock(mutex_);
  if (--open_streams_ == 0) streams_finished_.notify_all();
}

void GenerationServiceImpl::OnCancelled(GenerateReactor* reactor) {
  {
    std::lock_guard lock(mutex_);
    auto it = std::find(queue_.begin(), queue_.end(), reactor);
    if (it == queue_.end()) return;  // running (its worker sees the cancellation) or not queued
    queue_.erase(it);
  }
  spdlog::debug("a queued request was cancelled by its client");
  reactor->FinishNow(grpc::Status::CANCELLED);
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
    reactor->FinishWithError(ToGrpcStatus(plan.status()));
    return reactor;
  }
  reactor->set_plan(*std::move(plan));
  std::optional<grpc::Status> refusal;
  {
    std::lock_guard lock(mutex_);
    const size_t capacity = static_cast<size_t>(options_.max_active + options_.max_queue);
    if (shutting_down_) {
      refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    } else if (queue_.size() + running_.size() >= capacity) {
      spdlog::warn("refused a request: {} running and {} queued (--max-active {}, --max-queue {})",
                   running_.size(), queue_.size(), options_.max_active, options_.max_queue);
      refusal = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             absl::StrFormat("the server is busy: %d requests running and %d "
                                             "queued; retry later",
                                             running_.size(), queue_.size()));
    } else {
      queue_.push_back(reactor);
    }
  }
  if (refusal) {
    reactor->FinishWithError(*refusal);
  } else {
    work_available_.notify_one();
  }
  return reactor;
}

void GenerationServiceImpl::WorkerLoop() {
  while (true) {
    GenerateReactor* reactor = nullptr;
    {
      std::unique_lock lock(mutex_);
      work_available_.wait(lock, [this] { return shutting_down_ || !queue_.empty(); });
      if (queue_.empty()) return;  // shutting down
      reactor = queue_.front();
      queue_.pop_front();
      running_.push_back(reactor);
    }
    RunOne(reactor);
  }
}

void GenerationServiceImpl::RunOne(GenerateReactor* reactor) {
  const GenerationEnvironment environment{.drafter = &drafter_,
                                          .tokenizer = &tokenizer_,
                                          .context_length = options_.limits.context_length};
  absl::StatusOr<v1::GenerateComplete> complete =
      RunGeneration(reactor->plan(), environment, *reactor, reactor->arrival());
  const bool stopped_by_server = reactor->stop_requested();
  {
    std::lock_guard lock(mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), reactor));
  }
  if (complete.ok()) {
    v1::GenerateResponse last;
    *last.mutable_complete() = *std::move(complete);
    reactor->FinishWith(std::move(last), grpc::Status::OK);
    return;
  }
  absl::Status status = complete.status();
  if (absl::IsCancelled(status) && stopped_by_server) {
    status = absl::UnavailableError("the coordinator is shutting down");
  }
  if (absl::IsCancelled(status)) {
    spdlog::debug("Generate cancelled: {}", status.ToString());
  } else {
    spdlog::warn("Generate failed: {}", status.ToString());
  }
  reactor->FinishWithError(ToGrpcStatus(status));
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
