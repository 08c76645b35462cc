#pragma once
// Quality evaluation of a model configuration against a reference (`bitsplit eval`,
// docs/quality.md): per-token KL divergence KL(reference ‖ config), top-1 agreement and
// perplexity, over the same token windows for every configuration.
//
// Windowing: the token stream (at most `max_tokens` of it) is cut into consecutive,
// non-overlapping windows of `window` tokens (the last one may be shorter; one of fewer than 2
// tokens is dropped). Each window is run by every source as one causal sequence from an empty
// KV cache, positions 0..n-1, no BOS added. Position i of a window (i < n - 1) is scored: its
// distribution predicts token i + 1, so a window of n tokens scores n - 1 positions. The
// reference's logits of one window are computed once and compared with each configuration's
// before the next window: nothing larger than one window of full-vocabulary logits per source
// is ever held.
//
// Statistics are in double precision. With a = log_softmax(reference logits) and
// b = log_softmax(config logits):
//   KL       = sum_v exp(a_v) * (a_v - b_v)            (nats; exactly 0 when the logits match)
//   top-1    = argmax(reference) == argmax(config)     (lowest id on ties)
//   NLL      = -b[next token]; perplexity = exp(mean NLL)
// Median and p99 use linear interpolation between order statistics at rank q * (n - 1).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"

namespace bitsplit::offline {

// ---- Per-token statistics ---------------------------------------------------------------------

// log_softmax of `logits` in double: out[v] = logits[v] - logsumexp(logits). `out` is resized.
void LogSoftmax(std::span<const float> logits, std::vector<double>* out);

// Index of the largest logit; the lowest index among equal maxima. -1 for an empty span.
int32_t ArgMax(std::span<const float> logits);

// KL(p ‖ q) in nats from log-probabilities (as LogSoftmax writes them): sum exp(a) (a - b).
// Terms with exp(a) == 0 contribute 0. Spans must have equal sizes.
double KlDivergence(std::span<const double> log_p, std::span<const double> log_q);

// Mean over rows of KL(softmax(p_row) ‖ softmax(q_row)) for row-major logits [rows][vocab] of two
// sources (e.g. a reference and a configuration on the same window). Sizes must be equal and a
// multiple of vocab.
double MeanKlDivergence(std::span<const float> p_logits, std::span<const float> q_logits,
                        int64_t vocab);

// The q-quantile (0 <= q <= 1) of `values` with linear interpolation between the order
// statistics at rank q * (n - 1) (numpy's default). `values` is reordered. NaN when empty.
double Quantile(std::vector<double>& values, double q);

// Aggregate of one configuration over all scored positions.
struct EvalSummary {
  int64_t tokens = 0;  // scored positions
  double kl_mean = 0;  // nats
  double kl_median = 0;
  double kl_p99 = 0;
  double kl_max = 0;
  double top1_agreement = 0;  // fraction of positions whose argmax equals the reference's
  double perplexity = 0;      // of this configuration on the text
  double nll_mean = 0;        // mean negative log-likelihood of the next token (nats)
};

// Accumulates per-position results (all KL values are kept: 8 bytes per position).
class EvalAccumulator {
 public:
  void Add(double kl, bool top1_agrees, double nll);
  int64_t count() const { return static_cast<int64_t>(kl_.size()); }
  EvalSummary Summarize() const;

 private:
  std::vector<double> kl_;
  int64_t agree_ = 0;
  double nll_sum_ = 0;
};

// ---- Sources of logits ------------------------------------------------------------------------

// Something that runs a window of tokens as one causal sequence from an empty cache and returns
// the logits of every position.
class LogitsSource {
 public:
  virtual ~LogitsSource() = default;
  virtual int64_t vocab_size() const = 0;
  // logits is resized to tokens.size() * vocab_size(), row i = position i.
  virtual absl::Status WindowLogits(std::span<const int32_t> tokens,
                                    std::vector<float>* logits) = 0;
};

// The reference engine (LlamaModel over a GGUF file): f32 activations, weights dequantized from
// the file's types. Does not own the model.
class LlamaLogitsSource : public LogitsSource {
 public:
  explicit LlamaLogitsSource(model::LlamaModel* model) : model_(model) {}
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  absl::Status WindowLogits(std::span<const int32_t> tokens, std::vector<float>* logits) override;

 private:
  model::LlamaModel* model_;
  std::unique_ptr<model::KvCache> cache_;
};

// A LogitsSource over any forward function with LlamaModel::Forward's contract (e.g. a split
// model in some mode): a causal batch of the window, all logit rows, from a cleared cache.
class ForwardLogitsSource : public LogitsSource {
 public:
  using ForwardFn =
      std::function<absl::Status(const model::Batch&, model::KvCache&, std::span<float>)>;
  ForwardLogitsSource(const model::ModelConfig& config, ForwardFn forward)
      : config_(config), forward_(std::move(forward)) {}
  int64_t vocab_size() const override { return config_.vocab_size; }
  absl::Status WindowLogits(std::span<const int32_t> tokens, std::vector<float>* logits) override;

 private:
  model::ModelConfig config_;
  ForwardFn forward_;
  std::unique_ptr<model::KvCache> cache_;
};

// ---- The evaluation loop ----------------------------------------------------------------------

struct EvalOptions {
  int64_t window = 512;
  int64_t max_tokens = 0;  // 0: the whole stream
  // Threads for the statistics (the forward passes use their own engines' threads).
  int num_threads = 1;
  // Called after each window with (windows done, windows total, seconds so far).
  std::function<void(int64_t, int64_t, double)> progress;
};

// The windows `tokens` is cut into under `options`: (begin, length) pairs.
std::vector<std::pair<int64_t, int64_t>> EvalWindows(int64_t num_tokens,
                                                     const EvalOptions& options);

struct EvalResult {
  EvalSummary summary;
  double forward_seconds = 0;  // time in this source's forward passes
  double stats_seconds = 0;    // time computing its statistics
};

struct EvalReport {
  EvalSummary reference;  // the reference against itself: KL 0, top-1 1, its perplexity
  double reference_forward_seconds = 0;
  std::vector<EvalResult> configs;  // in the order given
  int64_t windows = 0;
  int64_t tokens_evaluated = 0;  // tokens run through each source (scored + one per window)
};

// Runs the reference and every configuration over the windows of `tokens` side by side.
// INVALID_ARGUMENT for a window < 2, no tokens to score or a vocabulary mismatch; errors of a
// source are returned with its index.
absl::StatusOr<EvalReport> Evaluate(LogitsSource& reference, std::span<LogitsSource* const> configs,
                                    std::span<const int32_t> tokens, const EvalOptions& options);

}  // namespace bitsplit::offline
