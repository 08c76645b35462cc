// DeviceKvCache: a session's f16 or q8_0 keys and values in VRAM, its slot ledger, and the model's
// count of the plan's caches in use.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_model.h"
#include "common/cuda/cuda_status.h"
#include "common/ops/kv_rows.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {

using model::AlignVram;

DeviceKvCache::~DeviceKvCache() {
  if (slab_ != nullptr) cudaFree(slab_);
  if (model_ != nullptr) --model_->live_caches_;
}

absl::Status DeviceKvCache::CommitSlots(std::span<const int32_t> pending_indices) {
  BITSPLIT_RETURN_IF_ERROR(slots_.CheckCommitSlots(pending_indices));
  const int64_t count = static_cast<int64_t>(pending_indices.size());
  if (count > 0) {
    // The indices travel through the model's top-k scratch ([max_batch_rows][64] int32, far more
    // than a path of at most max_batch_rows slots); stream order keeps them intact until the
    // kernel has read them.
    int32_t* indices = model_->d_.top_ids;
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(indices, pending_indices.data(),
                                                  count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                  model_->stream_));
    const bool uniform = std::all_of(layer_kv_dims_.begin(), layer_kv_dims_.end(),
                                     [&](int64_t dim) { return dim == layer_kv_dims_[0]; });
    if (uniform) {  // one launch over every layer
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::CommitSlots(
          keys_, values_, positions_, num_layers_, capacity_ * row_bytes(0), row_bytes(0),
          slots_.committed_length(), indices, count, model_->stream_));
    } else {
      for (int64_t layer = 0; layer < num_layers_; ++layer) {
        BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::CommitSlots(
            keys(layer), values(layer), layer == 0 ? positions_ : nullptr, 1, 0, row_bytes(layer),
            slots_.committed_length(), indices, count, model_->stream_));
      }
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
  }
  slots_.SlotsCommitted(count);
  return absl::OkStatus();
}

absl::Status DeviceKvCache::CopyToHost(int64_t layer, int64_t first, int64_t count,
                                       std::vector<float>* keys, std::vector<float>* values) const {
  if (layer < 0 || layer >= num_layers_ || first < 0 || count < 0 || first + count > capacity_) {
    return absl::InvalidArgumentError("KV slots out of range");
  }
  const int64_t width = kv_dim(layer);
  std::vector<uint8_t> rows(static_cast<size_t>(count * row_bytes(layer)));
  for (int side = 0; side < 2; ++side) {
    const uint8_t* source =
        (side == 0 ? this->keys(layer) : this->values(layer)) + first * row_bytes(layer);
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(rows.data(), source, rows.size(), cudaMemcpyDeviceToHost));
    std::vector<float>* out = side == 0 ? keys : values;
    out->resize(static_cast<size_t>(count * width));
    for (int64_t s = 0; s < count; ++s) {
      ops::DecodeKvElements(type_, rows.data() + s * row_bytes(layer), 0, width,
                            out->data() + s * width);
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceKvCache::CopyPositionsToHost(int64_t first, int64_t count,
                                                std::vector<int32_t>* positions) const {
  if (positions_ == nullptr) {
    return absl::FailedPreconditionError("this KV cache keeps no slot positions (no window)");
  }
  if (first < 0 || count < 0 || first + count > capacity_) {
    return absl::InvalidArgumentError("KV slots out of range");
  }
  positions->resize(static_cast<size_t>(count));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(positions->data(), positions_ + first,
                                           count * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceKvCache>> CudaModel::NewKvCache() {
  if (live_caches_.fetch_add(1) >= options_.sessions) {
    --live_caches_;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "all %d KV caches of the VRAM plan are in use (start the drafter with more sessions)",
        options_.sessions));
  }
  std::unique_ptr<DeviceKvCache> cache(new DeviceKvCache());
  cache->model_ = this;  // from here on the destructor returns the count
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&cache->slab_, plan_.kv_bytes_per_session));
  cache->num_layers_ = config_.num_layers;
  cache->capacity_ = options_.context;
  cache->slots_ = model::KvSlotLedger(options_.context);
  cache->type_ = options_.kv_type;
  cache->keys_ = static_cast<uint8_t*>(cache->slab_);
  // Layer after layer, each capacity rows of its KvDim (VramPlan's one side).
  int64_t bytes = 0;
  for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
    cache->layer_kv_dims_.push_back(config_.KvDim(layer));
    cache->layer_offsets_.push_back(bytes);
    bytes += options_.context * ops::KvRowBytes(options_.kv_type, config_.KvDim(layer));
  }
  const uint64_t one_side = AlignVram(static_cast<uint64_t>(bytes));
  cache->values_ = cache->keys_ + one_side;
  if (plan_.kv_positions_bytes > 0) {
    cache->positions_ =
        reinterpret_cast<int32_t*>(static_cast<uint8_t*>(cache->slab_) + 2 * one_side);
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemset(cache->positions_, 0, plan_.kv_positions_bytes));
  }
  return cache;
}

}  // namespace bitsplit::cuda
