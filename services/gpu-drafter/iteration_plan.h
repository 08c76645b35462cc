#pragma once
// The scheduling rule of one iteration of the drafter's scheduler (docs/design.md §3, "Limits per
// iteration"), apart from engines and streams so that it is tested on its own
// (tests/service_iteration_plan_test.cc).
//
// Speculation steps come first (the streams already running), each tree shrunk to what is left
// of the iteration's rows and of its session's room; prompt chunks then take what is left, at
// most `prefill_rows` rows all together, so that a long prompt enters in chunks between the
// other streams' steps instead of stalling them. Generations are visited round-robin from
// `first`, which the caller rotates, so that no one waits behind the same others every iteration
// when a cap binds; at most `generations` take part.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace bitsplit::drafter {

// What the rule needs of one active generation.
struct GenerationDemand {
  int64_t prompt_left = 0;  // prompt tokens not yet prefilled; 0 once it decodes
  int64_t room = 0;         // tokens its session can still take: capacity - committed length
  int32_t tree_nodes = 0;   // decoding: nodes beyond the root its next step's shape asks for
};

struct IterationLimits {
  int64_t rows = 0;          // verifier rows of the iteration, every generation's
  int64_t prefill_rows = 0;  // prompt rows among them, at most
  size_t generations = 0;    // generations the iteration takes, at most
  size_t first = 0;          // where the round-robin starts
};

// One generation's part in the iteration.
struct Assignment {
  enum class Kind {
    kStep,         // a speculation step with a tree of `rows` nodes beyond the root
    kPrefill,      // the next `rows` prompt tokens
    kContextFull,  // a decoding generation whose session has no room for another token
  };
  size_t generation = 0;  // index into the demands
  Kind kind = Kind::kStep;
  int64_t rows = 0;
};

// The iteration's assignments: steps (and context-full generations) in round-robin order, then
// prefill chunks in round-robin order. Generations left out wait for a later iteration.
std::vector<Assignment> PlanIteration(std::span<const GenerationDemand> demands,
                                      const IterationLimits& limits);

}  // namespace bitsplit::drafter
