// The coordinator's command-line client, run as the built `bitsplit` binary against the three real
// services (bitsplit-residual, bitsplit-drafter, bitsplit-coordinator, one thread each, unix
// sockets): `bitsplit chat --server` and `bitsplit generate --server` stream exactly the text the
// Generate stream carries and end with one stats line on stderr; bad input is one line and exit
// status 2; an unreachable server is one line and exit status 1.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bitsplit/v1/generation.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/service_process.h"
#include "tests/testing/shell.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

using ::testing::HasSubstr;
using testing::ServiceProcess;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds_to_first_output = -1;
  double seconds_total = 0;
};

// Runs the bitsplit binary; records when its first stdout bytes arrived.
Result Bitsplit(const std::vector<std::string>& args) {
  static int calls = 0;
  const std::string err_path =
      (testing::TestTempDir() / absl::StrCat("client-stderr.", calls++)).string();
  std::string command =
      testing::ShellQuote(std::string(BITSPLIT_BINARY_DIR) + "/tools/bitsplit/bitsplit");
  for (const std::string& arg : args) absl::StrAppend(&command, " ", testing::ShellQuote(arg));
  absl::StrAppend(&command, " 2>", testing::ShellQuote(err_path));
  Result result;
  const Clock::time_point start = Clock::now();
  std::FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return result;
  char buffer[256];
  ssize_t n;
  // read(2), not fread: the bytes must be seen as soon as the client flushes them.
  while ((n = read(fileno(pipe), buffer, sizeof(buffer))) > 0) {
    if (result.seconds_to_first_output < 0) {
      result.seconds_to_first_output = std::chrono::duration<double>(Clock::now() - start).count();
    }
    result.out.append(buffer, static_cast<size_t>(n));
  }
  const int status = pclose(pipe);
  result.seconds_total = std::chrono::duration<double>(Clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = testing::ReadFile(err_path);
  return result;
}

int Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

void ExpectOneLineError(const Result& result, int exit_code, const std::string& expected) {
  EXPECT_EQ(result.exit_code, exit_code) << result.err;
  EXPECT_EQ(Lines(result.err), 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr(expected));
  EXPECT_TRUE(result.out.empty()) << result.out;
}

class CliClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const testing::SplitModelPaths& model = testing::SmolLm2SplitModel();
    const std::string dir = (testing::TestTempDir() / "cli-client").string();
    std::filesystem::create_directories(dir);
    residual_socket_ = new std::string(dir + "/residual.sock");
    drafter_socket_ = new std::string(dir + "/drafter.sock");
    coordinator_socket_ = new std::string(dir + "/coordinator.sock");
    residual_ = new ServiceProcess(BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual");
    drafter_ = new ServiceProcess(BITSPLIT_BINARY_DIR "/services/gpu-drafter/bitsplit-drafter");
    coordinator_ =
        new ServiceProcess(BITSPLIT_BINARY_DIR "/services/coordinator/bitsplit-coordinator");
    if (!residual_->Start({model.residual, "--socket", *residual_socket_, "--threads", "1"}) ||
        !residual_->WaitServing("unix:" + *residual_socket_, std::chrono::seconds(60))) {
      ADD_FAILURE() << residual_->Stderr();
      return;
    }
    if (!drafter_->Start({model.base, "--residual-socket", "unix:" + *residual_socket_, "--socket",
                          *drafter_socket_, "--threads", "1", "--backend", "cpu"}) ||
        !drafter_->WaitServing("unix:" + *drafter_socket_, std::chrono::seconds(60))) {
      ADD_FAILURE() << drafter_->Stderr();
      return;
    }
    if (!coordinator_->Start({"--model", model.base, "--drafter", "unix:" + *drafter_socket_,
                              "--socket", *coordinator_socket_}) ||
        !coordinator_->WaitServing(Server(), std::chrono::seconds(60))) {
      ADD_FAILURE() << coordinator_->Stderr();
      return;
    }
    ready_ = true;
  }
  static void TearDownTestSuite() {
    for (ServiceProcess* process : {coordinator_, drafter_, residual_}) delete process;
    coordinator_ = drafter_ = residual_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << "the services did not start"; }

  static std::string Server() { return "unix:" + *coordinator_socket_; }

  // What the Generate stream itself carries for `request`: the text and the completion.
  static std::pair<std::string, v1::GenerateComplete> Stream(const v1::GenerateRequest& request) {
    auto stub =
        v1::Generation::NewStub(grpc::CreateChannel(Server(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse response;
    std::string text;
    v1::GenerateComplete complete;
    while (reader->Read(&response)) {
      if (response.has_chunk()) text += response.chunk().text();
      if (response.has_complete()) complete = response.complete();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return {text, complete};
  }

  static inline std::string* residual_socket_ = nullptr;
  static inline std::string* drafter_socket_ = nullptr;
  static inline std::string* coordinator_socket_ = nullptr;
  static inline ServiceProcess* residual_ = nullptr;
  static inline ServiceProcess* drafter_ = nullptr;
  static inline ServiceProcess* coordinator_ = nullptr;
  static inline bool ready_ = false;
};

// "[prompt 25 tokens | 120 tokens, 14.2 tok/s | spec tree N=16 k=4 depth<=8: 31 verify steps,
//   3.87 tokens/verify, depth acceptance 0.81 0.66 | ttft 85 ms | finish: eos]"
const std::regex kStatsLine(
    R"(\[prompt (\d+) tokens \| (\d+) tokens, [0-9.]+ tok/s \| spec (.+): (\d+) verify steps, )"
    R"([0-9.]+ tokens/verify(, depth acceptance( [0-9.]+)+)? \| ttft \d+ ms \| finish: )"
    R"((eos|length|stop)\]\n)");

TEST_F(CliClientTest, ChatStreamsTheReplyAndPrintsTheStatsLine) {
  const std::string message = "What is the capital of France?";
  const Result result = Bitsplit({"chat", "--server", Server(), message, "-n", "24",
                                  "--speculation", "tree", "--nodes", "8", "--expansions", "2"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  v1::GenerateRequest request;
  v1::ChatMessage* user = request.mutable_chat()->add_messages();
  user->set_role("user");
  user->set_content(message);
  request.set_max_tokens(24);
  request.mutable_speculation()->set_mode(v1::SpeculationSettings::MODE_TREE);
  request.mutable_speculation()->set_nodes(8);
  request.mutable_speculation()->set_expansions_per_step(2);
  const auto [text, complete] = Stream(request);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(result.out, text + "\n");

  std::smatch match;
  ASSERT_TRUE(std::regex_match(result.err, match, kStatsLine)) << result.err;
  EXPECT_EQ(std::stoi(match[1]), complete.usage().prompt_tokens());
  EXPECT_EQ(std::stoi(match[2]), complete.usage().completion_tokens());
  EXPECT_EQ(match[3], "tree N=8 k=2 depth<=8");
  EXPECT_EQ(match[7], complete.finish_reason() == v1::FINISH_REASON_EOS ? "eos" : "length");
}

TEST_F(CliClientTest, LocalGenerateCountsTheTokensTheServerCounts) {
  // An answer that ends with the end-of-generation token, which neither side counts.
  const std::string message = "What is the capital of France?";
  const testing::SplitModelPaths model = testing::SmolLm2SplitModel();
  const Result local = Bitsplit({"generate", "--model", model.base, "--residual", model.residual,
                                 "--chat", message, "-n", "48", "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  v1::GenerateRequest request;
  v1::ChatMessage* user = request.mutable_chat()->add_messages();
  user->set_role("user");
  user->set_content(message);
  request.set_max_tokens(48);
  const auto [text, complete] = Stream(request);
  ASSERT_EQ(complete.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(local.out, text + "\n");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(local.err, match, std::regex(R"(generated (\d+) tokens)")))
      << local.err;
  EXPECT_EQ(std::stoi(match[1]), complete.usage().completion_tokens());
}

TEST_F(CliClientTest, GenerateWithServerHonoursStopStringsAndSampling) {
  const std::string prompt = "Count from one to ten: one, two, three,";
  const Result full = Bitsplit({"generate", "--server", Server(), "--prompt", prompt, "-n", "16",
                                "--speculation", "off", "--temperature", "0.8", "--seed", "7"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ASSERT_GE(full.out.size(), 8u);
  // Stop at the text's sixth and seventh characters: the output ends before them.
  const std::string stop = full.out.substr(5, 2);
  const size_t stop_at = full.out.find(stop);
  const Result stopped =
      Bitsplit({"generate", "--server", Server(), "--prompt", prompt, "-n", "16", "--stop", stop,
                "--temperature", "0.8", "--seed", "7", "--stop", "never appears"});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(stopped.out, full.out.substr(0, stop_at) + (stop_at > 0 ? "\n" : ""));
  EXPECT_THAT(stopped.err, HasSubstr("finish: stop]"));
  EXPECT_THAT(stopped.err, HasSubstr("spec adaptive: "));  // the server's default
}

TEST_F(CliClientTest, OutputArrivesWhileGenerating) {
  const Result result = Bitsplit({"generate", "--server", Server(), "--prompt",
                                  "The licenses for most software are designed to", "-n", "120",
                                  "--speculation", "off"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // A long reply (the model may end it before 120 tokens), so that the timing below means
  // something.
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.err, match, std::regex(R"(\| (\d+) tokens, )")))
      << result.err;
  ASSERT_GE(std::stoi(match[1]), 64) << result.err;
  // A client that buffered the reply would print it all at the end.
  EXPECT_LT(result.seconds_to_first_output, 0.75 * result.seconds_total)
      << result.seconds_to_first_output << " s of " << result.seconds_total << " s";
}

TEST_F(CliClientTest, BadInputIsOneLineWithExitStatusTwo) {
  ExpectOneLineError(Bitsplit({"chat", "--server", Server(), "hi", "-n", "-1"}), 2,
                     "bitsplit chat: error: INVALID_ARGUMENT: max_tokens must be in [1, 4096]");
  ExpectOneLineError(Bitsplit({"chat", "--server", Server(), "hi", "--temperature", "-1"}), 2,
                     "temperature must be a finite number >= 0");
  ExpectOneLineError(Bitsplit({"generate", "--server", Server(), "--prompt", "hi", "--speculation",
                               "tree", "--nodes", "1000"}),
                     2,
                     "bitsplit generate: error: INVALID_ARGUMENT: speculation: draft tree nodes");
  ExpectOneLineError(Bitsplit({"generate", "--server", Server(), "--prompt", ""}), 2,
                     "the prompt is empty");
  ExpectOneLineError(Bitsplit({"chat", "--server", Server(), "hi", "--speculation", "sideways"}), 2,
                     "--speculation");
  ExpectOneLineError(Bitsplit({"chat", "hi"}), 2, "--server");
  ExpectOneLineError(Bitsplit({"generate", "--server", Server(), "--prompt", "hi", "--model",
                               testing::SmolLm2SplitModel().base}),
                     2, "--model: is for local generation; not with --server");
  ExpectOneLineError(Bitsplit({"generate", "--model", testing::SmolLm2SplitModel().base, "--prompt",
                               "hi", "--stop", "x"}),
                     2, "--stop: needs --server");
  ExpectOneLineError(Bitsplit({"generate", "--prompt", "hi"}), 2, "--model");
}

TEST_F(CliClientTest, UnreachableServerIsOneLineWithExitStatusOne) {
  const std::string nowhere =
      "unix:" + (testing::TestTempDir() / "cli-client" / "nobody-listens.sock").string();
  const Result result = Bitsplit({"chat", "--server", nowhere, "hi"});
  ExpectOneLineError(result, 1,
                     absl::StrCat("bitsplit chat: error: cannot reach the coordinator at ", nowhere,
                                  ": UNAVAILABLE"));
  ExpectOneLineError(Bitsplit({"generate", "--server", nowhere, "--prompt", "hi"}), 1,
                     "bitsplit generate: error: cannot reach the coordinator");
}

}  // namespace
}  // namespace bitsplit
