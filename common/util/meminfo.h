#pragma once
// The machine's memory as /proc/meminfo states it.
#include <cstdint>

namespace bitsplit {

struct MemInfo {
  uint64_t total_bytes = 0;      // MemTotal (0 when unknown)
  uint64_t available_bytes = 0;  // MemAvailable (0 when unknown)
};

MemInfo ReadMemInfo();

}  // namespace bitsplit
