#pragma once
// The public bitsplit.v1.Generation service (docs/design.md §5) on gRPC's callback API.
//
// Generate: each admitted stream is a GenerateReactor that a worker thread drives through
// RunGeneration; at most `max_active` run at once (one worker each), up to `max_queue` more wait
// in FIFO order, and a request beyond that is refused at once with RESOURCE_EXHAUSTED. Chunks are
// written with flow control (one write in flight per stream). A client that goes away is seen
// between steps and its drafter session is closed at once.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/rpc/drafter_client.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/speculation_loop.h"

namespace bitsplit::coordinator {

class GenerateReactor;

struct GenerationServiceOptions {
  int max_active = 1;
  int max_queue = 16;
  ServerLimits limits;
  v1::ModelInfo model_info;  // GetModelInfo's answer, assembled at start
};

// Generate and Tokenize take their requests as bytes and parse them here, so that a malformed
// message (or a string field that is not UTF-8, which protobuf refuses to parse) is answered
// with INVALID_ARGUMENT and a message; gRPC's generated handler answers it with an empty
// UNIMPLEMENTED.
using GenerationServiceBase =
    v1::Generation::WithRawCallbackMethod_Generate<v1::Generation::WithRawCallbackMethod_Tokenize<
        v1::Generation::WithCallbackMethod_GetModelInfo<v1::Generation::Service>>>;

class GenerationServiceImpl final : public GenerationServiceBase {
 public:
  // `drafter`, `tokenizer` and `chat_template` (null: the model has none) must outlive the
  // service. Starts the worker threads.
  GenerationServiceImpl(const GenerationServiceOptions& options, rpc::DrafterClient& drafter,
                        const text::Tokenizer& tokenizer, const text::ChatTemplate* chat_template);
  // Joins the workers; call after the server has shut down (or Shutdown() before that).
  ~GenerationServiceImpl() override;

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

  // Refuses new requests (UNAVAILABLE), finishes queued ones with UNAVAILABLE and asks running
  // ones to stop at their next step. Idempotent.
  void Shutdown();

  // Waits until every Generate stream has finished (gRPC called OnDone), or until `deadline`;
  // false if some were still open then. After Shutdown() no stream runs for more than one step.
  bool WaitForStreamsToFinish(std::chrono::steady_clock::time_point deadline);

  // OK when a request sent now would be taken: not shutting down, the queue has room, and the
  // drafter has a free session or this coordinator holds one that will come free.
  absl::Status CheckCapacity(int drafter_open_sessions, int drafter_max_sessions);

  // A stream's client went away: a queued request leaves the queue and finishes at once (a
  // running one is stopped by its worker at the next step).
  void OnCancelled(GenerateReactor* reactor);
  // gRPC is done with a stream (its reactor is about to be deleted).
  void OnStreamDone();

 private:
  void WorkerLoop();
  void RunOne(GenerateReactor* reactor);

  const GenerationServiceOptions options_;
  rpc::DrafterClient& drafter_;
  const text::Tokenizer& tokenizer_;
  const text::ChatTemplate* const chat_template_;

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<GenerateReactor*> queue_;
  std::vector<GenerateReactor*> running_;
  int open_streams_ = 0;  // Generate calls whose OnDone has not run yet
  std::condition_variable streams_finished_;
  bool shutting_down_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace bitsplit::coordinator
