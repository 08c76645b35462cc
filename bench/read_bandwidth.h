#pragma once
// The streaming-read bandwidth BW that every bench's floor divides by: the pool's threads reduce
// a 128 MiB window (4x L3) with AVX2 adds, in each of the ReadPattern ways; BW is the fastest
// read of any pattern, over `repetitions` windows of a buffer of `buffer_bytes` per pattern.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/util/thread_pool.h"

namespace bitsplit::bench {

// How a probe reads its window. The 2-core VM's memory (docs/performance.md, split kernels) moves
// between a slow phase (~35 GB/s whatever the pattern) and a fast one, where one stream per
// thread reads 37-64 GB/s depending on the window, 55-64 with software prefetch 2 KiB ahead,
// and four streams per thread without software prefetch 52-71 (mean 66): a ceiling has to
// take the best of them.
enum class ReadPattern {
  kOneStream,          // each thread its contiguous share, front to back
  kOneStreamPrefetch,  // the same, prefetching 2 KiB ahead like the kernels
  kFourStreams,        // each thread's share in 4 parts read side by side, no software prefetch
};
inline constexpr ReadPattern kReadPatterns[] = {
    ReadPattern::kOneStream, ReadPattern::kOneStreamPrefetch, ReadPattern::kFourStreams};
inline constexpr size_t kReadPatternCount = std::size(kReadPatterns);

// Keeps its buffer (filled once), so that a bench can probe often: kernel_bench probes between
// the calls of every cell, where allocating and touching the buffer each time would cost more
// than the reads.
class ReadBandwidthProbe {
 public:
  static constexpr size_t kWindow = size_t{128} << 20;

  explicit ReadBandwidthProbe(size_t buffer_bytes = size_t{512} << 20)
      : windows_(std::max<size_t>(buffer_bytes, kWindow) / kWindow),
        buffer_(static_cast<uint8_t*>(std::aligned_alloc(64, windows_ * kWindow))) {
    std::memset(buffer_, 1, windows_ * kWindow);
  }
  ~ReadBandwidthProbe() { std::free(buffer_); }
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // Bytes per second: the fastest of `repetitions` reads, each of the next window in turn.
  double Measure(ThreadPool& pool, ReadPattern pattern, int repetitions) {
    const int streams = pattern == ReadPattern::kFourStreams ? 4 : 1;
    const bool software_prefetch = pattern == ReadPattern::kOneStreamPrefetch;
    const int threads = pool.num_threads();
    // Per thread, per stream: whole 128-byte lines.
    const size_t part = kWindow / static_cast<size_t>(threads * streams) / 128 * 128;
    std::vector<long long> sink(static_cast<size_t>(threads));
    double best = 0;
    for (int rep = 0; rep < repetitions; ++rep) {
      const uint8_t* base = buffer_ + next_window_ * kWindow;
      next_window_ = (next_window_ + 1) % windows_;
      const auto start = std::chrono::steady_clock::now();
      pool.RunOnEveryWorker([&](int worker) {
        const uint8_t* share = base + static_cast<size_t>(worker * streams) * part;
        __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
        for (size_t offset = 0; offset < part; offset += 128) {
          for (int stream = 0; stream < streams; ++stream) {
            const uint8_t* line = share + static_cast<size_t>(stream) * part + offset;
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
        }
        const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
        sink[static_cast<size_t>(worker)] = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 3);
      });
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double bytes = static_cast<double>(part) * threads * streams;
      best = std::max(best, bytes / seconds);
    }
    benchmark::DoNotOptimize(sink.data());
    return best;
  }

  // BW: the fastest of `repetitions` reads of each pattern; each pattern's own in `by_pattern`
  // (indexed as kReadPatterns) where given.
  double MeasureBest(ThreadPool& pool, int repetitions,
                     std::array<double, kReadPatternCount>* by_pattern = nullptr) {
    double best = 0;
    for (size_t i = 0; i < kReadPatternCount; ++i) {
      const double rate = Measure(pool, kReadPatterns[i], repetitions);
      if (by_pattern != nullptr) (*by_pattern)[i] = rate;
      best = std::max(best, rate);
    }
    return best;
  }

 private:
  size_t windows_;
  uint8_t* buffer_;
  size_t next_window_ = 0;
};

// BW once, with a buffer of its own.
inline double MeasureReadBandwidth(ThreadPool& pool, int repetitions,
                                   size_t buffer_bytes = size_t{512} << 20) {
  ReadBandwidthProbe probe(buffer_bytes);
  return probe.MeasureBest(pool, repetitions);
}

}  // namespace bitsplit::bench
