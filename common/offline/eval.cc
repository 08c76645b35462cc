#include "common/offline/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

namespace bitsplit::offline {
namespace {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// logsumexp in double, max-shifted.
double LogSumExp(std::span<const float> logits) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float v : logits) max_logit = std::max(max_logit, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  return max_logit + std::log(sum);
}

// Runs `tokens` as one causal sequence from an empty cache (created or cleared here).
absl::Status RunCausalWindow(const model::ModelConfig& config, std::span<const int32_t> tokens,
                             std::unique_ptr<model::KvCache>& cache,
                             const ForwardLogitsSource::ForwardFn& forward,
                             std::vector<float>* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("empty window");
  if (cache == nullptr || cache->capacity() < n) {
    BITSPLIT_ASSIGN_OR_RETURN(model::KvCache created, model::KvCache::Create(config, n));
    cache = std::make_unique<model::KvCache>(std::move(created));
  }
  cache->Clear();
  logits->resize(static_cast<size_t>(n * config.vocab_size));
  const model::Batch batch = model::Batch::Causal(tokens, 0);
  BITSPLIT_RETURN_IF_ERROR(forward(batch, *cache, std::span<float>(*logits)));
  cache->DiscardPending();
  return absl::OkStatus();
}

}  // namespace

void LogSoftmax(std::span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  if (logits.empty()) return;
  const double lse = LogSumExp(logits);
  for (size_t v = 0; v < logits.size(); ++v) (*out)[v] = static_cast<double>(logits[v]) - lse;
}

int32_t ArgMax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  size_t best = 0;
  for (size_t v = 1; v < logits.size(); ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  return static_cast<int32_t>(best);
}

double KlDivergence(std::span<const double> log_p, std::span<const double> log_q) {
  BITSPLIT_CHECK(log_p.size() == log_q.size());
  double kl = 0;
  for (size_t v = 0; v < log_p.size(); ++v) {
    const double p = std::exp(log_p[v]);
    if (p == 0) continue;
    kl += p * (log_p[v] - log_q[v]);
  }
  return kl;
}

double MeanKlDivergence(std::span<const float> p_logits, std::span<const float> q_logits,
                        int64_t vocab) {
  const size_t n = static_cast<size_t>(vocab);
  BITSPLIT_CHECK(n > 0 && p_logits.size() == q_logits.size() && p_logits.size() % n == 0);
  const size_t rows = p_logits.size() / n;
  std::vector<double> log_p, log_q;
  double sum = 0;
  for (size_t r = 0; r < rows; ++r) {
    LogSoftmax(p_logits.subspan(r * n, n), &log_p);
    LogSoftmax(q_logits.subspan(r * n, n), &log_q);
    sum += KlDivergence(log_p, log_q);
  }
  return rows > 0 ? sum / static_cast<double>(rows) : 0.0;
}

double Quantile(std::vector<double>& values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

void EvalAccumulator::Add(double kl, bool top1_agrees, double nll) {
  kl_.push_back(kl);
  if (top1_agrees) ++agree_;
  nll_sum_ += nll;
}

EvalSummary EvalAccumulator::Summarize() const {
  EvalSummary s;
  s.tokens = count();
  if (s.tokens == 0) return s;
  double kl_sum = 0;
  for (double kl : kl_) kl_sum += kl;
  std::vector<double> sorted = kl_;
  s.kl_mean = kl_sum / static_cast<double>(s.tokens);
  s.kl_median = Quantile(sorted, 0.5);
  s.kl_p99 = Quantile(sorted, 0.99);
  s.kl_max = sorted.back();
  s.top1_agreement = static_cast<double>(agree_) / static_cast<double>(s.tokens);
  s.nll_mean = nll_sum_ / static_cast<double>(s.tokens);
  s.perplexity = std::exp(s.nll_mean);
  return s;
}

absl::Status LlamaLogitsSource::WindowLogits(std::span<const int32_t> tokens,
                                             std::vector<float>* logits) {
  ForwardLogitsSource::ForwardFn forward = [this](const model::Batch& batch, model::KvCache& cache,
                                                  std::span<float> out) {
    return model_->Forward(batch, cache, out);
  };
  return RunCausalWindow(model_->config(), tokens, cache_, forward, logits);
}

absl::Status ForwardLogitsSource::WindowLogits(std::span<const int32_t> tokens,
                                               std::vector<float>* logits) {
  return RunCausalWindow(config_, tokens, cache_, forward_, logits);
}

std::vector<std::pair<int64_t, int64_t>> EvalWindows(int64_t num_tokens,
                                                     const EvalOptions& options) {
  std::vector<std::pair<int64_t, int64_t>> windows;
  if (options.window < 2) return windows;
  const int64_t total =
      options.max_tokens > 0 ? std::min(num_tokens, options.max_tokens) : num_tokens;
  for (int64_t begin = 0; begin < total; begin += options.window) {
    const int64_t length = std::min(options.window, total - begin);
    if (length >= 2) windows.emplace_back(begin, length);
  }
  return windows;
}

absl::StatusOr<EvalReport> Evaluate(LogitsSource& reference, std::span<LogitsSource* const> configs,
                                    std::span<const int32_t> tokens, const EvalOptions& options) {
  if (options.window < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window must be at least 2 tokens, got %d", options.window));
  }
  const auto windows = EvalWindows(static_cast<int64_t>(tokens.size()), options);
  if (windows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nothing to score: %d tokens (max_tokens %d) give no window of >= 2 tokens",
                        tokens.size(), options.max_tokens));
  }
  const int64_t vocab = reference.vocab_size();
  for (size_t c = 0; c < configs.size(); ++c) {
    if (configs[c]->vocab_size() != vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("configuration %d has a vocabulary of %d, the reference %d", c,
                          configs[c]->vocab_size(), vocab));
    }
  }

  ThreadPool pool(std::max(1, options.num_threads));
  EvalReport report;
  report.windows = static_cast<int64_t>(windows.size());
  report.configs.resize(configs.size());
  EvalAccumulator reference_acc;
  std::vector<EvalAccumulator> accs(configs.size());

  std::vector<float> ref_logits;
  std::vector<float> logits;
  std::vector<double> ref_log_p;  // [n - 1][vocab]
  std::vector<double> ref_p;      // exp(ref_log_p)
  std::vector<int32_t> ref_argmax;
  std::vector<double> row_kl, row_nll;
  std::vector<uint8_t> row_agree;
  const Clock::time_point start = Clock::now();

  for (size_t w = 0; w < windows.size(); ++w) {
    const auto [begin, length] = windows[w];
    const std::span<const int32_t> window =
        tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(length));
    const int64_t scored = length - 1;
    report.tokens_evaluated += length;

    Clock::time_point t0 = Clock::now();
    if (absl::Status status = reference.WindowLogits(window, &ref_logits); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("reference, window %d: %s", w, status.message()));
    }
    report.reference_forward_seconds += SecondsSince(t0);

    ref_log_p.resize(static_cast<size_t>(scored * vocab));
    ref_p.resize(ref_log_p.size());
    ref_argmax.resize(static_cast<size_t>(scored));
    row_kl.resize(static_cast<size_t>(scored));
    row_nll.resize(static_cast<size_t>(scored));
    row_agree.resize(static_cast<size_t>(scored));
    pool.ParallelFor(scored, [&](int64_t lo, int64_t hi, int) {
      std::vector<double> row;
      for (int64_t i = lo; i < hi; ++i) {
        const std::span<const float> logit_row(ref_logits.data() + i * vocab,
                                               static_cast<size_t>(vocab));
        LogSoftmax(logit_row, &row);
        double* log_p = ref_log_p.data() + i * vocab;
        double* p = ref_p.data() + i * vocab;
        for (int64_t v = 0; v < vocab; ++v) {
          log_p[v] = row[static_cast<size_t>(v)];
          p[v] = std::exp(log_p[v]);
        }
        ref_argmax[static_cast<size_t>(i)] = ArgMax(logit_row);
      }
    });
    for (int64_t i = 0; i < scored; ++i) {
      reference_acc.Add(0.0, true, -ref_log_p[static_cast<size_t>(i * vocab + window[i + 1])]);
    }

    for (size_t c = 0; c < configs.size(); ++c) {
      t0 = Clock::now();
      if (absl::Status status = configs[c]->WindowLogits(window, &logits); !status.ok()) {
        return absl::Status(status.code(), absl::StrFormat("configuration %d, window %d: %s", c, w,
                                                           status.message()));
      }
      report.configs[c].forward_seconds += SecondsSince(t0);
      t0 = Clock::now();
      pool.ParallelFor(scored, [&](int64_t lo, int64_t hi, int) {
        for (int64_t i = lo; i < hi; ++i) {
          const std::span<const float> logit_row(logits.data() + i * vocab,
                                                 static_cast<size_t>(vocab));
          const double lse = LogSumExp(logit_row);
          const double* log_p = ref_log_p.data() + i * vocab;
          const double* p = ref_p.data() + i * vocab;
          double kl = 0;
          for (int64_t v = 0; v < vocab; ++v) {
            if (p[v] == 0) continue;
            kl += p[v] * (log_p[v] - (static_cast<double>(logit_row[v]) - lse));
          }
          const size_t r = static_cast<size_t>(i);
          row_kl[r] = kl;
          row_nll[r] = -(static_cast<double>(logit_row[window[i + 1]]) - lse);
          row_agree[r] = ArgMax(logit_row) == ref_argmax[r];
        }
      });
      for (size_t r = 0; r < static_cast<size_t>(scored); ++r) {
        accs[c].Add(row_kl[r], row_agree[r] != 0, row_nll[r]);
      }
      report.configs[c].stats_seconds += SecondsSince(t0);
    }
    if (options.progress) {
      options.progress(static_cast<int64_t>(w + 1), report.windows, SecondsSince(start));
    }
  }
  report.reference = reference_acc.Summarize();
  for (size_t c = 0; c < configs.size(); ++c) report.configs[c].summary = accs[c].Summarize();
  return report;
}

}  // namespace bitsplit::offline
