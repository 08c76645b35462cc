#pragma once
// Elapsed time for the nanosecond timings the services report.
#include <chrono>
#include <cstdint>

namespace bitsplit {

// Nanoseconds on the steady clock since `start`.
inline int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace bitsplit
