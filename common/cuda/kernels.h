#pragma once
// Device kernels of the CUDA drafter backend and their launchers. This header is plain C++17
// with the CUDA runtime only (no absl), so nvcc compiles the kernels apart from the C++20 host
// code; every launcher enqueues on `stream` and returns the launch error, which the host code
// turns into an absl::Status with file and line (cuda_status.h).
//
// Arithmetic contract (docs/cuda.md): every kernel is batch-invariant (a row's result depends on
// that row's inputs only, never on how many rows run, where the row sits or how the grid is
// shaped), and the library is compiled with --fmad=false so that multiply-adds are fused only
// where a kernel says so (__fmaf_rn), as on the CPU. Where a kernel mirrors a CPU operation's
// arithmetic exactly it says so, and the tests check those bit for bit:
//   exact:   Hadamard rotation, activation quantization, split matmul (MatMulReference's
//            sequence), embedding gather and scale, RoPE (both pairings, from a host-computed
//            table), residual and bias adds, attention scores and router logits (simd::Dot's
//            lane order), the sliding window's slot lists, the gather and weighted sum of a
//            mixture-of-experts layer, argmax, top-k ids
//   close:   RMSNorm (also per head for QK-norm, and the post-norms) and the attention softmax
//            sum (double sums in a fixed tree instead of index order), expf in SiLU / softmax
//            and tanhf in GeGLU and the soft-cap (the device's vs glibc's: <= 2 ulp apart)
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/quant/split_common.h"

namespace bitsplit::cuda::kernels {

// ---- Linear layers ---------------------------------------------------------------------------

// A weight matrix in a split format (common/quant/split_common.h) in device memory: rows are
// row_stride bytes apart, and row_stride and every row start are multiples of 4 (the CUDA backend
// pads rows; codes are read as 32-bit words).
struct DeviceMatrix {
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  quant::SplitFormat format = quant::SplitFormat::kB2Sym;
  int32_t group = 32;
  quant::SplitRowLayout layout;  // quant::SplitRowLayoutOf(format, group, cols)
};

// Activations quantized to int8 per row in blocks of 32 (quant::QuantizedActivations' layout).
struct DeviceActivations {
  const int8_t* codes = nullptr;  // [rows][cols]
  const float* scales = nullptr;  // [rows][block_stride]
  const float* sums = nullptr;    // [rows][block_stride]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_stride = 0;
};

inline constexpr int kMaxGroupMatrices = 3;

// The matrices of one linear group (all with the same cols) and their outputs:
// outputs[i][t * matrices[i].rows + r] (=|+=) x_t · W_i,r.
struct GroupMatMul {
  DeviceMatrix matrices[kMaxGroupMatrices];
  float* outputs[kMaxGroupMatrices] = {};
  int32_t count = 0;
};

// In place on x[rows][cols]: per block of `block` columns, the sign flip (XOR with
// sign_masks[column], 0 or 0x80000000), the butterflies h = 1 .. block/2 and the multiply by
// `scale`: quant::HadamardRotateRowsReference bit for bit. block is a power of two in [8, 1024].
cudaError_t HadamardRotate(float* x, int64_t rows, int64_t cols, int block,
                           const uint32_t* sign_masks, float scale, cudaStream_t stream);

// quant::QuantizeActivationsReference bit for bit: codes, scales and sums (padding blocks of
// each row's block_stride zeroed).
cudaError_t QuantizeActivations(const float* x, int64_t rows, int64_t cols, int8_t* codes,
                                float* scales, float* sums, int64_t block_stride,
                                cudaStream_t stream);

// quant::MatMulReference's sequence for every (activation row, weight row) of the group.
cudaError_t SplitMatMul(const GroupMatMul& group, const DeviceActivations& x, bool accumulate,
                        cudaStream_t stream);

// y[i] = y[i] + delta[i] (one f32 addition: a layer's output into the hidden state, and the
// residual matmul's output into the base's).
cudaError_t AddInPlace(float* y, const float* delta, int64_t n, cudaStream_t stream);

// ---- The rest of the layer -------------------------------------------------------------------

enum EmbeddingType : int32_t { kEmbeddingF32 = 0, kEmbeddingF16 = 1, kEmbeddingQ8_0 = 8 };

// out[t] = row tokens[t] of the table (ggml type F32, F16 or Q8_0), dequantized as
// ops::DequantizeWeightRow does.
cudaError_t EmbeddingGather(const uint8_t* table, int32_t type, int64_t row_bytes, int64_t cols,
                            const int32_t* tokens, int64_t rows, float* out, cudaStream_t stream);

// out[r] = RMSNorm(x[source_rows ? source_rows[r] : r]) * weight (ops::RmsNorm's formula; the sum
// of squares in double, in a fixed tree); no multiply when weight is null (a weightless norm).
cudaError_t RmsNorm(const float* x, const int32_t* source_rows, int64_t rows, int64_t n,
                    const float* weight, float eps, float* out, cudaStream_t stream);

// ops::ApplyRope with cos/sin from a table [positions][rotary_dims / 2] that the host computed
// with ApplyRope's own arithmetic: x is [rows][heads][head_dim], row t at positions[t]. Pair i is
// (x[2i], x[2i + 1]) (RopeStyle::kAdjacentPairs), or (x[i], x[i + rotary_dims / 2]) when
// `halves` (RopeStyle::kHalves, NEOX).
cudaError_t ApplyRope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dims,
                      const int32_t* positions, const float* cos_table, const float* sin_table,
                      bool halves, cudaStream_t stream);

// x[r * n + i] = x[r * n + i] + vector[i] for rows r < rows (one f32 addition: the q/k/v biases).
cudaError_t AddRowVector(float* x, const float* vector, int64_t rows, int64_t n,
                         cudaStream_t stream);

// x[i] = x[i] * scale (one f32 multiply: the embedding scale, a layer's output scale).
cudaError_t ScaleInPlace(float* x, int64_t n, float scale, cudaStream_t stream);

// x[i] = tanh(x[i] * (1 / cap)) * cap (the final logit soft-cap in llama.cpp's order; the
// device's tanhf, within 2 ulp of the CPU's std::tanh).
cudaError_t SoftCap(float* x, int64_t n, float cap, cudaStream_t stream);

// The KV cache rows the kernels read and write (ops::KvType's f16 and q8_0): f16 rows of kv_dim
// halves; q8_0 rows of kv_dim / 32 quant::BlockQ8_0 (34 bytes: fp16 scale, 32 int8 codes).
enum class KvStorage : int32_t { kF16 = 0, kQ8_0 = 1 };
__host__ __device__ inline int64_t KvStorageRowBytes(KvStorage storage, int64_t kv_dim) {
  return storage == KvStorage::kF16 ? 2 * kv_dim : kv_dim / 32 * 34;
}

// Encodes rows t < rows of x ([rows][kv_dim] f32) into cache rows *first_slot + t: f16 as
// half(x) (round to nearest even), q8_0 as ggml's quantize_row_q8_0_ref per 32 values
// (quant::QuantizeQ8_0Row bit for bit; kv_dim a multiple of 32). The slot is read from device
// memory when the kernel runs, so a captured CUDA graph serves every step.
cudaError_t StoreKvRows(const float* x, int64_t rows, int64_t kv_dim, KvStorage storage,
                        uint8_t* cache, const int64_t* first_slot, cudaStream_t stream);

// slot_positions[*first_slot + t] = positions[t] (the KV cache's per-slot positions, which
// sliding-window layers compare; the slot is read when the kernel runs, as in StoreKvRows).
cudaError_t StorePositions(const int32_t* positions, int64_t rows, int32_t* slot_positions,
                           const int64_t* first_slot, cudaStream_t stream);

// The slots a row of a sliding-window layer sees, as ops::AttentionWithContext lists them: the
// prefix slots [0, prefix_length), then slot prefix_length + j for every j < mask_width with
// mask[i * mask_width + j] != 0, in ascending order, keeping those whose position p satisfies
// query_positions[i] - p < window (window 0: all). slots[i * slot_stride + v] is row i's v-th
// visible slot, counts[i] how many there are.
struct VisibleSlotsArgs {
  const uint8_t* mask = nullptr;  // [rows][mask_width]
  int64_t rows = 0;
  int64_t prefix_length = 0;
  const int64_t* prefix_length_on_device = nullptr;  // as in AttentionArgs
  int64_t mask_width = 0;
  int64_t window = 0;
  const int32_t* query_positions = nullptr;  // [rows]
  const int32_t* slot_positions = nullptr;   // [prefix_length + mask_width]: the cache's
  int32_t* slots = nullptr;                  // [rows][slot_stride]
  int32_t* counts = nullptr;                 // [rows]
  int64_t slot_stride = 0;                   // >= prefix_length + mask_width
};
cudaError_t VisibleSlots(const VisibleSlotsArgs& args, cudaStream_t stream);

// The attention of ops::AttentionWithContext over an f16 or q8_0 cache (each value decoded as
// ops::DecodeKvElements does, then simd::Dot's order): token i sees slots
// [0, prefix_length) and slot prefix_length + j for every j < mask_width with
// mask[i * mask_width + j] != 0, in ascending order; or, when visible_slots is set, the slots
// VisibleSlots listed (a sliding window). `scores` is scratch of [rows][num_heads][score_stride]
// floats (score_stride >= the visible count of every row).
struct AttentionArgs {
  const float* q = nullptr;  // [rows][num_heads * head_dim]
  // One layer: [slots] rows of num_kv_heads * head_dim values in `storage` (q8_0: head_dim a
  // multiple of 32).
  const uint8_t* keys = nullptr;
  const uint8_t* values = nullptr;
  KvStorage storage = KvStorage::kF16;
  const uint8_t* mask = nullptr;  // [rows][mask_width]
  float* out = nullptr;           // [rows][num_heads * head_dim]
  float* scores = nullptr;
  int64_t rows = 0;
  int64_t prefix_length = 0;
  // When set, the prefix length is read from this device address when the kernel runs (and
  // prefix_length is ignored), so a captured CUDA graph serves every step.
  const int64_t* prefix_length_on_device = nullptr;
  int64_t mask_width = 0;
  int64_t score_stride = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  // [num_heads] attention-sink logits (gpt-oss): each head's softmax takes exp(sink) into its
  // denominator (and the sink into its max), as ops::AttentionShape::sinks; null: none.
  const float* sinks = nullptr;
  // VisibleSlots' output (slots, counts, slot_stride); null: the mask and prefix above.
  const int32_t* visible_slots = nullptr;
  const int32_t* visible_counts = nullptr;
  int64_t visible_stride = 0;
};
cudaError_t Attention(const AttentionArgs& args, cudaStream_t stream);

// model::FfnActivation, as the kernels know it.
enum class GatedActivation { kSilu, kGeluTanh, kSwigluOai };

// The gated activation on rows `stride` floats apart: out[r * width + i] = act(gate[r * stride +
// i]) * up[r * stride + i], stride >= width (gate and up may be the two halves of one fused row,
// an expert's gate|up output; out may alias gate when stride == width). act(g) * u is
// ops::SiluMul's g / (1 + expf(-g)) * u, ops::GeluTanhMul's formula in f32 (the device's tanhf:
// within a few ulp of the CPU's), or ops::SwigluOaiMul's clamped form with alpha and limit.
cudaError_t GatedActivationRows(const float* gate, const float* up, int64_t rows, int64_t width,
                                int64_t stride, GatedActivation activation, float alpha,
                                float limit, float* out, cudaStream_t stream);

// KvCache::CommitSlots on the device: for i in order, slot committed + i = slot committed +
// pending_indices[i] in keys and values of every layer (`layer_stride` bytes apart, rows of
// `row_bytes`), and in `positions` ([slots], may be null). The indices are strictly ascending, so
// the in-order copies never read an overwritten slot.
cudaError_t CommitSlots(uint8_t* keys, uint8_t* values, int32_t* positions, int64_t layers,
                        int64_t layer_stride, int64_t row_bytes, int64_t committed,
                        const int32_t* pending_indices, int64_t count, cudaStream_t stream);

// ---- Mixture of experts --------------------------------------------------------------------

// logits[t * experts + e] = x_t · router_e, router f32 [experts][cols], each dot in simd::Dot's
// order: ops::MatMul of the router (f32, or dequantized to f32) bit for bit.
cudaError_t RouterLogits(const float* x, int64_t rows, const float* router, int64_t experts,
                         int64_t cols, float* logits, cudaStream_t stream);

// out[s * n + i] = x[source_rows[s] * n + i] for s < rows: each routed pair's input row.
cudaError_t GatherRows(const float* x, const int32_t* source_rows, int64_t rows, int64_t n,
                       float* out, cudaStream_t stream);

// x[r * n + i] = x[r * n + i] * scale * vector[i] (two f32 multiplies in that order: gemma4's
// router input, RMSNorm(x) / sqrt(d_model) * ffn_gate_inp.scale).
cudaError_t ScaleRowsByVector(float* x, int64_t rows, int64_t n, float scale, const float* vector,
                              cudaStream_t stream);

// Per row t, its k experts' outputs added in the order chosen, LlamaModel's arithmetic exactly:
// value_c = expert_out[slot_of[t k + c]] * (expert_scales ? expert_scales[expert_of[t k + c]] :
// 1) * weights[t k + c] (two f32 multiplies), out[t] = value_0 + value_1 + ... left to right.
struct WeightedExpertSumArgs {
  const float* expert_out = nullptr;     // [grouped rows][n]
  const int32_t* slot_of = nullptr;      // [rows * k]: pair -> grouped row
  const int32_t* expert_of = nullptr;    // [rows * k]
  const float* weights = nullptr;        // [rows * k]
  const float* expert_scales = nullptr;  // [experts], or null
  int64_t rows = 0;
  int64_t k = 0;
  int64_t n = 0;
  float* out = nullptr;  // [rows][n]
};
cudaError_t WeightedExpertSum(const WeightedExpertSumArgs& args, cudaStream_t stream);

// ---- Target choice ---------------------------------------------------------------------------

// choices[r] = the index of the largest logits[r][*], the lowest index among equals.
cudaError_t ArgMaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* choices,
                       cudaStream_t stream);

// Sampler::Choose for temperature > 0 on every row: the candidates ordered by (logit desc, id
// asc), top_k (0: off) and top_p (1: off) truncation, and the draw u = UniformForPosition(seed,
// positions[r]) against the cumulative probabilities. The searches are over that order, with
// masses summed in double in a fixed tree (the CPU sums in sorted order: the same choice unless
// u falls within rounding of a boundary). `weights` is scratch of [rows][vocab] doubles.
struct SamplingArgs {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  const int64_t* positions = nullptr;  // [rows]: the sequence index the sampled token takes
  double temperature = 1.0;
  int32_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  double* weights = nullptr;
  int32_t* choices = nullptr;
};
cudaError_t SampleRows(const SamplingArgs& args, cudaStream_t stream);

// Per row: the k (<= 64) largest logits' ids, most likely first (lower id among equals), their
// logits, and log Σ exp(logits) (speculation.cc's LogSumExp: max + log Σ exp(double(l - max))).
cudaError_t TopKRows(const float* logits, int64_t rows, int64_t vocab, int32_t k, int32_t* ids,
                     float* top_logits, double* log_normalizers, cudaStream_t stream);

// The uniform double of model::UniformForPosition, on the device (for tests).
cudaError_t UniformForPositions(uint64_t seed, const int64_t* positions, int64_t count, double* out,
                                cudaStream_t stream);

}  // namespace bitsplit::cuda::kernels
