#include "common/offline/bit_allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/kv_cache.h"
#include "common/model/split_backend.h"
#include "common/offline/eval.h"
#include "common/ops/matmul.h"
#include "common/quant/split_common.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

namespace bitsplit::offline {
namespace {

double WeightedSquaredError(const float* a, const float* b, const float* weight, int64_t n) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = static_cast<double>(a[j]) - b[j];
    sum += (weight != nullptr ? weight[j] : 1.0) * d * d;
  }
  return sum;
}

absl::Status ValidateCandidates(const BitCandidates& c, const model::SplitQuantization& q,
                                const model::ModelConfig& config) {
  if (c.bases.empty() || c.residuals.empty()) {
    return absl::InvalidArgumentError("the allocator needs at least one base and one residual");
  }
  for (const quant::SplitFormat f : c.bases) {
    if (!quant::GetSplitFormatInfo(f).is_base) {
      return absl::InvalidArgumentError(
          absl::StrCat(model::SplitFormatName(f), " is not a base format"));
    }
  }
  for (const quant::SplitFormat f : c.residuals) {
    if (!quant::GetSplitFormatInfo(f).is_residual) {
      return absl::InvalidArgumentError(
          absl::StrCat(model::SplitFormatName(f), " is not a residual format"));
    }
  }
  // Every candidate must fit every input width with the quantization's groups.
  for (const quant::SplitFormat base : c.bases) {
    for (const quant::SplitFormat residual : c.residuals) {
      model::SplitQuantization trial = q;
      trial.base_format = base;
      trial.residual_format = residual;
      trial.tensor_formats.clear();
      BITSPLIT_RETURN_IF_ERROR(ValidateSplitQuantization(trial, config));
    }
  }
  return absl::OkStatus();
}

// The probability that a row is routed to each expert of `layer`: the calibration's routed rows
// x k / their total, or k / E without routed rows.
std::vector<double> ExpertFrequencies(const model::ModelConfig& config, int32_t layer,
                                      const Calibration* calibration) {
  const size_t num_experts = static_cast<size_t>(config.num_experts);
  const double k = static_cast<double>(config.num_experts_used);
  std::vector<double> frequencies(num_experts, k / static_cast<double>(num_experts));
  if (calibration == nullptr) return frequencies;
  const std::vector<int64_t>& rows = calibration->expert_rows[static_cast<size_t>(layer)];
  int64_t total = 0;
  for (const int64_t n : rows) total += n;
  if (total <= 0) return frequencies;
  for (size_t e = 0; e < num_experts; ++e) {
    frequencies[e] = k * static_cast<double>(rows[e]) / static_cast<double>(total);
  }
  return frequencies;
}

// Per row of one matrix: signal, Q8_0 error, and per base its error and its verify errors.
struct RowErrors {
  double signal = 0;
  double q8_0 = 0;
  std::vector<double> base;    // [base]
  std::vector<double> verify;  // [base * residuals + residual]
};

}  // namespace

absl::StatusOr<std::vector<GroupSensitivity>> MeasureSensitivities(
    const model::ModelWeights& weights, const model::ModelConfig& config,
    const model::SplitQuantization& q, const BitCandidates& candidates,
    const Calibration* calibration, int num_threads,
    const std::function<void(int64_t, int64_t)>& progress) {
  BITSPLIT_RETURN_IF_ERROR(ValidateCandidates(candidates, q, config));
  if (calibration != nullptr && config.has_experts() &&
      (calibration->expert_rows.size() != static_cast<size_t>(config.num_layers) ||
       absl::c_any_of(calibration->expert_rows, [&](const std::vector<int64_t>& rows) {
         return rows.size() != static_cast<size_t>(config.num_experts);
       }))) {
    return absl::InvalidArgumentError("calibration was collected on a different model");
  }
  const std::vector<model::LinearGroupId> ids = model::AllLinearGroups(config);
  if (calibration != nullptr && calibration->importance.size() != ids.size()) {
    return absl::InvalidArgumentError("calibration was collected on a different model");
  }
  const size_t num_bases = candidates.bases.size();
  const size_t num_residuals = candidates.residuals.size();
  ThreadPool pool(num_threads);
  std::vector<GroupSensitivity> groups;
  groups.reserve(ids.size());
  for (size_t g = 0; g < ids.size(); ++g) {
    const model::LinearGroupId id = ids[g];
    const int64_t cols = model::LinearGroupInputDim(config, id);
    const float* importance = nullptr;
    const float* source_importance = nullptr;
    if (calibration != nullptr) {
      if (static_cast<int64_t>(calibration->importance[g].size()) != cols ||
          calibration->source_importance.size() != ids.size() ||
          static_cast<int64_t>(calibration->source_importance[g].size()) != cols) {
        return absl::InvalidArgumentError("calibration was collected on a different model");
      }
      importance = calibration->importance[g].data();
      source_importance = calibration->source_importance[g].data();
    }
    GroupSensitivity group;
    group.id = id;
    group.tensors = model::LinearGroupTensorNames(config, id);
    // Per expert, the weight of its rows' errors: f_e x E / k.
    std::vector<double> expert_weight;
    if (model::IsExpertGroup(id.group)) {
      group.expert_frequencies = ExpertFrequencies(config, id.layer, calibration);
      for (const double f : group.expert_frequencies) {
        expert_weight.push_back(f * static_cast<double>(config.num_experts) /
                                static_cast<double>(config.num_experts_used));
      }
    }
    group.residual_bytes.assign(num_residuals, 0);
    group.bases.resize(num_bases);
    for (size_t b = 0; b < num_bases; ++b) {
      group.bases[b].base = candidates.bases[b];
      group.bases[b].verify_error.assign(num_residuals, 0);
    }
    for (const ops::WeightMatrix* matrix : model::GroupMatricesOf(weights, id).span()) {
      const ops::WeightMatrix& w = *matrix;
      if (w.cols != cols) {
        return absl::InternalError(absl::StrCat(model::LinearGroupIdString(id), ": a matrix has ",
                                                w.cols, " columns, expected ", cols));
      }
      group.weights += w.rows * w.cols;
      group.q8_0_bytes += static_cast<uint64_t>(w.rows) *
                          quant::SplitRowBytes(quant::SplitFormat::kQ8_0, 32, w.cols);
      for (size_t r = 0; r < num_residuals; ++r) {
        group.residual_bytes[r] +=
            static_cast<uint64_t>(w.rows) *
            quant::SplitRowBytes(candidates.residuals[r], q.residual_group, w.cols);
      }
      for (size_t b = 0; b < num_bases; ++b) {
        group.bases[b].device_bytes +=
            model::AlignVram(static_cast<uint64_t>(w.rows) *
                             model::DeviceRowStride(candidates.bases[b], q.base_group, w.cols));
      }
      // Per-row sums are kept and added in row order, so the totals do not depend on threads.
      std::vector<RowErrors> rows(static_cast<size_t>(w.rows));
      std::mutex error_mutex;
      absl::Status first_error;
      pool.ParallelFor(w.rows, [&](int64_t begin, int64_t end, int) {
        const size_t n = static_cast<size_t>(w.cols);
        std::vector<float> row(n), approx(n), rest(n), residual_approx(n);
        std::vector<uint8_t> codes(quant::SplitRowBytes(quant::SplitFormat::kQ8_0, 32, w.cols));
        for (int64_t r = begin; r < end; ++r) {
          RowErrors& out = rows[static_cast<size_t>(r)];
          out.base.resize(num_bases);
          out.verify.resize(num_bases * num_residuals);
          ops::DequantizeWeightRow(w, r, row.data());
          // Q8_0 in the source basis (the product's q8_0 configuration is not rotated), weighed
          // by the source basis's activations: its error meets the activations' outlier
          // channels unspread.
          quant::QuantizeQ8_0SplitRow(row.data(), w.cols, codes.data());
          quant::DequantizeSplitRow(quant::SplitFormat::kQ8_0, 32, codes.data(), w.cols,
                                    approx.data());
          out.q8_0 = WeightedSquaredError(row.data(), approx.data(), source_importance, w.cols);
          model::RotateRows(q.rotation, row.data(), 1, w.cols);
          for (size_t j = 0; j < n; ++j) {
            out.signal += (importance != nullptr ? importance[j] : 1.0) *
                          static_cast<double>(row[j]) * row[j];
          }
          for (size_t b = 0; b < num_bases; ++b) {
            const quant::SplitFormat base = candidates.bases[b];
            codes.resize(quant::SplitRowBytes(base, q.base_group, w.cols));
            absl::Status status = quant::QuantizeBaseRow(base, q.base_group, row.data(), importance,
                                                         w.cols, codes.data());
            if (!status.ok()) {
              std::lock_guard<std::mutex> lock(error_mutex);
              if (first_error.ok()) first_error = status;
              return;
            }
            quant::DequantizeSplitRow(base, q.base_group, codes.data(), w.cols, approx.data());
            out.base[b] = WeightedSquaredError(row.data(), approx.data(), importance, w.cols);
            for (size_t j = 0; j < n; ++j) rest[j] = row[j] - approx[j];
            for (size_t k = 0; k < num_residuals; ++k) {
              const quant::SplitFormat residual = candidates.residuals[k];
              codes.resize(quant::SplitRowBytes(residual, q.residual_group, w.cols));
              status = quant::QuantizeResidualRow(residual, q.residual_group, rest.data(), w.cols,
                                                  codes.data());
              if (!status.ok()) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (first_error.ok()) first_error = status;
                return;
              }
              quant::DequantizeSplitRow(residual, q.residual_group, codes.data(), w.cols,
                                        residual_approx.data());
              out.verify[b * num_residuals + k] =
                  WeightedSquaredError(rest.data(), residual_approx.data(), importance, w.cols);
            }
          }
        }
      });
      if (!first_error.ok()) {
        return absl::Status(first_error.code(), absl::StrCat(model::LinearGroupIdString(id), ": ",
                                                             first_error.message()));
      }
      const int64_t rows_per_expert =
          expert_weight.empty() ? w.rows : w.rows / static_cast<int64_t>(expert_weight.size());
      for (int64_t r = 0; r < w.rows; ++r) {
        const RowErrors& row = rows[static_cast<size_t>(r)];
        const double weight =
            expert_weight.empty() ? 1.0 : expert_weight[static_cast<size_t>(r / rows_per_expert)];
        group.signal += weight * row.signal;
        group.q8_0_error += weight * row.q8_0;
        for (size_t b = 0; b < num_bases; ++b) {
          group.bases[b].base_error += weight * row.base[b];
          for (size_t k = 0; k < num_residuals; ++k) {
            group.bases[b].verify_error[k] += weight * row.verify[b * num_residuals + k];
          }
        }
      }
    }
    group.kl_per_error = group.draft_kl_per_error = 1.0 / std::max(group.signal, 1e-30);
    groups.push_back(std::move(group));
    if (progress) progress(static_cast<int64_t>(groups.size()), static_cast<int64_t>(ids.size()));
  }
  return groups;
}

namespace {

// A group's predicted KL from its weighted error.
double Kl(const GroupSensitivity& group, double error) { return group.kl_per_error * error; }
double DraftKl(const GroupSensitivity& group, double error) {
  return group.draft_kl_per_error * error;
}
// The change of the draft distortion when a group's base moves from one candidate to another.
double DraftKlChange(const GroupSensitivity& group, size_t from_base, size_t to_base) {
  return DraftKl(group, group.bases[to_base].base_error) -
         DraftKl(group, group.bases[from_base].base_error);
}

double VerifyError(const GroupSensitivity& group, size_t base, size_t residual) {
  return Kl(group, group.bases[base].verify_error[residual]);
}

// Tokens per verify for a draft distortion, between the prior's uniform low and high points.
double ProjectedTau(double distortion, double low_distortion, double high_distortion,
                    const AcceptancePrior& prior) {
  if (distortion >= low_distortion) return prior.low_bits_tau;
  if (distortion <= high_distortion) return prior.high_bits_tau;
  const double t = (std::log(low_distortion) - std::log(distortion)) /
                   (std::log(low_distortion) - std::log(high_distortion));
  return prior.low_bits_tau + t * (prior.high_bits_tau - prior.low_bits_tau);
}

// The share of a group's bytes that a forward of `rows` rows reads: all of a dense group, the
// expected distinct experts' of an expert group.
double ReadShare(const GroupSensitivity& group, double rows) {
  if (group.expert_frequencies.empty()) return 1.0;
  return model::ExpectedDistinctExperts(group.expert_frequencies, rows) /
         static_cast<double>(group.expert_frequencies.size());
}

// The residual of `group` on base `base` minimizing bytes read per verify (`read_share` of its
// bytes) + price x relative verify error.
size_t CheapestResidual(const GroupSensitivity& group, size_t base, double read_share,
                        double price) {
  size_t best = 0;
  double best_cost = 0;
  for (size_t k = 0; k < group.residual_bytes.size(); ++k) {
    const double cost = read_share * static_cast<double>(group.residual_bytes[k]) +
                        price * VerifyError(group, base, k);
    if (k == 0 || cost < best_cost) {
      best = k;
      best_cost = cost;
    }
  }
  return best;
}

// Every group's residual for the given bases: the fewest RAM bytes read per verify (group g reads
// read_share[g] of its bytes) whose summed relative verify error stays within `target`. A
// Lagrangian price (bytes per unit of error) found by bisection gives each group its own choice;
// the slack the discrete choices leave is then spent, fewest bytes per unit of error first. When
// even the most residual bits exceed the target, every group takes them (feasible = false).
struct ResidualSolution {
  std::vector<size_t> residual;
  uint64_t stored_bytes = 0;
  double bytes = 0;  // read per verify
  double error = 0;
  double price = 0;  // the price the choices were made at (for pricing a change of base)
  bool feasible = true;
};

ResidualSolution SolveResiduals(const std::vector<GroupSensitivity>& groups,
                                const std::vector<size_t>& bases,
                                const std::vector<double>& read_share, double target) {
  const size_t num_groups = groups.size();
  const size_t last = groups[0].residual_bytes.size() - 1;
  ResidualSolution solution;
  auto choose = [&](double price) {
    solution.residual.assign(num_groups, last);
    solution.error = 0;
    for (size_t g = 0; g < num_groups; ++g) {
      solution.residual[g] =
          price < 0 ? last : CheapestResidual(groups[g], bases[g], read_share[g], price);
      solution.error += VerifyError(groups[g], bases[g], solution.residual[g]);
    }
  };
  choose(-1);  // the most bits everywhere
  solution.price = std::numeric_limits<double>::infinity();
  if (solution.error > target) {
    solution.feasible = false;
  } else {
    // The error is non-increasing in the price: the smallest price (in log space) meeting it.
    double low = -6, high = 24;  // log10 of bytes per unit of relative error
    for (int i = 0; i < 80; ++i) {
      const double mid = 0.5 * (low + high);
      choose(std::pow(10.0, mid));
      (solution.error <= target ? high : low) = mid;
    }
    solution.price = std::pow(10.0, high);
    choose(solution.price);
    // Spend the slack: the fewer-bits step saving the most bytes per unit of added error.
    for (;;) {
      std::optional<std::pair<size_t, size_t>> best;
      double best_ratio = -1;
      for (size_t g = 0; g < num_groups; ++g) {
        const size_t current = solution.residual[g];
        for (size_t k = 0; k < current; ++k) {
          const double added =
              VerifyError(groups[g], bases[g], k) - VerifyError(groups[g], bases[g], current);
          if (solution.error + added > target) continue;
          const double saved =
              read_share[g] * (static_cast<double>(groups[g].residual_bytes[current]) -
                               static_cast<double>(groups[g].residual_bytes[k]));
          const double ratio = saved / std::max(added, 1e-300);
          if (saved > 0 && ratio > best_ratio) {
            best_ratio = ratio;
            best = {g, k};
          }
        }
      }
      if (!best) break;
      solution.error +=
          VerifyError(groups[best->first], bases[best->first], best->second) -
          VerifyError(groups[best->first], bases[best->first], solution.residual[best->first]);
      solution.residual[best->first] = best->second;
    }
  }
  for (size_t g = 0; g < num_groups; ++g) {
    const uint64_t bytes = groups[g].residual_bytes[solution.residual[g]];
    solution.stored_bytes += bytes;
    solution.bytes += read_share[g] * static_cast<double>(bytes);
  }
  return solution;
}

}  // namespace

absl::StatusOr<BitPlan> AllocateBits(const std::vector<GroupSensitivity>& groups,
                                     const BitCandidates& candidates,
                                     const AllocationRequest& request) {
  const std::vector<model::LinearGroupId> ids = model::AllLinearGroups(request.vram.config);
  if (groups.size() != ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the sensitivities cover ", groups.size(),
                                                   " linear groups; the model has ", ids.size()));
  }
  for (const GroupSensitivity& group : groups) {
    if (group.bases.size() != candidates.bases.size() ||
        group.residual_bytes.size() != candidates.residuals.size() || group.tensors.empty() ||
        !(group.kl_per_error > 0) || !(group.draft_kl_per_error > 0)) {
      return absl::InvalidArgumentError(
          "the sensitivities were measured for other candidates or have no KL factor");
    }
    if (group.expert_frequencies.size() !=
        (model::IsExpertGroup(group.id.group) ? static_cast<size_t>(request.vram.config.num_experts)
                                              : 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(model::LinearGroupIdString(group.id),
                       ": routing frequencies do not match the model's experts"));
    }
  }
  if (!(request.error_factor > 0) || !(request.machine.ram_bytes_per_second > 0) ||
      !(request.machine.vram_bytes_per_second > 0) || !(request.machine.verify_rows >= 1) ||
      !(request.machine.draft_forwards_per_verify >= 0) || !(request.prior.low_bits_tau >= 1) ||
      !(request.prior.high_bits_tau >= request.prior.low_bits_tau)) {
    return absl::InvalidArgumentError(
        "allocation needs a positive quality factor and bandwidths, verify rows >= 1 and tokens "
        "per verify >= 1 rising with bits");
  }

  // The device plan with group g on base bases[g].
  auto vram_request_of = [&](const std::vector<size_t>& bases) {
    model::VramRequest vram = request.vram;
    vram.base_format = candidates.bases.front();
    vram.base_tensor_formats.clear();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const std::string& name : groups[g].tensors) {
        vram.base_tensor_formats.emplace(name, candidates.bases[bases[g]]);
      }
    }
    return vram;
  };

  std::vector<size_t> bases(groups.size(), 0);
  absl::StatusOr<model::VramPlan> smallest =
      model::PlanVram(vram_request_of(bases), request.budget_bytes);
  if (!smallest.ok()) {
    return absl::Status(smallest.status().code(),
                        absl::StrCat("even the fewest base bits (every linear weight ",
                                     model::SplitFormatName(candidates.bases.front()),
                                     ") do not fit: ", smallest.status().message()));
  }
  // Everything but the base weights' slab is independent of the bases.
  uint64_t base_bytes = 0;
  double low_distortion = 0, high_distortion = 0, q8_0_error = 0;
  for (const GroupSensitivity& group : groups) {
    base_bytes += group.bases.front().device_bytes;
    low_distortion += DraftKl(group, group.bases.front().base_error);
    high_distortion += DraftKl(group, group.bases.back().base_error);
    q8_0_error += Kl(group, group.q8_0_error);
  }
  BITSPLIT_CHECK(model::RoundVramSlab(base_bytes) == smallest->base_weights_bytes);
  const uint64_t other_bytes = smallest->total_bytes - smallest->base_weights_bytes;
  auto fits = [&](uint64_t bytes) {
    return model::RoundVramSlab(bytes) + other_bytes <= request.budget_bytes;
  };
  const double target = request.error_factor * q8_0_error;

  const MachineModel& machine = request.machine;
  // Per group, the share of its bytes a verify and a draft forward read.
  const double draft_rows =
      machine.draft_forwards_per_verify > 0
          ? std::max(1.0, machine.verify_rows / machine.draft_forwards_per_verify)
          : 1.0;
  std::vector<double> verify_share(groups.size()), draft_share(groups.size());
  // Base bytes a verify and a draft forward read.
  double verify_base = 0, draft_base = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    verify_share[g] = ReadShare(groups[g], machine.verify_rows);
    draft_share[g] = ReadShare(groups[g], draft_rows);
    verify_base += verify_share[g] * static_cast<double>(groups[g].bases.front().device_bytes);
    draft_base += draft_share[g] * static_cast<double>(groups[g].bases.front().device_bytes);
  }
  struct Seconds {
    double verify = 0, draft = 0;
  };
  auto seconds_of = [&](double verify_base_bytes, double draft_base_bytes, double residual_bytes) {
    return Seconds{
        residual_bytes / machine.ram_bytes_per_second +
            verify_base_bytes / machine.vram_bytes_per_second,
        machine.draft_forwards_per_verify * draft_base_bytes / machine.vram_bytes_per_second};
  };
  auto seconds_per_token = [&](double verify_base_bytes, double draft_base_bytes,
                               double residual_bytes, double distortion) {
    const Seconds s = seconds_of(verify_base_bytes, draft_base_bytes, residual_bytes);
    return (s.verify + s.draft) /
           ProjectedTau(distortion, low_distortion, high_distortion, request.prior);
  };
  double distortion = low_distortion;
  ResidualSolution residuals = SolveResiduals(groups, bases, verify_share, target);

  // Greedy base upgrades: the most time saved per VRAM byte among those that fit, the changed
  // group's residual priced at the current solution's price; the residuals are solved again
  // after every upgrade.
  for (;;) {
    const double now = seconds_per_token(verify_base, draft_base, residuals.bytes, distortion);
    double best_gain = 0;
    std::optional<std::pair<size_t, size_t>> best;
    for (size_t g = 0; g < groups.size(); ++g) {
      const GroupSensitivity& group = groups[g];
      const size_t current = bases[g];
      for (size_t b = current + 1; b < group.bases.size(); ++b) {
        const uint64_t trial_base =
            base_bytes - group.bases[current].device_bytes + group.bases[b].device_bytes;
        if (trial_base <= base_bytes || !fits(trial_base)) continue;
        const double added = static_cast<double>(group.bases[b].device_bytes) -
                             static_cast<double>(group.bases[current].device_bytes);
        const size_t residual = residuals.feasible
                                    ? CheapestResidual(group, b, verify_share[g], residuals.price)
                                    : group.residual_bytes.size() - 1;
        const double trial_residual =
            residuals.bytes +
            verify_share[g] * (static_cast<double>(group.residual_bytes[residual]) -
                               static_cast<double>(group.residual_bytes[residuals.residual[g]]));
        const double trial_distortion = distortion + DraftKlChange(group, current, b);
        const double gain = (now - seconds_per_token(verify_base + verify_share[g] * added,
                                                     draft_base + draft_share[g] * added,
                                                     trial_residual, trial_distortion)) /
                            static_cast<double>(trial_base - base_bytes);
        if (gain > best_gain) {
          best_gain = gain;
          best = {g, b};
        }
      }
    }
    if (!best) break;
    const auto [g, b] = *best;
    const double added = static_cast<double>(groups[g].bases[b].device_bytes) -
                         static_cast<double>(groups[g].bases[bases[g]].device_bytes);
    base_bytes += groups[g].bases[b].device_bytes - groups[g].bases[bases[g]].device_bytes;
    verify_base += verify_share[g] * added;
    draft_base += draft_share[g] * added;
    distortion += DraftKlChange(groups[g], bases[g], b);
    bases[g] = b;
    residuals = SolveResiduals(groups, bases, verify_share, target);
  }

  absl::StatusOr<model::VramPlan> vram =
      model::PlanVram(vram_request_of(bases), request.budget_bytes);
  BITSPLIT_CHECK(vram.ok());  // every accepted upgrade was checked to fit
  BitPlan plan;
  for (size_t g = 0; g < groups.size(); ++g) {
    plan.choices.push_back({bases[g], residuals.residual[g]});
    plan.q8_0_bytes += groups[g].q8_0_bytes;
  }
  plan.vram = *vram;
  plan.base_linear_bytes = base_bytes;
  plan.residual_stored_bytes = residuals.stored_bytes;
  plan.residual_bytes = static_cast<uint64_t>(std::llround(residuals.bytes));
  plan.verify_error = residuals.error;
  plan.q8_0_error = q8_0_error;
  plan.error_target = target;
  plan.meets_quality = residuals.feasible;
  plan.draft_distortion = distortion;
  plan.projected_tau = ProjectedTau(distortion, low_distortion, high_distortion, request.prior);
  const Seconds seconds = seconds_of(verify_base, draft_base, residuals.bytes);
  plan.verify_seconds = seconds.verify;
  plan.draft_seconds = seconds.draft;
  return plan;
}

namespace {

// Adds Gaussian noise to the outputs of the linear groups of one kind: group g's outputs get
// independent noise of variance energy[g] / (its output rows) per element, so that its expected
// squared output error per token is energy[g], as a weight error of weighted energy E would give.
// The noise is a function of (group, matrix, token, row) alone. Thread safety: one forward at a
// time, like every LinearBackend wrapper.
class OutputNoise final : public model::LinearBackend {
 public:
  OutputNoise(model::LinearBackend& inner, const model::ModelConfig& config,
              model::LinearGroup kind, const std::vector<double>& energy)
      : inner_(inner), config_(config), kind_(kind), energy_(energy) {}

  absl::Status Apply(model::LinearGroupId id, const float* x, int64_t num_tokens,
                     std::span<float* const> outputs, ThreadPool& pool) override {
    BITSPLIT_RETURN_IF_ERROR(inner_.Apply(id, x, num_tokens, outputs, pool));
    if (id.group == kind_)
      AddNoise(id, 0, num_tokens, model::LinearGroupOutputDims(config_, id), outputs);
    return absl::OkStatus();
  }
  // A routed row's expert output gets the noise of a weight error of the group's energy spread
  // over all its experts' rows (LinearGroupOutputDims counts them all): the error one routed
  // (row, expert) pair meets when every expert errs alike.
  absl::Status ApplyExperts(int32_t layer, model::LinearGroup group, const float* x,
                            int64_t num_rows, std::span<const model::ExpertRows> segments,
                            std::span<float* const> outputs, ThreadPool& pool) override {
    BITSPLIT_RETURN_IF_ERROR(
        inner_.ApplyExperts(layer, group, x, num_rows, segments, outputs, pool));
    if (group != kind_) return absl::OkStatus();
    const model::LinearGroupId id{layer, group};
    const std::vector<int64_t> widths = model::ExpertOutputDims(config_, group);
    for (const model::ExpertRows& segment : segments) {
      std::vector<float*> rows(outputs.size());
      for (size_t m = 0; m < outputs.size(); ++m) {
        rows[m] = outputs[m] + segment.first_row * widths[m];
      }
      AddNoise(id, segment.first_row, segment.count, model::LinearGroupOutputDims(config_, id),
               rows, widths);
    }
    return absl::OkStatus();
  }

 private:
  // Noise on `num_rows` rows (the forward's rows from `first_row` on) of each output: variance
  // energy / (sum of `all_rows`) per element. `widths` (default: all_rows) are the outputs' row
  // widths.
  void AddNoise(model::LinearGroupId id, int64_t first_row, int64_t num_rows,
                const std::vector<int64_t>& all_rows, std::span<float* const> outputs,
                std::vector<int64_t> widths = {}) const {
    if (widths.empty()) widths = all_rows;
    const int64_t index = model::LinearGroupIndex(config_, id);
    int64_t total_rows = 0;
    for (const int64_t r : all_rows) total_rows += r;
    const double sigma = std::sqrt(energy_[static_cast<size_t>(index)] / total_rows);
    for (size_t m = 0; m < outputs.size(); ++m) {
      const uint64_t seed = (static_cast<uint64_t>(index) << 8) | m;
      const int64_t first = first_row * widths[m];
      for (int64_t i = 0; i < num_rows * widths[m]; ++i) {
        // Box-Muller from two uniforms in (0, 1].
        const double u1 = 1.0 - PhiloxUniform(seed, 2 * (first + i));
        const double u2 = PhiloxUniform(seed, 2 * (first + i) + 1);
        outputs[m][i] += static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) *
                                            std::cos(6.283185307179586 * u2));
      }
    }
  }

  model::LinearBackend& inner_;
  const model::ModelConfig config_;
  const model::LinearGroup kind_;
  const std::vector<double>& energy_;
};

}  // namespace

absl::Status MeasureKlSensitivities(model::LlamaModel& model, const Calibration& calibration,
                                    std::vector<GroupSensitivity>& groups) {
  const model::ModelConfig& config = model.config();
  const std::vector<model::LinearGroupId> ids = model::AllLinearGroups(config);
  if (groups.size() != ids.size()) {
    return absl::InvalidArgumentError("the sensitivities are of another model");
  }
  const std::vector<int32_t>& tokens = calibration.first_window;
  if (tokens.size() < 2) {
    return absl::InvalidArgumentError("the calibration has no window of 2 or more tokens");
  }
  model::LinearBackend* reference = model.backend(model::ForwardMode::kReference);
  if (reference == nullptr) {
    return absl::FailedPreconditionError("the KL probe needs the source model (reference mode)");
  }
  // Two probes per kind: at a verifier's error (the fewest-bits base under the middle residual)
  // and at a draft's (the fewest-bits base alone); KL per unit of error differs between them.
  std::vector<double> verify_energy(groups.size()), draft_energy(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<double>& errors = groups[g].bases.front().verify_error;
    verify_energy[g] = errors[errors.size() / 2];
    draft_energy[g] = groups[g].bases.front().base_error;
  }
  const model::Batch batch = model::Batch::Causal(tokens, 0);
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  BITSPLIT_ASSIGN_OR_RETURN(model::KvCache cache,
                            model.NewKvCache(static_cast<int64_t>(tokens.size())));
  std::vector<float> clean(tokens.size() * vocab), noisy(tokens.size() * vocab);
  BITSPLIT_RETURN_IF_ERROR(model.ForwardWith(*reference, batch, cache, clean));
  // Mean KL over the window with noise of `energy` on the groups of `kind`, per unit of energy.
  auto kl_per_unit = [&](model::LinearGroup kind,
                         const std::vector<double>& energy) -> absl::StatusOr<double> {
    double kind_energy = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (ids[g].group == kind) kind_energy += energy[g];
    }
    if (!(kind_energy > 0)) return 1e-30;
    OutputNoise noise(*reference, config, kind, energy);
    cache.Clear();
    BITSPLIT_RETURN_IF_ERROR(model.ForwardWith(noise, batch, cache, noisy));
    return std::max(MeanKlDivergence(clean, noisy, config.vocab_size), 1e-30) / kind_energy;
  };
  for (const model::LinearGroup kind :
       {model::LinearGroup::kQkv, model::LinearGroup::kAttnOutput, model::LinearGroup::kGateUp,
        model::LinearGroup::kDown, model::LinearGroup::kOutputHead,
        model::LinearGroup::kExpertGateUp, model::LinearGroup::kExpertDown}) {
    BITSPLIT_ASSIGN_OR_RETURN(const double verify, kl_per_unit(kind, verify_energy));
    BITSPLIT_ASSIGN_OR_RETURN(const double draft, kl_per_unit(kind, draft_energy));
    for (size_t g = 0; g < groups.size(); ++g) {
      if (ids[g].group != kind) continue;
      groups[g].kl_per_error = verify;
      groups[g].draft_kl_per_error = draft;
    }
  }
  return absl::OkStatus();
}

double NextErrorFactor(const std::vector<BoundTrial>& trials, double target_kl) {
  BITSPLIT_CHECK(!trials.empty() && target_kl > 0);
  const double aim = (1 + kKlCloseEnough) / 2 * target_kl;
  std::vector<BoundTrial> met, missed;
  for (const BoundTrial& t : trials) {
    BITSPLIT_CHECK(t.error_factor > 0 && t.measured_kl > 0);
    (t.measured_kl <= target_kl ? met : missed).push_back(t);
  }
  // Met by the largest bounds first, missed by the smallest: the trials nearest the target.
  std::sort(met.begin(), met.end(), [](const BoundTrial& a, const BoundTrial& b) {
    return a.error_factor > b.error_factor;
  });
  std::sort(missed.begin(), missed.end(), [](const BoundTrial& a, const BoundTrial& b) {
    return a.error_factor < b.error_factor;
  });
  if (!met.empty() && !missed.empty() && missed[0].error_factor > met[0].error_factor) {
    const double fraction = std::clamp(
        std::log(aim / met[0].measured_kl) / std::log(missed[0].measured_kl / met[0].measured_kl),
        0.2, 0.8);
    return met[0].error_factor * std::pow(missed[0].error_factor / met[0].error_factor, fraction);
  }
  const std::vector<BoundTrial>& side = met.empty() ? missed : met;
  double exponent = 1;
  if (side.size() >= 2 && side[0].error_factor != side[1].error_factor) {
    exponent = std::clamp(std::log(side[0].measured_kl / side[1].measured_kl) /
                              std::log(side[0].error_factor / side[1].error_factor),
                          0.3, 2.0);
  }
  return side[0].error_factor * std::pow(aim / side[0].measured_kl, 1 / exponent);
}

model::SplitQuantization ApplyBitPlan(const std::vector<GroupSensitivity>& groups,
                                      const BitCandidates& candidates, const BitPlan& plan,
                                      model::SplitQuantization quantization) {
  BITSPLIT_CHECK(plan.choices.size() == groups.size());
  quantization.base_format = candidates.bases.front();
  quantization.residual_format = candidates.residuals.front();
  quantization.tensor_formats.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const model::TensorSplitFormats formats = {candidates.bases[plan.choices[g].base],
                                               candidates.residuals[plan.choices[g].residual]};
    for (const std::string& name : groups[g].tensors) {
      quantization.tensor_formats.emplace(name, formats);
    }
  }
  return quantization;
}

namespace {

// What the calibration's routing shows, over the mixture-of-experts layers: the share of routed
// rows the hottest tenth of the experts take, and the experts a verify is expected to touch,
// each beside its uniform-routing value.
std::string RoutingReport(const std::vector<GroupSensitivity>& groups, double verify_rows) {
  std::vector<double> hot_shares, distinct;
  size_t num_experts = 0;
  double used = 0;
  for (const GroupSensitivity& group : groups) {
    if (group.id.group != model::LinearGroup::kExpertGateUp) continue;
    std::vector<double> f = group.expert_frequencies;
    num_experts = f.size();
    used = 0;
    for (const double x : f) used += x;
    std::sort(f.begin(), f.end(), std::greater<>());
    const size_t hot = std::max<size_t>(1, f.size() / 10);
    double hot_sum = 0;
    for (size_t e = 0; e < hot; ++e) hot_sum += f[e];
    hot_shares.push_back(hot_sum / used);
    distinct.push_back(model::ExpectedDistinctExperts(group.expert_frequencies, verify_rows));
  }
  if (hot_shares.empty()) return "";
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (const double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  const size_t hot = std::max<size_t>(1, num_experts / 10);
  const double uniform_distinct = model::ExpectedDistinctExperts(static_cast<int64_t>(num_experts),
                                                                 std::llround(used), verify_rows);
  return absl::StrFormat(
      "routing (calibration text): the hottest %d of %d experts take %.1f%% of routed rows "
      "(layers %.1f-%.1f%%, uniform %.1f%%); a %.0f-row verify touches %.1f experts per layer "
      "(layers %.1f-%.1f, uniform %.1f)\n",
      hot, num_experts, 100 * mean(hot_shares), 100 * *absl::c_min_element(hot_shares),
      100 * *absl::c_max_element(hot_shares),
      100.0 * static_cast<double>(hot) / static_cast<double>(num_experts), verify_rows,
      mean(distinct), *absl::c_min_element(distinct), *absl::c_max_element(distinct),
      uniform_distinct);
}

}  // namespace

std::string BitPlanReport(const std::vector<GroupSensitivity>& groups,
                          const BitCandidates& candidates, const BitPlan& plan,
                          const AllocationRequest& request) {
  // Per matrix kind, in AllLinearGroups order of first appearance.
  std::vector<model::LinearGroup> kinds;
  std::map<model::LinearGroup, std::map<std::string, int>> bases, residuals;
  for (size_t g = 0; g < groups.size(); ++g) {
    const model::LinearGroup kind = groups[g].id.group;
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    ++bases[kind][model::SplitFormatName(candidates.bases[plan.choices[g].base])];
    ++residuals[kind][model::SplitFormatName(candidates.residuals[plan.choices[g].residual])];
  }
  auto counts = [](const std::map<std::string, int>& of) {
    return absl::StrJoin(of, "  ", [](std::string* out, const auto& entry) {
      absl::StrAppend(out, entry.first, " x", entry.second);
    });
  };
  int64_t linear_weights = 0;
  for (const GroupSensitivity& group : groups) linear_weights += group.weights;
  std::string text = absl::StrFormat("bit plan for a VRAM budget of %s:\n",
                                     model::FormatBytes(request.budget_bytes));
  for (const model::LinearGroup kind : kinds) {
    absl::StrAppendFormat(&text, "  %-12s base %-40s residual %s\n", model::LinearGroupName(kind),
                          counts(bases[kind]), counts(residuals[kind]));
  }
  absl::StrAppendFormat(
      &text, "GPU: %s of %s (linear weights %s, %.2f bits/weight)\n",
      model::FormatBytes(plan.vram.total_bytes), model::FormatBytes(request.budget_bytes),
      model::FormatBytes(plan.base_linear_bytes),
      8.0 * static_cast<double>(plan.base_linear_bytes) / static_cast<double>(linear_weights));
  absl::StrAppendFormat(&text, "     %s\n", plan.vram.ToString());
  absl::StrAppendFormat(
      &text, "RAM: residual %s, %.3f x Q8_0's %s (%.2f bits/weight)",
      model::FormatBytes(plan.residual_stored_bytes),
      static_cast<double>(plan.residual_stored_bytes) / static_cast<double>(plan.q8_0_bytes),
      model::FormatBytes(plan.q8_0_bytes),
      8.0 * static_cast<double>(plan.residual_stored_bytes) / static_cast<double>(linear_weights));
  if (plan.residual_bytes == plan.residual_stored_bytes) {
    absl::StrAppend(&text, ", all read per verify\n");
  } else {
    absl::StrAppendFormat(&text, ", of which a %.0f-row verify reads %s\n",
                          request.machine.verify_rows, model::FormatBytes(plan.residual_bytes));
    absl::StrAppend(&text, RoutingReport(groups, request.machine.verify_rows));
  }
  absl::StrAppendFormat(&text,
                        "quality: verifier's predicted KL %.3f x Q8_0's weights' (%.2e vs "
                        "%.2e nats), target %.3f x%s\n",
                        plan.verify_error / plan.q8_0_error, plan.verify_error, plan.q8_0_error,
                        request.error_factor,
                        plan.meets_quality ? ""
                                           : ": MISSED, even the most residual bits everywhere "
                                             "exceed it");
  absl::StrAppendFormat(
      &text,
      "projected (RAM %.0f GB/s, VRAM %.0f GB/s): verify floor %.3f ms + draft %.3f ms, %.2f "
      "tokens per verify (16-node tree), %.0f tokens/s\n",
      request.machine.ram_bytes_per_second / 1e9, request.machine.vram_bytes_per_second / 1e9,
      1e3 * plan.verify_seconds, 1e3 * plan.draft_seconds, plan.projected_tau,
      1.0 / plan.seconds_per_token());
  return text;
}

nlohmann::json BitPlanJson(const std::vector<GroupSensitivity>& groups,
                           const BitCandidates& candidates, const BitPlan& plan,
                           const AllocationRequest& request) {
  nlohmann::json json_groups = nlohmann::json::array();
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupSensitivity& group = groups[g];
    nlohmann::json bases = nlohmann::json::array();
    for (const BaseOption& base : group.bases) {
      bases.push_back({{"format", model::SplitFormatName(base.base)},
                       {"device_bytes", base.device_bytes},
                       {"base_error", base.base_error},
                       {"verify_error", base.verify_error}});
    }
    json_groups.push_back(
        {{"group", model::LinearGroupIdString(group.id)},
         {"kind", std::string(model::LinearGroupName(group.id.group))},
         {"layer", group.id.layer},
         {"tensors", group.tensors},
         {"weights", group.weights},
         {"signal", group.signal},
         {"kl_per_error", group.kl_per_error},
         {"draft_kl_per_error", group.draft_kl_per_error},
         {"q8_0_error", group.q8_0_error},
         {"q8_0_bytes", group.q8_0_bytes},
         {"residual_bytes", group.residual_bytes},
         {"bases", std::move(bases)},
         {"expert_frequencies", group.expert_frequencies},
         {"chosen_base", model::SplitFormatName(candidates.bases[plan.choices[g].base])},
         {"chosen_residual",
          model::SplitFormatName(candidates.residuals[plan.choices[g].residual])}});
  }
  nlohmann::json residual_names = nlohmann::json::array();
  for (const quant::SplitFormat f : candidates.residuals)
    residual_names.push_back(model::SplitFormatName(f));
  return {{"budget_bytes", request.budget_bytes},
          {"error_factor", request.error_factor},
          {"ram_bytes_per_second", request.machine.ram_bytes_per_second},
          {"vram_bytes_per_second", request.machine.vram_bytes_per_second},
          {"draft_forwards_per_verify", request.machine.draft_forwards_per_verify},
          {"verify_rows", request.machine.verify_rows},
          {"prior_tau", {request.prior.low_bits_tau, request.prior.high_bits_tau}},
          {"residual_formats", std::move(residual_names)},
          {"vram_total_bytes", plan.vram.total_bytes},
          {"base_linear_bytes", plan.base_linear_bytes},
          {"residual_bytes", plan.residual_bytes},
          {"residual_stored_bytes", plan.residual_stored_bytes},
          {"q8_0_bytes", plan.q8_0_bytes},
          {"verify_error", plan.verify_error},
          {"q8_0_error", plan.q8_0_error},
          {"error_target", plan.error_target},
          {"meets_quality", plan.meets_quality},
          {"draft_distortion", plan.draft_distortion},
          {"projected_tau", plan.projected_tau},
          {"verify_seconds", plan.verify_seconds},
          {"draft_seconds", plan.draft_seconds},
          {"groups", std::move(json_groups)}};
}

}  // namespace bitsplit::offline
