#pragma once
// Per-session key/value cache of a llama model (f32).
//
// Layout: for each layer, keys and values are [capacity, kv_dim(layer)] (slot-major), so a batch's
// rows go to consecutive slots with one copy. Keys are stored after RoPE. Layers may differ in
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

namespace bitsplit::model {

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

// How a forward pass stores the batch's keys and values: as computed, or rounded to the nearest
// fp16 (storage stays f32). kFp16 reproduces the CUDA backend's half-precision cache on the CPU,
// so the two engines can be compared with the same cache precision.
enum class KvRounding { kNone, kFp16 };

class KvCache {
 public:
  // INVALID_ARGUMENT unless every size is positive. `layer_kv_dims` has one width per layer.
  static absl::StatusOr<KvCache> Create(std::vector<int64_t> layer_kv_dims, int64_t capacity,
                                        KvRounding rounding = KvRounding::kNone);
  // Every layer kv_dim wide.
  static absl::StatusOr<KvCache> Create(int64_t num_layers, int64_t kv_dim, int64_t capacity,
                                        KvRounding rounding = KvRounding::kNone);
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int64_t capacity,
                                        KvRounding rounding = KvRounding::kNone) {
    return Create(LayerKvDims(config), capacity, rounding);
  }
  // The width of every layer's keys (and values) in a model of `config`.
  static std::vector<int64_t> LayerKvDims(const ModelConfig& config);

  int64_t num_layers() const { return static_cast<int64_t>(layer_kv_dims_.size()); }
  int64_t kv_dim(int64_t layer) const { return layer_kv_dims_[static_cast<size_t>(layer)]; }
  const std::vector<int64_t>& layer_kv_dims() const { return layer_kv_dims_; }
  int64_t capacity() const { return slots_.capacity(); }
  int64_t committed_length() const { return slots_.committed_length(); }
  int64_t pending_length() const { return slots_.pending_length(); }
  KvRounding rounding() const { return rounding_; }

  // Applies the cache's rounding to the keys and values of slots [first_slot, first_slot + count)
  // of one layer: what a forward pass calls once it has written them.
  void RoundStored(int64_t layer, int64_t first_slot, int64_t count);

  // One layer's storage, [capacity, kv_dim(layer)].
  float* keys(int64_t layer) { return keys_.data() + LayerOffset(layer); }
  float* values(int64_t layer) { return values_.data() + LayerOffset(layer); }
  const float* keys(int64_t layer) const { return keys_.data() + LayerOffset(layer); }
  const float* values(int64_t layer) const { return values_.data() + LayerOffset(layer); }

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

 private:
  KvCache(std::vector<int64_t> layer_kv_dims, int64_t capacity, KvRounding rounding);
  size_t LayerOffset(int64_t layer) const;
  // Copies slot `from` to slot `to` in every layer, keys and values.
  void MoveSlot(int64_t from, int64_t to);

  std::vector<int64_t> layer_kv_dims_;
  std::vector<size_t> layer_offsets_;  // [num_layers + 1], prefix sums of capacity * kv_dim
  KvRounding rounding_;
  KvSlotLedger slots_;
  std::vector<float> keys_;         // per layer [capacity, kv_dim(layer)], back to back
  std::vector<float> values_;       // the same
  std::vector<int32_t> positions_;  // [capacity]
};

// Host memory a KvCache of `capacity` tokens holds (keys, values and positions).
uint64_t KvCacheBytes(const std::vector<int64_t>& layer_kv_dims, int64_t capacity);
inline uint64_t KvCacheBytes(const ModelConfig& config, int64_t capacity) {
  return KvCacheBytes(KvCache::LayerKvDims(config), capacity);
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
