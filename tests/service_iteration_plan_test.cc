// The drafter scheduler's rule for one iteration (services/gpu-drafter/iteration_plan.h), on its
// own: which generations take part, with what, under the iteration's row, prefill and
// generation limits. Every expectation is worked out by hand from the demands and limits.
#include <ostream>
#include <vector>

#include "gtest/gtest.h"
#include "services/gpu-drafter/iteration_plan.h"

namespace bitsplit::drafter {
namespace {

using Kind = Assignment::Kind;

// The plan as (generation, kind, rows) triples, for whole-plan comparisons.
struct Entry {
  size_t generation;
  Kind kind;
  int64_t rows;
  bool operator==(const Entry&) const = default;
};
std::vector<Entry> Entries(const std::vector<Assignment>& plan) {
  std::vector<Entry> entries;
  for (const Assignment& a : plan) entries.push_back({a.generation, a.kind, a.rows});
  return entries;
}
void PrintTo(const Entry& e, std::ostream* os) {
  *os << "{" << e.generation << ", "
      << (e.kind == Kind::kStep      ? "step"
          : e.kind == Kind::kPrefill ? "prefill"
                                     : "full")
      << ", " << e.rows << "}";
}

GenerationDemand Decoding(int32_t tree_nodes, int64_t room = 1000) {
  return {.prompt_left = 0, .room = room, .tree_nodes = tree_nodes};
}
GenerationDemand Prefilling(int64_t prompt_left) {
  return {.prompt_left = prompt_left, .room = 1000, .tree_nodes = 0};
}

TEST(IterationPlanTest, StepsComeFirstThenPrefillChunksFromWhatIsLeft) {
  // Rows 64: the two trees take 17 + 9 = 26, the prompts 38 of the rest, within prefill 40.
  const std::vector<GenerationDemand> demands = {Prefilling(30), Decoding(16), Prefilling(30),
                                                 Decoding(8)};
  const auto plan =
      PlanIteration(demands, {.rows = 64, .prefill_rows = 40, .generations = 4, .first = 0});
  EXPECT_EQ(Entries(plan), (std::vector<Entry>{{1, Kind::kStep, 16},
                                               {3, Kind::kStep, 8},
                                               {0, Kind::kPrefill, 30},
                                               {2, Kind::kPrefill, 8}}));
}

TEST(IterationPlanTest, PrefillRowsAreSharedByEveryPrompt) {
  const std::vector<GenerationDemand> demands = {Prefilling(50), Prefilling(50), Prefilling(50)};
  const auto plan =
      PlanIteration(demands, {.rows = 256, .prefill_rows = 64, .generations = 3, .first = 0});
  EXPECT_EQ(Entries(plan), (std::vector<Entry>{{0, Kind::kPrefill, 50}, {1, Kind::kPrefill, 14}}));
}

TEST(IterationPlanTest, TreesShrinkToTheRowsLeftAndToTheirSessionsRoom) {
  // Rows 40: 16 + 16 rows, then a tree of 7 nodes in the 8 rows left; the 4th waits.
  const std::vector<GenerationDemand> demands = {Decoding(15), Decoding(15), Decoding(15),
                                                 Decoding(15)};
  EXPECT_EQ(Entries(PlanIteration(demands,
                                  {.rows = 40, .prefill_rows = 64, .generations = 4, .first = 0})),
            (std::vector<Entry>{{0, Kind::kStep, 15}, {1, Kind::kStep, 15}, {2, Kind::kStep, 7}}));
  // Room for 5 more tokens: a root and 4 nodes.
  EXPECT_EQ(Entries(PlanIteration(std::vector<GenerationDemand>{Decoding(15, 5)},
                                  {.rows = 40, .prefill_rows = 64, .generations = 1, .first = 0})),
            (std::vector<Entry>{{0, Kind::kStep, 4}}));
}

TEST(IterationPlanTest, AFullContextIsReportedWhateverTheLimits) {
  // No rows left after the first tree; generation 1 has no room at all and is reported anyway.
  const std::vector<GenerationDemand> demands = {Decoding(7), Decoding(7, 0), Decoding(7)};
  EXPECT_EQ(Entries(PlanIteration(demands,
                                  {.rows = 8, .prefill_rows = 64, .generations = 3, .first = 0})),
            (std::vector<Entry>{{0, Kind::kStep, 7}, {1, Kind::kContextFull, 0}}));
}

TEST(IterationPlanTest, TheRoundRobinStartDecidesWhoWaitsWhenTheRowsBind) {
  const std::vector<GenerationDemand> demands = {Decoding(7), Decoding(7), Decoding(7)};
  for (size_t first = 0; first < 3; ++first) {
    const auto plan =
        PlanIteration(demands, {.rows = 16, .prefill_rows = 64, .generations = 3, .first = first});
    EXPECT_EQ(Entries(plan),
              (std::vector<Entry>{{first, Kind::kStep, 7}, {(first + 1) % 3, Kind::kStep, 7}}))
        << "first " << first;
  }
}

TEST(IterationPlanTest, TheGenerationLimitServesOneAtATime) {
  // One generation per iteration (the serialized comparison): the one at `first`, prefill too.
  const std::vector<GenerationDemand> demands = {Decoding(4), Prefilling(10)};
  EXPECT_EQ(Entries(PlanIteration(demands,
                                  {.rows = 256, .prefill_rows = 64, .generations = 1, .first = 0})),
            (std::vector<Entry>{{0, Kind::kStep, 4}}));
  EXPECT_EQ(Entries(PlanIteration(demands,
                                  {.rows = 256, .prefill_rows = 64, .generations = 1, .first = 1})),
            (std::vector<Entry>{{0, Kind::kStep, 4}}));  // steps come first
  EXPECT_EQ(Entries(PlanIteration(std::vector<GenerationDemand>{Decoding(4, 0), Prefilling(10)},
                                  {.rows = 256, .prefill_rows = 64, .generations = 1, .first = 0})),
            (std::vector<Entry>{{0, Kind::kContextFull, 0}, {1, Kind::kPrefill, 10}}));
}

TEST(IterationPlanTest, NothingToDoIsAnEmptyPlan) {
  EXPECT_TRUE(PlanIteration({}, {.rows = 256, .prefill_rows = 64, .generations = 0}).empty());
  // A single row: the root of one step, with no tree.
  EXPECT_EQ(Entries(PlanIteration(std::vector<GenerationDemand>{Decoding(16), Prefilling(5)},
                                  {.rows = 1, .prefill_rows = 64, .generations = 2, .first = 0})),
            (std::vector<Entry>{{0, Kind::kStep, 0}}));
}

}  // namespace
}  // namespace bitsplit::drafter
