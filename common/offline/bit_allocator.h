#pragma once
// Bits by budget (`bitsplit quantize --vram-budget`, docs/design.md §4): per linear group (the
// q|k|v, o, gate|up and down matrices of each layer, the experts' gate|up and down of a
// mixture-of-experts layer, and the output head) a base format that the VRAM budget pays for and
// the residual format that the quality target needs. Attention, the dense FFN and the experts
// are separate groups, weighed separately.
//
// Sensitivities are measured, not assumed, in two steps:
//   * MeasureSensitivities quantizes every group with every candidate base and, on top of each
//     base, every candidate residual, and weighs each result's error by the calibration
//     activations: E = sum_j E[x_j^2] (w_j - w'_j)^2 over the group's rows, the expected squared
//     error of the group's output when input columns are uncorrelated.
//   * MeasureKlSensitivities converts output error into KL: per matrix kind (q|k|v, o, gate|up,
//     down, the experts' gate|up and down, head) it runs the reference model on the calibration
//     text with Gaussian noise of known energy added to that kind's outputs (of an expert group,
//     to each routed row's expert outputs) and divides the KL it causes by the energy.
//     Errors of different kinds differ by orders of magnitude in KL per unit (the head's errors
//     land on the logits directly); within a kind the factor is shared.
// The predicted KL of a plan is sum over groups of kl_per_error x E; it is additive for small
// errors (the regime of a verifier), and for drafts it only ranks plans. Q8_0's predicted KL from
// the same weights is the quality yardstick: a plan meets `--quality q8_0` when its verifier's
// predicted KL is at most Q8_0's; the residuals spend that KL where it saves the most RAM bytes.
// (The measured KL of Q8_0 is higher than its weights predict: it also quantizes unrotated
// activations to 8 bits. docs/quality.md compares predictions with measurements.)
//
// The allocation (AllocateBits) starts with every group on the fewest base bits, refuses a budget
// that even that plan exceeds (with what would fit), then upgrades one group at a time, each time
// the upgrade that most lowers the projected time per emitted token per VRAM byte, until no
// upgrade fits the budget or lowers the time. The projection (docs/design.md §4):
//   verify   = residual bytes / RAM bandwidth + base bytes / VRAM bandwidth
//   draft    = draft forwards per verify x base bytes / VRAM bandwidth
//              (of an expert group, the bytes of the experts a forward's rows are expected to
//              touch: ExpectedDistinctExperts over the measured routing frequencies, 16 rows a
//              verify and 4 a draft forward, as the allocation's MachineModel says)
//   tau      = tokens per verify, interpolated in log(draft distortion) between the acceptance
//              prior's measured uniform low-bit and high-bit bases, where the draft distortion is
//              the bases' predicted KL (with the draft-size KL factors)
//   time per token = (verify + draft) / tau
// Every plan the search visits is checked against the budget with PlanVram, so the result fits
// exactly as the CUDA backend allocates.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/linear_backend.h"
#include "common/model/llama_model.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/model/weights.h"
#include "common/offline/split_quantizer.h"
#include "nlohmann/json.hpp"

namespace bitsplit::offline {

// The formats the allocator chooses among, each list in ascending bits.
struct BitCandidates {
  std::vector<quant::SplitFormat> bases = {quant::SplitFormat::kB2Asym, quant::SplitFormat::kB3Asym,
                                           quant::SplitFormat::kB4Asym};
  std::vector<quant::SplitFormat> residuals = {quant::SplitFormat::kR3, quant::SplitFormat::kR4,
                                               quant::SplitFormat::kR5, quant::SplitFormat::kR6,
                                               quant::SplitFormat::kR8};
};

// One candidate base of one group.
struct BaseOption {
  quant::SplitFormat base = quant::SplitFormat::kB2Asym;
  uint64_t device_bytes = 0;  // VRAM of the group's matrices (device row strides, aligned)
  double base_error = 0;      // weighted squared error of W - B
  // Weighted squared error of W - B - R for each candidate residual (BitCandidates order).
  std::vector<double> verify_error;
};

// What quantizing one group costs and loses, for every candidate.
struct GroupSensitivity {
  model::LinearGroupId id;
  std::vector<std::string> tensors;  // LinearGroupTensorNames order
  int64_t weights = 0;
  double signal = 0;  // weighted squared weights, sum_j E[x_j^2] w_j^2
  // Weighted squared error of Q8_0 (group 32) of the same weights in the source basis (the q8_0
  // configuration is never rotated), weighed by the source-basis activations.
  double q8_0_error = 0;
  uint64_t q8_0_bytes = 0;
  // Predicted KL per unit of E at a verifier's error size and at a draft's: 1 / signal (the
  // relative error) until MeasureKlSensitivities sets them from the model.
  double kl_per_error = 0;
  double draft_kl_per_error = 0;
  std::vector<uint64_t> residual_bytes;  // RAM bytes per candidate residual
  std::vector<BaseOption> bases;         // per candidate base
  // Mixture-of-experts groups: the probability that a row is routed to each expert (they sum to
  // the experts used per row), measured on the calibration text, uniform k / E without one; empty
  // for a dense group. A verify of n rows reads ExpectedDistinctExperts(frequencies, n) of the
  // group's E experts.
  std::vector<double> expert_frequencies;
};

// Quantizes every linear group of `weights` with every candidate (in the basis of
// `quantization.rotation`, with its groups; calibration importance weighting the base fit exactly
// as QuantizeSplitModel does) and measures the errors. `calibration` (nullable) weighs the
// errors and the fit; without it every column weighs 1. `progress(done, total)` is called after
// every group on the calling thread. INVALID_ARGUMENT for candidates that are not base/residual
// formats or do not fit the model.
// Mixture-of-experts groups: expert e's rows weigh f_e x E / k (f_e its routing frequency,
// GroupSensitivity::expert_frequencies, from the calibration's routed rows), so that the group's
// error is E times the expected error of one routed (row, expert) pair: hot experts count more,
// and under uniform routing every expert counts 1.
absl::StatusOr<std::vector<GroupSensitivity>> MeasureSensitivities(
    const model::ModelWeights& weights, const model::ModelConfig& config,
    const model::SplitQuantization& quantization, const BitCandidates& candidates,
    const Calibration* calibration, int num_threads,
    const std::function<void(int64_t done, int64_t total)>& progress = {});

// Sets every group's kl_per_error and draft_kl_per_error from `model` (the reference: a GGUF
// model) on the calibration's first window: per matrix kind, the mean KL(clean || noisy) over
// the window's positions when every group of that kind gets Gaussian output noise of energy
// E_probe, divided by the kind's total E_probe; E_probe is the group's fewest-bits base under its
// middle residual (verify) or alone (draft). INVALID_ARGUMENT
// without a calibration window or for sensitivities of another model.
absl::Status MeasureKlSensitivities(model::LlamaModel& model, const Calibration& calibration,
                                    std::vector<GroupSensitivity>& groups);

// The machine the projection is for.
struct MachineModel {
  double ram_bytes_per_second = 60e9;
  double vram_bytes_per_second = 1e12;
  // Draft forwards per verify: a 16-node tree of depth 4 drafts 4 times.
  double draft_forwards_per_verify = 4;
  // Rows a verify computes (the tree's nodes); a draft forward computes verify_rows /
  // draft_forwards_per_verify. What share of an expert group each reads.
  double verify_rows = 16;
};

// Tokens per verify of a 16-node tree (k = 4) with uniform bases of the fewest and the most
// candidate bits. Defaults: SmolLM2-135M-Instruct, b2_asym/g64 and b4_asym/g64 + r8/g32 over the
// committed prompt set (docs/performance.md, acceptance).
struct AcceptancePrior {
  double low_bits_tau = 1.72;
  double high_bits_tau = 4.18;
};

struct AllocationRequest {
  // Config, base group, embedding bytes, context, sessions and batch rows of the device plan;
  // its base formats are the allocator's to choose.
  model::VramRequest vram;
  uint64_t budget_bytes = 0;
  // The residuals keep the verifier's predicted KL <= error_factor x Q8_0's.
  double error_factor = 1.0;
  MachineModel machine;
  AcceptancePrior prior;
};

struct BitPlan {
  // Per group (sensitivities order): the chosen base and residual (indices into BitCandidates).
  struct Choice {
    size_t base = 0;
    size_t residual = 0;
  };
  std::vector<Choice> choices;
  model::VramPlan vram;            // the device plan of the chosen bases
  uint64_t base_linear_bytes = 0;  // device bytes of the linear weights
  // RAM bytes of the residuals, and of those the bytes one verify reads (all of a dense group,
  // the expected distinct experts' share of an expert group).
  uint64_t residual_stored_bytes = 0;
  uint64_t residual_bytes = 0;
  uint64_t q8_0_bytes = 0;  // Q8_0's bytes of the same weights
  // Predicted KL (sums over the groups of kl_per_error x E): the verifier's, Q8_0's, and the
  // bound the residuals were chosen to meet (error_factor x Q8_0's).
  double verify_error = 0;
  double q8_0_error = 0;
  double error_target = 0;
  bool meets_quality = true;    // false: even the most residual bits exceed the bound
  double draft_distortion = 0;  // the same sum for the bases alone
  double projected_tau = 0;
  double verify_seconds = 0;
  double draft_seconds = 0;

  double seconds_per_token() const { return (verify_seconds + draft_seconds) / projected_tau; }
};

// The plan (see the header comment). INVALID_ARGUMENT for empty or inconsistent sensitivities,
// RESOURCE_EXHAUSTED (PlanVram's message: what fits instead) when even the fewest base bits do
// not fit the budget.
absl::StatusOr<BitPlan> AllocateBits(const std::vector<GroupSensitivity>& groups,
                                     const BitCandidates& candidates,
                                     const AllocationRequest& request);

// One measured check of a plan: the bound it was allocated for (AllocationRequest::error_factor)
// and its verifier's measured KL.
struct BoundTrial {
  double error_factor = 0;
  double measured_kl = 0;
};

// The check rounds stop once a plan's measured KL lies within [kKlCloseEnough, 1] x the target:
// a plan closer to it saves too few residual bytes to pay for another round.
inline constexpr double kKlCloseEnough = 0.9;

// The bound to allocate with next so that the measured KL lands in the middle of [kKlCloseEnough,
// 1] x `target_kl` (the cheapest plan that meets the target). Measured KL is modelled as a power
// of the bound, fitted locally: once one trial meets the target and one with a larger bound misses
// it, the next bound interpolates between the two in log-log, kept to the middle 60% of the
// bracket so a curved response still shrinks it; while every trial lies on one side, it
// extrapolates from the two trials nearest the target (exponent 1 from a single trial, the fitted
// one clamped to [0.3, 2]). `trials` must not be empty; bounds and KLs must be positive.
double NextErrorFactor(const std::vector<BoundTrial>& trials, double target_kl);

// `quantization` with the plan's formats for every linear tensor (tensor_formats) and the fewest
// candidate bits as its defaults.
model::SplitQuantization ApplyBitPlan(const std::vector<GroupSensitivity>& groups,
                                      const BitCandidates& candidates, const BitPlan& plan,
                                      model::SplitQuantization quantization);

// What `bitsplit quantize` prints: per matrix kind the groups on each base and residual, bytes on
// the GPU and in RAM beside Q8_0's, the projected verify floor and tokens/s.
std::string BitPlanReport(const std::vector<GroupSensitivity>& groups,
                          const BitCandidates& candidates, const BitPlan& plan,
                          const AllocationRequest& request);

// The sensitivities, the plan and its projection as JSON (`bitsplit quantize --plan-json`): for
// studies of the allocator and its proxy.
nlohmann::json BitPlanJson(const std::vector<GroupSensitivity>& groups,
                           const BitCandidates& candidates, const BitPlan& plan,
                           const AllocationRequest& request);

}  // namespace bitsplit::offline
