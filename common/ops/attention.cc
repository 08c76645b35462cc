#include "common/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/ops/simd_dot.h"
#include "common/util/status_macros.h"

namespace bitsplit::ops {
namespace {

// One head's slice of a cache row as f32: in place for an f32 cache, else decoded into `scratch`.
const float* HeadSlice(const KvRows& rows, int64_t slot, int64_t kv_offset, int64_t head_dim,
                       std::vector<float>& scratch) {
  const uint8_t* row = rows.data + slot * rows.row_bytes;
  if (rows.type == KvType::kF32) return reinterpret_cast<const float*>(row) + kv_offset;
  scratch.resize(static_cast<size_t>(head_dim));
  DecodeKvElements(rows.type, row, kv_offset, head_dim, scratch.data());
  return scratch.data();
}

// Attention of one query head of one token. `slots` lists the visible cache slots in ascending
// order; `scores` and `decoded` are scratch.
// `sink`: the head's sink logit, or -inf for none.
void AttendOneHead(const float* query, const KvRows& keys, const KvRows& values, int64_t kv_offset,
                   int64_t head_dim, float scale, float sink, const std::vector<int64_t>& slots,
                   std::vector<float>& scores, std::vector<float>& decoded, float* out) {
  const size_t count = slots.size();
  scores.resize(count);
  float max_score = -INFINITY;
  for (size_t j = 0; j < count; ++j) {
    const float* key = HeadSlice(keys, slots[j], kv_offset, head_dim, decoded);
    scores[j] = simd::Dot(query, key, head_dim) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  const bool has_sink = sink != -INFINITY;
  if (has_sink) max_score = std::max(max_score, sink);
  double sum = 0.0;
  for (size_t j = 0; j < count; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  if (has_sink) sum += std::exp(sink - max_score);
  const float inverse_sum = static_cast<float>(1.0 / sum);
  std::fill(out, out + head_dim, 0.0f);
  for (size_t j = 0; j < count; ++j) {
    const float weight = scores[j] * inverse_sum;
    const float* value = HeadSlice(values, slots[j], kv_offset, head_dim, decoded);
    // Independent per d: vectorizing this loop does not change any element's arithmetic.
    for (int64_t d = 0; d < head_dim; ++d) out[d] += weight * value[d];
  }
}

}  // namespace

void Attention(const float* q, int64_t num_tokens, const KvRows& keys, const KvRows& values,
               int64_t prefix_length, const uint8_t* mask, const AttentionShape& shape, float* out,
               ThreadPool& pool) {
  AttentionWithContext(q, num_tokens, keys, values, prefix_length, /*context=*/0, mask, shape, out,
                       pool);
}

void AttentionWithContext(const float* q, int64_t num_tokens, const KvRows& keys,
                          const KvRows& values, int64_t prefix_length, int64_t context,
                          const uint8_t* mask, const AttentionShape& shape, float* out,
                          ThreadPool& pool, const SlidingWindow& window) {
  BITSPLIT_CHECK(window.size == 0 ||
                 (window.query_positions != nullptr && window.slot_positions != nullptr));
  const int64_t mask_width = context + num_tokens;
  BITSPLIT_CHECK(shape.num_kv_heads > 0 && shape.num_heads % shape.num_kv_heads == 0);
  const int64_t heads_per_kv = shape.num_heads / shape.num_kv_heads;
  const int64_t q_dim = shape.num_heads * shape.head_dim;
  BITSPLIT_CHECK(KvTypeFitsHead(keys.type, shape.head_dim) &&
                 KvTypeFitsHead(values.type, shape.head_dim));
  pool.ParallelFor(num_tokens * shape.num_heads, [&](int64_t begin, int64_t end, int) {
    thread_local std::vector<int64_t> slots;
    thread_local std::vector<float> scores;
    thread_local std::vector<float> decoded;
    int64_t slots_token = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t token = task / shape.num_heads;
      const int64_t head = task % shape.num_heads;
      if (token != slots_token) {
        slots.clear();
        const auto in_window = [&](int64_t slot) {
          return window.size == 0 ||
                 static_cast<int64_t>(window.query_positions[token]) - window.slot_positions[slot] <
                     window.size;
        };
        for (int64_t s = 0; s < prefix_length; ++s) {
          if (in_window(s)) slots.push_back(s);
        }
        for (int64_t j = 0; j < mask_width; ++j) {
          if (mask[token * mask_width + j] != 0 && in_window(prefix_length + j)) {
            slots.push_back(prefix_length + j);
          }
        }
        BITSPLIT_CHECK(!slots.empty());
        slots_token = token;
      }
      const int64_t kv_offset = (head / heads_per_kv) * shape.head_dim;
      AttendOneHead(q + token * q_dim + head * shape.head_dim, keys, values, kv_offset,
                    shape.head_dim, shape.scale,
                    shape.sinks != nullptr ? shape.sinks[head] : -INFINITY, slots, scores, decoded,
                    out + token * q_dim + head * shape.head_dim);
    }
  });
}

}  // namespace bitsplit::ops
