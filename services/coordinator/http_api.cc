#include "services/coordinator/http_api.h"

#include <dirent.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "services/coordinator/openai_api.h"
#include "spdlog/spdlog.h"

namespace bitsplit::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How often a connection waiting for its generation's next chunk looks at its socket.
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Chunks a generation may run ahead of a slow client before its worker waits.
constexpr size_t kMaxPendingChunks = 64;

// The one place where a status becomes an HTTP status and OpenAI error type.
struct HttpError {
  int status;
  std::string_view type;
  std::string_view code;
};
HttpError HttpErrorFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return {400, "invalid_request_error", ""};
    case absl::StatusCode::kUnauthenticated:
      return {401, "authentication_error", "invalid_api_key"};
    case absl::StatusCode::kNotFound:
      return {404, "not_found_error", "model_not_found"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "rate_limit_error", "server_busy"};
    case absl::StatusCode::kUnavailable:
      return {503, "server_error", "service_unavailable"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "server_error", "timeout"};
    default:
      return {500, "server_error", ""};
  }
}

void SetJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(openai::Dump(body), "application/json");
}

void SetError(httplib::Response& res, const absl::Status& status) {
  const HttpError error = HttpErrorFor(status.code());
  SetJson(res, error.status,
          openai::ErrorBody(std::string(status.message()), error.type, error.code));
}

std::string SseEvent(const json& event) {
  return absl::StrCat("data: ", openai::Dump(event), "\n\n");
}

// The accepted socket of the connection `req` came on, found among this process's descriptors
// by its two addresses (httplib hands handlers the addresses, not the descriptor); -1 if none
// matches. The connection's thread owns the socket while its handler runs, so it stays valid.
int FindConnectionSocket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  auto matches = [](const sockaddr_storage& address, socklen_t length, const std::string& host,
                    int port) {
    char host_buffer[NI_MAXHOST];
    char port_buffer[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host_buffer,
                    sizeof(host_buffer), port_buffer, sizeof(port_buffer),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return false;
    }
    int parsed_port = 0;
    return host == host_buffer && absl::SimpleAtoi(port_buffer, &parsed_port) &&
           parsed_port == port;
  };
  while (dirent* entry = readdir(dir)) {
    int fd = 0;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, remote{};
    socklen_t local_length = sizeof(local), remote_length = sizeof(remote);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_length) != 0) continue;
    if (matches(local, local_length, req.local_addr, req.local_port) &&
        matches(remote, remote_length, req.remote_addr, req.remote_port)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// True once the client closed the connection (or it broke).
bool PeerClosed(int fd) {
  if (fd < 0) return false;
  pollfd entry{.fd = fd, .events = POLLRDHUP, .revents = 0};
  return poll(&entry, 1, 0) > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

std::string RandomId(std::string_view prefix) {
  absl::BitGen random;
  return absl::StrFormat("%s%016x%08x", prefix, absl::Uniform<uint64_t>(random),
                         absl::Uniform<uint32_t>(random));
}

std::array<unsigned char, SHA256_DIGEST_LENGTH> Sha256(std::string_view text) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

// One HTTP request's generation: the queue's job on one side, the connection's thread on the
// other. The worker sends chunks and the end; the connection reads them in order, and cancels
// when its client goes away. Thread safety: every method may be called from any thread.
class HttpJob final : public GenerationJob {
 public:
  explicit HttpJob(GenerationPlan plan) : plan_(std::move(plan)), arrival_(Clock::now()) {}

  struct Event {
    std::optional<v1::GenerateChunk> chunk;                      // a chunk, or
    std::optional<absl::StatusOr<v1::GenerateComplete>> result;  // the end
  };

  bool Send(const v1::GenerateChunk& chunk) override {
    std::unique_lock lock(mutex_);
    drained_.wait(lock, [this] { return events_.size() < kMaxPendingChunks || cancelled_; });
    if (cancelled_) return false;
    events_.push_back({.chunk = chunk, .result = std::nullopt});
    arrived_.notify_all();
    return true;
  }
  bool Cancelled() const override {
    std::lock_guard lock(mutex_);
    return cancelled_ || stop_requested_;
  }
  const GenerationPlan& plan() const override { return plan_; }
  Clock::time_point arrival() const override { return arrival_; }
  Api api() const override { return Api::kHttp; }
  void RequestStop() override {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
  }
  bool stop_requested() const override {
    std::lock_guard lock(mutex_);
    return stop_requested_;
  }
  void Finish(absl::StatusOr<v1::GenerateComplete> result) override {
    std::lock_guard lock(mutex_);
    events_.push_back({.chunk = std::nullopt, .result = std::move(result)});
    finished_ = true;
    arrived_.notify_all();
  }

  // The next event, waiting up to `timeout`.
  std::optional<Event> Next(Clock::duration timeout) {
    std::unique_lock lock(mutex_);
    if (!arrived_.wait_for(lock, timeout, [this] { return !events_.empty(); })) {
      return std::nullopt;
    }
    Event event = std::move(events_.front());
    events_.pop_front();
    drained_.notify_all();
    return event;
  }

  // The client went away: the generation stops at its next step (or leaves the queue), and
  // this returns once the queue is done with the job, which may then be destroyed.
  void Abandon(RequestQueue& queue) {
    {
      std::lock_guard lock(mutex_);
      if (abandoned_) return;
      abandoned_ = true;
      cancelled_ = true;
      drained_.notify_all();
    }
    if (queue.Withdraw(this)) Finish(absl::CancelledError("the client went away"));
    std::unique_lock lock(mutex_);
    arrived_.wait(lock, [this] { return finished_; });
  }

 private:
  const GenerationPlan plan_;
  const Clock::time_point arrival_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::condition_variable drained_;
  std::deque<Event> events_;
  bool cancelled_ = false;
  bool stop_requested_ = false;
  bool finished_ = false;
  bool abandoned_ = false;
};

}  // namespace

class HttpApi::Routes {
 public:
  Routes(const HttpApiOptions& options, const HttpApiContext& context,
         const std::atomic<bool>& stopping)
      : options_(options),
        context_(context),
        stopping_(stopping),
        created_(static_cast<int64_t>(std::time(nullptr))),
        api_key_digest_(Sha256(options.api_key)) {}

  void Install(httplib::Server& server) {
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                 : httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib answers itself (no route: 404, a body over the limit: 413, a malformed
    // request: 400) get OpenAI's error body; a handler's own error keeps its body.
    server.set_error_handler(httplib::Server::HandlerWithResponse(
        [](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          std::string message;
          std::string_view type = "invalid_request_error";
          switch (res.status) {
            case 404:
              message = absl::StrCat("no route for ", req.method, " ", req.path);
              type = "not_found_error";
              break;
            case 413:
              message = "the request body is larger than this server accepts (--max-request-bytes)";
              break;
            default:
              message = absl::StrCat("HTTP ", res.status);
              if (res.status >= 500) type = "server_error";
          }
          res.set_content(openai::Dump(openai::ErrorBody(message, type, "")), "application/json");
          return httplib::Server::HandlerResponse::Handled;
        }));
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          SetError(res, absl::InternalError("the server failed on this request"));
        });
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) {
                  Generate(openai::Endpoint::kChatCompletions, req, res);
                });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(openai::Endpoint::kCompletions, req, res);
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      SetJson(res, 200, openai::ModelList(*context_.model_info, options_.served_model, created_));
    });
    server.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != options_.served_model) {
        SetError(res, absl::NotFoundError(absl::StrCat("the model '", req.matches[1].str(),
                                                       "' does not exist; this server serves '",
                                                       options_.served_model, "'")));
        return;
      }
      SetJson(res, 200,
              openai::ModelList(*context_.model_info, options_.served_model, created_)["data"][0]);
    });
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (stopping_.load()) {
        SetJson(res, 503, {{"status", "stopping"}});
      } else {
        SetJson(res, 200, {{"status", "ok"}});
      }
    });
    server.Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
      const absl::Status ready =
          stopping_.load() ? absl::UnavailableError("shutting down")
                           : (context_.readiness ? context_.readiness() : absl::OkStatus());
      if (ready.ok()) {
        SetJson(res, 200, {{"status", "ready"}});
      } else {
        SetJson(res, 503, {{"status", "not_ready"}, {"reason", std::string(ready.message())}});
      }
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const QueueCounts counts = context_.queue->counts();
      const QueueFigures queue{.running = counts.running,
                               .waiting = counts.waiting,
                               .max_active = context_.queue->max_active(),
                               .max_queue = context_.queue->max_queue()};
      res.set_content(context_.metrics->Render(
                          queue, context_.drafter->GetInfo(std::chrono::milliseconds(1000),
                                                           /*include_residual_stats=*/true)),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
  }

 private:
  // Bearer-token check of every route but the probes; the comparison takes the same time
  // whatever the token (digests compared with CRYPTO_memcmp).
  bool Authorize(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_key.empty() || req.path == "/health" || req.path == "/ready") return true;
    const std::string authorization = req.get_header_value("Authorization");
    absl::string_view header = authorization;
    const bool bearer = absl::ConsumePrefix(&header, "Bearer ");
    const auto digest = Sha256(std::string_view(header.data(), header.size()));
    if (bearer && CRYPTO_memcmp(digest.data(), api_key_digest_.data(), digest.size()) == 0) {
      return true;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    SetError(res, absl::UnauthenticatedError(
                      "a valid API key is required: send it as \"Authorization: Bearer KEY\""));
    return false;
  }

  void Generate(openai::Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<openai::OpenAiRequest> parsed =
        openai::ParseRequest(endpoint, req.body, options_.served_model);
    if (parsed.ok()) {
      if (absl::Status applied = openai::ApplyToolCallFormat(context_.tool_call_format,
                                                             context_.tool_marker_ids, *parsed);
          !applied.ok()) {
        parsed = applied;
      }
    }
    absl::StatusOr<GenerationPlan> plan =
        parsed.ok() ? ValidateRequest(parsed->request, *context_.tokenizer, context_.chat_template,
                                      *context_.limits)
                    : absl::StatusOr<GenerationPlan>(parsed.status());
    if (!plan.ok()) {
      spdlog::debug("HTTP {} refused: {}", req.path, plan.status().ToString());
      context_.metrics->RecordRefused(Api::kHttp, plan.status());
      SetError(res, plan.status());
      return;
    }
    auto job = std::make_shared<HttpJob>(*std::move(plan));
    if (absl::Status admitted = context_.queue->Submit(job.get()); !admitted.ok()) {
      SetError(res, admitted);
      return;
    }
    // The request and the builder live as long as the answer: a stream's provider runs after
    // this handler returned.
    auto request = std::make_shared<openai::OpenAiRequest>(*std::move(parsed));
    const bool chat = endpoint == openai::Endpoint::kChatCompletions;
    auto builder = std::make_shared<openai::ResponseBuilder>(
        *request,
        openai::ResponseIdentity{
            .id = RandomId(chat ? "chatcmpl-" : "cmpl-"),
            .created = static_cast<int64_t>(std::time(nullptr)),
            .model = options_.served_model,
            .system_fingerprint =
                absl::StrCat("bitsplit-", context_.model_info->fingerprint().substr(0, 12))},
        *context_.tokenizer, context_.tool_call_format);
    const int socket = FindConnectionSocket(req);
    if (socket < 0) spdlog::debug("HTTP: the connection's socket was not found");
    RequestQueue& queue = *context_.queue;
    if (!request->stream) {
      Respond(*job, *builder, socket, res);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, builder, request, socket, &queue](size_t /*offset*/, httplib::DataSink& sink) {
          return Stream(*job, *builder, socket, queue, sink);
        },
        [job, &queue](bool /*success*/) { job->Abandon(queue); });
  }

  // A non-streaming answer: waits for the end, watching the connection.
  void Respond(HttpJob& job, openai::ResponseBuilder& builder, int socket, httplib::Response& res) {
    while (true) {
      std::optional<HttpJob::Event> event = job.Next(kPollInterval);
      // Checked on every turn, not only when no chunk came: a generation that produces chunks
      // faster than the poll interval would otherwise never notice the client left.
      if (PeerClosed(socket)) {
        job.Abandon(*context_.queue);
        res.status = 499;  // nobody reads it: the client closed the connection
        return;
      }
      if (!event) continue;
      if (event->chunk) {
        builder.AddChunk(*event->chunk);
        continue;
      }
      if (!event->result->ok()) {
        SetError(res, event->result->status());
      } else {
        SetJson(res, 200, builder.Response(**event->result));
      }
      return;
    }
  }

  // A streaming answer: Server-Sent Events until the end, then "data: [DONE]". False (the
  // connection is dropped) when the client went away; the generation is cancelled then.
  static bool Stream(HttpJob& job, openai::ResponseBuilder& builder, int socket,
                     RequestQueue& queue, httplib::DataSink& sink) {
    auto write = [&sink](const std::string& text) { return sink.write(text.data(), text.size()); };
    for (const json& event : builder.StreamStart()) {
      if (!write(SseEvent(event))) {
        job.Abandon(queue);
        return false;
      }
    }
    while (true) {
      std::optional<HttpJob::Event> event = job.Next(kPollInterval);
      if (PeerClosed(socket)) {  // a write into the socket's buffer can succeed after the close
        job.Abandon(queue);
        return false;
      }
      if (!event) continue;
      if (event->chunk) {
        if (std::optional<json> out = builder.AddChunk(*event->chunk);
            out && !write(SseEvent(*out))) {
          job.Abandon(queue);
          return false;
        }
        continue;
      }
      const absl::StatusOr<v1::GenerateComplete>& result = *event->result;
      bool written = true;
      if (result.ok()) {
        for (const json& last : builder.StreamEnd(*result))
          written = written && write(SseEvent(last));
      } else {
        // The status line went out with the first event: the error travels in the stream.
        const HttpError error = HttpErrorFor(result.status().code());
        written = write(SseEvent(
            openai::ErrorBody(std::string(result.status().message()), error.type, error.code)));
      }
      written = written && write("data: [DONE]\n\n");
      if (written) sink.done();
      return written;
    }
  }

  const HttpApiOptions& options_;
  const HttpApiContext& context_;
  const std::atomic<bool>& stopping_;
  const int64_t created_;
  const std::array<unsigned char, SHA256_DIGEST_LENGTH> api_key_digest_;
};

HttpApi::HttpApi(HttpApiOptions options, HttpApiContext context)
    : options_(std::move(options)), context_(std::move(context)) {}

HttpApi::~HttpApi() { Stop(); }

absl::StatusOr<std::string> HttpApi::Start() {
  const size_t colon = options_.address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options_.address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http ", options_.address, ": expected HOST:PORT (port 0: any free one)"));
  }
  std::string host = options_.address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  server_ = std::make_unique<httplib::Server>();
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(static_cast<size_t>(options_.max_request_bytes));
  server_->set_keep_alive_max_count(1000);
  server_->set_read_timeout(std::chrono::seconds(30));
  server_->set_write_timeout(std::chrono::seconds(30));
  routes_ = std::make_unique<Routes>(options_, context_, stopping_);
  routes_->Install(*server_);
  if (port == 0) {
    port = server_->bind_to_any_port(host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat("--http: cannot listen on ", options_.address));
    }
  } else if (!server_->bind_to_port(host, port)) {
    return absl::UnavailableError(absl::StrCat("--http: cannot listen on ", options_.address,
                                               " (in use, or not an address of this machine)"));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  const bool ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

void HttpApi::Stop() {
  stopping_.store(true);
  if (server_ != nullptr) server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace bitsplit::coordinator
