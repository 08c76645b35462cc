// The non-linear parts of a layer on the device: embedding gather and scale, RMSNorm, RoPE (both
// pairings), bias adds, the f16/q8_0 KV store and slot positions, sliding-window slot lists,
// tree-masked attention (with sinks), SiLU·mul, GeGLU and the clamped SwiGLU (also on strided
// rows), and the KV commit (see kernels.h for which are bit-exact with the CPU ops).
#include <cuda_fp16.h>

#include <cstddef>

#include "common/cuda/kernel_common.h"
#include "common/cuda/kernels.h"
#include "common/quant/ggml_blocks.h"

namespace bitsplit::cuda::kernels {
namespace {

constexpr int kNormThreads = 256;
constexpr int kAttentionThreads = 256;

__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__global__ void EmbeddingKernel(const uint8_t* table, int32_t type, int64_t row_bytes, int64_t cols,
                                const int32_t* tokens, int64_t rows, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t t = i / cols;
  const int64_t c = i % cols;
  const uint8_t* row = table + static_cast<int64_t>(tokens[t]) * row_bytes;
  float value;
  if (type == kEmbeddingF32) {
    value = reinterpret_cast<const float*>(row)[c];
  } else if (type == kEmbeddingF16) {
    value = HalfBitsToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
  } else {  // Q8_0 (quant::BlockQ8_0): y = float(q) * d
    using quant::BlockQ8_0;
    const uint8_t* block = row + (c / quant::kQk) * sizeof(BlockQ8_0);
    const uint8_t* d_bytes = block + offsetof(BlockQ8_0, d);
    const float d = HalfBitsToFloat(static_cast<uint16_t>(d_bytes[0] | (d_bytes[1] << 8)));
    const int8_t q = static_cast<int8_t>(block[offsetof(BlockQ8_0, qs) + c % quant::kQk]);
    value = __fmul_rn(__int2float_rn(q), d);
  }
  out[i] = value;
}

// Fixed-tree block sum (kThreads a power of two): the same order for every row.
template <int kThreads, typename T>
__device__ T BlockSum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = shared[threadIdx.x] + shared[threadIdx.x + stride];
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

template <int kThreads>
__device__ float BlockMax(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const float* x, const int32_t* source_rows, int64_t n, const float* weight,
                  float eps, float* out) {
  __shared__ double partial[kNormThreads];
  const int64_t row = blockIdx.x;
  const float* in = x + (source_rows != nullptr ? source_rows[row] : row) * n;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    sum += static_cast<double>(__fmul_rn(in[i], in[i]));
  }
  sum = BlockSum<kNormThreads>(sum, partial);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const float normed = __fmul_rn(in[i], scale);
    out[row * n + i] = weight != nullptr ? __fmul_rn(normed, weight[i]) : normed;
  }
}

// Pair i is (head[first(i)], head[first(i) + partner]): first = 2i, partner 1 for adjacent
// pairs; first = i, partner = pairs for halves (ops::ApplyRope's indexing).
__global__ void RopeKernel(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t pairs,
                           const int32_t* positions, const float* cos_table, const float* sin_table,
                           bool halves) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * heads * pairs) return;
  const int64_t pair = i % pairs;
  const int64_t head = (i / pairs) % heads;
  const int64_t t = i / (pairs * heads);
  const int64_t table = static_cast<int64_t>(positions[t]) * pairs + pair;
  const float c = cos_table[table], s = sin_table[table];
  const int64_t partner = halves ? pairs : 1;
  float* v = x + (t * heads + head) * head_dim + (halves ? pair : 2 * pair);
  const float x0 = v[0], x1 = v[partner];
  v[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  v[partner] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__global__ void AddRowVectorKernel(float* x, const float* vector, int64_t rows, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * n) x[i] = __fadd_rn(x[i], vector[i % n]);
}

__global__ void ScaleKernel(float* x, int64_t n, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fmul_rn(x[i], scale);
}

__global__ void SoftCapKernel(float* x, int64_t n, float inverse_cap, float cap) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], inverse_cap)), cap);
}

__global__ void StoreHalfKernel(const float* x, int64_t n, int64_t kv_dim, uint8_t* cache,
                                const int64_t* first_slot) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    reinterpret_cast<uint16_t*>(cache)[*first_slot * kv_dim + i] =
        __half_as_ushort(__float2half_rn(x[i]));
  }
}

// One warp per block of 32 values (the i-th of the batch's rows x kv_dim / 32), lane j its value
// j: ggml's quantize_row_q8_0_ref with each operation rounded as the CPU rounds it. The maximum
// of |x| does not depend on the order of the shuffles.
__global__ void StoreQ8Kernel(const float* x, int64_t blocks, int64_t kv_dim, uint8_t* cache,
                              const int64_t* first_slot) {
  const int64_t block = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (block >= blocks) return;  // a whole warp: the shuffles below see all 32 lanes
  const float value = x[block * 32 + lane];
  float amax = fabsf(value);
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  }
  const float d = __fdiv_rn(amax, 127.0f);
  const float inverse = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  const int64_t blocks_per_row = kv_dim / 32;
  const int64_t row = block / blocks_per_row;
  uint8_t* out = cache + (*first_slot + row) * blocks_per_row * sizeof(quant::BlockQ8_0) +
                 (block % blocks_per_row) * sizeof(quant::BlockQ8_0);
  if (lane == 0) {
    const uint16_t half = __half_as_ushort(__float2half_rn(d));
    out[offsetof(quant::BlockQ8_0, d)] = static_cast<uint8_t>(half & 0xFF);
    out[offsetof(quant::BlockQ8_0, d) + 1] = static_cast<uint8_t>(half >> 8);
  }
  out[offsetof(quant::BlockQ8_0, qs) + lane] =
      static_cast<uint8_t>(static_cast<int8_t>(roundf(__fmul_rn(value, inverse))));
}

__global__ void StorePositionsKernel(const int32_t* positions, int64_t rows,
                                     int32_t* slot_positions, const int64_t* first_slot) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows) slot_positions[*first_slot + i] = positions[i];
}

// One CUDA block per row: the candidates (prefix slots, then the masked-in batch columns) in
// chunks of kSlotThreads, each chunk's visible ones appended in order (warp ballots, then the
// warps' counts in warp order), so the list is ascending and independent of the grid.
constexpr int kSlotThreads = 256;
__global__ void __launch_bounds__(kSlotThreads) VisibleSlotsKernel(VisibleSlotsArgs a) {
  __shared__ int warp_counts[kSlotThreads / 32];
  __shared__ int chunk_base;
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t prefix_length =
      a.prefix_length_on_device != nullptr ? *a.prefix_length_on_device : a.prefix_length;
  const int64_t candidates = prefix_length + a.mask_width;
  const int64_t query_position = a.window > 0 ? a.query_positions[row] : 0;
  int32_t* slots = a.slots + row * a.slot_stride;
  if (threadIdx.x == 0) chunk_base = 0;
  __syncthreads();
  for (int64_t start = 0; start < candidates; start += kSlotThreads) {
    const int64_t c = start + threadIdx.x;
    bool visible = false;
    if (c < candidates) {
      visible = c < prefix_length || a.mask[row * a.mask_width + (c - prefix_length)] != 0;
      visible = visible && (a.window == 0 ||
                            query_position - static_cast<int64_t>(a.slot_positions[c]) < a.window);
    }
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, visible);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = chunk_base;
    for (int w = 0; w < warp; ++w) offset += warp_counts[w];
    offset += __popc(ballot & ((1u << lane) - 1u));
    if (visible) slots[offset] = static_cast<int32_t>(c);
    __syncthreads();
    if (threadIdx.x == kSlotThreads - 1) chunk_base = offset + (visible ? 1 : 0);
    __syncthreads();
  }
  if (threadIdx.x == 0) a.counts[row] = chunk_base;
}

// Value k of a head's slice of a cache row, decoded as ops::DecodeKvElements does.
struct HalfLoader {
  const uint8_t* slice;
  __device__ float operator()(int64_t k) const {
    return HalfBitsToFloat(reinterpret_cast<const uint16_t*>(slice)[k]);
  }
};
struct Q8Loader {
  const uint8_t* slice;  // starts at a block
  __device__ float operator()(int64_t k) const {
    using quant::BlockQ8_0;
    const uint8_t* block = slice + (k / 32) * sizeof(BlockQ8_0);
    const float d = HalfBitsToFloat(
        *reinterpret_cast<const uint16_t*>(block + offsetof(BlockQ8_0, d)));  // 2-aligned
    const int8_t q = static_cast<int8_t>(block[offsetof(BlockQ8_0, qs) + k % 32]);
    return __fmul_rn(d, __int2float_rn(q));
  }
};

// The head's slice of cache row `slot` (the head's first value is value `kv_offset` of the row).
__device__ __forceinline__ const uint8_t* HeadSlice(const uint8_t* rows, KvStorage storage,
                                                    int64_t kv_dim, int64_t slot,
                                                    int64_t kv_offset) {
  return rows + slot * KvStorageRowBytes(storage, kv_dim) +
         (storage == KvStorage::kF16 ? 2 * kv_offset : kv_offset / 32 * 34);
}

// simd::Dot's order over a decoded key.
__device__ float DotWithKey(const float* q, KvStorage storage, const uint8_t* key, int64_t n) {
  return storage == KvStorage::kF16 ? SimdOrderDot(q, HalfLoader{key}, n)
                                    : SimdOrderDot(q, Q8Loader{key}, n);
}

__device__ __forceinline__ float LoadValue(KvStorage storage, const uint8_t* value, int64_t d) {
  return storage == KvStorage::kF16 ? HalfLoader{value}(d) : Q8Loader{value}(d);
}

// One CUDA block per (head, row). Shared memory: the query head, the visible mask columns and
// the reduction scratch.
__global__ void __launch_bounds__(kAttentionThreads) AttentionKernel(AttentionArgs a) {
  extern __shared__ double shared[];
  double* partial = shared;                                              // [threads]
  float* query = reinterpret_cast<float*>(partial + kAttentionThreads);  // [head_dim]
  int* columns = reinterpret_cast<int*>(query + a.head_dim);             // [mask_width]
  __shared__ int masked_count;
  const int64_t head = blockIdx.x;
  const int64_t row = blockIdx.y;
  const int64_t q_dim = a.num_heads * a.head_dim;
  const int64_t kv_dim = a.num_kv_heads * a.head_dim;
  const int64_t kv_offset = (head / (a.num_heads / a.num_kv_heads)) * a.head_dim;
  for (int64_t d = threadIdx.x; d < a.head_dim; d += kAttentionThreads) {
    query[d] = a.q[row * q_dim + head * a.head_dim + d];
  }
  const bool listed = a.visible_slots != nullptr;
  if (threadIdx.x == 0 && !listed) {
    int count = 0;
    for (int64_t j = 0; j < a.mask_width; ++j) {
      if (a.mask[row * a.mask_width + j] != 0) columns[count++] = static_cast<int>(j);
    }
    masked_count = count;
  }
  __syncthreads();
  const int64_t prefix_length =
      a.prefix_length_on_device != nullptr ? *a.prefix_length_on_device : a.prefix_length;
  const int32_t* list = listed ? a.visible_slots + row * a.visible_stride : nullptr;
  const int64_t visible = listed ? a.visible_counts[row] : prefix_length + masked_count;
  float* scores = a.scores + (row * a.num_heads + head) * a.score_stride;
  auto slot_of = [&](int64_t v) -> int64_t {
    if (listed) return list[v];
    return v < prefix_length ? v : prefix_length + columns[v - prefix_length];
  };

  float local_max = -INFINITY;
  for (int64_t v = threadIdx.x; v < visible; v += kAttentionThreads) {
    const uint8_t* key = HeadSlice(a.keys, a.storage, kv_dim, slot_of(v), kv_offset);
    const float score = __fmul_rn(DotWithKey(query, a.storage, key, a.head_dim), a.scale);
    scores[v] = score;
    local_max = fmaxf(local_max, score);
  }
  const float sink = a.sinks != nullptr ? a.sinks[head] : -INFINITY;
  const float max_score =
      fmaxf(BlockMax<kAttentionThreads>(local_max, reinterpret_cast<float*>(partial)), sink);
  double local_sum = 0.0;
  for (int64_t v = threadIdx.x; v < visible; v += kAttentionThreads) {
    const float e = expf(__fsub_rn(scores[v], max_score));
    scores[v] = e;
    local_sum += static_cast<double>(e);
  }
  double sum = BlockSum<kAttentionThreads>(local_sum, partial);  // also orders the writes
  if (a.sinks != nullptr) sum += static_cast<double>(expf(__fsub_rn(sink, max_score)));
  const float inverse_sum = static_cast<float>(1.0 / sum);
  // Each output element sums the visible values in ascending order, as the CPU does.
  for (int64_t d = threadIdx.x; d < a.head_dim; d += kAttentionThreads) {
    float acc = 0.0f;
    for (int64_t v = 0; v < visible; ++v) {
      const float weight = __fmul_rn(scores[v], inverse_sum);
      const uint8_t* value = HeadSlice(a.values, a.storage, kv_dim, slot_of(v), kv_offset);
      acc = __fadd_rn(acc, __fmul_rn(weight, LoadValue(a.storage, value, d)));
    }
    a.out[row * q_dim + head * a.head_dim + d] = acc;
  }
}

__device__ __forceinline__ float SiluMulValue(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// ops::GeluTanh's operations in its order, each rounded on its own (no contraction into FMAs);
// tanhf is the device's (within 2 ulp), so the result is within a few ulp of the CPU's.
__device__ __forceinline__ float GeluTanhMulValue(float g, float u) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefficient = 0.044715f;
  const float cubic = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kCoefficient, g), g));
  const float inner = __fmul_rn(__fmul_rn(kSqrt2OverPi, g), cubic);
  const float gelu = __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
  return __fmul_rn(gelu, u);
}

// ops::SwigluOaiMul's steps in its order, each rounded on its own.
__device__ __forceinline__ float SwigluOaiMulValue(float g, float u, float alpha, float limit) {
  const float x = fminf(g, limit);
  const float y = fminf(fmaxf(u, -limit), limit);
  const float glu = __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(alpha, -x))));
  return __fmul_rn(glu, __fadd_rn(y, 1.0f));
}

__global__ void GatedRowsKernel(const float* gate, const float* up, int64_t rows, int64_t width,
                                int64_t stride, GatedActivation activation, float alpha,
                                float limit, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t in = i / width * stride + i % width;
  switch (activation) {
    case GatedActivation::kSilu:
      out[i] = SiluMulValue(gate[in], up[in]);
      break;
    case GatedActivation::kGeluTanh:
      out[i] = GeluTanhMulValue(gate[in], up[in]);
      break;
    case GatedActivation::kSwigluOai:
      out[i] = SwigluOaiMulValue(gate[in], up[in], alpha, limit);
      break;
  }
}

// One thread per (layer, keys or values, byte of a row), plus one for the positions: the slot
// copies in order.
__global__ void CommitSlotsKernel(uint8_t* keys, uint8_t* values, int32_t* positions,
                                  int64_t layers, int64_t layer_stride, int64_t row_bytes,
                                  int64_t committed, const int32_t* pending_indices,
                                  int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == layers * 2 * row_bytes) {
    if (positions != nullptr) {
      for (int64_t j = 0; j < count; ++j) {
        positions[committed + j] = positions[committed + pending_indices[j]];
      }
    }
    return;
  }
  if (i > layers * 2 * row_bytes) return;
  const int64_t byte = i % row_bytes;
  const int64_t side = (i / row_bytes) % 2;
  const int64_t layer = i / (2 * row_bytes);
  uint8_t* base = (side == 0 ? keys : values) + layer * layer_stride + byte;
  for (int64_t j = 0; j < count; ++j) {
    base[(committed + j) * row_bytes] = base[(committed + pending_indices[j]) * row_bytes];
  }
}

}  // namespace

cudaError_t EmbeddingGather(const uint8_t* table, int32_t type, int64_t row_bytes, int64_t cols,
                            const int32_t* tokens, int64_t rows, float* out, cudaStream_t stream) {
  if (type != kEmbeddingF32 && type != kEmbeddingF16 && type != kEmbeddingQ8_0) {
    return cudaErrorInvalidValue;
  }
  if (rows * cols == 0) return cudaSuccess;
  EmbeddingKernel<<<Blocks(rows * cols, 256), 256, 0, stream>>>(table, type, row_bytes, cols,
                                                                tokens, rows, out);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const int32_t* source_rows, int64_t rows, int64_t n,
                    const float* weight, float eps, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(x, source_rows, n, weight,
                                                                          eps, out);
  return cudaGetLastError();
}

cudaError_t ApplyRope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dims,
                      const int32_t* positions, const float* cos_table, const float* sin_table,
                      bool halves, cudaStream_t stream) {
  const int64_t pairs = rotary_dims / 2;
  if (rotary_dims % 2 != 0 || rotary_dims > head_dim) return cudaErrorInvalidValue;
  if (rows * heads * pairs == 0) return cudaSuccess;
  RopeKernel<<<Blocks(rows * heads * pairs, 256), 256, 0, stream>>>(
      x, rows, heads, head_dim, pairs, positions, cos_table, sin_table, halves);
  return cudaGetLastError();
}

cudaError_t AddRowVector(float* x, const float* vector, int64_t rows, int64_t n,
                         cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  AddRowVectorKernel<<<Blocks(rows * n, 256), 256, 0, stream>>>(x, vector, rows, n);
  return cudaGetLastError();
}

cudaError_t ScaleInPlace(float* x, int64_t n, float scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, n, scale);
  return cudaGetLastError();
}

cudaError_t SoftCap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SoftCapKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, n, 1.0f / cap, cap);
  return cudaGetLastError();
}

cudaError_t StoreKvRows(const float* x, int64_t rows, int64_t kv_dim, KvStorage storage,
                        uint8_t* cache, const int64_t* first_slot, cudaStream_t stream) {
  if (rows * kv_dim == 0) return cudaSuccess;
  if (storage == KvStorage::kF16) {
    StoreHalfKernel<<<Blocks(rows * kv_dim, 256), 256, 0, stream>>>(x, rows * kv_dim, kv_dim, cache,
                                                                    first_slot);
  } else {
    if (kv_dim % 32 != 0) return cudaErrorInvalidValue;
    const int64_t blocks = rows * kv_dim / 32;
    StoreQ8Kernel<<<Blocks(blocks * 32, 256), 256, 0, stream>>>(x, blocks, kv_dim, cache,
                                                                first_slot);
  }
  return cudaGetLastError();
}

cudaError_t StorePositions(const int32_t* positions, int64_t rows, int32_t* slot_positions,
                           const int64_t* first_slot, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  StorePositionsKernel<<<Blocks(rows, 256), 256, 0, stream>>>(positions, rows, slot_positions,
                                                              first_slot);
  return cudaGetLastError();
}

cudaError_t VisibleSlots(const VisibleSlotsArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.window < 0 || args.slots == nullptr || args.counts == nullptr ||
      (args.window > 0 && (args.query_positions == nullptr || args.slot_positions == nullptr))) {
    return cudaErrorInvalidValue;
  }
  VisibleSlotsKernel<<<static_cast<unsigned>(args.rows), kSlotThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t Attention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.num_kv_heads < 1 || args.num_heads % args.num_kv_heads != 0 ||
      (args.storage == KvStorage::kQ8_0 && args.head_dim % 32 != 0)) {
    return cudaErrorInvalidValue;
  }
  const size_t shared = kAttentionThreads * sizeof(double) + args.head_dim * sizeof(float) +
                        args.mask_width * sizeof(int);
  const dim3 grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.rows));
  AttentionKernel<<<grid, kAttentionThreads, shared, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t GatedActivationRows(const float* gate, const float* up, int64_t rows, int64_t width,
                                int64_t stride, GatedActivation activation, float alpha,
                                float limit, float* out, cudaStream_t stream) {
  if (rows * width == 0) return cudaSuccess;
  if (stride < width) return cudaErrorInvalidValue;
  GatedRowsKernel<<<Blocks(rows * width, 256), 256, 0, stream>>>(gate, up, rows, width, stride,
                                                                 activation, alpha, limit, out);
  return cudaGetLastError();
}

cudaError_t CommitSlots(uint8_t* keys, uint8_t* values, int32_t* positions, int64_t layers,
                        int64_t layer_stride, int64_t row_bytes, int64_t committed,
                        const int32_t* pending_indices, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  CommitSlotsKernel<<<Blocks(layers * 2 * row_bytes + 1, 256), 256, 0, stream>>>(
      keys, values, positions, layers, layer_stride, row_bytes, committed, pending_indices, count);
  return cudaGetLastError();
}

}  // namespace bitsplit::cuda::kernels
