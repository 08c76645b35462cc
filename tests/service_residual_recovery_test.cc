// cpu-residual killed (SIGKILL) under a running gpu-drafter, both real processes on the SmolLM2
// split fixture: while it is down every Generate request fails fast with UNAVAILABLE (a message
// with no socket path), the drafter removes the segment the killed service left in /dev/shm, and
// once the service is back the first request sent 1 s after it is SERVING succeeds
// (services/gpu-drafter/residual_link.h). The measured times are printed.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/rpc/drafter_client.h"
#include "gtest/gtest.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"

namespace bitsplit {
namespace {

namespace v1 = bitsplit::internal::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::ServiceProcess;

const char kResidualBinary[] = BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual";
const char kDrafterBinary[] = BITSPLIT_BINARY_DIR "/services/gpu-drafter/bitsplit-drafter";
constexpr int kResidualTimeoutMs = 3000;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The /dev/shm names of the channels of the cpu-residual process `pid`.
std::vector<std::string> SegmentsOf(pid_t pid) {
  const std::string prefix = "bitsplit-res-" + std::to_string(pid) + "-";
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

class ResidualRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);  // the cpu backend on every machine
    char pattern[] = "/tmp/bitsplit-recovery-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    paths_ = testing::SmolLm2SplitModel();
    ASSERT_TRUE(std::filesystem::exists(paths_.base)) << paths_.base;
  }
  void TearDown() override {
    drafter_.Kill(SIGKILL);
    residual_.Kill(SIGKILL);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string residual_target() const { return "unix:" + dir_ + "/residual.sock"; }
  std::string drafter_target() const { return "unix:" + dir_ + "/drafter.sock"; }

  // Starts cpu-residual; returns when its health says SERVING (the time point), or fails.
  Clock::time_point StartResidual() {
    EXPECT_TRUE(residual_.Start({paths_.residual, "--socket", dir_ + "/residual.sock", "--threads",
                                 "1", "--max-rows", "64"}));
    EXPECT_TRUE(residual_.WaitServing(residual_target(), std::chrono::seconds(60)))
        << residual_.Stderr();
    return Clock::now();
  }

  void StartDrafter() {
    ASSERT_TRUE(drafter_.Start({paths_.base, "--residual-socket", residual_target(), "--socket",
                                dir_ + "/drafter.sock", "--threads", "1", "--max-context", "128",
                                "--max-tree-nodes", "16", "--residual-timeout-ms",
                                std::to_string(kResidualTimeoutMs), "--backend", "cpu"}));
    ASSERT_TRUE(drafter_.WaitServing(drafter_target(), std::chrono::seconds(120)))
        << drafter_.Stderr();
    auto client =
        rpc::DrafterClient::Connect(drafter_target(), milliseconds(5000), milliseconds(60000));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // One short generation (a 6-token prompt prefilled, one token emitted): the status and how
  // long it took.
  std::pair<absl::Status, Clock::duration> Generate() {
    const auto start = Clock::now();
    v1::GenerateRequest request;
    for (int32_t token : {1, 310, 2170, 30, 253, 1345}) request.add_prompt(token);
    request.set_max_tokens(1);
    std::unique_ptr<rpc::DrafterClient::GenerateCall> call = client_->Generate(request);
    v1::GenerateEvent event;
    int tokens = 0;
    while (call->Read(&event)) tokens += event.tokens_size();
    absl::Status status = call->Finish();
    if (status.ok() && tokens != 1) status = absl::InternalError("not one token emitted");
    return {status, Clock::now() - start};
  }

  // Kills cpu-residual with SIGKILL and checks the outage: `requests` generations, spread over
  // `outage`, each UNAVAILABLE within 1 s without internal detail; the killed service's segment
  // disappears from /dev/shm. Returns the slowest failure.
  Clock::duration KillAndCheckOutage(int requests, milliseconds outage) {
    const pid_t pid = residual_.pid();
    EXPECT_FALSE(SegmentsOf(pid).empty()) << "the drafter's channel is not in /dev/shm";
    residual_.Kill(SIGKILL);
    const auto killed = Clock::now();
    Clock::duration slowest{0};
    for (int i = 0; i < requests; ++i) {
      std::this_thread::sleep_until(killed + outage * i / requests);
      const auto [status, elapsed] = Generate();
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_LT(elapsed, std::chrono::seconds(1)) << "request " << i << ": " << status;
      EXPECT_EQ(status.message().find(dir_), std::string::npos) << status;
      slowest = std::max(slowest, elapsed);
    }
    // The drafter removed the segment the killed service could not (long before now).
    EXPECT_TRUE(SegmentsOf(pid).empty()) << SegmentsOf(pid)[0];
    std::this_thread::sleep_until(killed + outage);
    return slowest;
  }

  std::string dir_;
  testing::SplitModelPaths paths_;
  ServiceProcess residual_{kResidualBinary};
  ServiceProcess drafter_{kDrafterBinary};
  std::unique_ptr<rpc::DrafterClient> client_;
};

TEST_F(ResidualRecoveryTest, OutageFailsFastAndTheFirstRequestOneSecondAfterRestartSucceeds) {
  StartResidual();
  ASSERT_NO_FATAL_FAILURE(StartDrafter());
  ASSERT_TRUE(Generate().first.ok());

  // The segment of a killed service goes as soon as the drafter's watcher sees the exit.
  {
    const pid_t pid = residual_.pid();
    residual_.Kill(SIGKILL);
    const auto killed = Clock::now();
    while (!SegmentsOf(pid).empty() && Clock::now() - killed < std::chrono::seconds(2)) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    const auto removed = Clock::now() - killed;
    EXPECT_TRUE(SegmentsOf(pid).empty());
    std::printf("segment of the killed service removed %.1f ms after it was reaped\n", Ms(removed));
    const auto [status, elapsed] = Generate();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(
        std::string(status.message()).find("the residual service is unavailable; retry shortly"),
        std::string::npos)
        << status;
    EXPECT_LT(elapsed, std::chrono::seconds(1));
  }
  // The outage cycle: fail fast while down; 1 s after SERVING the first request succeeds.
  Clock::time_point serving = StartResidual();
  ASSERT_TRUE(residual_.running());
  std::this_thread::sleep_until(serving + std::chrono::seconds(1));
  ASSERT_TRUE(Generate().first.ok());
  const Clock::duration slowest = KillAndCheckOutage(8, milliseconds(4000));
  serving = StartResidual();
  std::this_thread::sleep_until(serving + std::chrono::seconds(1));
  const auto [status, elapsed] = Generate();
  EXPECT_TRUE(status.ok()) << status;
  std::printf("outage: 8 requests over 4 s, each UNAVAILABLE, the slowest in %.1f ms\n",
              Ms(slowest));
  std::printf("first request 1 s after SERVING: %s in %.1f ms (reattach included)\n",
              status.ok() ? "OK" : "FAILED", Ms(elapsed));

  // How soon after SERVING the drafter can be back: requests every 50 ms from SERVING on.
  (void)KillAndCheckOutage(4, milliseconds(2000));
  serving = StartResidual();
  Clock::duration back{0};
  int failures = 0;
  while (Clock::now() - serving < std::chrono::seconds(5)) {
    if (Generate().first.ok()) {
      back = Clock::now() - serving;
      break;
    }
    ++failures;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GT(back.count(), 0) << "no success within 5 s of SERVING";
  EXPECT_LT(back, std::chrono::seconds(1));
  std::printf("probing every 50 ms: first success %.1f ms after SERVING (%d failures before)\n",
              Ms(back), failures);
}

}  // namespace
}  // namespace bitsplit
