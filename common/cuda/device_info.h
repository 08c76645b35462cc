#pragma once

namespace bitsplit::cuda {
// Number of CUDA devices visible to this process; 0 when there is no driver or no GPU.
int CountDevices();
// Adds 1 to each value on the device and copies back; false on any CUDA error.
bool AddOneOnDevice(float* host_values, int n);
}  // namespace bitsplit::cuda
