// Prefill and decode speed of the reference engine on a real GGUF model.
//
//   build/bench/engine_speed_bench [--model PATH] [--threads N] [--prompt-tokens 256]
//       [--decode-tokens 64] [--kv-type f32|f16|q8_0] [Google Benchmark flags]
//
// Token ids are synthetic but fixed ((i * 7919 + 13) % 32000 + 100), the same as
// bench/llamacpp_speed.py feeds llama.cpp, so bench/compare_llamacpp.sh compares like with like.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"

namespace {

std::string g_model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
int g_threads = 0;
int g_prompt_tokens = 256;
int g_decode_tokens = 64;
bitsplit::model::KvType g_kv_type = bitsplit::model::KvType::kF32;

bitsplit::model::LlamaModel& Model() {
  static std::unique_ptr<bitsplit::model::LlamaModel> model = [] {
    auto loaded = bitsplit::model::LlamaModel::Load(g_model, g_threads);
    if (!loaded.ok()) {
      std::fprintf(stderr, "engine_speed_bench: %s\n",
                   std::string(loaded.status().message()).c_str());
      std::exit(2);
    }
    return std::move(loaded).value();
  }();
  return *model;
}

std::vector<int32_t> PromptTokens() {
  std::vector<int32_t> tokens(g_prompt_tokens);
  for (int i = 0; i < g_prompt_tokens; ++i) tokens[i] = (i * 7919 + 13) % 32000 + 100;
  return tokens;
}

void Prefill(bitsplit::model::LlamaModel& model, bitsplit::model::KvCache& cache,
             const std::vector<int32_t>& tokens, std::vector<float>& logits) {
  auto batch = bitsplit::model::Batch::Causal(tokens, 0);
  batch.logit_rows = {static_cast<int32_t>(tokens.size() - 1)};
  if (!model.Forward(batch, cache, logits.data()).ok() ||
      !cache.Commit(static_cast<int64_t>(tokens.size())).ok()) {
    std::abort();
  }
}

void BM_Prefill(benchmark::State& state) {
  auto& model = Model();
  auto cache = model.NewKvCache(g_prompt_tokens + g_decode_tokens, g_kv_type).value();
  std::vector<float> logits(model.config().vocab_size);
  const auto tokens = PromptTokens();
  for (auto _ : state) {
    cache.Clear();
    Prefill(model, cache, tokens, logits);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(g_prompt_tokens) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["threads"] = model.num_threads();
}

void BM_Decode(benchmark::State& state) {
  auto& model = Model();
  auto cache = model.NewKvCache(g_prompt_tokens + g_decode_tokens, g_kv_type).value();
  std::vector<float> logits(model.config().vocab_size);
  const auto tokens = PromptTokens();
  for (auto _ : state) {
    state.PauseTiming();
    cache.Clear();
    Prefill(model, cache, tokens, logits);
    state.ResumeTiming();
    int32_t token = tokens.back();
    for (int i = 0; i < g_decode_tokens; ++i) {
      const int32_t one[1] = {token};
      auto batch = bitsplit::model::Batch::Causal(one, g_prompt_tokens + i);
      if (!model.Forward(batch, cache, logits.data()).ok() || !cache.Commit(1).ok()) std::abort();
      int32_t best = 0;
      for (int32_t v = 1; v < static_cast<int32_t>(logits.size()); ++v) {
        if (logits[v] > logits[best]) best = v;
      }
      token = best;
    }
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(g_decode_tokens) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["threads"] = model.num_threads();
}

BENCHMARK(BM_Prefill)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first; the rest goes to Google Benchmark.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> const char* {
      return (std::strcmp(argv[i], flag) == 0 && i + 1 < argc) ? argv[++i] : nullptr;
    };
    if (const char* v = value("--model"))
      g_model = v;
    else if (const char* v = value("--threads"))
      g_threads = std::atoi(v);
    else if (const char* v = value("--prompt-tokens"))
      g_prompt_tokens = std::atoi(v);
    else if (const char* v = value("--decode-tokens"))
      g_decode_tokens = std::atoi(v);
    else if (const char* v = value("--kv-type")) {
      auto type = bitsplit::model::ParseKvType(v);
      if (!type.ok()) {
        std::fprintf(stderr, "engine_speed_bench: %s\n",
                     std::string(type.status().message()).c_str());
        return 2;
      }
      g_kv_type = *type;
    } else
      rest.push_back(argv[i]);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
