// The CUDA drafter on a realistic shape: a synthetic random-weight split model (8B-class by
// default: 32 layers, d 4096, d_ff 14336) with its base in VRAM under a budget below the model's
// Q8_0 size, and its residual computed in this process on the machine's CPU cores
// (InProcessResidual: the cpu-residual service's kernels without the shared-memory hop, so no
// gRPC is needed). Reports, in one run:
//
//   draft step        one draft forward (T = 1 and T = k) + its top-k, and the draft rounds of a
//                     whole 16-node tree (a speculation step's draft time)
//   verify step       one verify forward + target choice for 1 node (a step with speculation off)
//                     and for a 16-node tree, with where the time went: host inside the residual,
//                     host waiting for the GPU, GPU idle waiting for the residual
//   floor             residual bytes / measured RAM read bandwidth (docs/design.md §6)
//   projection        tokens/s = acceptance / (draft tree + verify of 16 nodes) for the mean
//                     accepted tokens per verify measured on the real model (--acceptance)
//
// Random weights: shapes and speed only (docs/design.md §8). Usage: docs/cuda.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench/read_bandwidth.h"
#include "nlohmann/json.hpp"

#ifdef BITSPLIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "bench/synthetic_model.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_session.h"
#include "common/cuda/device_info.h"
#include "common/model/vram_plan.h"
#include "common/speculation/session.h"
#endif

namespace bitsplit::bench {
namespace {

#ifdef BITSPLIT_HAVE_CUDA
using Clock = std::chrono::steady_clock;

struct Options {
  int layers = 32;
  int64_t d_model = 4096;
  int64_t d_ff = 14336;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t vocab = 128256;
  std::string base = "b2_asym";
  int base_group = 64;
  std::string residual = "r8";
  int residual_group = 32;
  int rotate_block = 64;
  int64_t context = 4096;
  int64_t prompt = 512;
  int nodes = 16;
  int expansions = 4;
  int depth = 8;
  double vram_budget_gib = 0;  // 0: 3/4 of the model's Q8_0 linear size
  double acceptance = 0;       // mean accepted tokens per verify on the real model
  int repetitions = 10;
  int threads = 0;
  double max_seconds = 300;
  std::string json;
};

void Usage() {
  std::fprintf(stderr,
               "cuda_drafter_bench [--layers N] [--d-model N] [--d-ff N] [--heads N] "
               "[--kv-heads N] [--head-dim N] [--vocab N] [--base b2_asym] [--base-group 64] "
               "[--residual r8] [--residual-group 32] [--rotate-block 64] [--context 4096] "
               "[--prompt 512] [--nodes 16] [--expansions 4] [--depth 8] [--vram-budget-gib G] "
               "[--acceptance A] [--repetitions 10] [--threads N] [--max-seconds 300] "
               "[--json FILE]\n");
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || i + 1 >= argc) return false;
    const std::string value = argv[++i];
    auto integer = [&] { return std::stoll(value); };
    if (flag == "--layers")
      o->layers = static_cast<int>(integer());
    else if (flag == "--d-model")
      o->d_model = integer();
    else if (flag == "--d-ff")
      o->d_ff = integer();
    else if (flag == "--heads")
      o->heads = integer();
    else if (flag == "--kv-heads")
      o->kv_heads = integer();
    else if (flag == "--head-dim")
      o->head_dim = integer();
    else if (flag == "--vocab")
      o->vocab = integer();
    else if (flag == "--base")
      o->base = value;
    else if (flag == "--base-group")
      o->base_group = static_cast<int>(integer());
    else if (flag == "--residual")
      o->residual = value;
    else if (flag == "--residual-group")
      o->residual_group = static_cast<int>(integer());
    else if (flag == "--rotate-block")
      o->rotate_block = static_cast<int>(integer());
    else if (flag == "--context")
      o->context = integer();
    else if (flag == "--prompt")
      o->prompt = integer();
    else if (flag == "--nodes")
      o->nodes = static_cast<int>(integer());
    else if (flag == "--expansions")
      o->expansions = static_cast<int>(integer());
    else if (flag == "--depth")
      o->depth = static_cast<int>(integer());
    else if (flag == "--vram-budget-gib")
      o->vram_budget_gib = std::stod(value);
    else if (flag == "--acceptance")
      o->acceptance = std::stod(value);
    else if (flag == "--repetitions")
      o->repetitions = static_cast<int>(integer());
    else if (flag == "--threads")
      o->threads = static_cast<int>(integer());
    else if (flag == "--max-seconds")
      o->max_seconds = std::stod(value);
    else if (flag == "--json")
      o->json = value;
    else
      return false;
  }
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

#define BENCH_CHECK_OK(expr)                                                            \
  do {                                                                                  \
    const absl::Status bench_status_ = (expr);                                          \
    if (!bench_status_.ok()) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #expr, bench_status_.ToString().c_str()); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int Run(const Options& o) {
  const Clock::time_point started = Clock::now();
  auto seconds_left = [&] {
    return o.max_seconds - std::chrono::duration<double>(Clock::now() - started).count();
  };
  if (cuda::CountDevices() == 0) {
    std::printf("SKIP: no CUDA device is visible; the bench needs one\n");
    return 0;
  }
  model::ModelConfig config = model::EightBClassConfig();
  config.num_layers = o.layers;
  config.d_model = o.d_model;
  config.d_ff = o.d_ff;
  config.num_heads = o.heads;
  config.num_kv_heads = o.kv_heads;
  config.head_dim = o.head_dim;
  config.rope_dims = o.head_dim;
  config.attention_scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
  config.vocab_size = o.vocab;
  config.context_length = std::max<int64_t>(config.context_length, o.context);
  model::SplitQuantization quantization;
  auto base_format = quant::ParseSplitFormat(o.base);
  auto residual_format = quant::ParseSplitFormat(o.residual);
  if (!base_format.ok() || !residual_format.ok()) {
    std::fprintf(stderr, "unknown format\n");
    return 1;
  }
  quantization.base_format = *base_format;
  quantization.base_group = o.base_group;
  quantization.residual_format = *residual_format;
  quantization.residual_group = o.residual_group;
  quantization.rotation = {.block = o.rotate_block, .seed = 1};

  auto q8_bytes = model::SplitLinearBytes(config, quant::SplitFormat::kQ8_0, 32);
  BENCH_CHECK_OK(q8_bytes.status());
  const uint64_t budget = o.vram_budget_gib > 0
                              ? static_cast<uint64_t>(o.vram_budget_gib * (1ull << 30))
                              : *q8_bytes / 4 * 3;
  ThreadPool pool(o.threads);
  std::printf(
      "shape: %d layers, d %ld, d_ff %ld, heads %ld/%ld x %ld, vocab %ld; %s/g%d + %s/g%d\n",
      o.layers, static_cast<long>(o.d_model), static_cast<long>(o.d_ff), static_cast<long>(o.heads),
      static_cast<long>(o.kv_heads), static_cast<long>(o.head_dim), static_cast<long>(o.vocab),
      o.base.c_str(), o.base_group, o.residual.c_str(), o.residual_group);
  std::printf("Q8_0 linear weights would need %s; VRAM budget %s; %d host threads\n",
              model::FormatBytes(*q8_bytes).c_str(), model::FormatBytes(budget).c_str(),
              pool.num_threads());

  const Clock::time_point build_start = Clock::now();
  auto synthetic = MakeSyntheticSplitModel(config, quantization, 1, pool);
  BENCH_CHECK_OK(synthetic.status());
  const SyntheticSplitModel& m = **synthetic;
  std::printf("synthetic model built in %.1f s: base %s, residual %s (host RAM)\n",
              std::chrono::duration<double>(Clock::now() - build_start).count(),
              model::FormatBytes(m.base_linear_bytes).c_str(),
              model::FormatBytes(m.residual_linear_bytes).c_str());
  const double bandwidth = MeasureReadBandwidth(pool, /*repetitions=*/8);
  const double floor_ms = static_cast<double>(m.residual_linear_bytes) / bandwidth * 1e3;
  std::printf("RAM read bandwidth %.1f GB/s -> residual floor %.2f ms per verify\n",
              bandwidth / 1e9, floor_ms);

  cuda::CudaModelOptions options;
  options.context = o.context;
  options.sessions = 1;
  options.max_batch_rows = std::max<int64_t>(64, o.nodes + 1);
  options.vram_budget = budget;
  options.host_threads = o.threads;
  const Clock::time_point upload_start = Clock::now();
  auto cuda_model =
      cuda::CudaModel::Create(m.config, m.embedding_and_norms, m.base, m.quantization, options);
  BENCH_CHECK_OK(cuda_model.status());
  cuda::CudaModel& model = **cuda_model;
  model::InProcessResidual residual(m.residual);
  model.SetResidualSource(&residual);
  std::printf("device %s; upload %.1f s; VRAM plan: %s\n", model.device_name().c_str(),
              std::chrono::duration<double>(Clock::now() - upload_start).count(),
              model.plan().ToString().c_str());

  auto session = cuda::CudaSpeculativeSession::Create(model, {});
  BENCH_CHECK_OK(session.status());
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(o.vocab));
  }
  const Clock::time_point prefill_start = Clock::now();
  BENCH_CHECK_OK(speculation::PrefillInChunks(**session, prompt, 64));
  const double prefill_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - prefill_start).count();
  std::printf("prefill of %ld tokens: %.1f ms\n", static_cast<long>(o.prompt), prefill_ms);

  nlohmann::json results;
  results["device"] = model.device_name();
  results["shape"] = {{"layers", o.layers}, {"d_model", o.d_model},   {"d_ff", o.d_ff},
                      {"heads", o.heads},   {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                      {"vocab", o.vocab}};
  results["quantization"] = model::SplitQuantizationString(m.quantization);
  results["vram_budget_bytes"] = budget;
  results["q8_0_linear_bytes"] = *q8_bytes;
  results["vram_plan"] = model.plan().ToString();
  results["vram_plan_total_bytes"] = model.plan().total_bytes;
  results["base_bytes"] = m.base_linear_bytes;
  results["residual_bytes"] = m.residual_linear_bytes;
  results["ram_bandwidth_gbps"] = bandwidth / 1e9;
  results["floor_ms"] = floor_ms;
  results["prefill_ms"] = prefill_ms;
  results["context_tokens"] = o.prompt;
  results["host_threads"] = pool.num_threads();

  // The device's memory bandwidth (a device-to-device copy: bytes read + written per second) and
  // the base matmuls alone, against the time to read their weights at that bandwidth.
  double device_bandwidth = 0;
  {
    const size_t bytes = size_t{1} << 30;
    void* source = nullptr;
    void* target = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    if (cudaMalloc(&source, bytes) == cudaSuccess && cudaMalloc(&target, bytes) == cudaSuccess &&
        cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
      std::vector<float> ms;
      for (int rep = 0; rep < 6; ++rep) {
        cudaEventRecord(start, model.stream());
        cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, model.stream());
        cudaEventRecord(stop, model.stream());
        cudaEventSynchronize(stop);
        float elapsed = 0;
        cudaEventElapsedTime(&elapsed, start, stop);
        if (rep > 0) ms.push_back(elapsed);
      }
      device_bandwidth = 2.0 * static_cast<double>(bytes) / (Median({ms.begin(), ms.end()}) / 1e3);
    }
    cudaFree(source);
    cudaFree(target);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  std::printf("device memory bandwidth (copy, read + write) %.0f GB/s\n", device_bandwidth / 1e9);
  results["device_bandwidth_gbps"] = device_bandwidth / 1e9;
  for (const int rows : {1, o.expansions, o.nodes + 1, 64}) {
    if (rows > options.max_batch_rows) continue;
    auto timing = model.TimeBaseMatMuls(rows, o.repetitions);
    BENCH_CHECK_OK(timing.status());
    const double floor = static_cast<double>(timing->weight_bytes) / device_bandwidth * 1e3;
    std::printf(
        "base matmuls alone, %d row(s): %.3f ms for %s of weights = %.0f GB/s (floor %.3f ms, "
        "%.2fx)\n",
        rows, timing->ms, model::FormatBytes(timing->weight_bytes).c_str(),
        static_cast<double>(timing->weight_bytes) / (timing->ms / 1e3) / 1e9, floor,
        timing->ms / floor);
    results["base_matmuls"][std::to_string(rows)] = {
        {"ms", timing->ms}, {"weight_bytes", timing->weight_bytes}, {"floor_ms", floor}};
  }

  // Verify timings of steps: the step's verifier forward and where its time went.
  struct VerifySamples {
    std::vector<double> ms, residual_ms, wait_gpu_ms, gpu_idle_ms;
    void Add(const speculation::SessionStep& step, const cuda::ForwardTimings& t) {
      ms.push_back(step.verify_ns / 1e6);
      residual_ms.push_back(t.residual_ns / 1e6);
      wait_gpu_ms.push_back(t.wait_gpu_ns / 1e6);
      gpu_idle_ms.push_back(t.gpu_idle_residual_ns / 1e6);
    }
  };
  // Speculation steps from root 42: each drafts a tree from the committed prefix (which grows by
  // the accepted path), verifies it and commits; the first is a warm-up.
  auto run_steps = [&](const speculation::TreeShape& step_shape, std::vector<double>* draft_ms,
                       VerifySamples* verify, speculation::DraftTree* last_tree) -> int {
    for (int rep = 0; rep < o.repetitions + 1 && seconds_left() > 0; ++rep) {
      speculation::SessionStep step{.root = 42, .shape = step_shape};
      BENCH_CHECK_OK((*session)->Step(step));
      *last_tree = step.tree;
      if (rep == 0) continue;
      if (draft_ms != nullptr) draft_ms->push_back(step.draft_ns / 1e6);
      verify->Add(step, (*session)->verify_forward_timings());
    }
    return 0;
  };

  // Draft forwards of 1 and k tokens (base only) with their top-k, over the committed prompt,
  // and the draft rounds of a whole tree: kernels launched one by one, then replayed from CUDA
  // graphs (the default; the projection and the tree's verify use these).
  cuda::DeviceKvCache& cache = (*session)->cache();
  const speculation::TreeShape shape{
      .nodes = o.nodes, .expansions = o.expansions, .max_depth = o.depth};
  std::vector<double> draft_ms;
  speculation::DraftTree tree;
  VerifySamples verify_tree;
  for (const bool graphs : {false, true}) {
    model.set_cuda_graphs(graphs);
    const std::string suffix = graphs ? "" : "_no_graphs";
    const char* label = graphs ? "CUDA graphs" : "kernel by kernel";
    for (const int rows : {1, o.expansions}) {
      std::vector<double> ms;
      for (int rep = 0; rep < o.repetitions + 2 && seconds_left() > 0; ++rep) {
        std::vector<int32_t> tokens(static_cast<size_t>(rows), 42);
        model::Batch batch =
            model::Batch::Causal(tokens, static_cast<int32_t>(cache.committed_length()));
        const Clock::time_point start = Clock::now();
        BENCH_CHECK_OK(model.Forward(batch, cache, model::ForwardMode::kDraft));
        BENCH_CHECK_OK(model.TopK(o.expansions).status());
        cache.DiscardPending();
        if (rep >= 2)
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      std::printf("draft forward, %d token(s) + top-%d, %s: %.3f ms (median of %zu)\n", rows,
                  o.expansions, label, Median(ms), ms.size());
      results["draft_forward_ms" + suffix][std::to_string(rows)] = Median(ms);
    }
    draft_ms.clear();
    verify_tree = {};
    if (run_steps(shape, &draft_ms, &verify_tree, &tree) != 0) return 1;
    std::printf("draft tree of %d nodes (k %d, depth %d), %s: %.3f ms, %d draft forwards\n",
                o.nodes, o.expansions, o.depth, label, Median(draft_ms), tree.draft_forwards);
    results["draft_tree_ms" + suffix] = Median(draft_ms);
  }
  results["draft_tree_forwards"] = tree.draft_forwards;

  // Verify of 1 node (steps with speculation off) and of the drafted trees, greedy.
  VerifySamples verify_one;
  speculation::DraftTree root_only;
  if (run_steps({.nodes = 0}, nullptr, &verify_one, &root_only) != 0) return 1;
  struct VerifyCase {
    std::string name;
    const VerifySamples* samples;
  };
  const VerifyCase cases[] = {{"1", &verify_one}, {std::to_string(tree.size()), &verify_tree}};
  double verify_tree_ms = 0;
  for (const VerifyCase& c : cases) {
    const std::vector<double>& ms = c.samples->ms;
    const std::vector<double>& residual_ms = c.samples->residual_ms;
    const std::vector<double>& wait_gpu_ms = c.samples->wait_gpu_ms;
    const std::vector<double>& gpu_idle_ms = c.samples->gpu_idle_ms;
    const double total = Median(ms);
    std::printf(
        "verify %s node(s): %.3f ms (median of %zu); host in residual %.3f ms (%.0f%%), host "
        "waiting for GPU %.3f ms (%.0f%%), GPU idle waiting for residual %.3f ms; floor %.3f ms\n",
        c.name.c_str(), total, ms.size(), Median(residual_ms),
        100.0 * Median(residual_ms) / std::max(total, 1e-9), Median(wait_gpu_ms),
        100.0 * Median(wait_gpu_ms) / std::max(total, 1e-9), Median(gpu_idle_ms), floor_ms);
    results["verify"][c.name] = {{"ms", total},
                                 {"residual_ms", Median(residual_ms)},
                                 {"wait_gpu_ms", Median(wait_gpu_ms)},
                                 {"gpu_idle_residual_ms", Median(gpu_idle_ms)},
                                 {"residual_share", Median(residual_ms) / std::max(total, 1e-9)},
                                 {"wait_gpu_share", Median(wait_gpu_ms) / std::max(total, 1e-9)}};
    verify_tree_ms = total;
  }

  // Projection: one step = a draft tree + its verify.
  const double step_ms = Median(draft_ms) + verify_tree_ms;
  std::vector<double> acceptances = {1.0, 5.23};
  if (o.acceptance > 0) acceptances.insert(acceptances.begin(), o.acceptance);
  for (const double a : acceptances) {
    std::printf("projected: %.2f accepted tokens per verify -> %.1f tokens/s (step %.2f ms)%s\n", a,
                a / step_ms * 1e3, step_ms,
                a == o.acceptance ? "  [acceptance measured on the real model]" : "");
    results["projection"].push_back(
        {{"acceptance", a}, {"tokens_per_s", a / step_ms * 1e3}, {"step_ms", step_ms}});
  }
  results["floor_tokens_per_s_at_acceptance"] =
      (o.acceptance > 0 ? o.acceptance : 1.0) / floor_ms * 1e3;
  results["wall_seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << results.dump(2) << "\n";
  }
  if (seconds_left() <= 0) std::printf("note: stopped early at the --max-seconds budget\n");
  return 0;
}
#endif  // BITSPLIT_HAVE_CUDA

}  // namespace
}  // namespace bitsplit::bench

int main(int argc, char** argv) {
#ifndef BITSPLIT_HAVE_CUDA
  (void)argc;
  (void)argv;
  std::printf("SKIP: built without BITSPLIT_CUDA\n");
  return 0;
#else
  bitsplit::bench::Options options;
  if (!bitsplit::bench::Parse(argc, argv, &options)) {
    bitsplit::bench::Usage();
    return 2;
  }
  return bitsplit::bench::Run(options);
#endif
}
