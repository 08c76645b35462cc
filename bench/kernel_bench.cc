// Split-format matmul kernels (common/quant/split_matmul.h) against their two ceilings.
//
// For each format, time(T) of y[T x 4096] = x[T x 4096] · Wᵀ for T = 1..64 on synthetic 4096 x
// 4096 matrices, cycling through enough of them that the weights touched between two uses of
// one matrix are >= 4x the L3 cache (so every call streams its weights from DRAM). Beside it,
// measured in the same run with the same threads:
//   BW    streaming-read bandwidth: an AVX2 read-reduce over 128 MiB windows (4x L3);
//   P     the kernel's own multiply-add rate at T = 64;
//   peak  what the SIMD units can do for the kernel's instruction mix: per 32 multiply-adds
//         AVX2: one vpmaddubsw + vpmaddwd + vcvtdq2ps + vfmadd231ps; AVX-VNNI: one vpdpbusd +
//         vcvtdq2ps + vfmadd231ps on 256-bit vectors; AVX-512: the same on 512-bit vectors (64
//         multiply-adds each); run in 8 independent chains from registers (no loads), on every
//         thread. (Zen 5 and most AVX2 cores issue two of vpmaddubsw/vpmaddwd/vpdpbusd/vfmadd
//         per cycle, vcvtdq2ps on other pipes: 21.3 multiply-adds per cycle per core for AVX2, 32
//         for AVX-VNNI, 64 for AVX-512 where 512-bit pipes are full width.)
// Counters: GB/s of weights, fraction of BW, floor(T) = max(weight bytes / BW, T * MACs / P)
// and time / floor. A summary table is printed at the end. BW is the fastest read of a 128 MiB
// window by any of bench/read_bandwidth.h's patterns (one stream per thread, with or without
// software prefetch, or four streams per thread). Each cell probes it between its calls, every
// 80 ms of kernel time, and its floor uses the probes on either side of its fastest call: this
// VM's memory moves between a slow phase (~35 GB/s) and a fast one (60-70 GB/s) within minutes,
// and a memory-bound cell is compared with what memory delivered while it ran (one probe per
// format would hold cells that ran in one phase to the other's speed). The header gives
// the maximum over the run; the summary gives each row's range of cell bandwidths (marking the
// rows where it exceeds 1.25x), each cell's, and E/c: the per-row work of a call (E) in tokens
// (c), from the line through the T = 8 and T = 64 times, which is what keeps compute-bound
// cells at small T above floor(T). Every time is the fastest call and P and the mix peak are
// maxima over the run: the machine may be shared, and these are the least disturbed
// measurements.
//
//   build-*/bench/kernel_bench [--benchmark_filter=r6] [--threads=N] [--isa=avx2|avx-vnni|avx512]
//                              [--tiling=large-l1|small-l1]
// (default: the best kernels this CPU supports and the tiling for its L1, as the engine uses).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/read_bandwidth.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/util/fp16.h"
#include "common/util/thread_pool.h"

namespace bitsplit::quant {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 4096;
constexpr int kTokenCounts[] = {1, 2, 4, 8, 16, 32, 64};

int g_threads = 0;  // 0: all hardware threads

ThreadPool& Pool() {
  static ThreadPool pool(g_threads);
  return pool;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// L3 size as the kernel sees it (sysfs, like lscpu; sysconf may report the host's total).
size_t L3Bytes() {
  std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  size_t kib = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%zuK", &kib) != 1) kib = 0;
    std::fclose(f);
  }
  return kib > 0 ? kib << 10 : size_t{32} << 20;
}

struct Case {
  SplitFormat format;
  int group;
  std::string name() const {
    return std::string(GetSplitFormatInfo(format).name) + "/g" + std::to_string(group);
  }
};

const Case kCases[] = {
    {SplitFormat::kB2Sym, 64},  {SplitFormat::kB2Asym, 64}, {SplitFormat::kB3Sym, 64},
    {SplitFormat::kB3Asym, 64}, {SplitFormat::kB4Sym, 64},  {SplitFormat::kB4Asym, 64},
    {SplitFormat::kR3, 32},     {SplitFormat::kR4, 32},     {SplitFormat::kR5, 32},
    {SplitFormat::kR6, 32},     {SplitFormat::kR6, 128},    {SplitFormat::kR8, 32},
    {SplitFormat::kR8, 128},    {SplitFormat::kQ8_0, 32},   {SplitFormat::kBTern, 64},
};

uint64_t NextRandom(uint64_t* state) {  // xorshift64*: fast filler for hundreds of MB
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * 0x2545F4914F6CDD1DULL;
}

// The weights of one case: `count` matrices, back to back; random codes, and every fp16
// scale/min set to a random moderate value (speed does not depend on the values).
struct Weights {
  Case c;
  size_t matrix_bytes = 0;
  std::unique_ptr<uint8_t[]> bytes;
  std::vector<MatrixView> views;
};

Weights& WeightsFor(const Case& c) {
  static std::unique_ptr<Weights> cached;
  if (cached && cached->c.format == c.format && cached->c.group == c.group) return *cached;
  cached.reset();  // free the previous case first
  auto w = std::make_unique<Weights>();
  w->c = c;
  const size_t row_bytes = SplitRowBytes(c.format, c.group, kCols);
  w->matrix_bytes = row_bytes * kRows;
  const size_t count = std::max<size_t>(2, (4 * L3Bytes() + w->matrix_bytes - 1) / w->matrix_bytes);
  const size_t total = count * w->matrix_bytes;
  w->bytes.reset(new uint8_t[total]);
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i + 8 <= total; i += 8) {
    const uint64_t r = NextRandom(&state);
    std::memcpy(&w->bytes[i], &r, 8);
  }
  // Overwrite every fp16 scale (and min) with a moderate positive value.
  const SplitRowLayout layout = GetSplitRowLayout(c.format, c.group, kCols);
  const bool has_min = GetSplitFormatInfo(c.format).has_min;
  for (size_t row = 0; row < count * kRows; ++row) {
    uint8_t* base = &w->bytes[row * row_bytes];
    for (int64_t g = 0; g < layout.groups; ++g) {
      for (int k = 0; k < (has_min ? 2 : 1); ++k) {
        const float v = 0.01f * static_cast<float>(NextRandom(&state) % 1000) / 1000.0f + 1e-4f;
        const uint16_t half = Fp32ToFp16(v);
        const size_t offset = k == 0 ? layout.scale_offset + g * layout.scale_stride
                                     : layout.min_offset + g * layout.min_stride;
        std::memcpy(base + offset, &half, 2);
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    w->views.push_back(*MakeMatrixView(c.format, c.group, kRows, kCols,
                                       w->bytes.get() + i * w->matrix_bytes, w->matrix_bytes));
  }
  cached = std::move(w);
  return *cached;
}

const QuantizedActivations& ActivationsFor(int64_t tokens) {
  static std::map<int64_t, QuantizedActivations> cache;
  auto it = cache.find(tokens);
  if (it != cache.end()) return it->second;
  std::vector<float> x(tokens * kCols);
  uint64_t state = 12345 + tokens;
  for (float& v : x) v = static_cast<float>(NextRandom(&state) % 20001) / 10000.0f - 1.0f;
  QuantizeActivations(x.data(), tokens, kCols, &cache[tokens]);
  return cache[tokens];
}

// ---- Ceilings --------------------------------------------------------------------------------
// Measured again before every case and kept at their maximum, so that a ceiling measured while
// another process happened to load the machine does not flatter the kernels.

// bytes/s per bench::ReadPattern: one stream per thread, the same with software prefetch (like
// the kernels), four streams per thread
std::array<double, bench::kReadPatternCount> g_bandwidth_by_pattern{};
double g_peak_mix = 0;                        // multiply-adds/s
std::map<std::string, double> g_kernel_rate;  // P per case, multiply-adds/s

double Bandwidth() {
  return *std::max_element(g_bandwidth_by_pattern.begin(), g_bandwidth_by_pattern.end());
}

bench::ReadBandwidthProbe& BandwidthProbe() {
  static bench::ReadBandwidthProbe probe;
  return probe;
}

// BW now: the fastest of `repetitions` reads of each read pattern (raising the run maxima).
double ProbeBandwidth(int repetitions) {
  std::array<double, bench::kReadPatternCount> by_pattern;
  const double best = BandwidthProbe().MeasureBest(Pool(), repetitions, &by_pattern);
  for (size_t i = 0; i < by_pattern.size(); ++i) {
    g_bandwidth_by_pattern[i] = std::max(g_bandwidth_by_pattern[i], by_pattern[i]);
  }
  return best;
}

// The kernel's inner instruction mix from registers, 8 independent chains each doing 32
// multiply-adds: AVX2 vpmaddubsw -> vpmaddwd -> vcvtdq2ps -> vfmadd231ps; AVX-VNNI a zeroed
// accumulator -> vpdpbusd -> vcvtdq2ps -> vfmadd231ps (the 512-bit version is further down).
// One chain: the integer dot product `dot` into ymm8, then vcvtdq2ps and vfmadd231ps into acc.
#define BITSPLIT_MIX_CHAIN(dot, acc) \
  dot "vcvtdq2ps %%ymm8, %%ymm8\n\t" \
      "vfmadd231ps %%ymm12, %%ymm8, " acc "\n\t"
#define BITSPLIT_AVX2_DOT                   \
  "vpmaddubsw %%ymm14, %%ymm15, %%ymm8\n\t" \
  "vpmaddwd %%ymm13, %%ymm8, %%ymm8\n\t"
// The VEX (AVX-VNNI) encoding.
#define BITSPLIT_VNNI_DOT "vmovdqa %%ymm13, %%ymm8\n\t%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm8\n\t"
#define BITSPLIT_MIX_LOOP(dot) \
  asm volatile("vpxor %%ymm12, %%ymm12, %%ymm12\n\t"                                          \
               "vpxor %%ymm13, %%ymm13, %%ymm13\n\t"                                          \
               "vpxor %%ymm14, %%ymm14, %%ymm14\n\t"                                          \
               "vpxor %%ymm15, %%ymm15, %%ymm15\n\t"                                          \
               "1:\n\t" BITSPLIT_MIX_CHAIN(dot, "%%ymm0") BITSPLIT_MIX_CHAIN(dot, "%%ymm1")    \
                   BITSPLIT_MIX_CHAIN(dot, "%%ymm2") BITSPLIT_MIX_CHAIN(dot, "%%ymm3")          \
                       BITSPLIT_MIX_CHAIN(dot, "%%ymm4") BITSPLIT_MIX_CHAIN(dot, "%%ymm5")      \
                           BITSPLIT_MIX_CHAIN(dot, "%%ymm6") BITSPLIT_MIX_CHAIN(dot, "%%ymm7")  \
               "dec %0\n\t"                                                                   \
               "jnz 1b\n\t"                                                                   \
               : "+r"(n)                                                                      \
               :                                                                              \
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",        \
                 "xmm12", "xmm13", "xmm14", "xmm15", "cc")

bool UsesVnni() { return ActiveMatMulIsa() != MatMulIsa::kAvx2; }

// Multiply-adds per chain of the mix loop: one 256-bit integer dot product, or one 512-bit one.
double MixMacsPerChain() { return ActiveMatMulIsa() == MatMulIsa::kAvx512 ? 64.0 : 32.0; }

// Multiply-adds per cycle per core the mix allows on cores with two multiply/FMA pipes as wide as
// the vectors (Zen 5, most AVX2 cores; only for the clock shown beside the measured peak): AVX2
// issues 3 of its 4 ops there (32 MACs per 1.5 cycles), AVX-VNNI 2 (32 MACs per cycle), AVX-512
// 2 on 512-bit vectors (64 per cycle; half that where 512-bit ops take two passes, as on Zen 4).
double MixMacsPerCycle() {
  return ActiveMatMulIsa() == MatMulIsa::kAvx512 ? 64.0 : UsesVnni() ? 32.0 : 32.0 / 1.5;
}

// The VEX form where the CPU has AVX-VNNI, else (AVX-512 without it) the EVEX form.
__attribute__((target("avxvnni"))) void VnniMixLoop(int64_t n) {
  BITSPLIT_MIX_LOOP(BITSPLIT_VNNI_DOT);
}

// The AVX-512 kernels' mix on 512-bit vectors: 64 multiply-adds per chain.
#define BITSPLIT_ZMM_CHAIN(acc)           \
  "vmovdqa32 %%zmm13, %%zmm8\n\t"         \
  "vpdpbusd %%zmm14, %%zmm15, %%zmm8\n\t" \
  "vcvtdq2ps %%zmm8, %%zmm8\n\t"          \
  "vfmadd231ps %%zmm12, %%zmm8, " acc "\n\t"
__attribute__((target("avx512f,avx512vnni"))) void Avx512MixLoop(int64_t n) {
  asm volatile(
      "vpxord %%zmm12, %%zmm12, %%zmm12\n\t"
      "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"
      "vpxord %%zmm14, %%zmm14, %%zmm14\n\t"
      "vpxord %%zmm15, %%zmm15, %%zmm15\n\t"
      "1:\n\t" BITSPLIT_ZMM_CHAIN("%%zmm0") BITSPLIT_ZMM_CHAIN("%%zmm1") BITSPLIT_ZMM_CHAIN(
          "%%zmm2") BITSPLIT_ZMM_CHAIN("%%zmm3") BITSPLIT_ZMM_CHAIN("%%zmm4")
          BITSPLIT_ZMM_CHAIN("%%zmm5") BITSPLIT_ZMM_CHAIN("%%zmm6") BITSPLIT_ZMM_CHAIN("%%zmm7")
      "dec %0\n\t"
      "jnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm12", "xmm13",
        "xmm14", "xmm15", "cc");
}
#undef BITSPLIT_ZMM_CHAIN

double MeasurePeakMix() {
  constexpr int64_t kIterations = 2'000'000;
  double best = 0;
  for (int rep = 0; rep < 10; ++rep) {
    const double start = Now();
    Pool().ParallelFor(Pool().num_threads(), [&](int64_t, int64_t, int) {
      int64_t n = kIterations;
      if (ActiveMatMulIsa() == MatMulIsa::kAvx512) {
        Avx512MixLoop(n);
      } else if (UsesVnni()) {
        VnniMixLoop(n);
      } else {
        BITSPLIT_MIX_LOOP(BITSPLIT_AVX2_DOT);
      }
    });
    const double macs = 8.0 * MixMacsPerChain() * kIterations * Pool().num_threads();
    best = std::max(best, macs / (Now() - start));
  }
  return best;
}
#undef BITSPLIT_MIX_LOOP
#undef BITSPLIT_VNNI_DOT
#undef BITSPLIT_AVX2_DOT
#undef BITSPLIT_MIX_CHAIN

// Before a case's first cell (its T = 1 in a full run): the run's bandwidth maxima (for the
// header) and the mix peak.
void RefreshCeilings() {
  ProbeBandwidth(/*repetitions=*/8);
  g_peak_mix = std::max(g_peak_mix, MeasurePeakMix());
}

// P: multiply-adds per second of the kernel itself at T = 64: the fastest call of 3 passes over
// all matrices (raised later if the T = 64 benchmark finds a faster call). Fastest calls, like
// every time here, because the machine may be shared and the fastest call is the least
// disturbed one.
double KernelRate64(const Case& c) {
  auto it = g_kernel_rate.find(c.name());
  if (it != g_kernel_rate.end()) return it->second;
  RefreshCeilings();
  Weights& w = WeightsFor(c);
  const QuantizedActivations& x = ActivationsFor(64);
  std::vector<float> y(64 * kRows);
  double best = INFINITY;
  for (int pass = 0; pass < 3; ++pass) {
    for (const MatrixView& view : w.views) {
      const double start = Now();
      MatMul(view, x, y.data(), false, Pool());
      best = std::min(best, Now() - start);
    }
  }
  benchmark::DoNotOptimize(y.data());
  return g_kernel_rate[c.name()] = 64.0 * kRows * kCols / best;
}

struct Result {
  double best_seconds = 0;  // fastest call
  double mean_seconds = 0;
  double bytes = 0;
  double macs = 0;
  // The faster of the probes just before and after the fastest call's segment, or the weights'
  // bytes / that call's time where the call read faster: a ceiling is at least what was read.
  double bandwidth = 0;
  bool bandwidth_from_call = false;
};
std::map<std::string, std::map<int, Result>> g_results;

double FloorSeconds(const Result& r, double rate, double bandwidth) {
  return std::max(r.bytes / bandwidth, r.macs / rate);
}

// A cell's calls run in segments of this much kernel time with a bandwidth probe (2 reads of
// each pattern, 12-25 ms) before the first and after each.
constexpr double kSegmentSeconds = 0.08;

void BM_SplitMatMul(benchmark::State& state, Case c) {
  const int64_t tokens = state.range(0);
  KernelRate64(c);  // measures the ceilings too, on the first call for this case
  double& rate = g_kernel_rate[c.name()];
  Weights& w = WeightsFor(c);
  const QuantizedActivations& x = ActivationsFor(tokens);
  std::vector<float> y(tokens * kRows);
  size_t next = 0;
  int64_t calls = 0;
  double total = 0, best = INFINITY, bandwidth = 0;
  bool bandwidth_from_call = false;
  double probe_before = ProbeBandwidth(2), segment_seconds = 0, segment_best = INFINITY;
  auto close_segment = [&] {
    const double probe_after = ProbeBandwidth(2);
    if (segment_best < best) {
      // A ~0.2 ms call can catch a moment of fast memory that the probes around its segment
      // (2 reads of each pattern) missed; its own read rate is then the better bound.
      best = segment_best;
      const double probed = std::max(probe_before, probe_after);
      const double read = static_cast<double>(w.matrix_bytes) / best;
      bandwidth = std::max(probed, read);
      bandwidth_from_call = read > probed;
    }
    probe_before = probe_after;
    segment_seconds = 0;
    segment_best = INFINITY;
  };
  for (auto _ : state) {
    const double start = Now();
    MatMul(w.views[next], x, y.data(), /*accumulate=*/false, Pool());
    const double seconds = Now() - start;
    total += seconds;
    segment_seconds += seconds;
    segment_best = std::min(segment_best, seconds);
    next = next + 1 == w.views.size() ? 0 : next + 1;
    ++calls;
    if (segment_seconds >= kSegmentSeconds) {
      state.PauseTiming();
      close_segment();
      state.ResumeTiming();
    }
  }
  if (segment_best < INFINITY) close_segment();
  benchmark::DoNotOptimize(y.data());
  Result result{best,
                total / calls,
                static_cast<double>(w.matrix_bytes),
                static_cast<double>(kRows) * kCols * tokens,
                bandwidth,
                bandwidth_from_call};
  if (tokens == 64) rate = std::max(rate, result.macs / best);
  state.SetBytesProcessed(static_cast<int64_t>(result.bytes * calls));
  state.counters["best_us"] = best * 1e6;
  state.counters["BW_GBs"] = bandwidth / 1e9;
  state.counters["BW_frac"] = result.bytes / best / bandwidth;
  state.counters["floor_us"] = FloorSeconds(result, rate, bandwidth) * 1e6;
  state.counters["over_floor"] = best / FloorSeconds(result, rate, bandwidth);
  state.counters["P_GMACs"] = rate / 1e9;
  g_results[c.name()][static_cast<int>(tokens)] = result;
}

double LoadAverage() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

// A row whose cells' bandwidths differ by more than this is marked: its memory changed speed
// (this VM's memory moves between about 35 and 60-70 GB/s within minutes).
constexpr double kSpeedChange = 1.25;

// E / c of the line time(T) = T c + E through the T = 8 and T = 64 cells: what a call spends per
// weight row whatever its tokens (expanding the codes, the scale products), in units of one
// token's share. At T = 64 it is spread thin (P is measured there), at T = 2-8 it is not: it is
// why compute-bound cells near the crossover miss floor(T). -1 without both cells.
template <typename Cells>
double RowCostInTokens(const Cells& cells) {
  const auto t8 = cells.find(8), t64 = cells.find(64);
  if (t8 == cells.end() || t64 == cells.end()) return -1;
  const double per_token = (t64->second.best_seconds - t8->second.best_seconds) / (64 - 8);
  if (per_token <= 0) return -1;
  return (t8->second.best_seconds - 8 * per_token) / per_token;
}

// The table of the final values: P and the mix peak are maxima over the whole run, BW per cell
// (Result::bandwidth), times fastest calls; then each cell's BW.
void PrintSummary(double load_before) {
  std::printf(
      "\nkernels %s, %s tiling | threads %d | BW %.1f GB/s (run maximum; one stream per thread "
      "%.1f, with software prefetch %.1f, four streams %.1f) | mix peak %.1f GMAC/s = %.2f GHz x "
      "%d cores x %.2f MAC/cycle | L3 %zu MiB "
      "| load %.2f -> %.2f\n",
      MatMulIsaName(ActiveMatMulIsa()), L1TilingName(ActiveL1Tiling()), Pool().num_threads(),
      Bandwidth() / 1e9, g_bandwidth_by_pattern[0] / 1e9, g_bandwidth_by_pattern[1] / 1e9,
      g_bandwidth_by_pattern[2] / 1e9, g_peak_mix / 1e9,
      g_peak_mix / (Pool().num_threads() * MixMacsPerCycle()) / 1e9, Pool().num_threads(),
      MixMacsPerCycle(), L3Bytes() >> 20, load_before, LoadAverage());
  std::printf(
      "times: fastest call in us; x/fl = time / floor(T), floor(T) = max(bytes / BW, "
      "T * MACs / P), BW the cell's own: probed on either side of its fastest call's segment\n");
  std::printf("%-11s %6s %11s %7s %7s", "format", "MB", "BW range", "P", "P/peak");
  for (int t : kTokenCounts) std::printf(" | T=%-2d us   x/fl", t);
  std::printf(" | BW@T1 |  E/c\n");
  bool any_switched = false;
  for (const Case& c : kCases) {
    auto it = g_results.find(c.name());
    if (it == g_results.end()) continue;
    const double rate = g_kernel_rate[c.name()];
    double low = INFINITY, high = 0;
    for (const auto& [t, r] : it->second) {
      low = std::min(low, r.bandwidth);
      high = std::max(high, r.bandwidth);
    }
    const bool switched = high > kSpeedChange * low;
    any_switched |= switched;
    std::printf("%-11s %6.2f %5.1f-%-4.1f%s %7.1f %6.0f%%", c.name().c_str(),
                it->second.begin()->second.bytes / 1e6, low / 1e9, high / 1e9, switched ? "*" : " ",
                rate / 1e9, 100.0 * rate / g_peak_mix);
    for (int t : kTokenCounts) {
      auto r = it->second.find(t);
      if (r == it->second.end()) {
        std::printf(" | %8s %5s", "-", "-");
      } else {
        std::printf(" | %8.1f %5.2f", r->second.best_seconds * 1e6,
                    r->second.best_seconds / FloorSeconds(r->second, rate, r->second.bandwidth));
      }
    }
    auto t1 = it->second.find(1);
    if (t1 != it->second.end()) {
      std::printf(" | %4.0f%%",
                  100.0 * t1->second.bytes / t1->second.best_seconds / t1->second.bandwidth);
    } else {
      std::printf(" | %5s", "-");
    }
    const double row_cost = RowCostInTokens(it->second);
    if (row_cost >= 0) {
      std::printf(" | %4.2f\n", row_cost);
    } else {
      std::printf(" | %4s\n", "-");
    }
  }
  std::printf(
      "E/c: a call's per-row work (code expansion, scale products) in tokens, from the line "
      "time(T) = T c + E through T = 8 and 64; where T tokens are compute-bound, time / floor(T) "
      "is about 1 + (E/c) / T\n");
  if (any_switched) {
    std::printf(
        "*: this row's cells ran at memory speeds more than %.2fx apart; each cell is held to the "
        "speed probed around its own fastest call\n",
        kSpeedChange);
  }
  std::printf(
      "\nBW per cell, GB/s: the faster probe on either side of the fastest call's segment, or "
      "(+) the call's own read rate where that was faster\n");
  std::printf("%-11s", "format");
  for (int t : kTokenCounts) std::printf(" | T=%-4d", t);
  std::printf("\n");
  for (const Case& c : kCases) {
    auto it = g_results.find(c.name());
    if (it == g_results.end()) continue;
    std::printf("%-11s", c.name().c_str());
    for (int t : kTokenCounts) {
      auto r = it->second.find(t);
      if (r == it->second.end()) {
        std::printf(" | %5s", "-");
      } else {
        std::printf(" | %5.1f%s", r->second.bandwidth / 1e9,
                    r->second.bandwidth_from_call ? "+" : " ");
      }
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace bitsplit::quant

int main(int argc, char** argv) {
  using namespace bitsplit::quant;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) g_threads = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      const std::string name = argv[i] + 6;
      bool known = false;
      for (MatMulIsa isa : {MatMulIsa::kAvx2, MatMulIsa::kAvxVnni, MatMulIsa::kAvx512}) {
        if (name != MatMulIsaName(isa)) continue;
        known = true;
        if (const absl::Status status = SelectMatMulIsa(isa); !status.ok()) {
          std::fprintf(stderr, "kernel_bench: %s\n", std::string(status.message()).c_str());
          return 2;
        }
      }
      if (!known) {
        std::fprintf(stderr, "kernel_bench: --isa must be avx2, avx-vnni or avx512, not '%s'\n",
                     name.c_str());
        return 2;
      }
    }
    if (std::strncmp(argv[i], "--tiling=", 9) == 0) {
      const std::string name = argv[i] + 9;
      bool known = false;
      for (L1Tiling tiling : {L1Tiling::kLargeL1, L1Tiling::kSmallL1}) {
        if (name != L1TilingName(tiling)) continue;
        known = true;
        SelectL1Tiling(tiling);
      }
      if (!known) {
        std::fprintf(stderr, "kernel_bench: --tiling must be large-l1 or small-l1, not '%s'\n",
                     name.c_str());
        return 2;
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  const double load_before = LoadAverage();
  for (const Case& c : kCases) {
    auto* b =
        benchmark::RegisterBenchmark(("BM_SplitMatMul/" + c.name()).c_str(), BM_SplitMatMul, c);
    for (int t : kTokenCounts) b->Arg(t);
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  PrintSummary(load_before);
  benchmark::Shutdown();
  return 0;
}
