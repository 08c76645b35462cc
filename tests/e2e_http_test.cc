// The coordinator's HTTP API (services/coordinator/http_api.h) on the three real processes:
// the OpenAI-compatible endpoints answer token for token what the gRPC API answers for the same
// request; the wire format (Server-Sent Events, chunked encoding, keep-alive) read off a raw
// socket; OpenAI-shaped errors with their HTTP codes (400, 401, 404, 413, 429, 503); a client
// that disconnects frees its drafter session; 8 concurrent streams all complete; and the official
// `openai` Python client and prometheus_client's parser against the running stack
// (tests/http/openai_client_check.py, in the venv of scripts/test-venv.sh).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "common/rpc/drafter_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/generation_stack.h"
#include "tests/testing/paths.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using nlohmann::json;
using testing::GenerationStack;
using ::testing::HasSubstr;
using testing::kCoordinatorBinary;
using testing::ServiceProcess;
using Clock = std::chrono::steady_clock;

// ---- A raw HTTP/1.1 client: the bytes as they travel ------------------------------------------

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // chunked bodies decoded
  bool chunked = false;
  std::vector<size_t> chunk_sizes;
};

class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd_);
      fd_ = -1;
    }
    timeval timeout{.tv_sec = 120, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawConnection() { Close(); }
  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  bool SendRequest(const std::string& method, const std::string& path, const std::string& body,
                   const std::vector<std::string>& headers = {}) {
    std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\n");
    for (const std::string& header : headers) absl::StrAppend(&request, header, "\r\n");
    if (method == "POST") {
      absl::StrAppend(&request, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\n");
    }
    absl::StrAppend(&request, "\r\n", body);
    return Send(request);
  }

  // Reads up to and including `delimiter`; false when the connection ends first.
  bool ReadUntil(const std::string& delimiter, std::string* out) {
    while (true) {
      const size_t at = buffer_.find(delimiter);
      if (at != std::string::npos) {
        *out = buffer_.substr(0, at + delimiter.size());
        buffer_.erase(0, at + delimiter.size());
        return true;
      }
      if (!Fill()) return false;
    }
  }
  bool ReadExactly(size_t n, std::string* out) {
    while (buffer_.size() < n) {
      if (!Fill()) return false;
    }
    *out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return true;
  }

  // The status line and headers.
  std::optional<HttpResponse> ReadHead() {
    std::string head;
    if (!ReadUntil("\r\n\r\n", &head)) return std::nullopt;
    HttpResponse response;
    std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
    std::vector<std::string> status = absl::StrSplit(lines[0], ' ');
    if (status.size() < 2 || !absl::SimpleAtoi(status[1], &response.status)) return std::nullopt;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      response.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    response.chunked = response.headers["transfer-encoding"] == "chunked";
    return response;
  }

  // One chunk of a chunked body ("" at the last chunk); nullopt when the connection ends.
  std::optional<std::string> ReadChunk(HttpResponse& response) {
    std::string size_line;
    if (!ReadUntil("\r\n", &size_line)) return std::nullopt;
    size_t size = 0;
    if (!absl::SimpleHexAtoi(size_line.substr(0, size_line.size() - 2), &size)) {
      return std::nullopt;
    }
    response.chunk_sizes.push_back(size);
    if (size == 0) return std::string();  // the last chunk: trailers and an empty line follow
    std::string data, crlf;
    if (!ReadExactly(size, &data) || !ReadExactly(2, &crlf) || crlf != "\r\n") return std::nullopt;
    return data;
  }

  std::optional<HttpResponse> ReadResponse() {
    std::optional<HttpResponse> response = ReadHead();
    if (!response) return std::nullopt;
    if (response->chunked) {
      while (true) {
        std::optional<std::string> chunk = ReadChunk(*response);
        if (!chunk) return std::nullopt;
        if (chunk->empty()) break;
        response->body += *chunk;
      }
      std::string trailer;
      if (!ReadUntil("\r\n", &trailer)) return std::nullopt;
    } else {
      size_t length = 0;
      if (!absl::SimpleAtoi(response->headers["content-length"], &length) ||
          !ReadExactly(length, &response->body)) {
        return std::nullopt;
      }
    }
    return response;
  }

 private:
  bool Fill() {
    char data[65536];
    const ssize_t n = recv(fd_, data, sizeof(data), 0);
    if (n <= 0) return false;
    buffer_.append(data, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string buffer_;
};

std::optional<HttpResponse> Request(int port, const std::string& method, const std::string& path,
                                    const std::string& body = "",
                                    const std::vector<std::string>& headers = {}) {
  RawConnection connection(port);
  if (!connection.ok() || !connection.SendRequest(method, path, body, headers)) {
    return std::nullopt;
  }
  return connection.ReadResponse();
}

json ParseJson(const std::string& text) { return json::parse(text, nullptr, false); }

// The "data: " events of a Server-Sent Events body, in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> events;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
    events.emplace_back(event.substr(6));
  }
  return events;
}

// What an OpenAI answer (streaming or not) says, in the gRPC API's terms.
struct HttpAnswer {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

HttpAnswer ReadAnswer(const HttpResponse& response, bool stream, bool chat) {
  HttpAnswer answer;
  auto add_tokens = [&answer](const json& object) {
    if (object.contains("bitsplit") && object["bitsplit"].contains("token_ids")) {
      for (const json& id : object["bitsplit"]["token_ids"]) answer.tokens.push_back(id);
    }
  };
  if (!stream) {
    const json body = ParseJson(response.body);
    const json& choice = body["choices"][0];
    answer.text =
        chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
    answer.finish_reason = choice["finish_reason"];
    answer.prompt_tokens = body["usage"]["prompt_tokens"];
    answer.completion_tokens = body["usage"]["completion_tokens"];
    answer.cached_tokens = body["usage"]["prompt_tokens_details"]["cached_tokens"];
    add_tokens(body);
    return answer;
  }
  const std::vector<std::string> events = SseData(response.body);
  EXPECT_FALSE(events.empty());
  if (events.empty()) return answer;
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json event = ParseJson(events[i]);
    EXPECT_FALSE(event.is_discarded()) << events[i];
    if (event.contains("usage") && event["usage"].is_object()) {
      answer.prompt_tokens = event["usage"]["prompt_tokens"];
      answer.completion_tokens = event["usage"]["completion_tokens"];
      answer.cached_tokens = event["usage"]["prompt_tokens_details"]["cached_tokens"];
    }
    if (!event.contains("choices") || event["choices"].empty()) continue;
    const json& choice = event["choices"][0];
    if (chat) {
      if (choice["delta"].contains("content")) answer.text += choice["delta"]["content"];
    } else {
      answer.text += choice["text"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) answer.finish_reason = choice["finish_reason"];
    if (choice["finish_reason"].is_null()) add_tokens(event);
  }
  return answer;
}

std::string FinishReasonName(v1::FinishReason reason) {
  return reason == v1::FINISH_REASON_LENGTH ? "length" : "stop";
}

// ---- The stack: the three services, the coordinator with --http -------------------------------

int HttpPortOf(const ServiceProcess& coordinator) {
  const std::regex pattern(R"(HTTP API on http://127\.0\.0\.1:(\d+))");
  std::smatch match;
  const std::string log = coordinator.Stderr();
  if (!std::regex_search(log, match, pattern)) return -1;
  return std::stoi(match[1]);
}

class E2eHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stack_ = new GenerationStack();
    GenerationStack::Options options;
    options.coordinator_args = {"--http", "127.0.0.1:0", "--served-model-name", "smollm2"};
    const std::string dir = (testing::TestTempDir() / "e2e_http").string();
    if (!stack_->Start(testing::SmolLm2SplitModel(), dir, options)) return;
    port_ = HttpPortOf(stack_->coordinator);
  }
  static void TearDownTestSuite() {
    delete stack_;
    stack_ = nullptr;
  }
  void SetUp() override {
    ASSERT_GT(port_, 0) << "no HTTP port in the coordinator's log:\n"
                        << stack_->coordinator.Stderr();
  }

  // The drafter's open sessions, from its GetInfo.
  static int OpenSessions() {
    auto client = rpc::DrafterClient::Connect(stack_->DrafterTarget(), std::chrono::seconds(5),
                                              std::chrono::seconds(5));
    if (!client.ok()) return -1;
    auto info = (*client)->GetInfo();
    return info.ok() ? info->open_sessions() : -1;
  }
  static bool WaitForNoSessions(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (OpenSessions() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 public:
  static GenerationStack* stack_;
  static int port_;
};
GenerationStack* E2eHttpTest::stack_ = nullptr;
int E2eHttpTest::port_ = -1;

const json kMessages =
    json::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});
constexpr char kPrompt[] = "Once upon a time, in a small village,";

// The gRPC request equal to an OpenAI body of these tests.
v1::GenerateRequest GrpcRequestFor(bool chat, float temperature, uint64_t seed, int max_tokens,
                                   const json& speculation) {
  v1::GenerateRequest request;
  if (chat) {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role("user");
    message->set_content(kMessages[0]["content"]);
  } else {
    request.set_prompt(kPrompt);
  }
  request.set_max_tokens(max_tokens);
  request.set_temperature(temperature);
  request.set_seed(seed);
  if (speculation.value("mode", "") == "tree") {
    *request.mutable_speculation() =
        testing::Tree(speculation["nodes"], speculation["expansions"], speculation["max_depth"]);
  } else {
    *request.mutable_speculation() = testing::Off();
  }
  return request;
}

TEST_F(E2eHttpTest, AnswersEqualTheGrpcApiTokenForToken) {
  const json tree = {{"mode", "tree"}, {"nodes", 6}, {"expansions", 2}, {"max_depth", 4}};
  const json off = {{"mode", "off"}};
  struct Case {
    bool chat;
    float temperature;
    uint64_t seed;
    json speculation;
    bool stream;
  };
  const std::vector<Case> cases = {
      {true, 0.0f, 0, off, false}, {true, 0.0f, 0, tree, true},   {true, 0.8f, 3, tree, false},
      {true, 0.8f, 3, off, true},  {false, 0.0f, 0, tree, false}, {false, 0.8f, 5, off, true},
  };
  constexpr int kMaxTokens = 20;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.chat ? "chat" : "completions", " T=", c.temperature, " seed ",
                              c.seed, " ", c.speculation.dump(), c.stream ? " stream" : ""));
    json body = {{"model", "smollm2"},           {"max_tokens", kMaxTokens},
                 {"temperature", c.temperature}, {"seed", c.seed},
                 {"stream", c.stream},           {"bitsplit", {{"speculation", c.speculation}}}};
    if (c.stream) body["stream_options"] = {{"include_usage", true}};
    if (c.chat) {
      body["messages"] = kMessages;
    } else {
      body["prompt"] = kPrompt;
    }
    const std::optional<HttpResponse> response =
        Request(port_, "POST", c.chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
    ASSERT_TRUE(response.has_value());
    ASSERT_EQ(response->status, 200) << response->body;
    const HttpAnswer http = ReadAnswer(*response, c.stream, c.chat);
    const testing::StreamResult grpc =
        stack_->Generate(GrpcRequestFor(c.chat, c.temperature, c.seed, kMaxTokens, c.speculation));
    ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
    ASSERT_TRUE(grpc.complete.has_value());
    EXPECT_EQ(http.tokens, grpc.tokens);
    EXPECT_EQ(http.text, grpc.text);
    EXPECT_EQ(http.finish_reason, FinishReasonName(grpc.complete->finish_reason()));
    EXPECT_EQ(http.completion_tokens, grpc.complete->usage().completion_tokens());
    EXPECT_EQ(http.prompt_tokens, grpc.complete->usage().prompt_tokens());
    EXPECT_FALSE(http.tokens.empty());
  }
}

// The value of an unlabelled metric in a /metrics scrape.
double MetricValue(int port, const std::string& name) {
  const std::optional<HttpResponse> response = Request(port, "GET", "/metrics", "");
  EXPECT_TRUE(response.has_value() && response->status == 200);
  if (!response.has_value()) return -1;
  for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
    if (absl::StartsWith(line, name + " ")) return std::stod(std::string(line.substr(name.size())));
  }
  ADD_FAILURE() << name << " not in /metrics";
  return -1;
}

// A conversation's next turn takes the previous turn's session from the drafter's prefix cache:
// usage reports the reused prompt tokens, the answer equals the one without the cache
// (`cache_prompt: false`), and /metrics counts the hit.
TEST_F(E2eHttpTest, NextTurnReusesThePreviousTurnsPrefixExactly) {
  json messages = json::array({{{"role", "system"}, {"content", "You answer in one sentence."}},
                               {{"role", "user"}, {"content", "Name a large river in Europe."}}});
  const auto ask = [&](bool stream, bool cache_prompt) {
    json body = {
        {"model", "smollm2"},
        {"messages", messages},
        {"max_tokens", 24},
        {"temperature", 0},
        {"stream", stream},
        {"cache_prompt", cache_prompt},
        {"bitsplit",
         {{"speculation", {{"mode", "tree"}, {"nodes", 6}, {"expansions", 2}, {"max_depth", 4}}}}}};
    if (stream) body["stream_options"] = {{"include_usage", true}};
    const std::optional<HttpResponse> response =
        Request(port_, "POST", "/v1/chat/completions", body.dump());
    EXPECT_TRUE(response.has_value());
    if (!response.has_value()) return HttpAnswer();
    EXPECT_EQ(response->status, 200) << response->body;
    return ReadAnswer(*response, stream, /*chat=*/true);
  };
  const double hits_before = MetricValue(port_, "bitsplit:drafter_prefix_cache_hits_total");
  const HttpAnswer first = ask(false, true);
  ASSERT_FALSE(first.text.empty());
  messages.push_back({{"role", "assistant"}, {"content", first.text}});
  messages.push_back({{"role", "user"}, {"content", "How long is it?"}});
  const HttpAnswer cached = ask(true, true);
  const HttpAnswer fresh = ask(false, false);
  // The first turn's prompt is a prefix of the second's (its last token may merge with the
  // answer's first when the answer is encoded again).
  EXPECT_GE(cached.cached_tokens, first.prompt_tokens - 1);
  EXPECT_LT(cached.cached_tokens, cached.prompt_tokens);
  EXPECT_EQ(fresh.cached_tokens, 0);
  EXPECT_EQ(cached.text, fresh.text);
  EXPECT_EQ(cached.prompt_tokens, fresh.prompt_tokens);
  EXPECT_GE(MetricValue(port_, "bitsplit:drafter_prefix_cache_hits_total"), hits_before + 1);
  EXPECT_GT(MetricValue(port_, "bitsplit:drafter_prefix_cache_hit_ratio"), 0.0);
  EXPECT_GE(MetricValue(port_, "bitsplit:drafter_prefix_cache_tokens_total"), cached.cached_tokens);
}

// Structured output through the three processes: with a JSON Schema (and json_object) every
// answer is a JSON document of the schema, and a draft tree changes nothing: the tokens equal
// those of the verifier alone (speculation off: plain constrained decoding), greedy and sampled.
TEST_F(E2eHttpTest, StructuredOutputIsValidAndLosslessWithTrees) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
      "confidence": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string", "enum": ["geo", "city", "other"]},
               "maxItems": 2}},
      "required": ["answer", "confidence", "tags"], "additionalProperties": false})");
  const json tree = {{"mode", "tree"}, {"nodes", 8}, {"expansions", 2}, {"max_depth", 4}};
  const json off = {{"mode", "off"}};
  const json messages = json::array(
      {{{"role", "user"}, {"content", "Is Paris the capital of France? Answer in JSON."}}});
  const auto ask = [&](const json& format, const json& speculation, float temperature) {
    const json body = {{"model", "smollm2"},
                       {"messages", messages},
                       {"max_tokens", 48},
                       {"temperature", temperature},
                       {"seed", 11},
                       {"response_format", format},
                       {"bitsplit", {{"speculation", speculation}}}};
    const std::optional<HttpResponse> response =
        Request(port_, "POST", "/v1/chat/completions", body.dump());
    EXPECT_TRUE(response.has_value());
    if (!response.has_value()) return HttpAnswer();
    EXPECT_EQ(response->status, 200) << response->body << stack_->drafter.Stderr();
    return ReadAnswer(*response, /*stream=*/false, /*chat=*/true);
  };
  const json with_schema = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "verdict"}, {"strict", true}, {"schema", schema}}}};
  for (const float temperature : {0.0f, 0.9f}) {
    SCOPED_TRACE(absl::StrCat("T=", temperature));
    const HttpAnswer plain = ask(with_schema, off, temperature);
    const HttpAnswer speculative = ask(with_schema, tree, temperature);
    EXPECT_EQ(speculative.tokens, plain.tokens);
    EXPECT_EQ(speculative.text, plain.text);
    ASSERT_EQ(plain.finish_reason, "stop") << plain.text;  // the document completed, then EOS
    const json document = json::parse(plain.text, nullptr, false);
    ASSERT_TRUE(document.is_object()) << plain.text;
    EXPECT_EQ(document.size(), 3u) << plain.text;
    EXPECT_TRUE(document["answer"] == "yes" || document["answer"] == "no" ||
                document["answer"] == "maybe")
        << plain.text;
    EXPECT_TRUE(document["confidence"].is_number_integer()) << plain.text;
    ASSERT_TRUE(document["tags"].is_array()) << plain.text;
    EXPECT_LE(document["tags"].size(), 2u);
    // Any JSON object.
    const HttpAnswer object = ask({{"type", "json_object"}}, tree, temperature);
    EXPECT_EQ(object.tokens, ask({{"type", "json_object"}}, off, temperature).tokens);
    EXPECT_EQ(object.text.front(), '{') << object.text;
  }
  // A schema keyword the constraint does not implement is refused by name, before generating.
  const json bad = {
      {"model", "smollm2"},
      {"messages", messages},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a+"}}}}}}}};
  const std::optional<HttpResponse> refused =
      Request(port_, "POST", "/v1/chat/completions", bad.dump());
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 400);
  EXPECT_THAT(refused->body, ::testing::HasSubstr("pattern"));
}

TEST_F(E2eHttpTest, StreamIsServerSentEventsInChunksOnAKeptAliveConnection) {
  RawConnection connection(port_);
  ASSERT_TRUE(connection.ok());
  const json body = {{"model", "smollm2"},
                     {"messages", kMessages},
                     {"max_tokens", 12},
                     {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"bitsplit", {{"speculation", {{"mode", "off"}}}}}};
  ASSERT_TRUE(connection.SendRequest("POST", "/v1/chat/completions", body.dump()));
  std::optional<HttpResponse> response = connection.ReadHead();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers["content-type"], "text/event-stream");
  EXPECT_EQ(response->headers["cache-control"], "no-cache");
  ASSERT_TRUE(response->chunked) << "Transfer-Encoding: " << response->headers["transfer-encoding"];
  // Each event travels as its own chunk, as soon as it exists.
  std::vector<std::string> chunks;
  while (true) {
    std::optional<std::string> chunk = connection.ReadChunk(*response);
    ASSERT_TRUE(chunk.has_value());
    if (chunk->empty()) break;
    chunks.push_back(*chunk);
  }
  std::string trailer;
  ASSERT_TRUE(connection.ReadUntil("\r\n", &trailer));
  ASSERT_GE(chunks.size(), 4u);  // role, at least one token, finish, usage, [DONE]
  for (const std::string& chunk : chunks) {
    EXPECT_TRUE(absl::StartsWith(chunk, "data: ")) << chunk;
    EXPECT_TRUE(absl::EndsWith(chunk, "\n\n")) << chunk;
  }
  EXPECT_EQ(chunks.back(), "data: [DONE]\n\n");
  const json first = ParseJson(chunks.front().substr(6));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json usage = ParseJson(chunks[chunks.size() - 2].substr(6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(
      usage["usage"]["total_tokens"].get<int>(),
      usage["usage"]["prompt_tokens"].get<int>() + usage["usage"]["completion_tokens"].get<int>());
  const json last = ParseJson(chunks[chunks.size() - 3].substr(6));
  EXPECT_FALSE(last["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(last["bitsplit"]["speculation"]["shape"], "off");

  // The same connection serves the next requests (keep-alive).
  ASSERT_TRUE(connection.SendRequest("GET", "/v1/models", ""));
  std::optional<HttpResponse> models = connection.ReadResponse();
  ASSERT_TRUE(models.has_value());
  EXPECT_EQ(models->status, 200);
  const json list = ParseJson(models->body);
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "smollm2");
  EXPECT_EQ(list["data"][0]["owned_by"], "bitsplit");
  EXPECT_EQ(list["data"][0]["bitsplit"]["architecture"], "llama");
  EXPECT_THAT(list["data"][0]["bitsplit"]["base_format"].get<std::string>(), HasSubstr("b2"));
  json plain = body;
  plain["stream"] = false;
  plain.erase("stream_options");
  ASSERT_TRUE(connection.SendRequest("POST", "/v1/chat/completions", plain.dump()));
  std::optional<HttpResponse> answer = connection.ReadResponse();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->headers["content-type"], "application/json");
  EXPECT_EQ(ParseJson(answer->body)["object"], "chat.completion");
}

// The gRPC API's INVALID_ARGUMENT message for the same request.
std::string GrpcMessageFor(const v1::GenerateRequest& request) {
  const testing::StreamResult result = E2eHttpTest::stack_->Generate(request);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  return result.status.error_message();
}

TEST_F(E2eHttpTest, ErrorsHaveOpenAiShapeAndStatus) {
  auto expect_error = [this](const std::optional<HttpResponse>& response, int status,
                             const std::string& type, const std::string& needle) {
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->status, status) << response->body;
    EXPECT_EQ(response->headers.at("content-type"), "application/json");
    const json body = ParseJson(response->body);
    ASSERT_TRUE(body.contains("error")) << response->body;
    EXPECT_EQ(body["error"]["type"], type) << response->body;
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"].contains("code"));
    EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr(needle));
  };
  const json chat = {{"model", "smollm2"}, {"messages", kMessages}, {"max_tokens", 4}};
  auto with = [&chat](const json& patch) {
    json body = chat;
    body.merge_patch(patch);
    return body.dump();
  };
  expect_error(Request(port_, "GET", "/v2/nothing"), 404, "not_found_error", "no route");
  expect_error(Request(port_, "POST", "/v1/chat/completions", with({{"model", "gpt-4o"}})), 404,
               "not_found_error", "gpt-4o");
  expect_error(Request(port_, "GET", "/v1/models/gpt-4o"), 404, "not_found_error", "gpt-4o");
  expect_error(Request(port_, "POST", "/v1/chat/completions", "{\"model\": "), 400,
               "invalid_request_error", "not valid JSON");
  expect_error(Request(port_, "POST", "/v1/chat/completions", "[1, 2]"), 400,
               "invalid_request_error", "JSON object");
  expect_error(Request(port_, "POST", "/v1/chat/completions", with({{"n", 2}})), 400,
               "invalid_request_error", "n: only 1");
  expect_error(Request(port_, "POST", "/v1/chat/completions",
                       with({{"tools", json::array({{{"type", "function"}}})}})),
               400, "invalid_request_error", "tool");
  expect_error(
      Request(port_, "POST", "/v1/chat/completions",
              with({{"response_format",
                     {{"type", "json_schema"},
                      {"json_schema",
                       {{"name", "x"}, {"schema", {{"type", "string"}, {"format", "email"}}}}}}}})),
      400, "invalid_request_error", "response_format");
  expect_error(
      Request(port_, "POST", "/v1/completions", json({{"prompt", json::array({"a", "b"})}}).dump()),
      400, "invalid_request_error", "one prompt");
  // A body over --max-request-bytes (4 MiB) is refused before it is read.
  expect_error(Request(port_, "POST", "/v1/chat/completions", std::string(5 << 20, ' ')), 413,
               "invalid_request_error", "larger");
  // The generation's own validation: the same message as the gRPC API's.
  v1::GenerateRequest grpc = GrpcRequestFor(true, 0.0f, 0, 4, json::object());
  grpc.set_temperature(-1.0f);
  expect_error(Request(port_, "POST", "/v1/chat/completions", with({{"temperature", -1}})), 400,
               "invalid_request_error", GrpcMessageFor(grpc));
  grpc = GrpcRequestFor(true, 0.0f, 0, 1 << 30, json::object());
  expect_error(Request(port_, "POST", "/v1/chat/completions", with({{"max_tokens", 1 << 30}})), 400,
               "invalid_request_error", GrpcMessageFor(grpc));
  grpc = GrpcRequestFor(true, 0.0f, 0, 4, json::object());
  grpc.add_stop("");
  expect_error(Request(port_, "POST", "/v1/chat/completions", with({{"stop", json::array({""})}})),
               400, "invalid_request_error", GrpcMessageFor(grpc));
}

TEST_F(E2eHttpTest, ClientThatDisconnectsFreesItsSession) {
  ASSERT_TRUE(WaitForNoSessions(std::chrono::seconds(5)));
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streaming" : "not streaming");
    const json body = {{"model", "smollm2"}, {"prompt", kPrompt},
                       {"max_tokens", 1000}, {"temperature", 0},
                       {"stream", stream},   {"bitsplit", {{"speculation", {{"mode", "off"}}}}}};
    RawConnection connection(port_);
    ASSERT_TRUE(connection.ok());
    ASSERT_TRUE(connection.SendRequest("POST", "/v1/completions", body.dump()));
    if (stream) {
      std::optional<HttpResponse> head = connection.ReadHead();
      ASSERT_TRUE(head.has_value());
      ASSERT_EQ(head->status, 200);
      ASSERT_TRUE(connection.ReadChunk(*head).has_value());  // the first token is out
    } else {
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (OpenSessions() != 1 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_EQ(OpenSessions(), 1);
    }
    const Clock::time_point closed = Clock::now();
    connection.Close();
    EXPECT_TRUE(WaitForNoSessions(std::chrono::seconds(2)));
    std::printf("%s: the session closed %.0f ms after the client did\n",
                stream ? "streaming" : "non-streaming",
                std::chrono::duration<double, std::milli>(Clock::now() - closed).count());
  }
}

TEST_F(E2eHttpTest, EightConcurrentStreamsAllComplete) {
  std::vector<std::future<std::optional<HttpResponse>>> streams;
  for (int i = 0; i < 8; ++i) {
    const json body = {{"model", "smollm2"},
                       {"messages", kMessages},
                       {"max_tokens", 12},
                       {"temperature", 0.8},
                       {"seed", 100 + i},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}},
                       {"bitsplit", {{"speculation", {{"mode", i % 2 ? "off" : "adaptive"}}}}}};
    streams.push_back(std::async(std::launch::async, [this, body] {
      return Request(port_, "POST", "/v1/chat/completions", body.dump());
    }));
  }
  for (auto& stream : streams) {
    const std::optional<HttpResponse> response = stream.get();
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->status, 200) << response->body;
    const HttpAnswer answer = ReadAnswer(*response, true, true);
    EXPECT_FALSE(answer.finish_reason.empty());
    EXPECT_GT(answer.completion_tokens, 0);
    EXPECT_EQ(static_cast<int>(answer.tokens.size()), answer.completion_tokens);
  }
}

TEST_F(E2eHttpTest, HealthAndReadinessFollowTheDrafterAndTheResidual) {
  std::optional<HttpResponse> health = Request(port_, "GET", "/health");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);
  std::optional<HttpResponse> ready = Request(port_, "GET", "/ready");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 200) << ready->body;

  stack_->drafter.Kill(SIGKILL);
  health = Request(port_, "GET", "/health");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);  // the coordinator itself is alive
  ready = Request(port_, "GET", "/ready");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 503) << ready->body;
  const json answer = {{"model", "smollm2"}, {"messages", kMessages}, {"max_tokens", 4}};
  std::optional<HttpResponse> refused =
      Request(port_, "POST", "/v1/chat/completions", answer.dump());
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_EQ(ParseJson(refused->body)["error"]["type"], "server_error");

  ASSERT_TRUE(stack_->RestartStopped());
  auto wait_ready = [this](int status) {
    std::optional<HttpResponse> last;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      last = Request(port_, "GET", "/ready");
      if (last && last->status == status) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return last;
  };
  ready = wait_ready(200);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 200) << ready->body;

  // cpu-residual down: not ready (the drafter answers, its residual does not), ready again
  // once it is back.
  stack_->residual.Kill(SIGKILL);
  ready = wait_ready(503);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 503) << ready->body;
  EXPECT_THAT(ready->body, HasSubstr("cpu-residual"));
  ASSERT_TRUE(stack_->RestartStopped());
  ready = wait_ready(200);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 200) << ready->body;
}

// A second coordinator on the same drafter: an API key, and room for one request only.
TEST_F(E2eHttpTest, ApiKeyAndAFullQueue) {
  const std::string key_file = (testing::TestTempDir() / "api-key").string();
  std::ofstream(key_file) << "s3cret-key\n";
  ServiceProcess guarded(kCoordinatorBinary);
  ASSERT_TRUE(guarded.Start({"--model", testing::SmolLm2SplitModel().base, "--drafter",
                             stack_->DrafterTarget(), "--socket", stack_->dir() + "/guarded.sock",
                             "--http", "127.0.0.1:0", "--api-key-file", key_file, "--max-active",
                             "1", "--max-queue", "0"}));
  ASSERT_TRUE(guarded.WaitServing("unix:" + stack_->dir() + "/guarded.sock")) << guarded.Stderr();
  const int port = HttpPortOf(guarded);
  ASSERT_GT(port, 0) << guarded.Stderr();
  // No --served-model-name: the base file's name without .base.bsplit.
  const json body = {{"model", "smollm2_split"}, {"messages", kMessages}, {"max_tokens", 4}};

  for (const std::vector<std::string>& headers : {std::vector<std::string>{},
                                                  {"Authorization: Bearer wrong"},
                                                  {"Authorization: s3cret-key"}}) {
    std::optional<HttpResponse> refused =
        Request(port, "POST", "/v1/chat/completions", body.dump(), headers);
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->status, 401);
    EXPECT_EQ(refused->headers["www-authenticate"], "Bearer");
    EXPECT_EQ(ParseJson(refused->body)["error"]["type"], "authentication_error");
  }
  std::optional<HttpResponse> metrics = Request(port, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->status, 401);
  std::optional<HttpResponse> health = Request(port, "GET", "/health");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);  // probes need no key
  const std::string bearer = "Authorization: Bearer s3cret-key";
  std::optional<HttpResponse> served_answer =
      Request(port, "POST", "/v1/chat/completions", body.dump(), {bearer});
  ASSERT_TRUE(served_answer.has_value());
  EXPECT_EQ(served_answer->status, 200) << served_answer->body;

  // One long stream takes the only slot; the next request is refused with 429.
  json holder = body;
  holder["max_tokens"] = 1000;
  holder["stream"] = true;
  holder["bitsplit"] = {{"speculation", {{"mode", "off"}}}};
  RawConnection stream(port);
  ASSERT_TRUE(stream.SendRequest("POST", "/v1/chat/completions", holder.dump(), {bearer}));
  std::optional<HttpResponse> head = stream.ReadHead();
  ASSERT_TRUE(head.has_value());
  ASSERT_EQ(head->status, 200);
  ASSERT_TRUE(stream.ReadChunk(*head).has_value());
  std::optional<HttpResponse> busy =
      Request(port, "POST", "/v1/chat/completions", body.dump(), {bearer});
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->status, 429) << busy->body;
  EXPECT_EQ(ParseJson(busy->body)["error"]["type"], "rate_limit_error");
  EXPECT_THAT(ParseJson(busy->body)["error"]["message"].get<std::string>(),
              HasSubstr("the server is busy"));
  stream.Close();
  guarded.Kill(SIGKILL);
}

// SIGTERM with an HTTP stream running: the stream ends with an error event and [DONE], its
// session is closed, and the process exits 0.
TEST_F(E2eHttpTest, SigtermEndsHttpStreamsAndExitsCleanly) {
  ServiceProcess coordinator(kCoordinatorBinary);
  ASSERT_TRUE(coordinator.Start({"--model", testing::SmolLm2SplitModel().base, "--drafter",
                                 stack_->DrafterTarget(), "--socket",
                                 stack_->dir() + "/sigterm.sock", "--http", "127.0.0.1:0"}));
  ASSERT_TRUE(coordinator.WaitServing("unix:" + stack_->dir() + "/sigterm.sock"))
      << coordinator.Stderr();
  const int port = HttpPortOf(coordinator);
  ASSERT_GT(port, 0);
  const json body = {
      {"model", "smollm2_split"}, {"prompt", kPrompt},
      {"max_tokens", 1000},       {"temperature", 0},
      {"stream", true},           {"bitsplit", {{"speculation", {{"mode", "off"}}}}}};
  RawConnection stream(port);
  ASSERT_TRUE(stream.SendRequest("POST", "/v1/completions", body.dump()));
  std::optional<HttpResponse> head = stream.ReadHead();
  ASSERT_TRUE(head.has_value());
  ASSERT_EQ(head->status, 200);
  ASSERT_TRUE(stream.ReadChunk(*head).has_value());
  coordinator.Signal(SIGTERM);
  std::string rest;
  while (std::optional<std::string> chunk = stream.ReadChunk(*head)) {
    if (chunk->empty()) break;
    rest += *chunk;
  }
  const std::vector<std::string> events = SseData(rest);
  ASSERT_GE(events.size(), 2u) << rest;
  EXPECT_EQ(events.back(), "[DONE]");
  const json error = ParseJson(events[events.size() - 2]);
  ASSERT_TRUE(error.contains("error")) << events[events.size() - 2];
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("shutting down"));
  EXPECT_EQ(coordinator.Wait(std::chrono::seconds(20)), 0) << coordinator.Stderr();
  EXPECT_TRUE(WaitForNoSessions(std::chrono::seconds(5)));
}

// Runs tests/http/openai_client_check.py with `arguments` in the test venv's python; its output.
std::string RunClientCheck(const std::string& arguments, int* exit_status) {
  // scripts/test.sh exports the venv's python; otherwise the script makes (once) and names it.
  std::string python;
  if (const char* exported = std::getenv("BITSPLIT_TEST_PYTHON"); exported != nullptr) {
    python = exported;
  } else {
    FILE* venv = popen(testing::SourcePath("scripts/test-venv.sh").c_str(), "r");
    if (venv != nullptr) {
      char line[4096] = {};
      if (fgets(line, sizeof(line), venv) != nullptr) {
        python = std::string(absl::StripAsciiWhitespace(line));
      }
      pclose(venv);
    }
  }
  if (python.empty() || !std::filesystem::exists(python)) {
    *exit_status = -1;
    return "no python with the test clients: run scripts/test-venv.sh (it needs PyPI once)";
  }
  const std::string command =
      absl::StrCat(python, " ", testing::SourcePath("tests/http/openai_client_check.py"), " ",
                   arguments, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_status = -1;
    return "popen failed";
  }
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  *exit_status = pclose(pipe);
  std::printf("%s", output.c_str());
  return output;
}

TEST_F(E2eHttpTest, OfficialOpenAiClientAndPrometheusParser) {
  int status = 0;
  const std::string output = RunClientCheck(
      absl::StrCat("--base-url http://127.0.0.1:", port_, "/v1 --model smollm2"), &status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("ok: structured output"));
  EXPECT_THAT(output, HasSubstr("ok: metrics"));
}

// The source of a template of the committed corpus (tests/fixtures/chat_templates/corpus.json,
// taken from the pinned llama-cpp-python sdist).
std::string CorpusTemplate(const std::string& file) {
  std::ifstream in(testing::SourcePath("tests/fixtures/chat_templates/corpus.json"));
  const json corpus = json::parse(in);
  for (const json& entry : corpus["templates"]) {
    if (entry["file"] == file) return entry["source"].get<std::string>();
  }
  ADD_FAILURE() << "no template " << file << " in the corpus";
  return "";
}

// Qwen 2.5's template (ChatML, as SmolLM2's own, plus Hermes <tool_call> blocks) given to a second
// coordinator with --chat-template-file, on the same drafter: tool_choice "required" and a named
// function give a call in OpenAI's shape, the same with and without speculation (the constrained
// output is lossless), and the official client's tool-call checks pass.
TEST_F(E2eHttpTest, ForcedToolCallsThroughAToolTemplate) {
  const std::filesystem::path dir = testing::TestTempDir() / "e2e_http_tools";
  std::filesystem::create_directories(dir);
  const std::string template_path = (dir / "qwen2.5.jinja").string();
  {
    std::ofstream out(template_path, std::ios::binary);
    out << CorpusTemplate("Qwen-Qwen2.5-7B-Instruct.jinja");
  }
  ServiceProcess coordinator(kCoordinatorBinary);
  ASSERT_TRUE(coordinator.Start(
      {"--model", testing::SmolLm2SplitModel().base, "--drafter", stack_->DrafterTarget(),
       "--socket", (dir / "coordinator.sock").string(), "--http", "127.0.0.1:0",
       "--served-model-name", "smollm2-tools", "--chat-template-file", template_path}));
  ASSERT_TRUE(coordinator.WaitServing("unix:" + (dir / "coordinator.sock").string(),
                                      std::chrono::seconds(60)))
      << coordinator.Stderr();
  const int port = HttpPortOf(coordinator);
  ASSERT_GT(port, 0) << coordinator.Stderr();

  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
        "days": {"type": "integer"}}, "required": ["city", "days"]}}},
      {"type": "function", "function": {"name": "get_time"}}])");
  const json tree = {{"mode", "tree"}, {"nodes", 8}, {"expansions", 2}, {"max_depth", 4}};
  const json off = {{"mode", "off"}};
  const auto ask = [&](const json& tool_choice, const json& speculation, float temperature) {
    const json body = {
        {"model", "smollm2-tools"},
        {"messages", json::array({{{"role", "user"}, {"content", "Weather in Lyon, 3 days?"}}})},
        {"tools", tools},
        {"tool_choice", tool_choice},
        {"max_tokens", 48},
        {"temperature", temperature},
        {"seed", 7},
        {"bitsplit", {{"speculation", speculation}}}};
    const std::optional<HttpResponse> response =
        Request(port, "POST", "/v1/chat/completions", body.dump());
    EXPECT_TRUE(response.has_value() && response->status == 200)
        << (response ? response->body : "no response");
    return response ? ParseJson(response->body) : json();
  };
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const json& choice : {json("required"), named}) {
    for (const float temperature : {0.0f, 0.8f}) {
      SCOPED_TRACE(absl::StrCat(choice.dump(), " T=", temperature));
      const json plain = ask(choice, off, temperature);
      const json speculative = ask(choice, tree, temperature);
      ASSERT_TRUE(plain.contains("choices")) << plain.dump();
      EXPECT_EQ(speculative["bitsplit"]["token_ids"], plain["bitsplit"]["token_ids"]);
      const json& answer = plain["choices"][0];
      EXPECT_EQ(answer["finish_reason"], "tool_calls") << answer.dump();
      ASSERT_EQ(answer["message"]["tool_calls"].size(), 1u) << answer.dump();
      const json& call = answer["message"]["tool_calls"][0];
      if (choice.is_object()) {
        EXPECT_EQ(call["function"]["name"], "get_weather");
      }
      const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
      if (call["function"]["name"] == "get_weather") {
        EXPECT_TRUE(arguments["city"].is_string() && arguments["days"].is_number_integer())
            << arguments.dump();
      } else {
        EXPECT_TRUE(arguments.is_object());
      }
      // The same message but for the call's id, which is drawn per request.
      json speculative_message = speculative["choices"][0]["message"];
      json message = answer["message"];
      speculative_message["tool_calls"][0].erase("id");
      message["tool_calls"][0].erase("id");
      EXPECT_EQ(speculative_message, message);
    }
  }

  int status = 0;
  const std::string output = RunClientCheck(
      absl::StrCat("--base-url http://127.0.0.1:", port, "/v1 --model smollm2-tools --tool-calls"),
      &status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("ok: forced tool calls"));
  coordinator.Kill(SIGTERM);
}

// A frame around a constrained document, by gRPC: the prefix's control token comes first, shown
// in the text only when render_token_ids names it, and the suffix closes the document before the
// end; speculation changes nothing.
TEST_F(E2eHttpTest, FramedDocumentsAndRenderedControlTokens) {
  const text::Tokenizer& tokenizer = stack_->tokenizer();
  const std::vector<int32_t> start = tokenizer.Encode("<|im_start|>", /*parse_special=*/true);
  ASSERT_EQ(start.size(), 1u);
  ASSERT_TRUE(tokenizer.IsControl(start[0]));
  const auto generate = [&](bool render, const json& speculation) {
    v1::GenerateRequest request = GrpcRequestFor(true, 0.8f, 5, 40, speculation);
    request.set_response_schema(R"({"type": "object", "properties": {"answer":
        {"enum": ["yes", "no"]}}, "required": ["answer"]})");
    request.set_response_prefix("<|im_start|>");
    request.set_response_suffix("\n");
    if (render) request.add_render_token_ids(start[0]);
    return stack_->Generate(request);
  };
  const json tree = {{"mode", "tree"}, {"nodes", 8}, {"expansions", 2}, {"max_depth", 4}};
  const testing::StreamResult shown = generate(true, tree);
  const testing::StreamResult hidden = generate(false, json::object());
  ASSERT_TRUE(shown.status.ok()) << shown.status.error_message();
  ASSERT_TRUE(hidden.status.ok()) << hidden.status.error_message();
  EXPECT_EQ(shown.tokens, hidden.tokens);
  ASSERT_FALSE(shown.tokens.empty());
  EXPECT_EQ(shown.tokens[0], start[0]);
  EXPECT_EQ(shown.text, "<|im_start|>" + hidden.text);
  ASSERT_TRUE(hidden.complete.has_value());
  EXPECT_EQ(hidden.complete->finish_reason(), v1::FINISH_REASON_EOS);
  ASSERT_FALSE(hidden.text.empty());
  EXPECT_EQ(hidden.text.back(), '\n');
  const json document = json::parse(hidden.text.substr(0, hidden.text.size() - 1));
  EXPECT_TRUE(document["answer"] == "yes" || document["answer"] == "no") << hidden.text;
}

}  // namespace
}  // namespace bitsplit
