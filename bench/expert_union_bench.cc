// How many distinct experts a verify step of a mixture-of-experts model touches, and so how many
// residual bytes an expert-aware verify reads: docs/performance.md, "Experts a verify touches".
//
// A verify of N nodes routes N rows per MoE layer to k experts each. Reading each touched
// expert's residual once for all its rows costs (distinct experts) × (bytes of one expert's
// residual) per layer, not N × k × that. The bench runs the model's reference forward over a text
// in causal chunks of N tokens (each chunk one verify of an N-node chain after the committed
// prefix), counts the distinct experts of every MoE layer in every chunk through a LinearBackend
// wrapper, and prints, per N:
//
//   measured    mean distinct experts per layer per verify;
//   uniform     E · (1 − (1 − k/E)^N), the expectation if every row picked k of E experts
//               uniformly at random, independently of the other rows (no locality);
//   rows × k    N · k, the expert reads of a verify that read one expert per (row, choice);
//   bytes       the residual bytes of the measured experts per verify, all MoE layers, at the
//               default residual (r8, groups of 32; SplitRowBytes), and the same for rows × k.
//
//   build/bench/expert_union_bench --model FILE.gguf [--tokens 512] [--threads 2]
//
// The text is bench/prompts/prompts.jsonl's prompts, joined, tokenized with the model's own
// tokenizer. Random-weight models route without locality; a trained model's routing decides
// how far below `uniform` the measured union falls.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/llama_model.h"
#include "common/quant/split_format.h"
#include "common/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace bitsplit {
namespace {

// Counts the experts each ApplyExperts call names (one call per MoE layer and expert group).
class ExpertCounter final : public model::LinearBackend {
 public:
  explicit ExpertCounter(model::LinearBackend& inner) : inner_(inner) {}

  absl::Status Apply(model::LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override {
    return inner_.Apply(id, x, num_tokens, outputs, pool);
  }
  absl::Status ApplyExperts(int32_t layer, model::LinearGroup group, const float* x,
                            int64_t num_rows, std::span<const model::ExpertRows> segments,
                            std::span<float* const> outputs, ThreadPool& pool) override {
    if (group == model::LinearGroup::kExpertGateUp) {
      distinct_sum_ += static_cast<double>(segments.size());
      ++layer_calls_;
    }
    return inner_.ApplyExperts(layer, group, x, num_rows, segments, outputs, pool);
  }

  void Reset() { distinct_sum_ = 0, layer_calls_ = 0; }
  double MeanDistinct() const { return layer_calls_ == 0 ? 0 : distinct_sum_ / layer_calls_; }

 private:
  model::LinearBackend& inner_;
  double distinct_sum_ = 0;
  int64_t layer_calls_ = 0;
};

std::string PromptText() {
  std::ifstream in(BITSPLIT_SOURCE_DIR "/bench/prompts/prompts.jsonl");
  std::string text, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    text += nlohmann::json::parse(line)["prompt"].get<std::string>() + "\n\n";
  }
  return text;
}

int Run(const std::string& path, int64_t max_tokens, int threads) {
  auto loaded = model::LlamaModel::Load(path, threads);
  if (!loaded.ok()) {
    std::fprintf(stderr, "expert_union_bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  model::LlamaModel& m = **loaded;
  const model::ModelConfig& c = m.config();
  if (!c.has_experts()) {
    std::fprintf(stderr, "expert_union_bench: %s has no experts\n", path.c_str());
    return 1;
  }
  auto tokenizer = text::Tokenizer::FromGguf(m.gguf_metadata());
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "expert_union_bench: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> tokens = (*tokenizer)->Tokenize(PromptText(), true, false);
  if (static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(max_tokens);
  const double k = static_cast<double>(c.num_experts_used);
  int64_t expert_bytes = 0;  // one expert's residual: gate, up (d_ff_expert rows) and down
  expert_bytes += 2 * c.d_ff_expert * quant::SplitRowBytes(quant::SplitFormat::kR8, 32, c.d_model);
  expert_bytes += c.d_model * quant::SplitRowBytes(quant::SplitFormat::kR8, 32, c.d_ff_expert);
  std::printf(
      "%s: %s, %lld layers, %lld experts (%lld used) of width %lld; %zu tokens; one "
      "expert's r8 residual %.1f KiB\n",
      path.c_str(), c.architecture.c_str(), static_cast<long long>(c.num_layers),
      static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_used),
      static_cast<long long>(c.d_ff_expert), tokens.size(), expert_bytes / 1024.0);
  std::printf(
      "| N (verify rows) | measured distinct experts / layer | uniform E(1-(1-k/E)^N) | "
      "rows x k | residual MiB / verify, measured | residual MiB / verify, rows x k |\n");
  std::printf("|---|---|---|---|---|---|\n");
  ExpertCounter counter(*m.backend(model::ForwardMode::kReference));
  const double mib = 1024.0 * 1024.0;
  for (const int64_t n : {1, 4, 8, 16, 64}) {
    auto cache = m.NewKvCache(static_cast<int64_t>(tokens.size()));
    if (!cache.ok()) return 1;
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    counter.Reset();
    for (size_t start = 0; start + n <= tokens.size(); start += static_cast<size_t>(n)) {
      model::Batch batch = model::Batch::Causal(
          std::span(tokens).subspan(start, static_cast<size_t>(n)), static_cast<int32_t>(start));
      batch.logit_rows = {0};
      if (absl::Status status = m.ForwardWith(counter, batch, *cache, logits); !status.ok()) {
        std::fprintf(stderr, "expert_union_bench: %s\n", status.ToString().c_str());
        return 1;
      }
      if (!cache->Commit(n).ok()) return 1;
    }
    const double measured = counter.MeanDistinct();
    const double uniform =
        model::ExpectedDistinctExperts(c.num_experts, c.num_experts_used, static_cast<double>(n));
    const double rows_k = static_cast<double>(n) * k;
    const double layers = static_cast<double>(c.num_layers);
    std::printf("| %lld | %.2f | %.2f | %.0f | %.2f | %.2f |\n", static_cast<long long>(n),
                measured, uniform, rows_k, measured * expert_bytes * layers / mib,
                rows_k * expert_bytes * layers / mib);
  }
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) {
  std::string model;
  int64_t tokens = 512;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") {
      model = argv[i + 1];
    } else if (flag == "--tokens") {
      tokens = std::atoll(argv[i + 1]);
    } else if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "expert_union_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (model.empty() || tokens < 1 || threads < 1) {
    std::fprintf(stderr,
                 "usage: expert_union_bench --model FILE.gguf [--tokens N] [--threads N]\n");
    return 2;
  }
  return bitsplit::Run(model, tokens, threads);
}
