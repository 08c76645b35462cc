#include "common/model/kv_cache.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "common/model/vram_plan.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {

std::vector<int64_t> KvCache::LayerKvDims(const ModelConfig& config) {
  std::vector<int64_t> dims(static_cast<size_t>(config.num_layers));
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    dims[static_cast<size_t>(layer)] = config.KvDim(layer);
  }
  return dims;
}

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int64_t capacity,
                                        ops::KvType type) {
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    if (!ops::KvTypeFitsHead(type, config.HeadDim(layer))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a %s KV cache needs head widths that are multiples of %d; layer %d's heads are %d wide",
          std::string(ops::KvTypeName(type)), ops::kKvQ8Block, layer, config.HeadDim(layer)));
    }
  }
  return Create(LayerKvDims(config), capacity, type);
}

absl::StatusOr<KvCache> KvCache::Create(int64_t num_layers, int64_t kv_dim, int64_t capacity,
                                        ops::KvType type) {
  if (num_layers <= 0 || num_layers > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache sizes must be positive (layers %d)", num_layers));
  }
  return Create(std::vector<int64_t>(static_cast<size_t>(num_layers), kv_dim), capacity, type);
}

absl::StatusOr<KvCache> KvCache::Create(std::vector<int64_t> layer_kv_dims, int64_t capacity,
                                        ops::KvType type) {
  const int64_t num_layers = static_cast<int64_t>(layer_kv_dims.size());
  int64_t widest = 0;
  for (const int64_t kv_dim : layer_kv_dims) {
    if (kv_dim <= 0) widest = -1;
    if (widest >= 0) widest = std::max(widest, kv_dim);
  }
  if (num_layers <= 0 || widest <= 0 || capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache sizes must be positive (layers %d, kv_dim %d, capacity %d)",
                        num_layers, widest, capacity));
  }
  // Guard the size arithmetic; 2^40 elements (4 TiB in f32) is far beyond any real cache.
  if (num_layers > (int64_t{1} << 20) || widest > (int64_t{1} << 20) ||
      capacity > (int64_t{1} << 40) / (num_layers * widest)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache of %d layers x %d slots x %d elements is too large", num_layers,
                        capacity, widest));
  }
  for (const int64_t kv_dim : layer_kv_dims) {
    if (!ops::KvTypeFitsHead(type, kv_dim)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a %s KV cache needs widths that are multiples of %d, not %d",
                          std::string(ops::KvTypeName(type)), ops::kKvQ8Block, kv_dim));
    }
  }
  return KvCache(std::move(layer_kv_dims), capacity, type);
}

KvCache::KvCache(std::vector<int64_t> layer_kv_dims, int64_t capacity, ops::KvType type)
    : layer_kv_dims_(std::move(layer_kv_dims)),
      type_(type),
      slots_(capacity),
      positions_(static_cast<size_t>(capacity), 0) {
  layer_offsets_.push_back(0);
  for (const int64_t kv_dim : layer_kv_dims_) {
    layer_offsets_.push_back(layer_offsets_.back() +
                             static_cast<size_t>(capacity * ops::KvRowBytes(type, kv_dim)));
  }
  keys_.resize(layer_offsets_.back());
  values_.resize(layer_offsets_.back());
}

void KvCache::StoreRows(int64_t layer, int64_t first_slot, int64_t count, const float* keys,
                        const float* values) {
  BITSPLIT_CHECK(first_slot >= 0 && count >= 0 && first_slot + count <= slots_.capacity());
  const size_t offset = LayerOffset(layer) + static_cast<size_t>(first_slot * row_bytes(layer));
  ops::EncodeKvRows(type_, keys, count, kv_dim(layer), keys_.data() + offset);
  ops::EncodeKvRows(type_, values, count, kv_dim(layer), values_.data() + offset);
}

namespace {

void DecodeRows(const ops::KvRows& rows, int64_t first_slot, int64_t count, int64_t kv_dim,
                float* out) {
  for (int64_t s = 0; s < count; ++s) {
    ops::DecodeKvElements(rows.type, rows.data + (first_slot + s) * rows.row_bytes, 0, kv_dim,
                          out + s * kv_dim);
  }
}

}  // namespace

void KvCache::ReadKeys(int64_t layer, int64_t first_slot, int64_t count, float* out) const {
  BITSPLIT_CHECK(first_slot >= 0 && count >= 0 && first_slot + count <= slots_.capacity());
  DecodeRows(keys(layer), first_slot, count, kv_dim(layer), out);
}

void KvCache::ReadValues(int64_t layer, int64_t first_slot, int64_t count, float* out) const {
  BITSPLIT_CHECK(first_slot >= 0 && count >= 0 && first_slot + count <= slots_.capacity());
  DecodeRows(values(layer), first_slot, count, kv_dim(layer), out);
}

size_t KvCache::LayerOffset(int64_t layer) const {
  BITSPLIT_CHECK(layer >= 0 && layer < num_layers());
  return layer_offsets_[static_cast<size_t>(layer)];
}

absl::Status KvSlotLedger::BeginPending(int64_t count) {
  if (count < 0 || count > capacity_ - committed_length_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache full: %d committed + %d new tokens exceed the capacity of %d",
                        committed_length_, count, capacity_));
  }
  pending_length_ = count;
  return absl::OkStatus();
}

absl::Status KvSlotLedger::Commit(int64_t count) {
  if (count < 0 || count > pending_length_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot commit %d KV slots: only %d are pending", count, pending_length_));
  }
  SlotsCommitted(count);
  return absl::OkStatus();
}

absl::Status KvSlotLedger::CheckCommitSlots(std::span<const int32_t> pending_indices) const {
  for (size_t k = 0; k < pending_indices.size(); ++k) {
    const int32_t index = pending_indices[k];
    if (index < 0 || index >= pending_length_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot commit pending KV slot %d: only %d are pending", index, pending_length_));
    }
    if (k > 0 && index <= pending_indices[k - 1]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pending KV slots to commit must be strictly ascending (%d follows %d)",
                          index, pending_indices[k - 1]));
    }
  }
  return absl::OkStatus();
}

absl::Status KvCache::Grow(int64_t capacity) {
  if (capacity <= slots_.capacity()) {
    slots_.DiscardPending();
    return absl::OkStatus();
  }
  BITSPLIT_ASSIGN_OR_RETURN(KvCache grown, Create(layer_kv_dims_, capacity, type_));
  const int64_t committed = committed_length();
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    const size_t bytes = static_cast<size_t>(committed * row_bytes(layer));
    std::copy_n(KeyBytes(layer), bytes, grown.keys_.data() + grown.LayerOffset(layer));
    std::copy_n(ValueBytes(layer), bytes, grown.values_.data() + grown.LayerOffset(layer));
  }
  std::copy_n(positions_.begin(), committed, grown.positions_.begin());
  BITSPLIT_RETURN_IF_ERROR(grown.slots_.BeginPending(committed));
  BITSPLIT_RETURN_IF_ERROR(grown.slots_.Commit(committed));
  *this = std::move(grown);
  return absl::OkStatus();
}

absl::Status KvSlotLedger::Truncate(int64_t length) {
  if (length < 0 || length > committed_length_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot truncate the KV cache to %d tokens: %d are committed", length, committed_length_));
  }
  committed_length_ = length;
  pending_length_ = 0;
  return absl::OkStatus();
}

absl::Status KvCache::CommitSlots(std::span<const int32_t> pending_indices) {
  BITSPLIT_RETURN_IF_ERROR(slots_.CheckCommitSlots(pending_indices));
  // Ascending indices satisfy index >= k, so slot L + k is written only after every source at
  // or below it has been read: the compaction can run in place, front to back.
  const int64_t length = slots_.committed_length();
  for (size_t k = 0; k < pending_indices.size(); ++k) {
    const int64_t from = length + pending_indices[k];
    const int64_t to = length + static_cast<int64_t>(k);
    if (from != to) MoveSlot(from, to);
  }
  slots_.SlotsCommitted(static_cast<int64_t>(pending_indices.size()));
  return absl::OkStatus();
}

void KvCache::MoveSlot(int64_t from, int64_t to) {
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    const int64_t width = row_bytes(layer);
    const size_t base = LayerOffset(layer);
    const size_t source = base + static_cast<size_t>(from * width);
    const size_t target = base + static_cast<size_t>(to * width);
    std::copy_n(keys_.begin() + source, width, keys_.begin() + target);
    std::copy_n(values_.begin() + source, width, values_.begin() + target);
  }
  positions_[static_cast<size_t>(to)] = positions_[static_cast<size_t>(from)];
}

uint64_t KvCacheBytes(const std::vector<int64_t>& layer_kv_dims, int64_t capacity,
                      ops::KvType type) {
  const uint64_t slots = static_cast<uint64_t>(capacity);
  uint64_t bytes_per_slot = 0;
  for (const int64_t kv_dim : layer_kv_dims) {
    bytes_per_slot += static_cast<uint64_t>(ops::KvRowBytes(type, kv_dim));
  }
  return 2 * slots * bytes_per_slot + slots * sizeof(int32_t);
}

uint64_t DefaultKvRamBudget(uint64_t available_bytes, uint64_t unlocked_weight_bytes) {
  return available_bytes > unlocked_weight_bytes ? (available_bytes - unlocked_weight_bytes) / 2
                                                 : 0;
}

absl::StatusOr<int64_t> SessionsThatFit(uint64_t budget_bytes, uint64_t session_bytes, int64_t cap,
                                        std::string_view what) {
  BITSPLIT_CHECK(cap >= 1 && session_bytes > 0);
  const uint64_t fitting = budget_bytes / session_bytes;
  if (fitting == 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s holds %s of KV cache; the budget of %s holds none", what,
                        FormatBytes(session_bytes), FormatBytes(budget_bytes)));
  }
  return static_cast<int64_t>(std::min<uint64_t>(fitting, static_cast<uint64_t>(cap)));
}

}  // namespace bitsplit::model
