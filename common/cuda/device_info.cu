// Toolchain probe for the CUDA backend: proves in CI (nvcc, no GPU) that device code for the
// configured architectures compiles and links. The drafter's CUDA backend lands in its own issue.
#include <cuda_runtime.h>

#include "common/cuda/device_info.h"

namespace bitsplit::cuda {
namespace {
__global__ void AddOneKernel(float* values, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) values[i] += 1.0f;
}
}  // namespace

int CountDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

bool AddOneOnDevice(float* host_values, int n) {
  float* device_values = nullptr;
  if (cudaMalloc(&device_values, n * sizeof(float)) != cudaSuccess) return false;
  bool ok = cudaMemcpy(device_values, host_values, n * sizeof(float), cudaMemcpyHostToDevice) ==
            cudaSuccess;
  if (ok) {
    AddOneKernel<<<(n + 255) / 256, 256>>>(device_values, n);
    ok = cudaGetLastError() == cudaSuccess &&
         cudaMemcpy(host_values, device_values, n * sizeof(float), cudaMemcpyDeviceToHost) ==
             cudaSuccess;
  }
  cudaFree(device_values);
  return ok;
}
}  // namespace bitsplit::cuda
