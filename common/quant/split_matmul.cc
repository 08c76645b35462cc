#include "common/quant/split_matmul.h"

#include <immintrin.h>

#include <algorithm>
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
  kStrided,   // group 32, scales `scale_stride` bytes apart (Q8_0's blocks): one gather
  kGeneric,   // any other group: one load per block
};

// Everything a kernel needs about one MatMul call, shared by all threads.
struct Problem {
  const MatrixView* w;
  const QuantizedActivations* x;
  SplitRowLayout layout;
  int64_t blocks_per_group;
  ScaleLoad scale_load;
  __m256i strided_scale_index;  // kStrided: byte offsets 0, stride, ..., 7 * stride
  const float* group_sums;      // [x.rows][group_stride], zero padded; null without a min term
  int64_t group_stride;
  float* y;
  bool accumulate;
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

// ---- Per-format code expansion to 32 bytes in element order (see split_format.h) -----------

inline __m256i ExpandPlane2(const uint8_t* p) {  // values 0..3
  uint64_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  const __m256i v = _mm256_set1_epi64x(static_cast<long long>(bits));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 2, 4, 6)),
                          _mm256_set1_epi8(3));
}
// Plane1 as a byte mask: bit 7 of output byte j is element j's bit (other bits: garbage).
// Doubleword k holds elements 4k..4k+3, whose bits sit at bit k of bytes 0..3: shifting left by
// 7 - k moves them to bit 7 of each byte, which is all vpblendvb looks at.
inline __m256i ExpandPlane1Mask(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  const __m256i v = _mm256_set1_epi32(static_cast<int>(bits));
  return _mm256_sllv_epi32(v, _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
}
inline __m256i ExpandPlane4(const uint8_t* p) {  // values 0..15
  const __m256i v =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)),
                          _mm256_set1_epi8(15));
}

template <SplitFormat kFormat>
struct Codes;
template <>
struct Codes<SplitFormat::kB2Sym> {
  static __m256i Expand(const uint8_t* p) { return ExpandPlane2(p); }
};
template <>
struct Codes<SplitFormat::kB2Asym> : Codes<SplitFormat::kB2Sym> {};
template <>
struct Codes<SplitFormat::kB3Sym> {
  static __m256i Expand(const uint8_t* p) {
    const __m256i low = ExpandPlane2(p);  // bits 0-1; bit 2 is added where the mask says so
    return _mm256_blendv_epi8(low, _mm256_or_si256(low, _mm256_set1_epi8(4)),
                              ExpandPlane1Mask(p + 8));
  }
};
template <>
struct Codes<SplitFormat::kB3Asym> : Codes<SplitFormat::kB3Sym> {};
template <>
struct Codes<SplitFormat::kB4Sym> {
  static __m256i Expand(const uint8_t* p) { return ExpandPlane4(p); }
};
template <>
struct Codes<SplitFormat::kB4Asym> : Codes<SplitFormat::kB4Sym> {};
template <>
struct Codes<SplitFormat::kR6> {
  static __m256i Expand(const uint8_t* p) {
    return _mm256_or_si256(ExpandPlane4(p), _mm256_slli_epi16(ExpandPlane2(p + 16), 4));
  }
};
template <>
struct Codes<SplitFormat::kR8> {
  static __m256i Expand(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
};
template <>
struct Codes<SplitFormat::kQ8_0> : Codes<SplitFormat::kR8> {};

// Compile-time copy of the SplitFormatInfo fields the kernel branches on.
template <SplitFormat kFormat>
struct Traits {
  static constexpr bool kSigned = kFormat == SplitFormat::kR8 || kFormat == SplitFormat::kQ8_0;
  static constexpr bool kStoredMin = kFormat == SplitFormat::kB2Asym ||
                                     kFormat == SplitFormat::kB3Asym ||
                                     kFormat == SplitFormat::kB4Asym;
  static constexpr bool kMinTerm = !kSigned;  // stored min, or the implied -offset * d
  // y = d * (q - offset) for the offset formats (split_format.h).
  static constexpr float kCodeOffset = kFormat == SplitFormat::kB2Sym   ? 1.5f
                                       : kFormat == SplitFormat::kB3Sym ? 4.0f
                                       : kFormat == SplitFormat::kB4Sym ? 8.0f
                                       : kFormat == SplitFormat::kR6    ? 32.0f
                                                                        : 0.0f;
  // Bytes from one sub-block's codes to the next (Q8_0: its 34-byte block).
  static constexpr int64_t kCodeStride =
      kFormat == SplitFormat::kQ8_0                                       ? 34
      : kFormat == SplitFormat::kR8                                       ? 32
      : kFormat == SplitFormat::kR6                                       ? 24
      : kFormat == SplitFormat::kB4Sym || kFormat == SplitFormat::kB4Asym ? 16
      : kFormat == SplitFormat::kB3Sym || kFormat == SplitFormat::kB3Asym ? 12
                                                                          : 8;
};

inline __m256 HalvesToFloats(__m128i halves) { return _mm256_cvtph_ps(halves); }

// d of the 8 blocks [chunk, chunk + 8) of one row, as f32 (blocks past `chunk_blocks`: 0).
inline __m256 BlockScales(const Problem& p, const uint8_t* row, int64_t chunk, int chunk_blocks) {
  const uint8_t* scales = row + p.layout.scale_offset;
  if (chunk_blocks == kChunkBlocks) {
    switch (p.scale_load) {
      case ScaleLoad::kPerBlock:
        return HalvesToFloats(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * chunk)));
      case ScaleLoad::kPairs: {
        const __m256 four = HalvesToFloats(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 2 * (chunk / 2))));
        return _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
      }
      case ScaleLoad::kQuads: {
        uint32_t two;
        std::memcpy(&two, scales + 2 * (chunk / 4), sizeof(two));
        const __m256 pair = HalvesToFloats(_mm_cvtsi32_si128(static_cast<int>(two)));
        return _mm256_permutevar8x32_ps(pair, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
      }
      case ScaleLoad::kShared:
        return HalvesToFloats(_mm_set1_epi16(
            static_cast<int16_t>(LoadHalf(scales + 2 * (chunk / p.blocks_per_group)))));
      case ScaleLoad::kStrided: {
        // One 32-bit gather per block; the scale is the low half of each (Q8_0: d, qs[0..1]).
        const __m256i words = _mm256_i32gather_epi32(
            reinterpret_cast<const int*>(scales + chunk * p.layout.scale_stride),
            p.strided_scale_index, 1);
        const __m256i low = _mm256_and_si256(words, _mm256_set1_epi32(0xffff));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0x08);
        return HalvesToFloats(_mm256_castsi256_si128(packed));
      }
      case ScaleLoad::kGeneric:
        break;
    }
  }
  // Built in registers (not through a stack array: narrow stores feeding a wide load stall).
  int16_t h[kChunkBlocks];
  for (int j = 0; j < kChunkBlocks; ++j) {
    h[j] = j < chunk_blocks
               ? static_cast<int16_t>(
                     LoadHalf(scales + ((chunk + j) / p.blocks_per_group) * p.layout.scale_stride))
               : 0;
  }
  return HalvesToFloats(_mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
}

// The additive term of groups [g_begin, g_end) (at most 8; missing lanes 0): m for the
// asymmetric formats, -offset * d for the offset ones. -offset * d is exact (the offset is
// 1.5, 4, 8 or 32), so it equals the reference's product.
template <SplitFormat kFormat>
inline __m256 GroupMins(const Problem& p, const uint8_t* row, int64_t g_begin, int64_t g_end) {
  constexpr bool kStoredMin = Traits<kFormat>::kStoredMin;
  const uint8_t* source = row + (kStoredMin ? p.layout.min_offset : p.layout.scale_offset);
  __m256 values;
  if (g_end - g_begin == kGroupsPerRun) {
    values =
        HalvesToFloats(_mm_loadu_si128(reinterpret_cast<const __m128i*>(source + 2 * g_begin)));
  } else {
    int16_t h[kGroupsPerRun];
    for (int k = 0; k < kGroupsPerRun; ++k) {
      h[k] = g_begin + k < g_end ? static_cast<int16_t>(LoadHalf(source + 2 * (g_begin + k))) : 0;
    }
    values = HalvesToFloats(_mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
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
struct Prefetcher {
  const char* next = nullptr;  // next cache line to fetch
  int64_t lines = 0;           // lines left
  int64_t per_chunk = 0;       // lines per chunk step

  void Step() {
    for (int64_t i = 0; i < per_chunk && lines > 0; ++i, --lines, next += 64) {
      _mm_prefetch(next, _MM_HINT_T1);
    }
  }
  void Finish() {
    per_chunk = lines;
    Step();
  }
};

// The kernel: RT weight rows x TT activation rows, accumulators in registers, one pass over
// the weight rows. Every (row, token) pair follows the sequence in split_matmul.h, whatever the
// tile shape. (Not inlined: 9 formats x 9 tile shapes would bloat RunRows for no gain.)
template <SplitFormat kFormat, int RT, int TT>
__attribute__((noinline)) void Tile(const Problem& p, int64_t r0, int64_t t0, Prefetcher prefetch) {
  using T = Traits<kFormat>;
  const MatrixView& w = *p.w;
  const QuantizedActivations& x = *p.x;
  const int64_t blocks_per_group = p.blocks_per_group;
  const int64_t groups = p.layout.groups;
  BITSPLIT_CHECK(static_cast<int64_t>(p.layout.code_stride) == T::kCodeStride);
  const int64_t row_stride = static_cast<int64_t>(w.row_stride);
  const int64_t x_stride = x.cols;

  const uint8_t* rows[RT];
  const uint8_t* codes_base[RT];
  for (int r = 0; r < RT; ++r) {
    rows[r] = w.row(r0 + r);
    codes_base[r] = rows[r] + p.layout.code_offset;
  }
  const int8_t* xcodes[TT];
  const float* xscales[TT];
  for (int t = 0; t < TT; ++t) {
    xcodes[t] = x.row_codes(t0 + t);
    xscales[t] = x.row_scales(t0 + t);
  }
  const __m256i ones16 = _mm256_set1_epi16(1);

  __m256 acc[RT][TT];
#pragma GCC unroll 4
  for (int r = 0; r < RT; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  // scale[span parity][r][t][j] = d(row r, block first + j) * s[t][first + j] for a span of 32
  // blocks, computed eight at a time one span ahead of the block loop (so the broadcast loads
  // never wait for just-stored lines).
  alignas(32) float scale[2][RT][TT][kScaleSpan];
  auto compute_scales = [&](int64_t first, float(*out)[TT][kScaleSpan]) {
    const int span = static_cast<int>(std::min<int64_t>(kScaleSpan, p.layout.sub_blocks - first));
    for (int q = 0; q * kChunkBlocks < span; ++q) {
      const int64_t chunk = first + q * kChunkBlocks;
      const int chunk_blocks = std::min(kChunkBlocks, span - q * kChunkBlocks);
#pragma GCC unroll 4
      for (int r = 0; r < RT; ++r) {
        const __m256 d = BlockScales(p, rows[r], chunk, chunk_blocks);
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) {
          _mm256_store_ps(&out[r][t][q * kChunkBlocks],
                          _mm256_mul_ps(d, _mm256_loadu_ps(xscales[t] + chunk)));
        }
      }
    }
  };
  const int64_t run_blocks = kGroupsPerRun * blocks_per_group;
  int64_t next_run_end = std::min(run_blocks, p.layout.sub_blocks);
  int64_t run_first_group = 0;

  compute_scales(0, scale[0]);
  for (int64_t first = 0, parity = 0; first < p.layout.sub_blocks;
       first += kScaleSpan, parity ^= 1) {
    const int span = static_cast<int>(std::min<int64_t>(kScaleSpan, p.layout.sub_blocks - first));
    if (first + kScaleSpan < p.layout.sub_blocks) {
      compute_scales(first + kScaleSpan, scale[parity ^ 1]);
    }
    float(*span_scale)[TT][kScaleSpan] = scale[parity];
    // One pointer per operand, advanced per block; rows and tokens are fixed strides apart
    // (keeps the loop's addresses in registers).
    const uint8_t* code_pointer = codes_base[0] + first * T::kCodeStride;
    const int8_t* x_pointer = xcodes[0] + first * kActivationBlock;
    // Chunks of 8 blocks; runs of 8 groups are whole chunks (8 * blocks_per_group blocks, from
    // a multiple of 8), so a run can only end at the end of a chunk.
    for (int chunk = 0; chunk < span; chunk += kChunkBlocks) {
      const int chunk_end = std::min(span, chunk + kChunkBlocks);
      prefetch.Step();
      for (int j = chunk; j < chunk_end;
           ++j, code_pointer += T::kCodeStride, x_pointer += kActivationBlock) {
        __m256i codes[RT], magnitudes[RT];
#pragma GCC unroll 4
        for (int r = 0; r < RT; ++r) {
          codes[r] = Codes<kFormat>::Expand(code_pointer + r * row_stride);
          if constexpr (T::kSigned) magnitudes[r] = _mm256_abs_epi8(codes[r]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) {
          const __m256i xv =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_pointer + t * x_stride));
#pragma GCC unroll 4
          for (int r = 0; r < RT; ++r) {
            // Pairs of u8 * s8 products summed to int16 (no saturation: |w| <= 128 with
            // |x| <= 127 for the signed formats, w <= 63 otherwise), then to int32 lanes.
            const __m256i pairs =
                T::kSigned ? _mm256_maddubs_epi16(magnitudes[r], _mm256_sign_epi8(xv, codes[r]))
                           : _mm256_maddubs_epi16(codes[r], xv);
            const __m256i sums = _mm256_madd_epi16(pairs, ones16);
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums),
                                        _mm256_broadcast_ss(&span_scale[r][t][j]), acc[r][t]);
          }
        }
      }
      if constexpr (T::kMinTerm) {
        if (first + chunk_end == next_run_end) {  // the run of 8 groups ends with this chunk
          const int64_t g_begin = run_first_group;
          const int64_t g_end = std::min(groups, g_begin + kGroupsPerRun);
          run_first_group += kGroupsPerRun;
          next_run_end = std::min(next_run_end + run_blocks, p.layout.sub_blocks);
          __m256 mins[RT];
#pragma GCC unroll 4
          for (int r = 0; r < RT; ++r) mins[r] = GroupMins<kFormat>(p, rows[r], g_begin, g_end);
#pragma GCC unroll 4
          for (int t = 0; t < TT; ++t) {
            const __m256 group_sums =
                _mm256_loadu_ps(p.group_sums + (t0 + t) * p.group_stride + g_begin);
#pragma GCC unroll 4
            for (int r = 0; r < RT; ++r) {
              acc[r][t] = _mm256_fmadd_ps(mins[r], group_sums, acc[r][t]);
            }
          }
        }
      }
    }
  }
  prefetch.Finish();
#pragma GCC unroll 4
  for (int t = 0; t < TT; ++t) {
    float* out = p.y + (t0 + t) * w.rows + r0;
#pragma GCC unroll 4
    for (int r = 0; r < RT; ++r) {
      const float v = HorizontalSum(acc[r][t]);
      out[r] = p.accumulate ? out[r] + v : v;
    }
  }
}

// Tiles weight rows [row_begin, row_end) x all tokens. One token: 4 rows per tile for enough
// independent accumulation chains; more tokens: 2 rows x up to 4 tokens (8 accumulators). While
// a row tile is processed, the next row tile of this range is prefetched.
template <SplitFormat kFormat>
void RunRows(const Problem& p, int64_t row_begin, int64_t row_end) {
  const MatrixView& w = *p.w;
  const int64_t tokens = p.x->rows;
  const int64_t chunks = (p.layout.sub_blocks + kChunkBlocks - 1) / kChunkBlocks;
  const int64_t token_tiles = tokens == 1 ? 1 : (tokens + 3) / 4;
  // Every token tile of a row tile prefetches `slice` lines of the next row tile (at most), in
  // steps of `per_chunk` lines. Computed once: divisions per tile would cost more than 5%.
  const int64_t row_tile = tokens == 1 ? 4 : 2;
  const int64_t tile_lines = (row_tile * static_cast<int64_t>(w.row_stride) + 63) / 64;
  const int64_t slice = (tile_lines + token_tiles - 1) / token_tiles;
  const int64_t per_chunk = (slice + chunks - 1) / chunks;
  // Token tile `index` prefetches its slice of rows [next_row, next_end) (of this thread).
  auto prefetch_for = [&](int64_t next_row, int64_t next_end, int64_t index) {
    Prefetcher prefetch;
    if (next_row >= next_end) return prefetch;
    const char* first = reinterpret_cast<const char*>(w.row(next_row));
    const char* last = reinterpret_cast<const char*>(w.row(next_end - 1)) + p.layout.row_bytes;
    const int64_t lines = (last - first + 63) / 64;
    const int64_t begin = std::min(lines, slice * index);
    prefetch.next = first + 64 * begin;
    prefetch.lines = std::min(lines, begin + slice) - begin;
    prefetch.per_chunk = per_chunk;
    return prefetch;
  };
  int64_t r = row_begin;
  if (tokens == 1) {
    for (; r + 4 <= row_end; r += 4) {
      Tile<kFormat, 4, 1>(p, r, 0, prefetch_for(r + 4, std::min(r + 8, row_end), 0));
    }
    for (; r < row_end; ++r) Tile<kFormat, 1, 1>(p, r, 0, Prefetcher());
    return;
  }
  auto token_loop = [&](auto row_tile, int64_t row) {
    constexpr int RT = decltype(row_tile)::value;
    const int64_t next_end = std::min(row + 2 * RT, row_end);
    int64_t t = 0, index = 0;
    for (; t + 4 <= tokens; t += 4, ++index) {
      Tile<kFormat, RT, 4>(p, row, t, prefetch_for(row + RT, next_end, index));
    }
    const Prefetcher last = prefetch_for(row + RT, next_end, index);
    switch (tokens - t) {
      case 3:
        Tile<kFormat, RT, 3>(p, row, t, last);
        break;
      case 2:
        Tile<kFormat, RT, 2>(p, row, t, last);
        break;
      case 1:
        Tile<kFormat, RT, 1>(p, row, t, last);
        break;
      default:
        break;
    }
  };
  for (; r + 2 <= row_end; r += 2) token_loop(std::integral_constant<int, 2>(), r);
  for (; r < row_end; ++r) token_loop(std::integral_constant<int, 1>(), r);
}

using RunRowsFn = void (*)(const Problem&, int64_t, int64_t);

RunRowsFn GetRunRows(SplitFormat format) {
  switch (format) {
    case SplitFormat::kB2Sym:
      return RunRows<SplitFormat::kB2Sym>;
    case SplitFormat::kB2Asym:
      return RunRows<SplitFormat::kB2Asym>;
    case SplitFormat::kB3Sym:
      return RunRows<SplitFormat::kB3Sym>;
    case SplitFormat::kB3Asym:
      return RunRows<SplitFormat::kB3Asym>;
    case SplitFormat::kB4Sym:
      return RunRows<SplitFormat::kB4Sym>;
    case SplitFormat::kB4Asym:
      return RunRows<SplitFormat::kB4Asym>;
    case SplitFormat::kR6:
      return RunRows<SplitFormat::kR6>;
    case SplitFormat::kR8:
      return RunRows<SplitFormat::kR8>;
    case SplitFormat::kQ8_0:
      return RunRows<SplitFormat::kQ8_0>;
  }
  BITSPLIT_CHECK(false);
  return nullptr;
}

void CheckProblem(const MatrixView& w, const QuantizedActivations& x) {
  BITSPLIT_CHECK(ValidateSplitLayout(w.format, w.group, w.cols).ok());
  BITSPLIT_CHECK(w.data != nullptr && w.rows > 0);
  BITSPLIT_CHECK(w.row_stride >= SplitRowBytes(w.format, w.group, w.cols));
  BITSPLIT_CHECK(x.cols == w.cols && x.rows >= 1);
  BITSPLIT_CHECK(x.block_stride == RoundUp(x.cols / kActivationBlock, kChunkBlocks));
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
            _mm256_setzero_si256(),
            nullptr,
            0,
            y,
            accumulate};
  if (p.blocks_per_group == 1 && p.layout.scale_stride >= sizeof(uint32_t)) {
    p.scale_load = ScaleLoad::kStrided;
    p.strided_scale_index =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                           _mm256_set1_epi32(static_cast<int>(p.layout.scale_stride)));
  }
  if (p.layout.scale_stride == sizeof(uint16_t)) {
    if (p.blocks_per_group == 1) p.scale_load = ScaleLoad::kPerBlock;
    if (p.blocks_per_group == 2) p.scale_load = ScaleLoad::kPairs;
    if (p.blocks_per_group == 4) p.scale_load = ScaleLoad::kQuads;
    if (p.blocks_per_group % kChunkBlocks == 0) p.scale_load = ScaleLoad::kShared;
  }
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
  out->block_stride = RoundUp(cols / kActivationBlock, kChunkBlocks);
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

void MatMul(const MatrixView& w, const QuantizedActivations& x, float* y, bool accumulate,
            ThreadPool& pool) {
  CheckProblem(w, x);
  thread_local std::vector<float> group_sums;
  const Problem problem = MakeProblem(w, x, y, accumulate, &group_sums);
  const RunRowsFn run = GetRunRows(w.format);
  // Grain 4 keeps chunk boundaries on row-tile boundaries (tiling never changes results; it
  // only avoids short tiles).
  pool.ParallelForGrained(
      w.rows, 4, [&](int64_t begin, int64_t end, int /*worker*/) { run(problem, begin, end); });
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
      float acc[8] = {};
      for (int64_t g_begin = 0; g_begin < layout.groups; g_begin += kGroupsPerRun) {
        const int64_t g_end = std::min(layout.groups, g_begin + kGroupsPerRun);
        for (int64_t g = g_begin; g < g_end; ++g) {
          const float d = scale_of(g);
          for (int64_t s = 0; s < blocks_per_group; ++s) {
            const int64_t b = g * blocks_per_group + s;
            UnpackSubBlock(w.format, row + layout.code_offset + b * layout.code_stride, codes);
            const int8_t* xc = x.row_codes(t) + b * kActivationBlock;
            const float scale = d * x.row_scales(t)[b];
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
            acc[k] = std::fma(min, group_sum, acc[k]);
          }
        }
      }
      const float v = HorizontalSumReference(acc);
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
