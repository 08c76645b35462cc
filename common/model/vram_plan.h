#pragma once
// The VRAM plan of the CUDA drafter backend: where the device memory goes (base weights, the
// embedding table, norms and tables, every session's f16 or q8_0 KV cache, the scratch of one
// forward)
// and whether it fits a budget. Pure arithmetic, so it is tested without a GPU; the CUDA backend
// allocates exactly the buffers counted here (ForwardScratchLayout is its scratch layout), so the
// plan is what the device holds, up to the CUDA runtime's own use (the budget's margin).
//
// When the request does not fit, PlanVram refuses with RESOURCE_EXHAUSTED and says what fits:
// the longest context at the requested session count, the most sessions at the requested
// context, and the base formats with fewer bits that fit as requested.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/ggml_type.h"
#include "common/model/config.h"
#include "common/ops/kv_rows.h"
#include "common/quant/split_format.h"

namespace bitsplit::model {

// Device allocations are carved from a few large slabs, each rounded up to this (the CUDA
// allocator's large-page granularity), and every buffer inside a slab is aligned to kVramAlign.
inline constexpr uint64_t kVramSlabGranularity = 2ull << 20;
inline constexpr uint64_t kVramAlign = 256;

// Weight rows on the device are padded to a multiple of this, so that every row starts on a
// 4-byte boundary and the kernels read codes as aligned 32-bit words.
inline constexpr uint64_t kDeviceRowAlign = 4;

uint64_t AlignVram(uint64_t bytes);      // up to a multiple of kVramAlign
uint64_t RoundVramSlab(uint64_t bytes);  // up to a multiple of kVramSlabGranularity
// SplitRowBytes padded to kDeviceRowAlign: a row's stride on the device.
uint64_t DeviceRowStride(quant::SplitFormat format, int group, int64_t cols);

// Bytes of every linear weight of `config` in `format` with `group`, as the CUDA backend packs
// them: each matrix (q, k, v, o, gate, up, down of every layer, then the output head) is rows x
// DeviceRowStride, aligned to kVramAlign. INVALID_ARGUMENT when the group does not divide an input
// width (d_model, q_dim, d_ff) or the config has a non-positive dimension.
// `tensor_formats` (nullable): a bit plan's per-tensor base formats (tensor name -> format),
// overriding `format` for the tensors it names.
absl::StatusOr<uint64_t> SplitLinearBytes(
    const ModelConfig& config, quant::SplitFormat format, int group,
    const std::map<std::string, quant::SplitFormat, std::less<>>* tensor_formats = nullptr);

// The scratch of one forward of up to `max_rows` tokens whose sessions hold up to `max_context`
// tokens. Every field is one device buffer's size in bytes (aligned); the CUDA backend carves its
// scratch slab in this order.
struct ForwardScratchLayout {
  // Batch description: tokens, positions, logit rows (i32 [T]) and the mask (u8 [T, 2T]: a
  // forward's mask is at most context + T wide and the context of a draft forward is < T).
  uint64_t batch_bytes = 0;
  uint64_t hidden_state_bytes = 0;  // x, f32 [T, d_model]
  uint64_t normed_bytes = 0;        // f32 [T, d_model]
  uint64_t q_bytes = 0;             // f32 [T, q_dim]
  uint64_t kv_new_bytes = 0;        // the batch's keys and values before fp16: f32 2 x [T, kv]
  uint64_t attention_bytes = 0;     // f32 [T, q_dim]
  uint64_t gate_up_bytes = 0;       // f32 2 x [T, d_ff] (0 without a dense FFN)
  uint64_t projected_bytes = 0;     // f32 [T, d_model]
  // The rotation and int8 activation scratch of one linear group: linear_rows rows (a forward's
  // T, or T x k for a mixture-of-experts model, whose expert groups run on every routed pair) of
  // the widest input, linear_cols.
  int64_t linear_rows = 0;
  int64_t linear_cols = 0;
  uint64_t rotated_bytes = 0;          // f32 [linear_rows, linear_cols]
  uint64_t activation_bytes = 0;       // int8 codes [linear_rows, linear_cols] + f32 scales, sums
  uint64_t residual_output_bytes = 0;  // f32 [T, widest group output]: the residual's result
  uint64_t logits_bytes = 0;           // f32 [T, vocab]
  uint64_t scores_bytes = 0;           // attention scores f32 [T, heads, max_context]
  // Sliding-window models only (0 otherwise): each row's visible slots of a windowed layer,
  // i32 [T, max_context], and their counts, i32 [T].
  uint64_t visible_slots_bytes = 0;
  // Mixture-of-experts models only (0 otherwise), carved in this order: the router's logits f32
  // [T, E]; the experts' and the router's inputs f32 2 x [T, d_model] (gemma4 normalizes them
  // apart); per routed pair (T x k) its expert (i32), weight (f32), grouped row (i32) and source
  // row (i32); per grouped row its input f32 [d_model], gate|up f32 [2 x d_ff_expert], gated
  // activation f32 [d_ff_expert] and output f32 [d_model]; the weighted sum f32 [T, d_model].
  uint64_t expert_bytes = 0;
  uint64_t sampling_bytes = 0;  // f64 [T, vocab]: target-choice weights
  // Per-row results: top-k ids i32 [T, 64], their logits f32 [T, 64], log-normalizers f64 [T],
  // choices i32 [T], sampling positions i64 [T].
  uint64_t choice_bytes = 0;
  uint64_t total_bytes = 0;  // the sum

  static ForwardScratchLayout For(const ModelConfig& config, int64_t max_rows, int64_t max_context);
};

// What the device must hold.
struct VramRequest {
  ModelConfig config;
  quant::SplitFormat base_format = quant::SplitFormat::kB2Asym;
  int base_group = 64;
  // A bit plan's base formats by tensor name, overriding base_format (SplitQuantization's
  // tensor_formats); empty for a uniform base.
  std::map<std::string, quant::SplitFormat, std::less<>> base_tensor_formats;
  // The embedding table's bytes on the device; 0 when the backend gathers embedding rows on
  // the host (a type its gather kernel does not read).
  uint64_t embedding_bytes = 0;
  int64_t context = 2048;       // tokens per session (the KV cache capacity)
  int64_t sessions = 1;         // KV caches held at once
  int64_t max_batch_rows = 64;  // largest forward: tree nodes + 1, prefill chunk
  // The KV cache's rows: f16 or q8_0 (the device kernels read those two).
  ops::KvType kv_type = ops::KvType::kF16;
};

struct VramItem {
  std::string name;
  uint64_t bytes = 0;
};

struct VramPlan {
  uint64_t budget_bytes = 0;
  uint64_t base_weights_bytes = 0;  // one slab
  // Embedding table, norms, RoPE table and Hadamard signs: one slab.
  uint64_t embedding_bytes = 0;
  uint64_t norms_bytes = 0;   // every per-layer vector (LayerVectorSpecs) and the output norm
  uint64_t router_bytes = 0;  // mixture of experts: every layer's router, f32
  uint64_t rope_table_bytes =
      0;  // cos/sin per position; one more table for local (windowed) layers
  uint64_t hadamard_bytes = 0;
  uint64_t constants_slab_bytes = 0;
  uint64_t kv_bytes_per_token = 0;  // one session, all layers, keys and values
  // Sliding-window models: each slot's position, i32 [context] per session (else 0).
  uint64_t kv_positions_bytes = 0;
  uint64_t kv_bytes_per_session = 0;  // one slab per session
  uint64_t kv_cache_bytes = 0;        // all sessions
  ForwardScratchLayout scratch;       // one slab
  uint64_t scratch_slab_bytes = 0;
  uint64_t total_bytes = 0;  // the slabs
  int64_t context = 0;
  int64_t sessions = 0;
  int64_t max_batch_rows = 0;

  // Name and bytes of each slab, for GetModelInfo and logs.
  std::vector<VramItem> Items() const;
  // "base weights 2.19 GiB, constants 0.54 GiB, KV cache 4 x 1.00 GiB (8192 tokens), scratch
  // 0.08 GiB: 6.81 of 7.50 GiB".
  std::string ToString() const;
};

// The plan of `request` under `budget_bytes`. INVALID_ARGUMENT for a malformed request (sizes
// < 1, a context beyond the model's, a base format that is not a base format, a group that does
// not divide the inputs); RESOURCE_EXHAUSTED when it does not fit, naming every item and what
// fits instead.
absl::StatusOr<VramPlan> PlanVram(const VramRequest& request, uint64_t budget_bytes);

// The most sessions, at most `cap`, whose plan at request.context fits `budget_bytes`
// (request.sessions is not read); when not even one fits, PlanVram's refusal of one session.
absl::StatusOr<int64_t> VramSessionsThatFit(const VramRequest& request, uint64_t budget_bytes,
                                            int64_t cap);

// Total bytes of `request` regardless of any budget (same validation).
absl::StatusOr<uint64_t> VramTotalBytes(const VramRequest& request);

// The embedding table's device bytes: its whole size when the CUDA gather kernel reads `type`
// (F32, F16, Q8_0), else 0 (the backend gathers rows on the host).
bool EmbeddingGatheredOnDevice(GgmlType type);
uint64_t DeviceEmbeddingBytes(GgmlType type, int64_t rows, int64_t row_bytes);

// Where the embedding table goes, as request.embedding_bytes: `table_device_bytes`
// (DeviceEmbeddingBytes; 0 for a type only the host gathers) or 0, the table in host RAM, where
// the CPU dequantizes each step's rows and only they cross PCIe (llama.cpp keeps token_embd on
// the CPU too). On the device a draft step runs as one CUDA graph; that is worth no session and
// no base bit, so the table goes there only when it costs nothing: the request fits
// `budget_bytes` with it, and when request.sessions is 0 (as many as fit, at most
// `max_sessions`) as many sessions fit with it as without. request.embedding_bytes is not read.
uint64_t PlacedEmbeddingBytes(const VramRequest& request, uint64_t table_device_bytes,
                              uint64_t budget_bytes, int64_t max_sessions);

// The default budget: free device memory minus a margin for the CUDA runtime and other users
// (5% of the free memory, at least 512 MiB); 0 when less than the margin is free.
uint64_t DefaultVramBudget(uint64_t free_bytes);

// Largest value v in [1, high] with fits(v), or 0 when fits(1) is false; fits is monotone.
template <typename Fits>
int64_t LargestFitting(int64_t high, Fits fits) {
  if (!fits(1)) return 0;
  int64_t low = 1;  // fits(low) holds
  while (low < high) {
    const int64_t mid = low + (high - low + 1) / 2;
    if (fits(mid)) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

// A positive size in bytes: digits with an optional KiB, MiB or GiB suffix ("512MiB").
// INVALID_ARGUMENT otherwise, saying the syntax (the caller names the flag).
absl::StatusOr<uint64_t> ParseBytes(std::string_view text);

// "7.50 GiB", "512.0 MiB": sizes in messages.
std::string FormatBytes(uint64_t bytes);

}  // namespace bitsplit::model
