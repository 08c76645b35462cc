#pragma once
// A service binary (bitsplit-residual, bitsplit-drafter, ...) run as a child process by a test:
// started with fork + exec, its stderr captured in a file, killed (SIGKILL) when the object goes
// out of scope, so that a failing test never leaves a process behind.
//
//   ServiceProcess residual(BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual");
//   ASSERT_TRUE(residual.Start({path, "--socket", socket}));
//   ASSERT_TRUE(residual.WaitServing("unix:" + socket)) << residual.Stderr();
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

extern char** environ;

namespace bitsplit::testing {

// SERVING / NOT_SERVING / ... of the standard health service for `service` ("" = the server as
// a whole), or -1 when the call fails.
inline int HealthStatus(const std::string& target, const std::string& service = "") {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) return -1;
  return response.status();
}

class ServiceProcess {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ServiceProcess(std::string binary) : binary_(std::move(binary)) {}
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;
  ~ServiceProcess() {
    Kill(SIGKILL);
    if (!stderr_path_.empty()) {
      std::error_code ignored;
      std::filesystem::remove(stderr_path_, ignored);
    }
  }

  // Starts the binary with `args`; `env` ("NAME=value") is added to this process's environment.
  // Returns once the process exists (an exec failure shows as exit status 127); see
  // WaitServing / WaitForLine / WaitForSocket. The child is SIGKILLed if this process dies.
  ::testing::AssertionResult Start(const std::vector<std::string>& args,
                                   const std::vector<std::string>& env = {}) {
    if (pid_ > 0) return ::testing::AssertionFailure() << binary_ << " is already running";
    std::vector<std::string> argv = {binary_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw_argv;
    for (std::string& a : argv) raw_argv.push_back(a.data());
    raw_argv.push_back(nullptr);
    std::vector<std::string> env_strings = env;
    std::vector<char*> raw_env;
    for (char** e = environ; *e != nullptr; ++e) raw_env.push_back(*e);
    for (std::string& s : env_strings) raw_env.push_back(s.data());
    raw_env.push_back(nullptr);

    if (stderr_path_.empty()) {
      stderr_path_ = std::filesystem::temp_directory_path() /
                     (std::filesystem::path(binary_).filename().string() + "-test-" +
                      std::to_string(getpid()) + "-" + std::to_string(counter_++) + ".log");
    }
    // fork + exec rather than posix_spawn, so that the child can ask to be killed when this
    // process dies (PR_SET_PDEATHSIG): a crashing test leaves no service behind. Between fork
    // and exec only async-signal-safe calls.
    const pid_t parent = getpid();
    const pid_t child = fork();
    if (child < 0) return ::testing::AssertionFailure() << "fork: " << strerror(errno);
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      const int fd = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
      }
      execve(binary_.c_str(), raw_argv.data(), raw_env.data());
      _exit(127);
    }
    pid_ = child;
    exit_status_ = -1;
    return ::testing::AssertionSuccess();
  }

  // Waits for the process to exit; returns its exit status (128 + signal when killed), or -1
  // when it is still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return exit_status_;
    const auto deadline = Clock::now() + timeout;
    do {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (Clock::now() < deadline);
    return -1;
  }
  bool running() { return Wait(std::chrono::milliseconds(0)) < 0 && pid_ > 0; }

  // Sends `signal`; SIGKILL also reaps the process.
  void Kill(int signal) {
    if (pid_ > 0) {
      kill(pid_, signal);
      if (signal == SIGKILL) Wait(std::chrono::seconds(10));
    }
  }
  void Signal(int signal) {
    if (pid_ > 0) kill(pid_, signal);
  }
  // SIGSTOP, and waits until every thread is stopped (delivery is asynchronous).
  void Stop() {
    Signal(SIGSTOP);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      bool all_stopped = true;
      std::error_code error;
      for (const auto& task :
           std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", error)) {
        std::ifstream in(task.path() / "stat");
        std::string stat;
        std::getline(in, stat);
        const size_t paren = stat.rfind(')');
        if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
          all_stopped = false;
        }
      }
      if (all_stopped && !error) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Until the health service says SERVING: false when the process exits or `timeout` passes.
  bool WaitServing(const std::string& target,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (HealthStatus(target) == grpc::health::v1::HealthCheckResponse::SERVING) return true;
      if (Wait(std::chrono::milliseconds(20)) >= 0) return false;
    }
    return false;
  }
  // Until stderr contains `text`: false when the process exits first or `timeout` passes.
  bool WaitForLine(const std::string& text,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (Stderr().find(text) != std::string::npos) return true;
      if (Wait(std::chrono::milliseconds(20)) >= 0) return Stderr().find(text) != std::string::npos;
    }
    return false;
  }
  // Until `path` is a unix socket: false when the process exits first or `timeout` passes.
  bool WaitForSocket(const std::string& path,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      struct stat st;
      if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return true;
      if (Wait(std::chrono::milliseconds(20)) >= 0) return false;
    }
    return false;
  }

  pid_t pid() const { return pid_; }
  const std::string& binary() const { return binary_; }
  std::string Stderr() const {
    std::ifstream in(stderr_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  static inline int counter_ = 0;
  std::string binary_;
  pid_t pid_ = 0;
  int exit_status_ = -1;
  std::filesystem::path stderr_path_;
};

}  // namespace bitsplit::testing
