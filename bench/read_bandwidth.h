#pragma once
// The streaming-read bandwidth BW that every bench's floor divides by: each pool thread reduces
// its contiguous share of a 128 MiB window (4x L3) with AVX2 adds, optionally prefetching 2 KiB
// ahead like the kernels do; the best of `repetitions` windows over a `buffer_bytes` buffer.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/util/thread_pool.h"

namespace bitsplit::bench {

inline double MeasureReadBandwidth(ThreadPool& pool, bool software_prefetch, int repetitions,
                                   size_t buffer_bytes = size_t{512} << 20) {
  constexpr size_t kWindow = size_t{128} << 20;
  buffer_bytes = std::max(buffer_bytes, kWindow);
  auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(64, buffer_bytes));
  std::memset(buffer, 1, buffer_bytes);
  std::vector<long long> sink(static_cast<size_t>(pool.num_threads()));
  double best = 0;
  for (int rep = 0; rep < repetitions; ++rep) {
    const uint8_t* base = buffer + (static_cast<size_t>(rep) % (buffer_bytes / kWindow)) * kWindow;
    const auto start = std::chrono::steady_clock::now();
    pool.ParallelFor(static_cast<int64_t>(kWindow / 128), [&](int64_t begin, int64_t end,
                                                              int worker) {
      __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
      for (int64_t i = begin; i < end; ++i) {
        const uint8_t* line = base + i * 128;
        if (software_prefetch) {
          _mm_prefetch(reinterpret_cast<const char*>(line) + 2048, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(line) + 2048 + 64, _MM_HINT_T0);
        }
        const auto* p = reinterpret_cast<const __m256i*>(line);
        a = _mm256_add_epi64(a, _mm256_load_si256(p));
        b = _mm256_add_epi64(b, _mm256_load_si256(p + 1));
        c = _mm256_add_epi64(c, _mm256_load_si256(p + 2));
        d = _mm256_add_epi64(d, _mm256_load_si256(p + 3));
      }
      const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
      sink[static_cast<size_t>(worker)] = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 3);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(kWindow) / seconds);
  }
  benchmark::DoNotOptimize(sink.data());
  std::free(buffer);
  return best;
}

}  // namespace bitsplit::bench
