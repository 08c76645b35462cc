#pragma once
// What the fuzz targets share: touching every byte range a parser hands out, so that ASan sees a
// view that leaves its image even when nothing else would read it.
#include <cstddef>
#include <cstdint>

namespace bitsplit::fuzz {

inline volatile uint8_t touch_sink;  // the reads below must happen

// Reads the first and last byte of [data, data + size).
inline void Touch(const void* data, uint64_t size) {
  if (size == 0) return;
  const volatile uint8_t* bytes = static_cast<const uint8_t*>(data);
  touch_sink = bytes[0];
  touch_sink = bytes[size - 1];
}

}  // namespace bitsplit::fuzz
