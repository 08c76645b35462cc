#pragma once
// Bits by budget, the measured half (docs/design.md §4, "Bits by budget", step 4): the predicted
// KL of a bit plan misses interactions, so plans are quantized and their verifiers' KL measured
// on the calibration window against Q8_0's, and the predicted bound searched for the cheapest
// plan that meets the quality target. Also the budget of a base share (`--vram-budget N%`).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/offline/bit_allocator.h"
#include "common/offline/split_quantizer.h"

namespace bitsplit::offline {

// Bytes of every linear weight in Q8_0: the yardstick of a budget given as a share.
uint64_t Q8_0LinearBytes(const model::ModelConfig& config);

// The device budget that gives the base weights `percent`% of Q8_0LinearBytes beside what the
// rest of `vram`'s plan (its constants, KV cache and scratch, with uniform bases) needs.
absl::StatusOr<uint64_t> BudgetForBaseShare(const model::VramRequest& vram, double percent);

struct PlanCheckOptions {
  std::string source_path;     // the GGUF the plans split
  std::string scratch_prefix;  // each measured plan is quantized to PREFIX.*.bsplit, then removed
  int rounds = 4;              // plans measured at most
  int threads = 0;             // 0: every core
  // Receives one line per measured plan (progress output); may be empty.
  std::function<void(const std::string&)> report;
};

struct PlanCheck {
  BitPlan plan;              // the plan kept
  double measured_kl = 0.0;  // mean KL(reference || its verifier) on the calibration window
  double q8_0_kl = 0.0;      // Q8_0's, measured the same way
  double target_kl = 0.0;    // the request's error factor x q8_0_kl
  bool met() const { return measured_kl <= target_kl; }
};

// Quantizes Q8_0 and the plans of `checked`'s bound, measures each verifier's KL on the
// calibration window, and searches the bound (NextErrorFactor) for the cheapest plan whose KL
// is at most the request's error factor x Q8_0's, at most `options.rounds` plans; a bound that
// changes no choice reuses the earlier measurement, and the search stops at a plan within
// kKlCloseEnough of the target. Keeps the measured plan with the least projected time per token
// among those that meet the target, else the one with the lowest KL; `checked` ends with that
// plan's bound.
absl::StatusOr<PlanCheck> CheckBitPlan(const PlanCheckOptions& options,
                                       const BitCandidates& candidates,
                                       const model::SplitQuantization& quantization,
                                       const Calibration& calibration,
                                       const std::vector<GroupSensitivity>& groups,
                                       AllocationRequest& checked);

}  // namespace bitsplit::offline
