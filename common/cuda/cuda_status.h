#pragma once
// CUDA errors as absl::Status, with the failing call and its file:line, so a drafter error names
// where it happened. The service maps the status to gRPC in its one place.
//
//   BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
//
// Codes: out of memory -> RESOURCE_EXHAUSTED; no device / no driver / an unsupported device ->
// FAILED_PRECONDITION; anything else (a failed launch, an illegal address: the CUDA context is
// then unusable) -> INTERNAL.
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace bitsplit::cuda {

absl::Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line);

}  // namespace bitsplit::cuda

#define BITSPLIT_CUDA_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                      \
    const cudaError_t bitsplit_cuda_error_ = (expr);                                        \
    if (bitsplit_cuda_error_ != cudaSuccess) {                                              \
      return ::bitsplit::cuda::CudaStatus(bitsplit_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)
