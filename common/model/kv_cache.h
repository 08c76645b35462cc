#pragma once
// Per-session key/value cache of a llama model, in f32, f16 or q8_0 rows (ops::KvType).
//
// Layout: for each layer, keys and values are [capacity] rows of kv_dim(layer) elements encoded
// in the cache's type (slot-major), so a batch's rows go to consecutive slots in one pass. Keys
// are stored after RoPE. Layers may differ in
// width (gemma4's global layers have other head counts and widths than its local ones).
//
// Slots [0, committed_length) hold the committed sequence: slot p is position p. A forward pass
// writes its T tokens to the "pending" slots [committed_length, committed_length + T); the caller
// then keeps some of them with Commit (a prefix of the batch: plain decoding and prefill) or
// CommitSlots (any ascending subset: the accepted path of a draft tree), or drops them.
//
// Thread safety: none. A cache belongs to one session and is used by one forward pass at a
// time.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/ops/kv_rows.h"

namespace bitsplit::model {

// The cache's element types, named through the model layer for the services above it.
using KvType = ops::KvType;
using ops::KvTypeName;
using ops::ParseKvType;

// The slot bookkeeping of a KV cache: the committed prefix [0, committed_length) and the pending
// slots after it. Shared by the host cache below and the device cache of common/cuda, which
// differ only in where the keys and values live. Thread safety: none.
class KvSlotLedger {
 public:
  explicit KvSlotLedger(int64_t capacity = 0) : capacity_(capacity) {}

  int64_t capacity() const { return capacity_; }
  int64_t committed_length() const { return committed_length_; }
  int64_t pending_length() const { return pending_length_; }

  // See KvCache.
  absl::Status BeginPending(int64_t count);
  absl::Status Commit(int64_t count);
  absl::Status Truncate(int64_t length);
  void DiscardPending() { pending_length_ = 0; }
  void Clear() { committed_length_ = pending_length_ = 0; }
  // CommitSlots in two halves: the check (nothing changes on an error), then, once the caller
  // moved pending slot pending_indices[k] to committed_length + k, the new lengths.
  absl::Status CheckCommitSlots(std::span<const int32_t> pending_indices) const;
  void SlotsCommitted(int64_t count) {
    committed_length_ += count;
    pending_length_ = 0;
  }

 private:
  int64_t capacity_;
  int64_t committed_length_ = 0;
  int64_t pending_length_ = 0;
};

class KvCache {
 public:
  // INVALID_ARGUMENT unless every size is positive and every width holds whole rows of `type`
  // (q8_0: a multiple of 32). `layer_kv_dims` has one width per layer.
  static absl::StatusOr<KvCache> Create(std::vector<int64_t> layer_kv_dims, int64_t capacity,
                                        ops::KvType type = ops::KvType::kF32);
  // Every layer kv_dim wide.
  static absl::StatusOr<KvCache> Create(int64_t num_layers, int64_t kv_dim, int64_t capacity,
                                        ops::KvType type = ops::KvType::kF32);
  // INVALID_ARGUMENT also when a head of `config` is not whole rows of `type` (q8_0 needs head
  // widths that are multiples of 32).
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int64_t capacity,
                                        ops::KvType type = ops::KvType::kF32);
  // The width of every layer's keys (and values) in a model of `config`.
  static std::vector<int64_t> LayerKvDims(const ModelConfig& config);

  int64_t num_layers() const { return static_cast<int64_t>(layer_kv_dims_.size()); }
  int64_t kv_dim(int64_t layer) const { return layer_kv_dims_[static_cast<size_t>(layer)]; }
  const std::vector<int64_t>& layer_kv_dims() const { return layer_kv_dims_; }
  int64_t capacity() const { return slots_.capacity(); }
  int64_t committed_length() const { return slots_.committed_length(); }
  int64_t pending_length() const { return slots_.pending_length(); }
  ops::KvType type() const { return type_; }
  int64_t row_bytes(int64_t layer) const { return ops::KvRowBytes(type_, kv_dim(layer)); }

  // Encodes `count` f32 rows of keys and of values, [count, kv_dim(layer)] each, into slots
  // [first_slot, first_slot + count) of one layer.
  void StoreRows(int64_t layer, int64_t first_slot, int64_t count, const float* keys,
                 const float* values);
  // Decodes slots [first_slot, first_slot + count) of one layer to f32, [count, kv_dim(layer)].
  void ReadKeys(int64_t layer, int64_t first_slot, int64_t count, float* out) const;
  void ReadValues(int64_t layer, int64_t first_slot, int64_t count, float* out) const;

  // One layer's rows, [capacity] of row_bytes(layer), as attention reads them.
  ops::KvRows keys(int64_t layer) const { return {KeyBytes(layer), type_, row_bytes(layer)}; }
  ops::KvRows values(int64_t layer) const { return {ValueBytes(layer), type_, row_bytes(layer)}; }

  // The RoPE position of every slot, [capacity]: what a forward wrote with the slot's keys
  // (sliding-window attention reads it). Commits move it with the slot.
  int32_t* positions() { return positions_.data(); }
  const int32_t* positions() const { return positions_.data(); }

  // Declares slots [committed_length, committed_length + count) pending, replacing any earlier
  // pending slots. RESOURCE_EXHAUSTED when they do not fit in the capacity.
  absl::Status BeginPending(int64_t count) { return slots_.BeginPending(count); }

  // Keeps the first `count` pending slots (positions committed_length .. + count - 1) and drops
  // the rest. INVALID_ARGUMENT when count exceeds the pending length.
  absl::Status Commit(int64_t count) { return slots_.Commit(count); }

  // Keeps the pending slots with the given indices (0 = first pending slot), strictly
  // ascending, moving them down to committed_length, committed_length + 1, ...; drops the rest.
  // INVALID_ARGUMENT for indices out of range or not strictly ascending (nothing changes then).
  absl::Status CommitSlots(std::span<const int32_t> pending_indices);

  void DiscardPending() { slots_.DiscardPending(); }
  // Forgets committed slots from `length` on (and everything pending): a rollback to an earlier
  // committed length. INVALID_ARGUMENT when length exceeds the committed length.
  absl::Status Truncate(int64_t length) { return slots_.Truncate(length); }
  // Forgets everything (committed and pending); the storage is kept.
  void Clear() { slots_.Clear(); }
  // Makes room for `capacity` slots (none when it already has them), keeping the committed
  // rows and dropping the pending ones: a cache kept for a prefix grows to the next request's
  // size. RESOURCE_EXHAUSTED as Create for a size beyond any real cache.
  absl::Status Grow(int64_t capacity);

 private:
  KvCache(std::vector<int64_t> layer_kv_dims, int64_t capacity, ops::KvType type);
  size_t LayerOffset(int64_t layer) const;
  const uint8_t* KeyBytes(int64_t layer) const { return keys_.data() + LayerOffset(layer); }
  const uint8_t* ValueBytes(int64_t layer) const { return values_.data() + LayerOffset(layer); }
  // Copies slot `from` to slot `to` in every layer, keys and values.
  void MoveSlot(int64_t from, int64_t to);

  std::vector<int64_t> layer_kv_dims_;
  std::vector<size_t> layer_offsets_;  // [num_layers + 1], prefix sums of capacity * row_bytes
  ops::KvType type_;
  KvSlotLedger slots_;
  std::vector<uint8_t> keys_;       // per layer [capacity] rows of row_bytes(layer), back to back
  std::vector<uint8_t> values_;     // the same
  std::vector<int32_t> positions_;  // [capacity]
};

// Host memory a KvCache of `capacity` tokens in `type` holds (keys, values and positions).
uint64_t KvCacheBytes(const std::vector<int64_t>& layer_kv_dims, int64_t capacity,
                      ops::KvType type);
inline uint64_t KvCacheBytes(const ModelConfig& config, int64_t capacity, ops::KvType type) {
  return KvCacheBytes(KvCache::LayerKvDims(config), capacity, type);
}

// The host memory the CPU backend's KV caches may take when no budget is given: half of what
// the kernel reports available (MemAvailable) once the mapped weights that must stay resident
// and are not locked are taken out (MemAvailable counts their page cache as free, and a cold
// mapping will need that memory anyway), so the machine keeps room for its other processes.
// 0 when the weights alone take what is available.
uint64_t DefaultKvRamBudget(uint64_t available_bytes, uint64_t unlocked_weight_bytes);

// How many sessions of `session_bytes` each fit `budget_bytes`, at most `cap` (>= 1).
// RESOURCE_EXHAUSTED when not even one fits, with both sizes and `what` (the session, e.g. "a
// session of 2048 tokens") in the message.
absl::StatusOr<int64_t> SessionsThatFit(uint64_t budget_bytes, uint64_t session_bytes, int64_t cap,
                                        std::string_view what);

}  // namespace bitsplit::model
