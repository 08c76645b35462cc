#pragma once
// The two decoders the losslessness tests compare (docs/design.md §3): plain decoding with the
// verifier, and the speculation loop (draft, verify, walk, commit) in process.
#include <cstdint>
#include <span>
#include <vector>

#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/model/speculation.h"
#include "gtest/gtest.h"

namespace bitsplit::testing {

// The reference: the verifier one token at a time, the token at index i sampled with the logits
// of index i - 1 (what `bitsplit generate` does). The prompt is prefilled in one batch.
inline std::vector<int32_t> PlainDecode(model::LlamaModel& model,
                                        const std::vector<int32_t>& prompt,
                                        const model::SamplingParams& sampling, int count) {
  using model::Batch;
  using model::ForwardMode;
  model::KvCache cache = *model.NewKvCache(static_cast<int64_t>(prompt.size()) + count);
  const int64_t vocab = model.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  Batch batch = Batch::Causal(prompt, 0);
  batch.logit_rows = {static_cast<int32_t>(prompt.size() - 1)};
  EXPECT_TRUE(model.Forward(batch, cache, logits, ForwardMode::kVerify).ok());
  EXPECT_TRUE(cache.Commit(static_cast<int64_t>(prompt.size())).ok());
  model::Sampler sampler;
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) {
    const int64_t index = static_cast<int64_t>(prompt.size()) + i;
    out.push_back(sampler.Choose(logits, sampling, index));
    if (i + 1 == count) break;
    const int32_t token[1] = {out.back()};
    EXPECT_TRUE(model
                    .Forward(Batch::Causal(token, static_cast<int32_t>(index)), cache, logits,
                             ForwardMode::kVerify)
                    .ok());
    EXPECT_TRUE(cache.Commit(1).ok());
  }
  return out;
}

struct SpecRun {
  std::vector<int32_t> tokens;
  int verify_steps = 0;
};

// The speculation loop of docs/design.md §3 with `draft_mode` drafting (kVerify: a perfect
// drafter). The prompt is prefilled in chunks of 16.
inline SpecRun SpeculativeDecode(model::LlamaModel& model, const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& sampling, int count,
                                 const model::TreeShape& shape, model::ForwardMode draft_mode,
                                 model::DraftKv draft_kv = model::DraftKv::kShared) {
  SpecRun run;
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + count + shape.nodes + 8;
  auto session = model::CpuSpeculativeSession::Create(
      model, model::ForwardMode::kVerify, model, draft_mode,
      {.capacity = capacity, .prefill_chunk = 16, .draft_kv = draft_kv});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return run;
  model::SpeculativeSession& s = **session;
  const std::span<const int32_t> all(prompt);
  EXPECT_TRUE(s.Prefill(all.first(all.size() - 1)).ok());
  int32_t root = prompt.back();
  while (static_cast<int>(run.tokens.size()) < count) {
    auto tree = s.Draft(root, shape);
    EXPECT_TRUE(tree.ok()) << tree.status();
    if (!tree.ok()) break;
    EXPECT_EQ(tree->size(), shape.nodes + 1);
    auto choices = s.Verify(tree->tokens, tree->parents, sampling, 0, false);
    EXPECT_TRUE(choices.ok()) << choices.status();
    if (!choices.ok()) break;
    std::vector<int32_t> targets;
    for (const model::TargetChoice& c : *choices) targets.push_back(c.token);
    const model::WalkResult walk = model::WalkTree(tree->tokens, tree->parents, targets);
    EXPECT_TRUE(s.Commit(walk.path).ok());
    ++run.verify_steps;
    run.tokens.insert(run.tokens.end(), walk.tokens.begin(), walk.tokens.end());
    root = walk.tokens.back();
  }
  run.tokens.resize(static_cast<size_t>(count));
  return run;
}

}  // namespace bitsplit::testing
