// Linear-layer kernels: block Hadamard rotation, int8 activation quantization and the split
// matmul, each reproducing the CPU reference's arithmetic bit for bit (see kernels.h and
// common/quant/split_matmul.h for the sequence).
#include <cuda_fp16.h>

#include "common/cuda/kernels.h"

namespace bitsplit::cuda::kernels {
namespace {

constexpr int kBlock = 32;        // activation block and weight sub-block
constexpr int kGroupsPerRun = 8;  // one f32 lane per group of a run (split_matmul.cc)
constexpr int kLanesPerRow = 16;  // (k, parity): the CPU kernel's f32 lanes of both lane sets
constexpr int kRowsPerWarp = 32 / kLanesPerRow;
constexpr int kMatMulThreads = 256;
constexpr int kRowsPerBlock = kMatMulThreads / 32 * kRowsPerWarp;

using quant::SplitFormat;

// Weights and activations are read-only for a kernel's lifetime: load them through the
// read-only data cache.
__device__ __forceinline__ uint32_t Load32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
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

// Ternary: element j is trit j % 5 of byte j / 5 (quant::SubBlockTern). Its 7-byte sub-blocks
// are not word-aligned, so the (at most two) bytes of elements 4k..4k+3 are loaded one by one.
__device__ __forceinline__ uint32_t Tern4(const uint8_t* p, int k) {
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int j = 4 * k + i;
    const uint8_t byte = __ldg(p + j / quant::kTernTritsPerByte);
    out |= static_cast<uint32_t>(quant::TernTrit(byte, j % quant::kTernTritsPerByte)) << (8 * i);
  }
  return out;
}

// The codes of elements 4k .. 4k+3 of one sub-block as four bytes (element 4k in the low byte),
// ready for __dp4a: unsigned codes are < 64, so their bytes read the same signed.
template <SplitFormat kFormat>
__device__ __forceinline__ int Codes4(const uint8_t* sub, int k) {
  if constexpr (kFormat == SplitFormat::kB2Sym || kFormat == SplitFormat::kB2Asym) {
    return static_cast<int>(Plane2(sub, k));
  } else if constexpr (kFormat == SplitFormat::kB3Sym || kFormat == SplitFormat::kB3Asym ||
                       kFormat == SplitFormat::kR3) {
    return static_cast<int>(Plane2(sub, k) | (Plane1(sub + 8, k) << 2));
  } else if constexpr (kFormat == SplitFormat::kB4Sym || kFormat == SplitFormat::kB4Asym ||
                       kFormat == SplitFormat::kR4) {
    return static_cast<int>(Plane4(sub, k));
  } else if constexpr (kFormat == SplitFormat::kR5) {
    return static_cast<int>(Plane4(sub, k) | (Plane1(sub + 16, k) << 4));
  } else if constexpr (kFormat == SplitFormat::kR6) {
    return static_cast<int>(Plane4(sub, k) | (Plane2(sub + 16, k) << 4));
  } else if constexpr (kFormat == SplitFormat::kBTern) {
    return static_cast<int>(Tern4(sub, k));
  } else {  // SplitFormat::kR8, SplitFormat::kQ8_0: int8 codes in element order
    return static_cast<int>(Load32(sub + 4 * k));
  }
}

// Bytes from one sub-block (and from one group scale) to the next in a row of kFormat: the
// layouts of quant::GetSplitRowLayout. Known at compile time, so a run's loads are one base
// address plus constant offsets.
template <SplitFormat kFormat>
constexpr int kCodeStride = quant::SplitFormatTraitsOf(kFormat).sub_block_bytes;
constexpr int kScaleStride = 2;

// What one thread reads: lane k of one weight row against a tile of activation rows. Offsets
// inside a row and inside the activations fit in 32 bits (the launcher checks).
struct RowSlice {
  const uint8_t* codes;   // the row's first sub-block
  const uint8_t* scales;  // the row's first group scale
  int code_stride;
  int scale_stride;
  const int8_t* x_codes;  // activation row t0, element 4k
  const float* x_scales;  // activation row t0
  int x_cols;
  int x_block_stride;
};

// Blocks first_block, first_block + 2, ... (count of them: one parity) of the row, each with its
// group's scale, into acc[j] for the tile's activation rows j: split_matmul.h's step
// acc += float(dot) * (d * x_scale), one rounding each. Any group size (the group of a block is
// found at run time). Rows j >= tile read row tile - 1 and are never written.
template <SplitFormat kFormat, int kTile>
__device__ __forceinline__ void AccumulateBlocks(const RowSlice& s, int k, int tile,
                                                 int first_block, int count, int blocks_per_group,
                                                 float (&acc)[kTile]) {
  for (int i = 0; i < count; ++i) {
    const int b = first_block + 2 * i;
    const float d = LoadHalf(s.scales + (b / blocks_per_group) * s.scale_stride);
    const int codes = Codes4<kFormat>(s.codes + b * s.code_stride, k);
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const int row = j < tile ? j : tile - 1;
      const int xcodes =
          __ldg(reinterpret_cast<const int*>(s.x_codes + row * s.x_cols + b * kBlock));
      const float scale = __fmul_rn(d, __ldg(s.x_scales + row * s.x_block_stride + b));
      acc[j] = __fmaf_rn(__int2float_rn(__dp4a(codes, xcodes, 0)), scale, acc[j]);
    }
  }
}

// The blocks of one parity of a whole run of kGroupsPerRun groups of kBlocksPerGroup blocks (a
// compile-time group size; the run's first block is even): every weight load of the run is
// issued first, then for each activation row all its loads, then the multiply-adds in order, so
// that many loads are in flight per thread.
template <SplitFormat kFormat, int kTile, int kBlocksPerGroup>
__device__ __forceinline__ void AccumulateRun(const RowSlice& s, int k, int parity, int tile,
                                              int first_group, float (&acc)[kTile]) {
  constexpr int kBlocks = kGroupsPerRun * kBlocksPerGroup / 2;  // of this thread's parity
  const int first_block = first_group * kBlocksPerGroup + parity;
  // Block i of this thread is run block 2i + parity; its group's scale is at constant offsets
  // from `scales` (with one block per group the parity moves the base instead).
  const uint8_t* codes_base = s.codes + first_block * kCodeStride<kFormat>;
  const uint8_t* scales =
      s.scales + (first_group + (kBlocksPerGroup == 1 ? parity : 0)) * kScaleStride;
  int codes[kBlocks];
  float d[kBlocks];
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    codes[i] = Codes4<kFormat>(codes_base + 2 * i * kCodeStride<kFormat>, k);
    d[i] = LoadHalf(scales + (2 * i / kBlocksPerGroup) * kScaleStride);
  }
#pragma unroll
  for (int j = 0; j < kTile; ++j) {
    const int row = j < tile ? j : tile - 1;
    const int8_t* x_codes = s.x_codes + row * s.x_cols + first_block * kBlock;
    const float* x_scales = s.x_scales + row * s.x_block_stride + first_block;
    int xcodes[kBlocks];
    float xscales[kBlocks];
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      xcodes[i] = __ldg(reinterpret_cast<const int*>(x_codes + 2 * i * kBlock));
      xscales[i] = __ldg(x_scales + 2 * i);
    }
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      acc[j] = __fmaf_rn(__int2float_rn(__dp4a(codes[i], xcodes[i], 0)),
                         __fmul_rn(d[i], xscales[i]), acc[j]);
    }
  }
}

// One thread = lane k (0..7) of the even (parity 0) or odd (parity 1) blocks of one weight row,
// for up to kTile activation rows at a time: exactly the f32 lane k of one of the CPU kernel's
// two lane sets. Lane k of the even set also adds, in the min term, the k-th group of each run
// of eight groups. A row's sixteen lanes are consecutive threads of a warp, odd lanes after even
// ones: even + odd, then the eight sums by shuffles in HorizontalSum's order.
// kBlocksPerGroup > 0 compiles whole runs for that group size; 0 handles any group size at run
// time.
template <SplitFormat kFormat, int kTile, int kBlocksPerGroup>
__global__ void __launch_bounds__(kMatMulThreads)
    SplitMatMulKernel(GroupMatMul group, DeviceActivations x, int accumulate, int64_t total_rows) {
  const int lane = threadIdx.x & 31;
  const int k = lane & 7;
  const int parity = (lane >> 3) & 1;
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock +
                             (threadIdx.x >> 5) * kRowsPerWarp + lane / kLanesPerRow;
  // Threads past the end compute the last row again (the shuffles need every lane) but write
  // nothing.
  const bool writes = global_row < total_rows;
  int64_t r = writes ? global_row : total_rows - 1;
  int m = 0;
  while (m + 1 < group.count && r >= group.matrices[m].rows) r -= group.matrices[m++].rows;
  const DeviceMatrix& w = group.matrices[m];
  float* out = group.outputs[m];
  const uint8_t* row = w.data + r * w.row_stride;
  const int blocks_per_group = static_cast<int>(w.group / kBlock);
  const int groups = static_cast<int>(w.layout.groups);
  constexpr quant::SplitFormatTraits kTraits = quant::SplitFormatTraitsOf(kFormat);
  const bool min_term = !kTraits.signed_codes && parity == 0;
  const quant::SplitRowLayout& layout = w.layout;
  RowSlice s{row + layout.code_offset,
             row + layout.scale_offset,
             static_cast<int>(layout.code_stride),
             static_cast<int>(layout.scale_stride),
             nullptr,
             nullptr,
             static_cast<int>(x.cols),
             static_cast<int>(x.block_stride)};

  for (int64_t t0 = 0; t0 < x.rows; t0 += kTile) {
    const int tile = static_cast<int>(x.rows - t0 < kTile ? x.rows - t0 : kTile);
    s.x_codes = x.codes + t0 * x.cols + 4 * k;
    s.x_scales = x.scales + t0 * x.block_stride;
    float acc[kTile];  // split_matmul.h's lane k of this thread's lane set
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc[j] = 0.0f;
    for (int g_begin = 0; g_begin < groups; g_begin += kGroupsPerRun) {
      const int g_end = g_begin + kGroupsPerRun < groups ? g_begin + kGroupsPerRun : groups;
      bool whole_run = false;
      if constexpr (kBlocksPerGroup > 0) {
        if (g_end - g_begin == kGroupsPerRun) {
          AccumulateRun<kFormat, kTile, kBlocksPerGroup>(s, k, parity, tile, g_begin, acc);
          whole_run = true;
        }
      }
      if (!whole_run) {
        const int first_block = g_begin * blocks_per_group + parity;
        const int end_block = g_end * blocks_per_group;
        AccumulateBlocks<kFormat, kTile>(s, k, tile, first_block, (end_block - first_block + 1) / 2,
                                         blocks_per_group, acc);
      }
      if (min_term) {
        const int g = g_begin + k;
        float min = 0.0f;
        if (g < g_end) {
          min = kTraits.has_min
                    ? LoadHalf(row + layout.min_offset + g * layout.min_stride)
                    : __fmul_rn(LoadHalf(row + layout.scale_offset + g * layout.scale_stride),
                                -kTraits.code_offset);
        }
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
          const int tile_row = j < tile ? j : tile - 1;
          float group_sum = 0.0f;
          if (g < g_end) {
            const float* sums = x.sums + (t0 + tile_row) * x.block_stride + g * blocks_per_group;
            for (int b = 0; b < blocks_per_group; ++b) group_sum = __fadd_rn(group_sum, sums[b]);
          }
          acc[j] = __fmaf_rn(min, group_sum, acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      // (even + odd) per lane k, then ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
      const float odd = __shfl_down_sync(0xffffffffu, acc[j], 8, 16);
      float v = __fadd_rn(acc[j], odd);
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, 8));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 8));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 8));
      if (writes && k == 0 && parity == 0 && j < tile) {
        float& y = out[(t0 + j) * w.rows + r];
        y = accumulate ? __fadd_rn(y, v) : v;
      }
    }
  }
}

template <SplitFormat kFormat, int kBlocksPerGroup>
void LaunchSplitMatMulKernel(const GroupMatMul& group, const DeviceActivations& x, bool accumulate,
                             int64_t total_rows, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  // Tiles of 1, 4 or 8 activation rows: a draft forward's few rows run without idle tile rows.
  if (x.rows == 1) {
    SplitMatMulKernel<kFormat, 1, kBlocksPerGroup>
        <<<blocks, kMatMulThreads, 0, stream>>>(group, x, accumulate ? 1 : 0, total_rows);
  } else if (x.rows <= 4) {
    SplitMatMulKernel<kFormat, 4, kBlocksPerGroup>
        <<<blocks, kMatMulThreads, 0, stream>>>(group, x, accumulate ? 1 : 0, total_rows);
  } else {
    SplitMatMulKernel<kFormat, 8, kBlocksPerGroup>
        <<<blocks, kMatMulThreads, 0, stream>>>(group, x, accumulate ? 1 : 0, total_rows);
  }
}

template <SplitFormat kFormat>
cudaError_t LaunchSplitMatMul(const GroupMatMul& group, const DeviceActivations& x, bool accumulate,
                              cudaStream_t stream) {
  int64_t total_rows = 0;
  for (int i = 0; i < group.count; ++i) {
    const DeviceMatrix& w = group.matrices[i];
    // The kernel's in-row and activation offsets are 32-bit; a group's matrices share the format
    // and the group size (one kernel specialization for all of them).
    if (w.row_stride >= (int64_t{1} << 31) || w.format != kFormat ||
        w.layout.code_stride != static_cast<size_t>(kCodeStride<kFormat>) ||
        w.layout.scale_stride != static_cast<size_t>(kScaleStride) ||
        w.group != group.matrices[0].group || w.group < kBlock || w.group % kBlock != 0) {
      return cudaErrorInvalidValue;
    }
    total_rows += w.rows;
  }
  if (x.rows * x.cols >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  switch (group.matrices[0].group / kBlock) {
    case 1:
      LaunchSplitMatMulKernel<kFormat, 1>(group, x, accumulate, total_rows, stream);
      break;
    case 2:
      LaunchSplitMatMulKernel<kFormat, 2>(group, x, accumulate, total_rows, stream);
      break;
    case 4:
      LaunchSplitMatMulKernel<kFormat, 4>(group, x, accumulate, total_rows, stream);
      break;
    default:
      LaunchSplitMatMulKernel<kFormat, 0>(group, x, accumulate, total_rows, stream);
      break;
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
    case SplitFormat::kB2Sym:
      return LaunchSplitMatMul<SplitFormat::kB2Sym>(group, x, accumulate, stream);
    case SplitFormat::kB2Asym:
      return LaunchSplitMatMul<SplitFormat::kB2Asym>(group, x, accumulate, stream);
    case SplitFormat::kB3Sym:
      return LaunchSplitMatMul<SplitFormat::kB3Sym>(group, x, accumulate, stream);
    case SplitFormat::kB3Asym:
      return LaunchSplitMatMul<SplitFormat::kB3Asym>(group, x, accumulate, stream);
    case SplitFormat::kB4Sym:
      return LaunchSplitMatMul<SplitFormat::kB4Sym>(group, x, accumulate, stream);
    case SplitFormat::kB4Asym:
      return LaunchSplitMatMul<SplitFormat::kB4Asym>(group, x, accumulate, stream);
    case SplitFormat::kR3:
      return LaunchSplitMatMul<SplitFormat::kR3>(group, x, accumulate, stream);
    case SplitFormat::kR4:
      return LaunchSplitMatMul<SplitFormat::kR4>(group, x, accumulate, stream);
    case SplitFormat::kR5:
      return LaunchSplitMatMul<SplitFormat::kR5>(group, x, accumulate, stream);
    case SplitFormat::kR6:
      return LaunchSplitMatMul<SplitFormat::kR6>(group, x, accumulate, stream);
    case SplitFormat::kBTern:
      return LaunchSplitMatMul<SplitFormat::kBTern>(group, x, accumulate, stream);
    case SplitFormat::kR8:
      return LaunchSplitMatMul<SplitFormat::kR8>(group, x, accumulate, stream);
    case SplitFormat::kQ8_0:
      return LaunchSplitMatMul<SplitFormat::kQ8_0>(group, x, accumulate, stream);
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
