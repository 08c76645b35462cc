#include "services/gpu-drafter/iteration_plan.h"

#include <algorithm>

namespace bitsplit::drafter {

std::vector<Assignment> PlanIteration(std::span<const GenerationDemand> demands,
                                      const IterationLimits& limits) {
  std::vector<Assignment> plan;
  const size_t count = demands.size();
  int64_t rows_left = limits.rows;
  int64_t prefill_left = limits.prefill_rows;
  size_t taken = 0;
  for (size_t n = 0; n < count && taken < limits.generations; ++n) {
    const size_t i = (limits.first + n) % count;
    const GenerationDemand& demand = demands[i];
    if (demand.prompt_left > 0) continue;
    if (demand.room < 1) {
      plan.push_back({.generation = i, .kind = Assignment::Kind::kContextFull});
      continue;
    }
    if (rows_left < 1) continue;
    // The verify batch (root + nodes) must fit behind the committed tokens and in the rows left.
    const int64_t nodes = std::min<int64_t>({demand.tree_nodes, demand.room - 1, rows_left - 1});
    rows_left -= nodes + 1;
    ++taken;
    plan.push_back({.generation = i, .kind = Assignment::Kind::kStep, .rows = nodes});
  }
  for (size_t n = 0; n < count && taken < limits.generations; ++n) {
    const size_t i = (limits.first + n) % count;
    const int64_t rows = std::min({demands[i].prompt_left, prefill_left, rows_left});
    if (rows < 1) continue;
    prefill_left -= rows;
    rows_left -= rows;
    ++taken;
    plan.push_back({.generation = i, .kind = Assignment::Kind::kPrefill, .rows = rows});
  }
  return plan;
}

}  // namespace bitsplit::drafter
