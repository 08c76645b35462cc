#pragma once
// Scaled dot-product attention of a batch of query tokens over a KV cache, with grouped-query
// heads and an explicit in-batch mask (causal chains and draft trees alike).
#include <cstdint>

#include "common/ops/kv_rows.h"
#include "common/util/thread_pool.h"

namespace bitsplit::ops {

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // divides num_heads; query head h reads kv head h / (heads / kv)
  int64_t head_dim = 0;
  float scale = 1.0f;  // multiplies q·k, normally 1 / sqrt(head_dim)
  // Attention sinks (gpt-oss): [num_heads] learned logits, one per query head, that join each
  // softmax's denominator as a slot with no value: weights exp(s_j - m) / (sum_j exp(s_j - m) +
  // exp(sink - m)), m the larger of the scores' and the sink's maximum (llama.cpp's
  // ggml_soft_max_add_sinks). Null: none.
  const float* sinks = nullptr;
};

// Sliding-window attention (llama.cpp's LLAMA_SWA_TYPE_STANDARD): a query at position p sees
// only the slots whose position q satisfies p - q < size, on top of the mask.
struct SlidingWindow {
  int64_t size = 0;                          // 0: no window
  const int32_t* query_positions = nullptr;  // [num_tokens]
  // The position of every slot the call can see, [prefix_length + context + num_tokens].
  const int32_t* slot_positions = nullptr;
};

// q and out are [num_tokens, num_heads * head_dim]. keys and values are one layer of the cache,
// [slots, num_kv_heads * head_dim] rows of their KvType (head_dim must fit it), already holding the
// batch's own keys/values at slots [prefix_length, prefix_length + num_tokens). Batch token i
// attends to every prefix slot [0, prefix_length) and to batch token j (slot prefix_length + j) iff
// mask[i * num_tokens + j] is nonzero; it must see at least one slot.
//
// Batch invariance: the visible slots are visited in ascending order, and scores, softmax and
// the weighted sum of values depend only on that sequence of keys/values, not on the slot
// numbers, the other tokens in the batch, or the thread count. So a tree node gets the same bits
// as the same path run alone as a causal sequence. Parallel over (token, head) pairs.
void Attention(const float* q, int64_t num_tokens, const KvRows& keys, const KvRows& values,
               int64_t prefix_length, const uint8_t* mask, const AttentionShape& shape, float* out,
               ThreadPool& pool);

// The same with `context` masked slots between the prefix and the batch (the KV of earlier
// forwards of a draft tree, still pending): mask is [num_tokens, context + num_tokens], column j
// is slot prefix_length + j, and the batch's own keys/values sit at slots
// [prefix_length + context, prefix_length + context + num_tokens). Attention() is context 0.
// With a `window` of nonzero size, a slot outside a query's window is dropped from its visible
// list, which keeps the invariance: a tree node and the same token decoded alone see the same
// slots.
void AttentionWithContext(const float* q, int64_t num_tokens, const KvRows& keys,
                          const KvRows& values, int64_t prefix_length, int64_t context,
                          const uint8_t* mask, const AttentionShape& shape, float* out,
                          ThreadPool& pool, const SlidingWindow& window = {});

}  // namespace bitsplit::ops
