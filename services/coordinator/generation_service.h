#pragma once
// The public bitsplit.v1.Generation service (docs/design.md §5) on gRPC's callback API.
//
// Generate: each admitted stream is a GenerateReactor, a job of the coordinator's RequestQueue
// (shared with the HTTP API: the same limits, queue and metrics), which a worker thread drives
// through RunGeneration. Chunks are written with flow control (one write in flight per stream).
// A client that goes away is seen between steps and its drafter session is closed at once.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "services/coordinator/metrics.h"
#include "services/coordinator/request_queue.h"
#include "services/coordinator/request_validation.h"

namespace bitsplit::coordinator {

class GenerateReactor;

struct GenerationServiceOptions {
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

// Thread safety: gRPC calls its methods on its threads; the queue's workers drive the streams.
class GenerationServiceImpl final : public GenerationServiceBase {
 public:
  // `queue` (shared with the HTTP API), `metrics`, `tokenizer` and `chat_template` (null: the
  // model has none) must outlive the service.
  GenerationServiceImpl(const GenerationServiceOptions& options, RequestQueue& queue,
                        CoordinatorMetrics& metrics, const text::Tokenizer& tokenizer,
                        const text::ChatTemplate* chat_template);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

  // Waits until every Generate stream has finished (gRPC called OnDone), or until `deadline`;
  // false if some were still open then. After the queue's Shutdown() no stream runs for more
  // than one step.
  bool WaitForStreamsToFinish(std::chrono::steady_clock::time_point deadline);

  // A stream's client went away: a queued request leaves the queue and finishes at once (a
  // running one is stopped by its worker at the next step).
  void OnCancelled(GenerateReactor* reactor);
  // gRPC is done with a stream (its reactor is about to be deleted).
  void OnStreamDone();

 private:
  const GenerationServiceOptions options_;
  RequestQueue& queue_;
  CoordinatorMetrics& metrics_;
  const text::Tokenizer& tokenizer_;
  const text::ChatTemplate* const chat_template_;

  std::mutex mutex_;
  int open_streams_ ABSL_GUARDED_BY(mutex_) = 0;  // Generate calls whose OnDone has not run yet
  std::condition_variable streams_finished_;
};

}  // namespace bitsplit::coordinator
