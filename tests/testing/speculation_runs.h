#pragma once
// The two decoders the losslessness tests compare (docs/design.md §3): plain decoding with the
// verifier, and speculation steps (draft, verify, walk, commit) of one session in process.
#include <cstdint>
#include <span>
#include <vector>

#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/speculation/cpu_session.h"
#include "gtest/gtest.h"

namespace bitsplit::testing {

// The reference: the verifier one token at a time, the token at index i sampled with the logits
// of index i - 1 (what `bitsplit generate` does). The prompt is prefilled in one batch. With a
// constraint (advanced past every token chosen), constrained decoding: each row masked first.
inline std::vector<int32_t> PlainDecode(model::LlamaModel& model,
                                        const std::vector<int32_t>& prompt,
                                        const model::SamplingParams& sampling, int count,
                                        model::KvType kv_type = model::KvType::kF32,
                                        speculation::TokenConstraint* constraint = nullptr) {
  using model::Batch;
  using model::ForwardMode;
  model::KvCache cache = *model.NewKvCache(static_cast<int64_t>(prompt.size()) + count, kv_type);
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
    if (constraint != nullptr) {
      std::vector<uint64_t> mask;
      constraint->Allowed(mask);
      model::MaskLogits(logits, mask);
    }
    out.push_back(sampler.Choose(logits, sampling, index));
    if (constraint != nullptr) {
      EXPECT_TRUE(constraint->Advance(out.back()));
    }
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
  // With a constraint: drafted nodes (the roots not counted), and those whose path the
  // constraint refuses (checked by advancing a copy along the path).
  int drafted_nodes = 0;
  int forbidden_drafts = 0;
};

// Speculation steps of one session (a batch of one) with `draft_mode` drafting (kVerify: a
// perfect drafter): `model`'s own weights, or `draft` (e.g. a separate GGUF in reference mode)
// when given. The prompt is prefilled in chunks of 16. Both decoders take the KV cache's type.
inline SpecRun SpeculativeDecode(model::LlamaModel& model, const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& sampling, int count,
                                 const speculation::TreeShape& shape, model::ForwardMode draft_mode,
                                 speculation::DraftKv draft_kv = speculation::DraftKv::kShared,
                                 model::LlamaModel* draft = nullptr,
                                 model::KvType kv_type = model::KvType::kF32,
                                 speculation::TokenConstraint* constraint = nullptr) {
  SpecRun run;
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + count + shape.nodes + 8;
  auto session = speculation::CpuSpeculativeSession::Create(
      model, model::ForwardMode::kVerify, draft != nullptr ? *draft : model, draft_mode,
      {.capacity = capacity, .draft_kv = draft_kv, .own_kv_chunk = 16, .kv_type = kv_type});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return run;
  speculation::CpuSpeculativeSession& s = **session;
  const std::span<const int32_t> all(prompt);
  const absl::Status prefilled = speculation::PrefillInChunks(s, all.first(all.size() - 1), 16);
  EXPECT_TRUE(prefilled.ok()) << prefilled;
  int32_t root = prompt.back();
  while (static_cast<int>(run.tokens.size()) < count) {
    speculation::SessionStep step{
        .root = root, .shape = shape, .sampling = sampling, .constraint = constraint};
    const absl::Status stepped = s.Step(step);
    EXPECT_TRUE(stepped.ok()) << stepped;
    if (!stepped.ok()) break;
    EXPECT_EQ(step.tree.size(), shape.nodes + 1);
    ++run.verify_steps;
    run.tokens.insert(run.tokens.end(), step.walk.tokens.begin(), step.walk.tokens.end());
    if (constraint != nullptr) {
      for (size_t node = 1; node < step.tree.tokens.size(); ++node) {
        std::vector<int32_t> path;
        for (int32_t at = static_cast<int32_t>(node); at > 0; at = step.tree.parents[at]) {
          path.insert(path.begin(), step.tree.tokens[static_cast<size_t>(at)]);
        }
        std::unique_ptr<speculation::TokenConstraint> walker = constraint->Clone();
        ++run.drafted_nodes;
        for (int32_t token : path) {
          if (!walker->Advance(token)) {
            ++run.forbidden_drafts;
            break;
          }
        }
      }
      for (int32_t token : step.walk.tokens) EXPECT_TRUE(constraint->Advance(token));
    }
    root = step.walk.tokens.back();
  }
  run.tokens.resize(static_cast<size_t>(count));
  return run;
}

}  // namespace bitsplit::testing
