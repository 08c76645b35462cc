#pragma once
// A split model with random weights built in memory, for benchmarks of realistic shapes (an
// 8B-class llama) without a multi-gigabyte file or a quantize run: random codes in the base and
// residual formats with scales that keep activations in a sane range. Shapes and speed only:
// never for quality or acceptance claims (docs/design.md §8).
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/model/weights.h"
#include "common/util/thread_pool.h"

namespace bitsplit::bench {

struct SyntheticSplitModel {
  model::ModelConfig config;
  model::SplitQuantization quantization;         // residual_format must be set
  model::EmbeddingAndNorms embedding_and_norms;  // Q8_0 embedding table, unit norms
  model::SplitLinearWeights base;
  model::SplitLinearWeights residual;
  uint64_t base_linear_bytes = 0;
  uint64_t residual_linear_bytes = 0;

  // Storage the views point into.
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<float> norms;
};

// Builds the model with `pool`'s threads. INVALID_ARGUMENT when the quantization does not fit
// the config (groups, rotation block) or has no residual format.
absl::StatusOr<std::unique_ptr<SyntheticSplitModel>> MakeSyntheticSplitModel(
    const model::ModelConfig& config, const model::SplitQuantization& quantization, uint64_t seed,
    ThreadPool& pool);

}  // namespace bitsplit::bench
