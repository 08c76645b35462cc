#pragma once
// The coordinator's HTTP listener (--http): the OpenAI-compatible API (POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models), GET /health, GET /ready and GET /metrics. It shares the
// gRPC API's RequestQueue (limits, queue, cancellation, metrics) and its validation
// (ValidateRequest): an HTTP request is a GenerateRequest written in JSON.
//
// HTTP library: cpp-httplib 0.11 (Debian's libcpp-httplib-dev). It writes Server-Sent Events
// through a chunked content provider that runs on the connection's own thread, so a stream
// blocks on its generation's next chunk without any event loop; it serves connections from a
// thread pool of a size we choose, refuses bodies over a limit with 413 before reading them,
// and keeps connections alive. A client that goes away is seen by polling the connection's
// socket for POLLRDHUP between chunks (and by a failed write), for streaming and non-streaming
// requests alike: its request is cancelled and its drafter session closed at once.
//
// Thread safety: Start and Stop from one thread; the handlers run on the listener's pool.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bitsplit/v1/generation.pb.h"
#include "common/rpc/drafter_client.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "common/text/tool_calls.h"
#include "services/coordinator/metrics.h"
#include "services/coordinator/request_queue.h"
#include "services/coordinator/request_validation.h"

namespace httplib {
class Server;
}

namespace bitsplit::coordinator {

struct HttpApiOptions {
  std::string address;       // "host:port"; port 0 picks a free one
  std::string served_model;  // the model id of /v1/models and of requests' "model"
  std::string api_key;       // non-empty: every route but /health and /ready needs this bearer
  int64_t max_request_bytes = 4 << 20;  // larger bodies: 413
  int threads = 32;                     // connections served at once (streams hold one each)
};

// Everything the API reads; each must outlive the HttpApi.
struct HttpApiContext {
  RequestQueue* queue = nullptr;
  CoordinatorMetrics* metrics = nullptr;
  rpc::DrafterClient* drafter = nullptr;
  const text::Tokenizer* tokenizer = nullptr;
  const text::ChatTemplate* chat_template = nullptr;  // null: chat requests are refused
  // The tool-call syntax of the chat template (text::DetectToolCallFormat); none: requests with
  // tools are refused.
  std::optional<text::ToolCallFormat> tool_call_format;
  // Its markers that are control tokens (openai::ControlMarkerIds).
  std::vector<int32_t> tool_marker_ids;
  const ServerLimits* limits = nullptr;
  const v1::ModelInfo* model_info = nullptr;
  // OK when a request sent now would be taken (the gRPC readiness probe's function).
  std::function<absl::Status()> readiness;
};

class HttpApi {
 public:
  HttpApi(HttpApiOptions options, HttpApiContext context);
  ~HttpApi();  // Stop()
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  // Binds the address and serves on a thread of its own; returns "host:port" as bound.
  // INVALID_ARGUMENT for an address that is not host:port, UNAVAILABLE when it cannot be bound.
  absl::StatusOr<std::string> Start();
  // /health turns 503; then stops accepting connections and waits for the open ones to end
  // (stop the queue first, so that running streams end within a step). Idempotent.
  void Stop();

 private:
  class Routes;
  const HttpApiOptions options_;
  const HttpApiContext context_;
  std::unique_ptr<httplib::Server> server_;
  std::unique_ptr<Routes> routes_;
  std::thread listener_;
  std::atomic<bool> stopping_{false};
};

}  // namespace bitsplit::coordinator
