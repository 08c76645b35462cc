#include "common/quant/split_matmul.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::quant {
namespace {

constexpr int kGroupsPerRun = 8;  // groups per min-term fma: one per f32 lane
constexpr int kChunkBlocks = 8;   // blocks per vectorized scale product
constexpr int kScaleSpan = 32;    // blocks whose scale products are computed ahead
// L1 data caches up to this size take L1Tiling::kSmallL1.
constexpr long kSmallL1Bytes = long{32} << 10;

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

uint16_t LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the order of HorizontalSum below.
float HorizontalSumReference(const float lanes[8]) {
  const float s0 = lanes[0] + lanes[4], s1 = lanes[1] + lanes[5];
  const float s2 = lanes[2] + lanes[6], s3 = lanes[3] + lanes[7];
  return (s0 + s2) + (s1 + s3);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// How a chunk of 8 consecutive blocks finds its 8 scales (each block takes its group's d).
enum class ScaleLoad {
  kPerBlock,  // group 32, contiguous fp16 scales: one 16-byte load
  kPairs,     // group 64: 4 scales, each used twice
  kQuads,     // group 128: 2 scales, each used 4 times
  kShared,    // group a multiple of 256: one scale for the whole chunk
  kGeneric,   // any other group: one load per block
  kCached,    // from Problem::scale_cache, filled once per row tile (see RunRowsWith)
};

// 64 bytes of a prepared activation vector (AVX-512's PrepareActivationPairs; kPreparedPerPair
// per token and block pair); also of a block pair's expanded codes (Problem::code_cache).
struct alignas(64) PairVector {
  int8_t bytes[64];
};

// Where an AVX-512 multi-token tile takes its codes from: expanded from the weights (kNone), the
// same and stored into Problem::code_cache (kStore: a row tile's first token tile), or loaded
// from there (kLoad: its later token tiles).
enum class CodeCache { kNone, kStore, kLoad };

// Everything a kernel needs about one MatMul call, shared by all threads.
struct Problem {
  const MatrixView* w;
  const QuantizedActivations* x;
  SplitRowLayout layout;
  int64_t blocks_per_group;
  ScaleLoad scale_load;
  const float* group_sums;  // [x.rows][group_stride], zero padded; null without a min term
  int64_t group_stride;
  float* y;
  bool accumulate;
  // AVX-512, T >= 3, the formats kPreparesActivations admits: [x.rows][pairs][kPreparedPerPair]
  // (PrepareActivationPairs), set by RunRows.
  const PairVector* pairs = nullptr;
  // kCached: one thread's f32 d of the current row tile, [row in tile][scale_cache_stride], set
  // by RunRowsWith (the rows' chunk scales, zero past each row's blocks).
  const float* scale_cache = nullptr;
  int64_t scale_cache_stride = 0;
  // CodeCache: one thread's expanded codes of the current row tile, [block pair][row in tile], set
  // by RunRowsWith.
  PairVector* code_cache = nullptr;
  L1Tiling tiling = L1Tiling::kLargeL1;  // ActiveL1Tiling() at the call
};

// 32 bytes of f32 scales, 32-byte aligned for the kernels' aligned loads (a vector of these is the
// kCached buffer).
struct alignas(32) EightScales {
  float d[8];
};

// group_sums[t][g] = sum over the group's blocks of x.sums (in order, from 0.0f).
void ComputeGroupSums(const QuantizedActivations& x, int group, std::vector<float>* out,
                      int64_t* stride) {
  const int64_t blocks_per_group = group / kActivationBlock;
  const int64_t groups = x.cols / group;
  *stride = RoundUp(groups, kGroupsPerRun);
  out->assign(x.rows * *stride, 0.0f);
  for (int64_t t = 0; t < x.rows; ++t) {
    const float* sums = x.row_sums(t);
    for (int64_t g = 0; g < groups; ++g) {
      float total = 0.0f;
      for (int64_t b = 0; b < blocks_per_group; ++b) total += sums[g * blocks_per_group + b];
      (*out)[t * *stride + g] = total;
    }
  }
}

// Compile-time copy of the SplitFormatInfo fields the kernel branches on.
template <SplitFormat kFormat>
struct Traits {
  static_assert(kFormat != SplitFormat::kQ8_0, "q8_0 runs r8's kernels (GetRunRows)");
  static constexpr bool kSigned = kFormat == SplitFormat::kR8;
  static constexpr bool kStoredMin = kFormat == SplitFormat::kB2Asym ||
                                     kFormat == SplitFormat::kB3Asym ||
                                     kFormat == SplitFormat::kB4Asym;
  static constexpr bool kMinTerm = !kSigned;  // stored min, or the implied -offset * d
  // y = d * (q - offset) for the offset formats (split_format.h).
  static constexpr float kCodeOffset = kStoredMin ? 0.0f : SplitFormatTraitsOf(kFormat).code_offset;
  // Bytes from one sub-block's codes to the next.
  static constexpr int64_t kCodeStride = SplitFormatTraitsOf(kFormat).sub_block_bytes;
};

// AVX-512 prepared activation vectors (PrepareActivationPairs) per token and block pair: the
// interleaved codes, then for signed codes MinusBiasTimesSum of them.
template <SplitFormat kFormat>
constexpr int64_t kPreparedPerPair = Traits<kFormat>::kSigned ? 2 : 1;

inline __m256 HalvesToFloats(__m128i halves) { return _mm256_cvtph_ps(halves); }

// d of the 8 blocks [chunk, chunk + 8) of one row, as f32 (blocks past `chunk_blocks`: 0).
// Up to 8 fp16 values into lanes 0..count-1 (the rest 0), lane k's from the address next()
// returns on its k-th call. Built in a register with vpinsrw: through a stack array, narrow
// stores would feed the wide load of vcvtph2ps and stall it (measured: on SmolLM2's 576-column
// rows that stall cost more than the rows' dot products).
template <typename Next>
inline __m128i InsertHalves(int64_t count, Next&& next) {
  __m128i halves = _mm_setzero_si128();
  auto insert = [&]<int kLane>() {
    if (kLane < count) halves = _mm_insert_epi16(halves, LoadHalf(next()), kLane);
  };
  insert.template operator()<0>();
  insert.template operator()<1>();
  insert.template operator()<2>();
  insert.template operator()<3>();
  insert.template operator()<4>();
  insert.template operator()<5>();
  insert.template operator()<6>();
  insert.template operator()<7>();
  return halves;
}

// The f32 scales d of blocks [chunk, chunk + count) of one row (count <= 8; lanes past count:
// 0), any layout: walks the groups (one division per call). Not inlined: the kernels need it
// only for a row's last, partial chunk and for group sizes without a fast path below.
__attribute__((noinline)) __m256 GeneralChunkScales(const Problem& p, const uint8_t* row,
                                                    int64_t chunk, int count) {
  const int64_t bpg = p.blocks_per_group;
  const size_t stride = p.layout.scale_stride;
  const uint8_t* source = row + p.layout.scale_offset + (chunk / bpg) * stride;
  int64_t left_in_group = bpg - chunk % bpg;
  return HalvesToFloats(InsertHalves(count, [&] {
    const uint8_t* at = source;
    if (--left_in_group == 0) {
      source += stride;
      left_in_group = bpg;
    }
    return at;
  }));
}

// The same for a scale layout fixed at compile time, inlined into the kernels' scale loop, which
// dispatches on the layout once per 32-block span: a call and a switch per chunk cost a quarter
// of the one-token kernel's time. Full chunks take one or a few loads.
template <ScaleLoad kLoad>
__attribute__((always_inline)) inline __m256 ChunkScales(const Problem& p, const uint8_t* row,
                                                         int64_t chunk, int count) {
  const uint8_t* scales = row + p.layout.scale_offset;
  if (count == kChunkBlocks) {
    if constexpr (kLoad == ScaleLoad::kPerBlock) {
      return HalvesToFloats(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * chunk)));
    } else if constexpr (kLoad == ScaleLoad::kPairs) {
      const __m256 four = HalvesToFloats(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 2 * (chunk / 2))));
      return _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    } else if constexpr (kLoad == ScaleLoad::kQuads) {
      uint32_t two;
      std::memcpy(&two, scales + 2 * (chunk / 4), sizeof(two));
      const __m256 pair = HalvesToFloats(_mm_cvtsi32_si128(static_cast<int>(two)));
      return _mm256_permutevar8x32_ps(pair, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    } else if constexpr (kLoad == ScaleLoad::kShared) {
      return HalvesToFloats(_mm_set1_epi16(
          static_cast<int16_t>(LoadHalf(scales + 2 * (chunk / p.blocks_per_group)))));
    }
  }
  return GeneralChunkScales(p, row, chunk, count);
}

// The additive term of groups [g_begin, g_end) (at most 8; missing lanes 0): m for the
// asymmetric formats, -offset * d for the offset ones. -offset * d is exact (the offset is
// 1, 1.5, 4, 8 or 32), so it equals the reference's product.
template <SplitFormat kFormat>
inline __m256 GroupMins(const Problem& p, const uint8_t* row, int64_t g_begin, int64_t g_end) {
  constexpr bool kStoredMin = Traits<kFormat>::kStoredMin;
  const uint8_t* source = row + (kStoredMin ? p.layout.min_offset : p.layout.scale_offset);
  __m256 values;
  if (g_end - g_begin == kGroupsPerRun) {
    values =
        HalvesToFloats(_mm_loadu_si128(reinterpret_cast<const __m128i*>(source + 2 * g_begin)));
  } else {
    // A partial run (a row's last): in a register (an array here cost a third of the one-token
    // time of SmolLM2's 576-column rows).
    const uint8_t* next = source + 2 * g_begin;
    values = HalvesToFloats(InsertHalves(g_end - g_begin, [&] {
      const uint8_t* at = next;
      next += 2;
      return at;
    }));
  }
  if constexpr (!kStoredMin) {
    values = _mm256_mul_ps(values, _mm256_set1_ps(-Traits<kFormat>::kCodeOffset));
  }
  return values;
}

// Software prefetch of the weight rows a thread will read next, spread evenly over the 8-block
// chunks of the current tile. With T = 1 the hardware prefetcher alone streams four interleaved
// rows poorly (measured: about half the bandwidth), and when several token tiles re-read the
// current rows from cache it sees no new misses at all, so DRAM would idle during those tiles.
// Into L1 (T0): at T = 1 r6 streamed 10-20% faster than with T1 (into L2) in interleaved runs;
// no difference at T > 1.
struct Prefetcher {
  const char* next = nullptr;  // next cache line to fetch
  int64_t lines = 0;           // lines left
  int64_t per_step = 0;        // lines per step (one per 8-block chunk)
  bool into_l2 = false;        // _MM_HINT_T1 instead of T0 (see RunRowsWith)

  // One-token tiles: checks both counts per line, about 10 instructions per line. The plain loop
  // of StepAtOnce made r8 at T = 1 15-25% slower from DRAM (576 and 1536 columns, one thread; r6
  // on the Zen 4 VM 15-20%).
  void Step() {
    if (into_l2) {
      for (int64_t i = 0; i < per_step && lines > 0; ++i, --lines, next += 64) {
        _mm_prefetch(next, _MM_HINT_T1);
      }
    } else {
      for (int64_t i = 0; i < per_step && lines > 0; ++i, --lines, next += 64) {
        _mm_prefetch(next, _MM_HINT_T0);
      }
    }
  }
  // Multi-token tiles: the count first, then a plain loop. Step's cost per line had been a
  // quarter of a tile's instructions for short rows (38 lines per 4-row tile of SmolLM2's r8
  // residual, 9 block pairs of work). From L2 on one thread, r8 at 576 columns: T = 4 5-9% faster;
  // from DRAM: T = 4 9-14% faster at 1536-4096 columns, T = 2 8% at 576.
  void StepAtOnce() {
    const int64_t n = std::min(per_step, lines);
    if (into_l2) {
      for (int64_t i = 0; i < n; ++i) _mm_prefetch(next + 64 * i, _MM_HINT_T1);
    } else {
      for (int64_t i = 0; i < n; ++i) _mm_prefetch(next + 64 * i, _MM_HINT_T0);
    }
    next += 64 * n;
    lines -= n;
  }
  void Finish() {
    per_step = lines;
    Step();
  }
};

using RunRowsFn = void (*)(const Problem&, int64_t, int64_t);

// The kernels, compiled once per instruction set (see split_matmul_kernel.inc): the same
// sequence of operations. AVX2 does the integer dot product with vpmaddubsw + vpmaddwd; AVX-VNNI
// with one vpdpbusd (those three and vfmadd share two ports on current cores, so this takes a
// third of the work off the ports that bound the kernel); AVX-512 (VL, BW, VNNI, VBMI, GFNI)
// puts two blocks in each 512-bit vector (one vpdpbusd, vcvtdq2ps and vfmadd per block pair),
// expands codes with vpermb and vgf2p8affineqb, and loads partial scale chunks masked.
namespace avx2 {
#define BITSPLIT_MATMUL_VNNI 0
#define BITSPLIT_MATMUL_AVX512 0
#include "common/quant/split_matmul_kernel.inc"
#undef BITSPLIT_MATMUL_AVX512
#undef BITSPLIT_MATMUL_VNNI
}  // namespace avx2
#pragma GCC push_options
#pragma GCC target("avxvnni")
namespace avxvnni {
#define BITSPLIT_MATMUL_VNNI 1
#define BITSPLIT_MATMUL_AVX512 0
#include "common/quant/split_matmul_kernel.inc"
#undef BITSPLIT_MATMUL_AVX512
#undef BITSPLIT_MATMUL_VNNI
}  // namespace avxvnni
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi,gfni")
// GCC 12's 512-bit intrinsics fill their pass-through operand with a self-initialised
// _mm512_undefined_*() and then warn about it (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
#define BITSPLIT_MATMUL_VNNI 1
#define BITSPLIT_MATMUL_AVX512 1
#include "common/quant/split_matmul_kernel.inc"
#undef BITSPLIT_MATMUL_AVX512
#undef BITSPLIT_MATMUL_VNNI
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

bool CpuHasAvxVnni() {
  static const bool has = __builtin_cpu_supports("avxvnni");
  return has;
}
bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
  return has;
}

// From the L1 data cache size (glibc reads it from CPUID); where unknown (0 or -1), kLargeL1,
// the tiling the kernels were first tuned with.
std::atomic<L1Tiling>& SelectedTiling() {
  static std::atomic<L1Tiling> tiling{[] {
    const long l1_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1_bytes > 0 && l1_bytes <= kSmallL1Bytes ? L1Tiling::kSmallL1 : L1Tiling::kLargeL1;
  }()};
  return tiling;
}

std::atomic<MatMulIsa>& SelectedIsa() {
  static std::atomic<MatMulIsa> isa{CpuHasAvx512()    ? MatMulIsa::kAvx512
                                    : CpuHasAvxVnni() ? MatMulIsa::kAvxVnni
                                                      : MatMulIsa::kAvx2};
  return isa;
}

RunRowsFn GetRunRows(SplitFormat format) {
  switch (SelectedIsa().load(std::memory_order_relaxed)) {
    case MatMulIsa::kAvx512:
      return avx512::GetRunRows(format);
    case MatMulIsa::kAvxVnni:
      return avxvnni::GetRunRows(format);
    case MatMulIsa::kAvx2:
      break;
  }
  return avx2::GetRunRows(format);
}

void CheckProblem(const MatrixView& w, const QuantizedActivations& x) {
  BITSPLIT_CHECK(ValidateSplitLayout(w.format, w.group, w.cols).ok());
  BITSPLIT_CHECK(w.data != nullptr && w.rows > 0);
  BITSPLIT_CHECK(w.row_stride >= SplitRowBytes(w.format, w.group, w.cols));
  BITSPLIT_CHECK(x.cols == w.cols && x.rows >= 1);
  BITSPLIT_CHECK(x.block_stride == ActivationBlockStride(x.cols));
  BITSPLIT_CHECK(static_cast<int64_t>(x.codes.size()) == x.rows * x.cols);
  BITSPLIT_CHECK(static_cast<int64_t>(x.scales.size()) == x.rows * x.block_stride);
  BITSPLIT_CHECK(static_cast<int64_t>(x.sums.size()) == x.rows * x.block_stride);
}

// Builds the per-call Problem; the group sums live in `group_sums` (caller-owned scratch).
Problem MakeProblem(const MatrixView& w, const QuantizedActivations& x, float* y, bool accumulate,
                    std::vector<float>* group_sums) {
  Problem p{&w,
            &x,
            GetSplitRowLayout(w.format, w.group, w.cols),
            w.group / kSplitSubBlock,
            ScaleLoad::kGeneric,
            nullptr,
            0,
            y,
            accumulate};
  // Every format's scales are consecutive fp16 values (ChunkScales' fast paths rely on it).
  BITSPLIT_CHECK(p.layout.scale_stride == sizeof(uint16_t));
  if (p.blocks_per_group == 1) p.scale_load = ScaleLoad::kPerBlock;
  if (p.blocks_per_group == 2) p.scale_load = ScaleLoad::kPairs;
  if (p.blocks_per_group == 4) p.scale_load = ScaleLoad::kQuads;
  if (p.blocks_per_group % kChunkBlocks == 0) p.scale_load = ScaleLoad::kShared;
  p.tiling = SelectedTiling().load(std::memory_order_relaxed);
  if (!GetSplitFormatInfo(w.format).signed_codes) {
    ComputeGroupSums(x, w.group, group_sums, &p.group_stride);
    p.group_sums = group_sums->data();
  }
  return p;
}

// s = amax / 127 and its inverse. A block so small that 1 / s overflows (amax < ~4e-37) is
// stored as zeros rather than as codes of an infinite inverse.
void BlockScale(float amax, float* scale, float* inverse) {
  *scale = amax / 127.0f;
  *inverse = *scale != 0.0f ? 1.0f / *scale : 0.0f;
  if (std::isinf(*inverse)) *scale = *inverse = 0.0f;
}

void ResizeActivations(int64_t rows, int64_t cols, QuantizedActivations* out) {
  BITSPLIT_CHECK(rows >= 0 && cols > 0 && cols % kActivationBlock == 0);
  out->rows = rows;
  out->cols = cols;
  out->block_stride = ActivationBlockStride(cols);
  out->codes.resize(rows * cols);
  out->scales.assign(rows * out->block_stride, 0.0f);
  out->sums.assign(rows * out->block_stride, 0.0f);
}

}  // namespace

void QuantizeActivationsReference(const float* x, int64_t rows, int64_t cols,
                                  QuantizedActivations* out) {
  ResizeActivations(rows, cols, out);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b = 0; b < cols / kActivationBlock; ++b) {
      const float* v = x + t * cols + b * kActivationBlock;
      float amax = 0.0f;
      for (int j = 0; j < kActivationBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
      float scale, inverse;
      BlockScale(amax, &scale, &inverse);
      int sum = 0;
      int8_t* codes = out->codes.data() + t * cols + b * kActivationBlock;
      for (int j = 0; j < kActivationBlock; ++j) {
        const float c = std::clamp(std::nearbyint(v[j] * inverse), -127.0f, 127.0f);
        codes[j] = static_cast<int8_t>(c);
        sum += codes[j];
      }
      out->scales[t * out->block_stride + b] = scale;
      out->sums[t * out->block_stride + b] = scale * static_cast<float>(sum);
    }
  }
}

void QuantizeActivations(const float* x, int64_t rows, int64_t cols, QuantizedActivations* out) {
  ResizeActivations(rows, cols, out);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t b = 0; b < cols / kActivationBlock; ++b) {
      const float* v = x + t * cols + b * kActivationBlock;
      __m256 values[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        values[i] = _mm256_loadu_ps(v + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, values[i]));
      }
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      m = _mm_max_ss(m, _mm_movehdup_ps(m));
      float scale, inverse_scalar;
      BlockScale(_mm_cvtss_f32(m), &scale, &inverse_scalar);
      const __m256 inverse = _mm256_set1_ps(inverse_scalar);
      __m256i q[4];
      __m256i sum = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        // cvtps rounds half to even (MXCSR default), like nearbyint; clamp as the reference.
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(values[i], inverse));
        q[i] = _mm256_max_epi32(_mm256_min_epi32(q[i], _mm256_set1_epi32(127)),
                                _mm256_set1_epi32(-127));
        sum = _mm256_add_epi32(sum, q[i]);
      }
      // Pack 32 int32 -> 32 int8; packs interleave 128-bit lanes, the permute restores order.
      const __m256i q16_01 = _mm256_packs_epi32(q[0], q[1]);
      const __m256i q16_23 = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 = _mm256_packs_epi16(q16_01, q16_23);
      const __m256i ordered =
          _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out->codes.data() + t * cols + b * kActivationBlock), ordered);
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      out->scales[t * out->block_stride + b] = scale;
      out->sums[t * out->block_stride + b] = scale * static_cast<float>(_mm_cvtsi128_si32(s));
    }
  }
}

absl::StatusOr<MatrixView> MakeMatrixView(SplitFormat format, int group, int64_t rows, int64_t cols,
                                          const uint8_t* data, size_t size_bytes,
                                          size_t row_stride) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSplitLayout(format, group, cols));
  if (rows <= 0) return absl::InvalidArgumentError(absl::StrCat("matrix has ", rows, " rows"));
  if (data == nullptr) return absl::InvalidArgumentError("matrix data is null");
  const size_t row_bytes = SplitRowBytes(format, group, cols);
  if (row_stride == 0) row_stride = row_bytes;
  if (row_stride < row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("row stride ", row_stride, " is below the row size ", row_bytes));
  }
  const size_t needed = (static_cast<size_t>(rows) - 1) * row_stride + row_bytes;
  if (size_bytes < needed || (static_cast<size_t>(rows) - 1) > SIZE_MAX / row_stride) {
    return absl::InvalidArgumentError(absl::StrCat("matrix of ", rows, " x ", cols, " needs ",
                                                   needed, " bytes, have ", size_bytes));
  }
  return MatrixView{format, group, rows, cols, data, row_stride};
}

bool MatMulIsaSupported(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kAvx2:
      return true;
    case MatMulIsa::kAvxVnni:
      return CpuHasAvxVnni();
    case MatMulIsa::kAvx512:
      return CpuHasAvx512();
  }
  return false;
}

MatMulIsa ActiveMatMulIsa() { return SelectedIsa().load(std::memory_order_relaxed); }

absl::Status SelectMatMulIsa(MatMulIsa isa) {
  if (!MatMulIsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU does not support the ", MatMulIsaName(isa), " kernels"));
  }
  SelectedIsa().store(isa, std::memory_order_relaxed);
  return absl::OkStatus();
}

L1Tiling ActiveL1Tiling() { return SelectedTiling().load(std::memory_order_relaxed); }

void SelectL1Tiling(L1Tiling tiling) { SelectedTiling().store(tiling, std::memory_order_relaxed); }

const char* L1TilingName(L1Tiling tiling) {
  return tiling == L1Tiling::kSmallL1 ? "small-l1" : "large-l1";
}

const char* MatMulIsaName(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kAvx2:
      return "avx2";
    case MatMulIsa::kAvxVnni:
      return "avx-vnni";
    case MatMulIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

void MatMul(const MatrixView& w, const QuantizedActivations& x, float* y, bool accumulate,
            ThreadPool& pool) {
  CheckProblem(w, x);
  thread_local std::vector<float> group_sums;
  const Problem problem = MakeProblem(w, x, y, accumulate, &group_sums);
  const RunRowsFn run = GetRunRows(w.format);
  pool.ParallelForGrained(w.rows, kMatMulRowGrain, [&](int64_t begin, int64_t end, int /*worker*/) {
    run(problem, begin, end);
  });
}

void MatMulRows(const MatrixView& w, const QuantizedActivations& x, int64_t row_begin,
                int64_t row_end, float* y, bool accumulate) {
  CheckProblem(w, x);
  BITSPLIT_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows);
  if (row_begin == row_end) return;
  thread_local std::vector<float> group_sums;
  const Problem problem = MakeProblem(w, x, y, accumulate, &group_sums);
  GetRunRows(w.format)(problem, row_begin, row_end);
}

void MatMulReference(const MatrixView& w, const QuantizedActivations& x, float* y,
                     bool accumulate) {
  CheckProblem(w, x);
  const SplitFormatInfo& info = GetSplitFormatInfo(w.format);
  const SplitRowLayout layout = GetSplitRowLayout(w.format, w.group, w.cols);
  const bool min_term = !info.signed_codes;
  const int64_t blocks_per_group = w.group / kSplitSubBlock;
  std::vector<float> group_sums;
  int64_t group_stride = 0;
  if (min_term) ComputeGroupSums(x, w.group, &group_sums, &group_stride);
  int codes[kSplitSubBlock];
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.row(r);
    auto scale_of = [&](int64_t g) {
      return Fp16ToFp32(LoadHalf(row + layout.scale_offset + g * layout.scale_stride));
    };
    for (int64_t t = 0; t < x.rows; ++t) {
      float even[8] = {}, odd[8] = {};  // lanes of the even and of the odd blocks
      for (int64_t g_begin = 0; g_begin < layout.groups; g_begin += kGroupsPerRun) {
        const int64_t g_end = std::min(layout.groups, g_begin + kGroupsPerRun);
        for (int64_t g = g_begin; g < g_end; ++g) {
          const float d = scale_of(g);
          for (int64_t s = 0; s < blocks_per_group; ++s) {
            const int64_t b = g * blocks_per_group + s;
            UnpackSubBlock(w.format, row + layout.code_offset + b * layout.code_stride, codes);
            const int8_t* xc = x.row_codes(t) + b * kActivationBlock;
            const float scale = d * x.row_scales(t)[b];
            float* acc = b % 2 == 0 ? even : odd;
            for (int k = 0; k < 8; ++k) {
              int32_t isum = 0;
              for (int i = 0; i < 4; ++i) isum += codes[4 * k + i] * xc[4 * k + i];
              acc[k] = std::fma(static_cast<float>(isum), scale, acc[k]);
            }
          }
        }
        if (min_term) {
          for (int k = 0; k < kGroupsPerRun; ++k) {
            const int64_t g = g_begin + k;
            float min = 0.0f, group_sum = 0.0f;
            if (g < g_end) {
              min = info.has_min
                        ? Fp16ToFp32(LoadHalf(row + layout.min_offset + g * layout.min_stride))
                        : scale_of(g) * -info.code_offset;
              group_sum = group_sums[t * group_stride + g];
            }
            even[k] = std::fma(min, group_sum, even[k]);
          }
        }
      }
      float lanes[8];
      for (int k = 0; k < 8; ++k) lanes[k] = even[k] + odd[k];
      const float v = HorizontalSumReference(lanes);
      float& out = y[t * w.rows + r];
      out = accumulate ? out + v : v;
    }
  }
}

void MatMulF32Reference(const MatrixView& w, const float* x, int64_t tokens, float* y) {
  BITSPLIT_CHECK(ValidateSplitLayout(w.format, w.group, w.cols).ok());
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeSplitRow(w.format, w.group, w.row(r), w.cols, row.data());
    for (int64_t t = 0; t < tokens; ++t) {
      double sum = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) sum += static_cast<double>(row[k]) * x[t * w.cols + k];
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace bitsplit::quant
