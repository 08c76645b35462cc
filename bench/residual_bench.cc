// The cpu-residual service (services/cpu-residual) against the bare kernels: tables for
// docs/performance.md, "cpu-residual".
//
//   1. Shared-memory round trip of a minimal request (T = 1 on a tiny residual whose kernel
//      work is ~1 µs): median and p99 over many calls, and the same minus the kernel time.
//   2. A full residual pass (every layer's qkv, attn_output, gate_up, down, then the head, as a
//      verify step issues them) for T = 1, 4, 16, 64 on one or more residual files:
//        floor(T)    max(weight bytes / BW, T * MACs / P), BW and P measured in this run like
//                    bench/kernel_bench.cc does (BW: bench/read_bandwidth.h's fastest read of a
//                    128 MiB window, 4 reads of each pattern, probed before, between and after
//                    T's in-process and shm passes, or the faster pass's own read rate where
//                    higher; P: the kernels' multiply-add rate at T = 64 over this residual, in
//                    process, median pass);
//        in-process  the same pass with the kernels in this process (SplitMatMulGroup, the
//                    in-process verify path), same thread count;
//        shm         through the service over the shared-memory channel (RemoteResidual);
//        gRPC        through the service's MatMul RPC (GrpcResidual).
//      Each is the median of the passes after a warm-up pass.
//
//   build-*/bench/residual_bench [--threads N] [--passes K] [--residual FILE]...
//                                [--synthetic-1b] [--workdir DIR] [--service BITSPLIT_RESIDUAL]
// Without --residual and --synthetic-1b it runs only the round trip.
#include <immintrin.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/read_bandwidth.h"
#include "common/io/split_file.h"
#include "common/model/remote_residual.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/rpc/residual_client.h"
#include "common/util/fp16.h"
#include "common/util/thread_pool.h"

extern char** environ;

namespace bitsplit {
namespace {

using model::LinearGroup;
using model::LinearGroupId;
using Clock = std::chrono::steady_clock;

// The service this bench starts: the build's unless --service names another (a copy carried to
// a machine without the build tree, scripts/device-check.sh).
std::string& ServiceBinary() {
  static std::string path = BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual";
  return path;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void Die(const std::string& what) {
  std::fprintf(stderr, "residual_bench: %s\n", what.c_str());
  std::exit(1);
}

// ---- Synthetic residual files
// --------------------------------------------------------------------

struct Shape {
  int layers, d_model, q_dim, kv_dim, d_ff, vocab;
};

uint64_t NextRandom(uint64_t* state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * 0x2545F4914F6CDD1DULL;
}

// r6/g32 matrices with random codes and moderate fp16 scales (speed does not depend on values).
void WriteSyntheticResidual(const std::string& path, const Shape& s) {
  if (std::filesystem::exists(path)) return;
  model::SplitQuantization q;
  q.residual_format = quant::SplitFormat::kR6;
  q.residual_group = 32;
  const nlohmann::json metadata = {
      {model::kSplitMetadataKey, {{"version", 1}, {"quantization", SplitQuantizationToJson(q)}}}};
  SplitFingerprint fingerprint{};
  fingerprint[0] = static_cast<uint8_t>(s.layers);
  fingerprint[1] = static_cast<uint8_t>(s.d_model >> 4);
  auto writer = SplitFileWriter::Create(path, SplitFileKind::kResidual, fingerprint, metadata,
                                        model::SplitFormatRowSizeOracle());
  if (!writer.ok()) Die(std::string(writer.status().message()));
  struct M {
    std::string name;
    int64_t rows, cols;
  };
  std::vector<M> ms;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ms.push_back({p + "attn_q.weight", s.q_dim, s.d_model});
    ms.push_back({p + "attn_k.weight", s.kv_dim, s.d_model});
    ms.push_back({p + "attn_v.weight", s.kv_dim, s.d_model});
    ms.push_back({p + "attn_output.weight", s.d_model, s.q_dim});
    ms.push_back({p + "ffn_gate.weight", s.d_ff, s.d_model});
    ms.push_back({p + "ffn_up.weight", s.d_ff, s.d_model});
    ms.push_back({p + "ffn_down.weight", s.d_model, s.d_ff});
  }
  ms.push_back({"output.weight", s.vocab, s.d_model});
  const uint32_t format = SplitTensorFormat(static_cast<uint32_t>(quant::SplitFormat::kR6));
  for (const M& m : ms) {
    if (!(*writer)->DeclareTensor(m.name, format, 32, {m.cols, m.rows}).ok()) Die("declare");
  }
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  for (const M& m : ms) {
    const size_t row_bytes = quant::SplitRowBytes(quant::SplitFormat::kR6, 32, m.cols);
    const quant::SplitRowLayout layout =
        quant::GetSplitRowLayout(quant::SplitFormat::kR6, 32, m.cols);
    std::vector<uint8_t> chunk;
    const int64_t rows_per_chunk = 256;
    for (int64_t r0 = 0; r0 < m.rows; r0 += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, m.rows - r0);
      chunk.resize(static_cast<size_t>(n) * row_bytes);
      for (size_t i = 0; i + 8 <= chunk.size(); i += 8) {
        const uint64_t r = NextRandom(&state);
        std::memcpy(&chunk[i], &r, 8);
      }
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t g = 0; g < layout.groups; ++g) {
          const uint16_t half = Fp32ToFp16(1e-3f + 1e-5f * static_cast<float>(g % 7));
          std::memcpy(&chunk[r * row_bytes + layout.scale_offset + g * layout.scale_stride], &half,
                      2);
        }
      }
      if (!(*writer)->WriteTensorData(m.name, chunk.data(), chunk.size()).ok()) Die("write");
    }
  }
  if (!(*writer)->Finish().ok()) Die("finish");
}

// ---- The service -------------------------------------------------------------------------------

struct Service {
  pid_t pid = 0;
  std::string socket;
  ~Service() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status;
      waitpid(pid, &status, 0);
    }
  }
};

std::unique_ptr<Service> StartService(const std::string& residual, const std::string& socket,
                                      int threads) {
  auto service = std::make_unique<Service>();
  service->socket = socket;
  std::vector<std::string> args = {ServiceBinary(),
                                   residual,
                                   "--socket",
                                   socket,
                                   "--threads",
                                   std::to_string(threads),
                                   "--max-rows",
                                   "64",
                                   "--shutdown-grace-ms",
                                   "0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&service->pid, ServiceBinary().c_str(), nullptr, nullptr, argv.data(), environ) !=
      0) {
    Die("cannot start the service " + ServiceBinary());
  }
  return service;
}

std::unique_ptr<rpc::ResidualClient> ConnectWhenReady(const std::string& socket) {
  const auto deadline = Clock::now() + std::chrono::minutes(5);  // pre-faulting a big file
  while (Clock::now() < deadline) {
    auto client = rpc::ResidualClient::Connect("unix:" + socket, {}, std::chrono::seconds(2));
    if (client.ok() && (*client)->Info().ok()) return *std::move(client);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Die("the service did not come up");
  return nullptr;
}

// ---- Ceilings -----------------------------------------------------------------------------------

// BW probed around each T's passes: this VM's memory moves between a slow phase (~35 GB/s) and a
// fast one (60-70 GB/s) within minutes (docs/performance.md), and a pass is compared
// with what memory delivered while it ran.
double ProbeBandwidth(bench::ReadBandwidthProbe& probe, ThreadPool& pool) {
  return probe.MeasureBest(pool, /*repetitions=*/4);
}

// ---- Passes ------------------------------------------------------------------------------------

struct Residual {
  std::unique_ptr<SplitFile> file;
  model::ResidualShapes shapes;
  std::vector<LinearGroupId> ids;
  std::vector<std::vector<quant::MatrixView>> views;  // per id
  uint64_t weight_bytes = 0;
  double macs_per_row = 0;  // multiply-adds of one activation row over all matrices
};

Residual LoadResidual(const std::string& path) {
  Residual r;
  auto file = SplitFile::Open(path, SplitFileKind::kResidual, model::SplitFormatRowSizeOracle());
  if (!file.ok()) Die(std::string(file.status().message()));
  r.file = *std::move(file);
  int32_t layers = 0;
  while (r.file->FindTensor("blk." + std::to_string(layers) + ".attn_q.weight") != nullptr) {
    ++layers;
  }
  r.shapes.layout = {.num_layers = layers};
  r.ids = model::AllLinearGroups(r.shapes.layout);
  for (const LinearGroupId id : r.ids) {
    std::vector<quant::MatrixView> views;
    model::ResidualGroupShape shape;
    for (const std::string& name : model::LinearGroupTensorNames(model::ModelConfig(), id)) {
      const SplitTensor* t = r.file->FindTensor(name);
      if (t == nullptr) Die("missing " + name);
      const auto format = static_cast<quant::SplitFormat>(SplitFormatIdOf(t->format));
      views.push_back(*quant::MakeMatrixView(format, static_cast<int>(t->group_size), t->rows(),
                                             t->cols(), t->data, t->num_bytes));
      shape.cols = t->cols();
      shape.rows.push_back(t->rows());
      r.weight_bytes += t->num_bytes;
      r.macs_per_row += static_cast<double>(t->rows()) * static_cast<double>(t->cols());
    }
    r.shapes.groups.push_back(shape);
    r.views.push_back(std::move(views));
  }
  return r;
}

// Activations and outputs of every group for one T.
struct PassData {
  std::vector<quant::QuantizedActivations> x;        // per id
  std::vector<std::vector<std::vector<float>>> out;  // per id, per matrix
  std::vector<std::vector<float*>> out_ptrs;
};

PassData MakePassData(const Residual& r, int64_t rows) {
  PassData d;
  std::mt19937 rng(static_cast<uint32_t>(rows));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < r.ids.size(); ++i) {
    const model::ResidualGroupShape& shape = r.shapes.groups[i];
    std::vector<float> x(static_cast<size_t>(rows * shape.cols));
    for (float& v : x) v = normal(rng);
    d.x.emplace_back();
    quant::QuantizeActivations(x.data(), rows, shape.cols, &d.x.back());
    d.out.emplace_back();
    d.out_ptrs.emplace_back();
    for (int64_t n : shape.rows) d.out.back().emplace_back(static_cast<size_t>(rows * n), 0.0f);
    for (auto& o : d.out.back()) d.out_ptrs.back().push_back(o.data());
  }
  return d;
}

// Median seconds of `passes` passes of `source` (after one warm-up pass).
// The median of `passes` timed passes after a warm-up pass; `all_seconds` (if given) gets the
// total of all passes, warm-up included.
double TimePasses(const Residual& r, PassData& d, model::ResidualSource& source, ThreadPool& pool,
                  int passes, double* all_seconds = nullptr) {
  std::vector<double> times;
  double total = 0;
  for (int p = 0; p <= passes; ++p) {
    const auto start = Clock::now();
    for (size_t i = 0; i < r.ids.size(); ++i) {
      const absl::Status status = source.Accumulate(r.ids[i], d.x[i], d.out_ptrs[i], pool);
      if (!status.ok()) Die(std::string(status.message()));
    }
    const double seconds = Seconds(Clock::now() - start);
    total += seconds;
    if (p > 0) times.push_back(seconds);
  }
  if (all_seconds != nullptr) *all_seconds = total;
  return Median(times);
}

// The in-process verify path's residual half (InProcessResidual = SplitMatMulGroup).
class LocalSource final : public model::ResidualSource {
 public:
  explicit LocalSource(const Residual& r) : r_(r) {}
  absl::Status Accumulate(LinearGroupId id, const quant::QuantizedActivations& x,
                          std::span<float* const> outputs, ThreadPool& pool) override {
    const size_t index = id.group == LinearGroup::kOutputHead
                             ? r_.ids.size() - 1
                             : static_cast<size_t>(id.layer) * 4 + static_cast<size_t>(id.group);
    model::SplitMatMulGroup(r_.views[index], x, outputs, /*accumulate=*/true, pool);
    return absl::OkStatus();
  }

 private:
  const Residual& r_;
};

void RoundTrip(const std::string& workdir, int threads) {
  const std::string path = workdir + "/tiny.residual.bsplit";
  WriteSyntheticResidual(path, {1, 128, 128, 64, 256, 128});
  Residual r = LoadResidual(path);
  auto service = StartService(path, workdir + "/rt.sock", threads);
  auto client = ConnectWhenReady(service->socket);
  auto session = client->Attach(r.file->fingerprint_hex(), 1, &r.shapes);
  if (!session.ok()) Die(std::string(session.status().message()));
  model::RemoteResidual& remote = (*session)->residual();
  PassData d = MakePassData(r, 1);
  const LinearGroupId id{0, LinearGroup::kAttnOutput};  // 128 x 128: ~1 µs of kernel work
  std::vector<double> rtt, overhead, compute;
  for (int i = 0; i < 20000; ++i) {
    const float* y = nullptr;
    shm::ShmCallInfo info;
    const absl::Status status = remote.Compute(id, d.x[1], &y, &info);
    if (!status.ok()) Die(std::string(status.message()));
    if (i < 1000) continue;  // warm-up
    rtt.push_back(static_cast<double>(info.round_trip_ns) / 1e3);
    compute.push_back(static_cast<double>(info.compute_ns) / 1e3);
    overhead.push_back(static_cast<double>(info.round_trip_ns - info.compute_ns) / 1e3);
  }
  std::printf("\n## Shared-memory round trip (T = 1, 128 x 128 r6 matrix, %d service threads)\n\n",
              threads);
  std::printf("| measure | median µs | p99 µs |\n|---|---|---|\n");
  std::printf("| round trip (client submit to response seen) | %.1f | %.1f |\n", Median(rtt),
              Percentile(rtt, 0.99));
  std::printf("| of which kernel (service compute_ns) | %.1f | %.1f |\n", Median(compute),
              Percentile(compute, 0.99));
  std::printf("| round trip minus kernel | %.1f | %.1f |\n", Median(overhead),
              Percentile(overhead, 0.99));
  std::fflush(stdout);
}

void FullPass(const std::string& path, const std::string& label, const std::string& workdir,
              int threads, int passes, bench::ReadBandwidthProbe& probe) {
  Residual r = LoadResidual(path);
  ThreadPool pool(threads);
  LocalSource local(r);
  const int64_t kTs[] = {1, 4, 16, 64};
  std::vector<PassData> data;
  for (int64_t t : kTs) data.push_back(MakePassData(r, t));

  auto service = StartService(path, workdir + "/full.sock", threads);
  auto client = ConnectWhenReady(service->socket);
  auto session = client->Attach(r.file->fingerprint_hex(), 64, &r.shapes);
  if (!session.ok()) Die(std::string(session.status().message()));
  rpc::GrpcResidual grpc_source(*client, r.shapes);
  ThreadPool client_pool(1);
  std::vector<double> in_process, shm_times, grpc_times;
  // Per T: the fastest of the probes before the in-process passes, between them and the shm
  // passes, and after those, or the weights' bytes / the faster pass where that read faster.
  std::vector<double> bandwidths;
  // Where a shm pass's time goes: means over all passes, the warm-up one included.
  std::vector<model::RemoteResidualStats> shm_stats;
  std::vector<double> shm_all_seconds(4);
  for (size_t i = 0; i < 4; ++i) {
    double bandwidth = ProbeBandwidth(probe, pool);
    in_process.push_back(TimePasses(r, data[i], local, pool, passes));
    bandwidth = std::max(bandwidth, ProbeBandwidth(probe, pool));
    const model::RemoteResidualStats before = (*session)->residual().stats();
    shm_times.push_back(
        TimePasses(r, data[i], (*session)->residual(), client_pool, passes, &shm_all_seconds[i]));
    bandwidth = std::max(
        {bandwidth, ProbeBandwidth(probe, pool),
         static_cast<double>(r.weight_bytes) / std::min(in_process.back(), shm_times.back())});
    bandwidths.push_back(bandwidth);
    model::RemoteResidualStats delta = (*session)->residual().stats();
    delta.round_trip_ns -= before.round_trip_ns;
    delta.server_ns -= before.server_ns;
    delta.compute_ns -= before.compute_ns;
    shm_stats.push_back(delta);
    grpc_times.push_back(TimePasses(r, data[i], grpc_source, client_pool, passes));
  }
  const double rate = r.macs_per_row * 64 / in_process[3];  // P: multiply-adds/s at T = 64
  std::printf("\n## Full residual pass: %s\n\n", label.c_str());
  std::printf(
      "%zu groups (%d layers x 4 + head), %.1f MiB of weights, %d threads; P %.1f G "
      "multiply-adds/s (in-process kernels at T = 64); BW per T: probed before, between and after "
      "its in-process and shm passes (or the faster pass's read rate where higher).\n\n",
      r.ids.size(), r.shapes.layout.num_layers, static_cast<double>(r.weight_bytes) / (1 << 20),
      threads, rate / 1e9);
  std::printf(
      "| T | BW GB/s | floor ms | in-process ms | in-process / floor | shm ms | shm / floor | "
      "shm / in-process | gRPC ms | gRPC / shm |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < 4; ++i) {
    const double floor = std::max(static_cast<double>(r.weight_bytes) / bandwidths[i],
                                  static_cast<double>(kTs[i]) * r.macs_per_row / rate);
    std::printf("| %lld | %.1f | %.3f | %.3f | %.2f | %.3f | %.2f | %.2f | %.3f | %.2f |\n",
                static_cast<long long>(kTs[i]), bandwidths[i] / 1e9, floor * 1e3,
                in_process[i] * 1e3, in_process[i] / floor, shm_times[i] * 1e3,
                shm_times[i] / floor, shm_times[i] / in_process[i], grpc_times[i] * 1e3,
                grpc_times[i] / shm_times[i]);
  }
  std::printf(
      "\nshm pass, mean per pass (warm-up included): the pass, the kernels (service compute_ns),\n"
      "the service (server_ns: kernels + reading requests, writing outputs), the round trips\n"
      "(client submit to response seen) and the rest (client copies in, adds outputs in place)\n\n"
      "| T | pass ms | kernels ms | service ms | round trips ms | rest ms |\n"
      "|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < 4; ++i) {
    const double calls_per_pass = passes + 1;
    const double pass_ms = shm_all_seconds[i] * 1e3 / calls_per_pass;
    const double round_trips_ms = shm_stats[i].round_trip_ns / 1e6 / calls_per_pass;
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.3f |\n", static_cast<long long>(kTs[i]),
                pass_ms, shm_stats[i].compute_ns / 1e6 / calls_per_pass,
                shm_stats[i].server_ns / 1e6 / calls_per_pass, round_trips_ms,
                pass_ms - round_trips_ms);
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int passes = 5;
  bool synthetic_1b = false;
  std::vector<std::string> residuals;
  std::string workdir = "/tmp/bitsplit-residual-bench";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) Die("missing value of " + arg);
      return std::string(argv[++i]);
    };
    if (arg == "--threads") {
      threads = std::stoi(value());
    } else if (arg == "--passes") {
      passes = std::stoi(value());
    } else if (arg == "--residual") {
      residuals.push_back(value());
    } else if (arg == "--synthetic-1b") {
      synthetic_1b = true;
    } else if (arg == "--workdir") {
      workdir = value();
    } else if (arg == "--service") {
      ServiceBinary() = value();
    } else {
      Die("unknown argument " + arg);
    }
  }
  std::filesystem::create_directories(workdir);
  RoundTrip(workdir, threads);
  if (residuals.empty() && !synthetic_1b) return 0;
  bench::ReadBandwidthProbe probe(size_t{1} << 30);
  for (const std::string& path : residuals) {
    FullPass(path, std::filesystem::path(path).filename().string(), workdir, threads, passes,
             probe);
  }
  if (synthetic_1b) {
    // Llama-3.2-1B's shapes (16 layers, d 2048, GQA 512, d_ff 8192, vocab 128256), r6/g32.
    const std::string path = workdir + "/synthetic-1b.residual.bsplit";
    WriteSyntheticResidual(path, {16, 2048, 2048, 512, 8192, 128256});
    FullPass(path, "synthetic 1B-class (Llama-3.2-1B shapes, r6/g32)", workdir, threads, passes,
             probe);
  }
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) { return bitsplit::Main(argc, argv); }
