// Linear-layer kernels: block Hadamard rotation, int8 activation quantization and the split
// matmul, each reproducing the CPU reference's arithmetic bit for bit (see kernels.h and
// common/quant/split_matmul.h for the sequence).
#include <cuda_fp16.h>

#include "common/cuda/kernels.h"

namespace bitsplit::cuda::kernels {
namespace {

constexpr int kBlock = 32;        // activation block and weight sub-block
constexpr int kGroupsPerRun = 8;  // one f32 lane per group of a run (split_matmul.cc)
constexpr int kRowsPerWarp = 4;   // weight rows per warp: 8 lanes each
constexpr int kMatMulThreads = 256;
constexpr int kRowsPerBlock = kMatMulThreads / 32 * kRowsPerWarp;

// quant::SplitFormat ids.
enum Format : int32_t {
  kB2Sym = 0,
  kB2Asym = 1,
  kB3Sym = 2,
  kB3Asym = 3,
  kB4Sym = 4,
  kB4Asym = 5,
  kR6 = 6,
  kR8 = 7,
  kQ8_0 = 8,
};

__device__ __forceinline__ uint32_t Load32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Elements 4k .. 4k+3 of a Plane2 sub-block: bytes 4(k&1)..+3 hold elements j with j % 8 equal
// to their index, at bit pair j / 8 = k / 2.
__device__ __forceinline__ uint32_t Plane2(const uint8_t* p, int k) {
  return (Load32(p + 4 * (k & 1)) >> (2 * (k >> 1))) & 0x03030303u;
}
// Plane1: element j at bit j / 4 of byte j % 4: elements 4k..4k+3 are bit k of bytes 0..3.
__device__ __forceinline__ uint32_t Plane1(const uint8_t* p, int k) {
  return (Load32(p) >> k) & 0x01010101u;
}
// Plane4: element j < 16 in the low nibble of byte j, else the high nibble of byte j - 16.
__device__ __forceinline__ uint32_t Plane4(const uint8_t* p, int k) {
  const uint32_t word = Load32(p + 4 * (k & 3));
  return k < 4 ? (word & 0x0F0F0F0Fu) : ((word >> 4) & 0x0F0F0F0Fu);
}

// The codes of elements 4k .. 4k+3 of one sub-block as four bytes (element 4k in the low byte),
// ready for __dp4a: unsigned codes are < 64, so their bytes read the same signed.
template <int kFormat>
__device__ __forceinline__ int Codes4(const uint8_t* sub, int k) {
  if constexpr (kFormat == kB2Sym || kFormat == kB2Asym) {
    return static_cast<int>(Plane2(sub, k));
  } else if constexpr (kFormat == kB3Sym || kFormat == kB3Asym) {
    return static_cast<int>(Plane2(sub, k) | (Plane1(sub + 8, k) << 2));
  } else if constexpr (kFormat == kB4Sym || kFormat == kB4Asym) {
    return static_cast<int>(Plane4(sub, k));
  } else if constexpr (kFormat == kR6) {
    return static_cast<int>(Plane4(sub, k) | (Plane2(sub + 16, k) << 4));
  } else if constexpr (kFormat == kR8) {
    return static_cast<int>(Load32(sub + 4 * k));
  } else {  // kQ8_0: the codes start 2 bytes into a 34-byte block, so only 2-byte aligned
    const unsigned short* p = reinterpret_cast<const unsigned short*>(sub + 4 * k);
    return static_cast<int>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16));
  }
}

// One thread = lane k (0..7) of one weight row for up to kTile activation rows at a time. Lane k
// owns elements 4k..4k+3 of every 32-block and, in the min term, the k-th group of each run of
// eight groups: exactly the f32 lane k of both lane sets (even and odd blocks) of the CPU kernel.
// The eight lanes of a row are consecutive threads of a warp and are summed by shuffles in
// HorizontalSum's order.
template <int kFormat, int kTile>
__global__ void __launch_bounds__(kMatMulThreads)
    SplitMatMulKernel(GroupMatMul group, DeviceActivations x, int accumulate, int64_t total_rows) {
  const int lane = threadIdx.x & 31;
  const int k = lane & 7;
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock +
                             (threadIdx.x >> 5) * kRowsPerWarp + (lane >> 3);
  // Threads past the end compute the last row again (the shuffles need every lane) but write
  // nothing.
  const bool writes = global_row < total_rows;
  int64_t r = writes ? global_row : total_rows - 1;
  int m = 0;
  while (m + 1 < group.count && r >= group.matrices[m].rows) r -= group.matrices[m++].rows;
  const DeviceMatrix& w = group.matrices[m];
  float* out = group.outputs[m];
  const uint8_t* row = w.data + r * w.row_stride;
  const int64_t blocks_per_group = w.group / kBlock;
  const bool min_term = !w.signed_codes;

  for (int64_t t0 = 0; t0 < x.rows; t0 += kTile) {
    const int tile = static_cast<int>(x.rows - t0 < kTile ? x.rows - t0 : kTile);
    // Lane k of the even blocks and of the odd blocks (split_matmul.h's sequence).
    float even[kTile], odd[kTile];
#pragma unroll
    for (int j = 0; j < kTile; ++j) even[j] = odd[j] = 0.0f;
    for (int64_t g_begin = 0; g_begin < w.groups; g_begin += kGroupsPerRun) {
      const int64_t g_end = g_begin + kGroupsPerRun < w.groups ? g_begin + kGroupsPerRun : w.groups;
      for (int64_t b = g_begin * blocks_per_group; b < g_end * blocks_per_group; ++b) {
        const float d = LoadHalf(row + w.scale_offset + (b / blocks_per_group) * w.scale_stride);
        const int codes = Codes4<kFormat>(row + w.code_offset + b * w.code_stride, k);
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
          if (j < tile) {
            const int64_t t = t0 + j;
            const int xcodes =
                *reinterpret_cast<const int*>(x.codes + t * x.cols + b * kBlock + 4 * k);
            const int isum = __dp4a(codes, xcodes, 0);
            const float scale = __fmul_rn(d, x.scales[t * x.block_stride + b]);
            float& acc = (b & 1) == 0 ? even[j] : odd[j];
            acc = __fmaf_rn(__int2float_rn(isum), scale, acc);
          }
        }
      }
      if (min_term) {
        const int64_t g = g_begin + k;
        float min = 0.0f;
        if (g < g_end) {
          min = w.has_min ? LoadHalf(row + w.min_offset + g * w.min_stride)
                          : __fmul_rn(LoadHalf(row + w.scale_offset + g * w.scale_stride),
                                      -w.code_offset_value);
        }
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
          if (j < tile) {
            float group_sum = 0.0f;
            if (g < g_end) {
              const float* sums = x.sums + (t0 + j) * x.block_stride + g * blocks_per_group;
              for (int64_t s = 0; s < blocks_per_group; ++s)
                group_sum = __fadd_rn(group_sum, sums[s]);
            }
            even[j] = __fmaf_rn(min, group_sum, even[j]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
      float v = __fadd_rn(even[j], odd[j]);
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, 8));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 8));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 8));
      if (writes && k == 0 && j < tile) {
        float& y = out[(t0 + j) * w.rows + r];
        y = accumulate ? __fadd_rn(y, v) : v;
      }
    }
  }
}

template <int kFormat>
cudaError_t LaunchSplitMatMul(const GroupMatMul& group, const DeviceActivations& x, bool accumulate,
                              cudaStream_t stream) {
  int64_t total_rows = 0;
  for (int i = 0; i < group.count; ++i) total_rows += group.matrices[i].rows;
  const unsigned blocks = static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (x.rows == 1) {
    SplitMatMulKernel<kFormat, 1>
        <<<blocks, kMatMulThreads, 0, stream>>>(group, x, accumulate ? 1 : 0, total_rows);
  } else {
    SplitMatMulKernel<kFormat, 8>
        <<<blocks, kMatMulThreads, 0, stream>>>(group, x, accumulate ? 1 : 0, total_rows);
  }
  return cudaGetLastError();
}

// One CUDA block per (row, Hadamard block); thread p does butterfly pair p of every stage.
__global__ void HadamardKernel(float* x, int64_t cols, int block, const uint32_t* sign_masks,
                               float scale) {
  extern __shared__ float values[];
  const int64_t row = blockIdx.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * block;
  float* v = x + row * cols + first;
  for (int i = threadIdx.x; i < block; i += blockDim.x) {
    values[i] = __uint_as_float(__float_as_uint(v[i]) ^ sign_masks[first + i]);
  }
  __syncthreads();
  for (int h = 1; h < block; h *= 2) {
    for (int p = threadIdx.x; p < block / 2; p += blockDim.x) {
      const int i = (p / h) * 2 * h + (p % h);
      const float a = values[i], b = values[i + h];
      values[i] = __fadd_rn(a, b);
      values[i + h] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < block; i += blockDim.x) v[i] = __fmul_rn(values[i], scale);
}

// One warp per (row, 32-block of the block stride); lane j holds element j.
__global__ void QuantizeKernel(const float* x, int64_t rows, int64_t cols, int8_t* codes,
                               float* scales, float* sums, int64_t block_stride) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (warp >= rows * block_stride) return;
  const int64_t t = warp / block_stride;
  const int64_t b = warp % block_stride;
  if (b >= cols / kBlock) {  // padding of the row's scales and sums
    if (lane == 0) scales[t * block_stride + b] = sums[t * block_stride + b] = 0.0f;
    return;
  }
  const float value = x[t * cols + b * kBlock + lane];
  float amax = fabsf(value);
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  // split_matmul.cc's BlockScale.
  float scale = __fdiv_rn(amax, 127.0f);
  float inverse = scale != 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
  if (isinf(inverse)) scale = inverse = 0.0f;
  const float rounded = fminf(fmaxf(rintf(__fmul_rn(value, inverse)), -127.0f), 127.0f);
  const int code = static_cast<int>(rounded);
  codes[t * cols + b * kBlock + lane] = static_cast<int8_t>(code);
  int sum = code;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    scales[t * block_stride + b] = scale;
    sums[t * block_stride + b] = __fmul_rn(scale, __int2float_rn(sum));
  }
}

__global__ void AddKernel(float* y, const float* delta, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(y[i], delta[i]);
}

}  // namespace

cudaError_t HadamardRotate(float* x, int64_t rows, int64_t cols, int block,
                           const uint32_t* sign_masks, float scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(cols / block), static_cast<unsigned>(rows));
  const int threads = block / 2 < 256 ? block / 2 : 256;
  HadamardKernel<<<grid, threads, block * sizeof(float), stream>>>(x, cols, block, sign_masks,
                                                                   scale);
  return cudaGetLastError();
}

cudaError_t QuantizeActivations(const float* x, int64_t rows, int64_t cols, int8_t* codes,
                                float* scales, float* sums, int64_t block_stride,
                                cudaStream_t stream) {
  const int64_t warps = rows * block_stride;
  if (warps == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + threads - 1) / threads);
  QuantizeKernel<<<blocks, threads, 0, stream>>>(x, rows, cols, codes, scales, sums, block_stride);
  return cudaGetLastError();
}

cudaError_t SplitMatMul(const GroupMatMul& group, const DeviceActivations& x, bool accumulate,
                        cudaStream_t stream) {
  if (group.count < 1 || group.count > kMaxGroupMatrices || x.rows < 1) {
    return cudaErrorInvalidValue;
  }
  switch (group.matrices[0].format) {
    case kB2Sym:
      return LaunchSplitMatMul<kB2Sym>(group, x, accumulate, stream);
    case kB2Asym:
      return LaunchSplitMatMul<kB2Asym>(group, x, accumulate, stream);
    case kB3Sym:
      return LaunchSplitMatMul<kB3Sym>(group, x, accumulate, stream);
    case kB3Asym:
      return LaunchSplitMatMul<kB3Asym>(group, x, accumulate, stream);
    case kB4Sym:
      return LaunchSplitMatMul<kB4Sym>(group, x, accumulate, stream);
    case kB4Asym:
      return LaunchSplitMatMul<kB4Asym>(group, x, accumulate, stream);
    case kR6:
      return LaunchSplitMatMul<kR6>(group, x, accumulate, stream);
    case kR8:
      return LaunchSplitMatMul<kR8>(group, x, accumulate, stream);
    case kQ8_0:
      return LaunchSplitMatMul<kQ8_0>(group, x, accumulate, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t AddInPlace(float* y, const float* delta, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(y, delta, n);
  return cudaGetLastError();
}

}  // namespace bitsplit::cuda::kernels
