#include "common/cuda/cuda_status.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace bitsplit::cuda {
namespace {

// The path from the repository root ("common/cuda/x.cc"), not the build machine's.
const char* RepoPath(const char* file) {
  const char* common = std::strstr(file, "common/");
  return common != nullptr ? common : file;
}

absl::StatusCode CodeOf(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line) {
  return absl::Status(CodeOf(error), absl::StrCat("CUDA error ", cudaGetErrorName(error), " (",
                                                  cudaGetErrorString(error), ") in ", expression,
                                                  " at ", RepoPath(file), ":", line));
}

}  // namespace bitsplit::cuda
