#include "bench/synthetic_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/io/ggml_type.h"
#include "common/offline/split_quantizer.h"
#include "common/ops/matmul.h"
#include "common/quant/split_format.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::bench {
namespace {

// splitmix64: one independent stream per (seed, matrix, row).
uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct Random {
  uint64_t state;
  uint64_t Next() { return state = Mix(state); }
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }  // [0, 1)
};

void StoreHalf(uint8_t* p, float value) {
  const uint16_t h = Fp32ToFp16(value);
  std::memcpy(p, &h, sizeof(h));
}

// Random codes and scales for every row of one matrix, values of about `scale` magnitude.
void FillMatrix(quant::SplitFormat format, int group, int64_t rows, int64_t cols, float scale,
                uint64_t seed, uint8_t* data, ThreadPool& pool) {
  const quant::SplitRowLayout layout = quant::GetSplitRowLayout(format, group, cols);
  const quant::SplitFormatInfo& info = quant::GetSplitFormatInfo(format);
  // Spread of the codes around their centre: uniform codes of n levels have std n / sqrt(12).
  const float levels = static_cast<float>(quant::SplitCodeLevels(format));
  const float d_typical = scale / (levels / std::sqrt(12.0f));
  pool.ParallelFor(rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      uint8_t* row = data + r * layout.row_bytes;
      Random random{Mix(seed ^ (static_cast<uint64_t>(r) * 0xD1B54A32D192ED03ULL))};
      for (size_t i = 0; i + 8 <= layout.row_bytes; i += 8) {
        const uint64_t bits = random.Next();
        std::memcpy(row + i, &bits, 8);
      }
      for (size_t i = layout.row_bytes / 8 * 8; i < layout.row_bytes; ++i) {
        row[i] = static_cast<uint8_t>(random.Next());
      }
      if (info.signed_codes) {  // keep codes in -127..127 as our quantizers do
        for (int64_t b = 0; b < layout.sub_blocks; ++b) {
          int8_t* codes =
              reinterpret_cast<int8_t*>(row + layout.code_offset + b * layout.code_stride);
          for (int j = 0; j < 32; ++j) codes[j] = codes[j] == -128 ? -127 : codes[j];
        }
      }
      for (int64_t g = 0; g < layout.groups; ++g) {
        const float d = d_typical * (0.75f + 0.5f * random.Uniform());
        StoreHalf(row + layout.scale_offset + g * layout.scale_stride, d);
        if (info.has_min) {
          const float m = -d * (levels - 1.0f) / 2.0f * (0.9f + 0.2f * random.Uniform());
          StoreHalf(row + layout.min_offset + g * layout.min_stride, m);
        }
      }
    }
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<SyntheticSplitModel>> MakeSyntheticSplitModel(
    const model::ModelConfig& config, const model::SplitQuantization& quantization, uint64_t seed,
    ThreadPool& pool) {
  if (!quantization.residual_format.has_value()) {
    return absl::InvalidArgumentError("a synthetic split model needs a residual format");
  }
  BITSPLIT_RETURN_IF_ERROR(offline::ValidateSplitQuantization(quantization, config));
  auto m = std::make_unique<SyntheticSplitModel>();
  m->config = config;
  m->quantization = quantization;
  m->base = model::SplitLinearWeights(config);
  m->residual = model::SplitLinearWeights(config);
  uint64_t matrix_seed = Mix(seed);
  for (const model::LinearGroupId id : model::AllLinearGroups(config)) {
    const int64_t cols = model::LinearGroupInputDim(config, id);
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    for (const int64_t rows : model::LinearGroupOutputDims(config, id)) {
      struct Half {
        quant::SplitFormat format;
        int group;
        float scale;
        model::SplitLinearWeights* weights;
        uint64_t* bytes;
      };
      const Half halves[] = {{quantization.base_format, quantization.base_group, scale, &m->base,
                              &m->base_linear_bytes},
                             {*quantization.residual_format, quantization.residual_group,
                              scale / 20.0f, &m->residual, &m->residual_linear_bytes}};
      for (const Half& half : halves) {
        const size_t row_bytes = quant::SplitRowBytes(half.format, half.group, cols);
        const size_t size = row_bytes * static_cast<size_t>(rows);
        std::unique_ptr<uint8_t[]> buffer(new uint8_t[size]);
        FillMatrix(half.format, half.group, rows, cols, half.scale, matrix_seed = Mix(matrix_seed),
                   buffer.get(), pool);
        BITSPLIT_ASSIGN_OR_RETURN(
            const quant::MatrixView view,
            quant::MakeMatrixView(half.format, half.group, rows, cols, buffer.get(), size));
        half.weights->mutable_group(id).push_back(view);
        *half.bytes += size;
        m->buffers.push_back(std::move(buffer));
      }
    }
  }
  // Q8_0 embedding table (random codes, small scales), unit norms.
  const int64_t embedding_row_bytes = config.d_model / 32 * 34;
  const size_t embedding_size = static_cast<size_t>(config.vocab_size * embedding_row_bytes);
  std::unique_ptr<uint8_t[]> embedding(new uint8_t[embedding_size]);
  pool.ParallelFor(config.vocab_size, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      Random random{Mix(seed + 7 + static_cast<uint64_t>(r))};
      for (int64_t b = 0; b < config.d_model / 32; ++b) {
        uint8_t* block = embedding.get() + r * embedding_row_bytes + b * 34;
        StoreHalf(block, 0.02f * (0.5f + random.Uniform()));
        for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(random.Next());
      }
    }
  });
  BITSPLIT_ASSIGN_OR_RETURN(
      m->embedding_and_norms.token_embd,
      ops::MakeWeightMatrix(GgmlType::kQ8_0, embedding.get(), config.vocab_size, config.d_model,
                            "synthetic token_embd"));
  m->buffers.push_back(std::move(embedding));
  m->norms.assign(static_cast<size_t>(config.d_model * (2 * config.num_layers + 1)), 1.0f);
  m->embedding_and_norms.output_norm = m->norms.data() + 2 * config.num_layers * config.d_model;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    model::LayerNorms& norms = m->embedding_and_norms.layers.emplace_back();
    norms.attn_norm = m->norms.data() + (2 * layer) * config.d_model;
    norms.ffn_norm = m->norms.data() + (2 * layer + 1) * config.d_model;
  }
  return m;
}

}  // namespace bitsplit::bench
