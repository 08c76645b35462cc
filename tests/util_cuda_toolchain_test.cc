// Proves the CUDA toolchain end to end: the probe kernel compiles for 86;89;90 in every build
// with nvcc, and runs (adding one to each element) where a GPU exists.
#include <gtest/gtest.h>

#include <vector>

#ifdef BITSPLIT_HAVE_CUDA
#include "common/cuda/device_info.h"
#endif

TEST(CudaToolchain, KernelRunsWhereAGpuExists) {
#ifndef BITSPLIT_HAVE_CUDA
  GTEST_SKIP() << "built without BITSPLIT_CUDA (no nvcc found at configure time)";
#else
  if (bitsplit::cuda::CountDevices() == 0) {
    GTEST_SKIP() << "CUDA code compiled, but no CUDA device is visible on this machine";
  }
  std::vector<float> values = {1.0f, -2.5f, 0.0f, 41.0f};
  ASSERT_TRUE(bitsplit::cuda::AddOneOnDevice(values.data(), static_cast<int>(values.size())));
  EXPECT_EQ(values, (std::vector<float>{2.0f, -1.5f, 1.0f, 42.0f}));
#endif
}
