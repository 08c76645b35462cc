// A mixture-of-experts layer's kernels around the expert matmuls: the router's logits, the
// gather of each routed pair's input row, gemma4's router input scaling and the weighted sum of
// each row's experts (see kernels.h for which are bit-exact with the CPU forward).
#include <cstddef>

#include "common/cuda/kernel_common.h"
#include "common/cuda/kernels.h"

namespace bitsplit::cuda::kernels {
namespace {

struct F32Loader {
  const float* values;
  __device__ float operator()(int64_t k) const { return values[k]; }
};

// One thread per (row, expert): the dot product in simd::Dot's order.
__global__ void RouterLogitsKernel(const float* x, int64_t rows, const float* router,
                                   int64_t experts, int64_t cols, float* logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * experts) return;
  const int64_t row = i / experts, expert = i % experts;
  logits[i] = SimdOrderDot(x + row * cols, F32Loader{router + expert * cols}, cols);
}

__global__ void GatherRowsKernel(const float* x, const int32_t* source_rows, int64_t rows,
                                 int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  out[i] = x[static_cast<int64_t>(source_rows[i / n]) * n + i % n];
}

__global__ void ScaleRowsByVectorKernel(float* x, int64_t rows, int64_t n, float scale,
                                        const float* vector) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  x[i] = __fmul_rn(__fmul_rn(x[i], scale), vector[i % n]);
}

// One thread per (row, element): the row's k choices in the order chosen.
__global__ void WeightedExpertSumKernel(const float* expert_out, const int32_t* slot_of,
                                        const int32_t* expert_of, const float* weights,
                                        const float* expert_scales, int64_t rows, int64_t k,
                                        int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t row = i / n, j = i % n;
  float sum = 0.0f;
  for (int64_t c = 0; c < k; ++c) {
    const int64_t pair = row * k + c;
    const float scale = expert_scales != nullptr ? expert_scales[expert_of[pair]] : 1.0f;
    const float value = __fmul_rn(
        __fmul_rn(expert_out[static_cast<int64_t>(slot_of[pair]) * n + j], scale), weights[pair]);
    sum = c == 0 ? value : __fadd_rn(sum, value);
  }
  out[i] = sum;
}

}  // namespace

cudaError_t RouterLogits(const float* x, int64_t rows, const float* router, int64_t experts,
                         int64_t cols, float* logits, cudaStream_t stream) {
  if (rows * experts == 0) return cudaSuccess;
  RouterLogitsKernel<<<Blocks(rows * experts, 128), 128, 0, stream>>>(x, rows, router, experts,
                                                                      cols, logits);
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* x, const int32_t* source_rows, int64_t rows, int64_t n,
                       float* out, cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  GatherRowsKernel<<<Blocks(rows * n, 256), 256, 0, stream>>>(x, source_rows, rows, n, out);
  return cudaGetLastError();
}

cudaError_t ScaleRowsByVector(float* x, int64_t rows, int64_t n, float scale, const float* vector,
                              cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  ScaleRowsByVectorKernel<<<Blocks(rows * n, 256), 256, 0, stream>>>(x, rows, n, scale, vector);
  return cudaGetLastError();
}

cudaError_t WeightedExpertSum(const WeightedExpertSumArgs& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  if (a.k < 1) return cudaErrorInvalidValue;
  WeightedExpertSumKernel<<<Blocks(a.rows * a.n, 256), 256, 0, stream>>>(
      a.expert_out, a.slot_of, a.expert_of, a.weights, a.expert_scales, a.rows, a.k, a.n, a.out);
  return cudaGetLastError();
}

}  // namespace bitsplit::cuda::kernels
