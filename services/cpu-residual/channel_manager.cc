#include "services/cpu-residual/channel_manager.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace bitsplit::residual {
namespace {

constexpr char kShmPrefix[] = "bitsplit-res-";

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool PidfdExited(int pidfd) {
  pollfd pfd{pidfd, POLLIN, 0};
  return poll(&pfd, 1, 0) > 0;
}

bool IsProofName(const std::string& proof) {
  const size_t prefix = sizeof(shm::kAttachProofPrefix) - 1;
  if (proof.size() != prefix + 32 || proof.compare(0, prefix, shm::kAttachProofPrefix) != 0) {
    return false;
  }
  for (size_t i = prefix; i < proof.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(proof[i]))) return false;
  }
  return true;
}

}  // namespace

struct ChannelManager::Channel {
  uint64_t id = 0;
  pid_t client_pid = 0;
  int pidfd = -1;
  uint32_t max_rows = 0;
  std::unique_ptr<shm::ShmSegment> segment;
  std::atomic<bool> stop{false};
  std::thread thread;
  model::QuantizedActivations activations;  // the serving thread's copy of each request
  std::vector<model::ExpertRows> segments;  // and of an expert group's segments

  ~Channel() {
    if (pidfd >= 0) close(pidfd);
  }
};

ChannelManager::ChannelManager(ResidualStore& store, const ChannelOptions& options)
    : store_(store), options_(options), pid_(getpid()) {
  housekeeper_ = std::thread([this] { Housekeeping(); });
}

ChannelManager::~ChannelManager() { Shutdown(); }

void ChannelManager::RemoveStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(kShmPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + sizeof(kShmPrefix) - 1));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) stale.push_back("/" + name);
  }
  closedir(dir);
  for (const std::string& name : stale) {
    if (shm_unlink(name.c_str()) == 0) spdlog::info("removed stale segment {}", name);
  }
}

absl::Status ChannelManager::VerifyClientPid(pid_t pid, int pidfd, const std::string& proof) {
  const std::string dir_path = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) {
    const int error = errno;
    if (error == EACCES || error == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat("client_pid ", pid, " cannot be verified: the service (uid ", getuid(),
                       ") may not read ", dir_path, "; clients must run as the service's user"));
    }
    return absl::InvalidArgumentError(absl::StrCat("client_pid ", pid,
                                                   " is not a live process visible to the "
                                                   "service: ",
                                                   std::strerror(error)));
  }
  // A memfd's link reads "/memfd:NAME (deleted)" (it never has a file-system name).
  const std::string expected = absl::StrCat("/memfd:", proof, " (deleted)");
  bool found = false;
  char target[PATH_MAX];
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const ssize_t n = readlinkat(dirfd(dir), entry->d_name, target, sizeof(target));
    if (n == static_cast<ssize_t>(expected.size()) &&
        expected.compare(0, expected.size(), target, expected.size()) == 0) {
      found = true;
      break;
    }
  }
  closedir(dir);
  if (PidfdExited(pidfd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_pid ", pid, " exited while its attach was verified"));
  }
  if (!found) {
    return absl::PermissionDeniedError(
        absl::StrCat("client_pid ", pid, " does not hold the attach proof ", proof,
                     " open: a client attaches channels for its own process only"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AttachResult> ChannelManager::Attach(pid_t client_pid, const std::string& pid_proof,
                                                    uint32_t max_rows) {
  if (stopping_.load()) return absl::UnavailableError("the residual service is shutting down");
  if (client_pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("client_pid ", client_pid, " is not a pid"));
  }
  if (max_rows > options_.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows ", max_rows, " exceeds the service maximum ", options_.max_rows));
  }
  if (!IsProofName(pid_proof)) {
    return absl::InvalidArgumentError(absl::StrCat("pid_proof \"", pid_proof.substr(0, 64),
                                                   "\" is not ", shm::kAttachProofPrefix,
                                                   " followed by 32 hex digits"));
  }
  if (max_rows == 0) max_rows = options_.max_rows;
  const int pidfd = PidfdOpen(client_pid);
  if (pidfd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("client_pid ", client_pid,
                                                   " is not a live process visible to the "
                                                   "service: ",
                                                   std::strerror(errno)));
  }
  auto channel = std::make_unique<Channel>();
  channel->pidfd = pidfd;  // closed with the channel, on every path
  channel->client_pid = client_pid;
  channel->max_rows = max_rows;
  BITSPLIT_RETURN_IF_ERROR(VerifyClientPid(client_pid, pidfd, pid_proof));
  const model::ResidualShapes& shapes = store_.shapes();
  auto layout = shm::ComputeShmLayout(max_rows, static_cast<uint32_t>(shapes.max_cols()),
                                      static_cast<uint32_t>(shapes.max_outputs()));
  if (!layout.ok()) return layout.status();
  // The limits are checked and the channel inserted under one hold of the lock, so that
  // concurrent attaches cannot together exceed them (creating a segment takes milliseconds).
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_.load()) return absl::UnavailableError("the residual service is shutting down");
  if (channels_.size() >= options_.max_channels) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the service already has ", channels_.size(),
                     " attached channels, its limit (--max-channels)"));
  }
  size_t own = 0;
  for (const auto& [id, other] : channels_) {
    // A channel of an exited process with a reused pid is about to be reclaimed: not counted.
    if (other->client_pid == client_pid && !PidfdExited(other->pidfd)) ++own;
  }
  if (own >= options_.max_channels_per_client) {
    return absl::ResourceExhaustedError(
        absl::StrCat("client pid ", client_pid, " already has ", own,
                     " attached channels, the per-client limit (--max-channels-per-client)"));
  }
  // Ids are hard to guess, so that a client cannot detach another's channel by accident.
  std::random_device random;
  channel->id = (uint64_t{random()} << 32 ^ random()) << 16 | (next_id_++ & 0xffff);
  const std::string name =
      absl::StrFormat("/%s%d-%016x", kShmPrefix, static_cast<int>(pid_), channel->id);
  auto segment = shm::ShmSegment::Create(name, *layout, channel->id, pid_, client_pid,
                                         store_.file().fingerprint().data());
  if (!segment.ok()) return segment.status();
  channel->segment = *std::move(segment);
  AttachResult result{channel->id, name, layout->segment_bytes, max_rows};
  Channel* raw = channel.get();
  channels_[raw->id] = std::move(channel);
  raw->thread = std::thread([this, raw] { Serve(raw); });
  spdlog::info("attached channel {:016x} for pid {} ({}, {} bytes, T <= {})", result.channel_id,
               client_pid, name, result.shm_bytes, max_rows);
  return result;
}

void ChannelManager::Close(std::unique_ptr<Channel> channel) {
  channel->stop.store(true);
  shm::CloseChannel(*channel->segment);
  shm::FutexWakeAll(&channel->segment->request()->seq);
  if (channel->thread.joinable()) channel->thread.join();
  channel->segment->Unlink();
}

absl::Status ChannelManager::Detach(uint64_t channel_id) {
  std::unique_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = channels_.find(channel_id);
    if (it == channels_.end()) {
      return absl::NotFoundError(absl::StrFormat("no attached channel %016x", channel_id));
    }
    it->second->segment->Unlink();  // as in Housekeeping: the name goes before the count drops
    channel = std::move(it->second);
    channels_.erase(it);
  }
  spdlog::info("detached channel {:016x} (pid {})", channel_id, channel->client_pid);
  Close(std::move(channel));
  return absl::OkStatus();
}

size_t ChannelManager::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return channels_.size();
}

void ChannelManager::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (housekeeper_.joinable()) housekeeper_.join();
  std::map<uint64_t, std::unique_ptr<Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    channels.swap(channels_);
  }
  for (auto& [id, channel] : channels) Close(std::move(channel));
}

void ChannelManager::Housekeeping() {
  while (!stopping_.load()) {
    std::vector<std::unique_ptr<Channel>> dead;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const uint64_t now = shm::MonotonicNanos();
      for (auto it = channels_.begin(); it != channels_.end();) {
        shm::Word64(it->second->segment->response()->heartbeat_ns)
            .store(now, std::memory_order_release);
        if (PidfdExited(it->second->pidfd)) {
          // Remove the segment's name while still counted, so that once a client sees the
          // channel gone from Info its /dev/shm entry is gone too (Close may take a while).
          it->second->segment->Unlink();
          dead.push_back(std::move(it->second));
          it = channels_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& channel : dead) {
      spdlog::info("client pid {} exited: reclaiming channel {:016x}", channel->client_pid,
                   channel->id);
      Close(std::move(channel));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void ChannelManager::Serve(Channel* channel) {
  if (store_.worker0_cpu() >= 0) (void)PinCurrentThread(store_.worker0_cpu());
  shm::ShmSegment& segment = *channel->segment;
  const shm::ShmHeader& header = segment.header();  // the service's own copy
  uint32_t last = 0;  // a new segment starts at seq 0; a request may already be waiting
  model::QuantizedActivations& x = channel->activations;
  while (!channel->stop.load(std::memory_order_relaxed)) {
    shm::ShmRequestCopy request;
    if (!shm::WaitForRequest(segment, last, options_.spin, std::chrono::milliseconds(100),
                             &request)) {
      continue;
    }
    last = request.seq;
    const uint64_t start = shm::MonotonicNanos();
    // Every field was copied once out of shared memory; validate the copies: layer, group and
    // width against the model, their sizes and views against this segment (DecodeRequest).
    auto group = store_.Validate(request.layer, request.group, request.rows, request.cols,
                                 channel->max_rows);
    auto view =
        shm::DecodeRequest(header, segment.base(), segment.size(), request, channel->max_rows);
    if (!group.ok() || !view.ok()) {
      const absl::Status refused = group.ok() ? view.status() : group.status();
      spdlog::debug("channel {:016x}: refused request: {}", channel->id,
                    std::string(refused.message()));
      shm::PublishResponse(segment, request.seq, refused, 0, nullptr, 0,
                           shm::MonotonicNanos() - start);
      continue;
    }
    // An expert group's segments, copied once out of shared memory and checked: experts of the
    // model, rows inside the request; a dense group has none.
    const bool experts = model::IsExpertGroup((*group)->id.group);
    std::vector<model::ExpertRows>& segments = channel->segments;
    segments.clear();
    for (uint32_t i = 0; i < view->num_segments; ++i) {
      const shm::ShmExpertSegment s = view->segments[i];
      segments.push_back({.expert = s.expert, .first_row = s.first_row, .count = s.count});
    }
    absl::Status segments_ok =
        experts == !segments.empty()
            ? model::ValidateExpertSegments(request.layer, store_.shapes().num_experts, view->rows,
                                            segments)
            : absl::InvalidArgumentError(
                  absl::StrCat(model::LinearGroupIdString((*group)->id), " with ", segments.size(),
                               " expert segments (an expert group needs them, "
                               "a dense group takes none)"));
    if (!segments_ok.ok()) {
      shm::PublishResponse(segment, request.seq, segments_ok, 0, nullptr, 0,
                           shm::MonotonicNanos() - start);
      continue;
    }
    model::CopyActivations(view->rows, view->cols, static_cast<int64_t>(view->block_stride),
                           view->codes, view->scales, view->sums, &x);
    float* y = view->outputs;
    const uint64_t compute_ns =
        experts ? store_.ComputeExperts(**group, segments, x, y) : store_.Compute(**group, x, y);
    uint32_t output_rows[shm::kShmMaxOutputs] = {0, 0, 0};
    const auto& matrices = (*group)->matrices;
    for (size_t i = 0; i < matrices.size(); ++i) {
      output_rows[i] = static_cast<uint32_t>(
          experts ? matrices[i].rows / store_.shapes().num_experts : matrices[i].rows);
    }
    shm::PublishResponse(segment, request.seq, absl::OkStatus(),
                         static_cast<uint32_t>(matrices.size()), output_rows, compute_ns,
                         shm::MonotonicNanos() - start);
  }
}

}  // namespace bitsplit::residual
