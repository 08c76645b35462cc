#include "common/util/meminfo.h"

#include <fstream>
#include <string>

namespace bitsplit {

MemInfo ReadMemInfo() {
  MemInfo info;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") info.total_bytes = kib << 10;
    if (key == "MemAvailable:") info.available_bytes = kib << 10;
  }
  return info;
}

}  // namespace bitsplit
