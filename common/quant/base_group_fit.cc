#include "common/quant/base_group_fit.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/util/status_macros.h"

namespace bitsplit::quant {
namespace {

constexpr float kFp16Max = 65504.0f;

// fp16 bits nearest to v, saturated to the finite range (so a candidate never becomes inf).
// F16C's conversions round like util/fp16.h's (to nearest even) and cost a tenth as much; a
// fit converts every candidate both ways.
uint16_t ToHalfSaturated(float v) {
  return _cvtss_sh(std::clamp(v, -kFp16Max, kFp16Max), _MM_FROUND_TO_NEAREST_INT);
}
float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// below[k] = how many of the n values (a multiple of 32) have a code q < k, for k in
// 1..levels - 1, where q = clamp(nearbyint(transform(w)), 0, levels - 1). Eight codes at a time
// with the same correctly rounded operations as the scalar expressions, so the same codes; they
// are packed to bytes into `scratch` (n bytes, in an order the packs permute, which counting
// does not see), then compared with each k.
template <typename Transform>
void CountCodesBelow(const float* w, int n, int levels, Transform transform, uint8_t* scratch,
                     int* below) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 top = _mm256_set1_ps(static_cast<float>(levels - 1));
  for (int i = 0; i < n; i += 32) {
    __m256i codes[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 u = _mm256_round_ps(transform(_mm256_loadu_ps(w + i + 8 * j)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      codes[j] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(u, zero), top));
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(codes[0], codes[1]),
                                             _mm256_packs_epi32(codes[2], codes[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(scratch + i), bytes);
  }
  for (int k = 1; k < levels; ++k) {
    const __m256i level = _mm256_set1_epi8(static_cast<char>(k));
    int count = 0;
    for (int i = 0; i < n; i += 32) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scratch + i));
      count += __builtin_popcount(
          static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(level, bytes))));
    }
    below[k] = count;
  }
}

using LevelSums = BaseGroupFitter::LevelSums;

// sum a (w - y_k)^2 over the levels, y_k = value(k) the stored (f32) value of level k.
template <typename Value>
double LevelError(const LevelSums& s, Value value) {
  double error = 0.0;
  for (int k = 0; k < s.levels; ++k) {
    const double y = value(k);
    error += s.aww[k] - 2.0 * y * s.aw[k] + y * y * s.a[k];
  }
  return error;
}

double SymmetricError(const LevelSums& s, float d, float offset) {
  return LevelError(s, [&](int k) { return d * (static_cast<float>(k) - offset); });
}

double AsymmetricError(const LevelSums& s, float d, float m) {
  return LevelError(s, [&](int k) { return d * static_cast<float>(k) + m; });
}

// Least-squares scale for fixed codes: argmin_d sum a (w - d c)^2 = sum a w c / sum a c^2.
bool SymmetricRefit(const LevelSums& s, float offset, float* d) {
  double wc = 0.0, cc = 0.0;
  for (int k = 0; k < s.levels; ++k) {
    const double c = static_cast<double>(k) - offset;
    wc += c * s.aw[k];
    cc += c * c * s.a[k];
  }
  if (cc <= 0.0) return false;
  *d = static_cast<float>(wc / cc);
  return std::isfinite(*d);
}

// Weighted least squares of (d, m) for fixed codes: minimize sum a (d q + m - w)^2.
bool AsymmetricRefit(const LevelSums& s, float* d, float* m) {
  double sa = 0, sq = 0, sqq = 0, sw = 0, sqw = 0;
  for (int k = 0; k < s.levels; ++k) {
    sa += s.a[k];
    sq += k * s.a[k];
    sqq += static_cast<double>(k) * k * s.a[k];
    sw += s.aw[k];
    sqw += k * s.aw[k];
  }
  const double det = sa * sqq - sq * sq;
  if (!(det > 0.0)) return false;
  *d = static_cast<float>((sa * sqw - sq * sw) / det);
  *m = static_cast<float>((sqq * sw - sq * sqw) / det);
  return *d > 0.0f && std::isfinite(*d) && std::isfinite(*m);
}

// With the min already rounded, the best scale: argmin_d sum a (w - m - d q)^2.
bool AsymmetricRefitScale(const LevelSums& s, float m, float* d) {
  double num = 0, den = 0;
  for (int k = 0; k < s.levels; ++k) {
    num += k * (s.aw[k] - m * s.a[k]);
    den += static_cast<double>(k) * k * s.a[k];
  }
  if (!(den > 0.0)) return false;
  *d = static_cast<float>(num / den);
  return *d > 0.0f && std::isfinite(*d);
}

// The codes in the group's own order (the stored ones), from the stored parameters.
void SymmetricCodes(const GroupData& g, float d, int levels, float offset, uint8_t* q) {
  for (int i = 0; i < g.n; ++i) {
    const float u = d != 0.0f ? std::nearbyint(g.w[i] / d + offset) : std::nearbyint(offset);
    q[i] = static_cast<uint8_t>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
  }
}

void AsymmetricCodes(const GroupData& g, float d, float m, int levels, uint8_t* q) {
  for (int i = 0; i < g.n; ++i) {
    const float u = d != 0.0f ? std::nearbyint((g.w[i] - m) / d) : 0.0f;
    q[i] = static_cast<uint8_t>(std::clamp(u, 0.0f, static_cast<float>(levels - 1)));
  }
}

}  // namespace

void BaseGroupFitter::Sort(const GroupData& g) {
  BITSPLIT_CHECK(g.n > 0 && g.n % 32 == 0);
  n_ = g.n;
  // The value's bits made order-preserving, as signed 32-bit keys (-0 sorts before +0; both get
  // the same code, so the order of equal values does not matter).
  keys_.resize(n_);
  for (int i = 0; i < n_; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &g.w[i], sizeof(bits));
    bits ^= (bits >> 31) != 0 ? 0x7fffffffu : 0u;
    keys_[i] = static_cast<int32_t>(bits);
  }
  // The permutation by rank: value i goes to position #{j : key j < key i} + #{j < i : key j =
  // key i}, counted eight keys at a time. For a group (64 values) that is 512 compares with no
  // branch, where a comparison sort mispredicts about one branch in two; the sort was a quarter
  // of the quantizer's time.
  order_.resize(n_);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < n_; ++i) {
    const __m256i key = _mm256_set1_epi32(keys_[i]);
    const __m256i index = _mm256_set1_epi32(i);
    __m256i count = _mm256_setzero_si256();
    for (int j = 0; j < n_; j += 8) {
      const __m256i other = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&keys_[j]));
      const __m256i before =
          _mm256_cmpgt_epi32(index, _mm256_add_epi32(lane, _mm256_set1_epi32(j)));
      const __m256i less = _mm256_cmpgt_epi32(key, other);
      const __m256i tie = _mm256_and_si256(_mm256_cmpeq_epi32(key, other), before);
      count = _mm256_sub_epi32(count, _mm256_or_si256(less, tie));  // a true lane is -1
    }
    const __m128i quad =
        _mm_add_epi32(_mm256_castsi256_si128(count), _mm256_extracti128_si256(count, 1));
    const __m128i pair = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
    const int rank = _mm_cvtsi128_si32(_mm_add_epi32(pair, _mm_shuffle_epi32(pair, 1)));
    order_[rank] = i;
  }
  sorted_.resize(n_);
  codes_.resize(n_);
  prefix_.resize(3 * static_cast<size_t>(n_ + 1));
  double* a = prefix_.data();
  double* aw = a + (n_ + 1);
  double* aww = aw + (n_ + 1);
  a[0] = aw[0] = aww[0] = 0.0;
  for (int i = 0; i < n_; ++i) {
    const int index = order_[i];
    const double w = g.w[index], weight = g.a[index];
    sorted_[i] = g.w[index];
    a[i + 1] = a[i] + weight;
    aw[i + 1] = aw[i] + weight * w;
    aww[i + 1] = aww[i] + weight * w * w;
  }
}

void BaseGroupFitter::SumLevels(int levels, bool increasing, const int* below,
                                LevelSums* out) const {
  const double* a = prefix_.data();
  const double* aw = a + (n_ + 1);
  const double* aww = aw + (n_ + 1);
  out->levels = levels;
  // Level k holds the sorted values [below(k), below(k + 1)) when the codes increase along the
  // sorted order, [n - below(k + 1), n - below(k)) when they decrease.
  for (int k = 0; k < levels; ++k) {
    const int lower = k > 0 ? below[k] : 0;
    const int upper = k + 1 < levels ? below[k + 1] : n_;
    const int begin = increasing ? lower : n_ - upper;
    const int end = increasing ? upper : n_ - lower;
    out->a[k] = a[end] - a[begin];
    out->aw[k] = aw[end] - aw[begin];
    out->aww[k] = aww[end] - aww[begin];
  }
}

template <typename Transform>
void BaseGroupFitter::TransformLevels(int levels, bool increasing, Transform transform,
                                      LevelSums* out) {
  int below[kMaxBaseLevels];
  CountCodesBelow(sorted_.data(), n_, levels, transform, codes_.data(), below);
  SumLevels(levels, increasing, below, out);
}

void BaseGroupFitter::AsymmetricLevels(int levels, float d, float m, LevelSums* out) {
  BITSPLIT_CHECK(d > 0.0f);
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  TransformLevels(
      levels, /*increasing=*/true,
      [&](__m256 w) { return _mm256_div_ps(_mm256_sub_ps(w, vm), vd); }, out);
}

void BaseGroupFitter::ScaledLevels(int levels, float origin, float inverse, LevelSums* out) {
  BITSPLIT_CHECK(inverse >= 0.0f);
  const __m256 vo = _mm256_set1_ps(origin), vi = _mm256_set1_ps(inverse);
  TransformLevels(
      levels, /*increasing=*/true,
      [&](__m256 w) { return _mm256_mul_ps(_mm256_sub_ps(w, vo), vi); }, out);
}

void BaseGroupFitter::SymmetricLevels(int levels, float d, float offset, LevelSums* out) {
  BITSPLIT_CHECK(d != 0.0f);
  const __m256 vd = _mm256_set1_ps(d), vo = _mm256_set1_ps(offset);
  TransformLevels(
      levels, /*increasing=*/d > 0.0f,
      [&](__m256 w) { return _mm256_add_ps(_mm256_div_ps(w, vd), vo); }, out);
}

void BaseGroupFitter::TrySymmetric(int levels, float d, float offset, SymFit* best) {
  const uint16_t h = ToHalfSaturated(d);
  const float rounded = HalfToFloat(h);
  if (rounded == 0.0f) return;
  LevelSums sums;
  SymmetricLevels(levels, rounded, offset, &sums);
  const double error = SymmetricError(sums, rounded, offset);
  if (error < best->error) *best = {h, error};
}

uint16_t BaseGroupFitter::FitSymmetric(const GroupData& g, int levels, float offset,
                                       uint8_t* codes) {
  BITSPLIT_CHECK(levels <= kMaxBaseLevels);
  float amax = 0.0f, extreme = 0.0f;
  for (int i = 0; i < g.n; ++i) {
    if (std::fabs(g.w[i]) > amax) {
      amax = std::fabs(g.w[i]);
      extreme = g.w[i];
    }
  }
  if (amax == 0.0f) {
    SymmetricCodes(g, 0.0f, levels, offset, codes);
    return 0;
  }
  // Mid-rise grids are symmetric: one orientation. Mid-tread grids have one more negative level,
  // so try the extreme on either end (the scale's sign picks which side gets the extra level).
  float bases[2];
  int base_count = 0;
  const float top = static_cast<float>(levels - 1) - offset;  // largest positive code
  if (top == offset) {
    bases[base_count++] = amax / offset;
  } else {
    bases[base_count++] = extreme / -offset;
    bases[base_count++] = extreme / top;
  }
  Sort(g);
  SymFit best;
  LevelSums sums;
  for (int b = 0; b < base_count; ++b) {
    for (int k = 0; k <= 40; ++k) {
      const float d = bases[b] * (0.4f + 0.02f * static_cast<float>(k));
      TrySymmetric(levels, d, offset, &best);
      SymmetricLevels(levels, d, offset, &sums);
      float refit;
      if (SymmetricRefit(sums, offset, &refit)) TrySymmetric(levels, refit, offset, &best);
    }
  }
  for (int round = 0; round < 3 && std::isfinite(best.error); ++round) {
    SymmetricLevels(levels, HalfToFloat(best.d), offset, &sums);
    float refit;
    if (!SymmetricRefit(sums, offset, &refit)) break;
    const SymFit before = best;
    TrySymmetric(levels, refit, offset, &best);
    if (best.d == before.d) break;
  }
  if (!std::isfinite(best.error)) best.d = 0;  // every candidate underflowed fp16
  SymmetricCodes(g, HalfToFloat(best.d), levels, offset, codes);
  return best.d;
}

void BaseGroupFitter::TryAsymmetric(int levels, float d, float m, AsymFit* best) {
  const uint16_t dh = ToHalfSaturated(d);
  const uint16_t mh = ToHalfSaturated(m);
  const float dr = HalfToFloat(dh), mr = HalfToFloat(mh);
  if (dr <= 0.0f) return;
  LevelSums sums;
  AsymmetricLevels(levels, dr, mr, &sums);
  double error = AsymmetricError(sums, dr, mr);
  if (error < best->error) *best = {dh, mh, error};
  // Rounding m moved every value; re-fit d for the rounded m and the new codes.
  float refit;
  if (AsymmetricRefitScale(sums, mr, &refit)) {
    const uint16_t rh = ToHalfSaturated(refit);
    const float rr = HalfToFloat(rh);
    if (rr > 0.0f && rh != dh) {
      AsymmetricLevels(levels, rr, mr, &sums);
      error = AsymmetricError(sums, rr, mr);
      if (error < best->error) *best = {rh, mh, error};
    }
  }
}

void BaseGroupFitter::FitAsymmetric(const GroupData& g, int levels, uint8_t* codes, uint16_t* d_out,
                                    uint16_t* m_out) {
  BITSPLIT_CHECK(levels <= kMaxBaseLevels);
  float lo = g.w[0], hi = g.w[0];
  for (int i = 1; i < g.n; ++i) {
    lo = std::min(lo, g.w[i]);
    hi = std::max(hi, g.w[i]);
  }
  AsymFit best;
  const float range = hi - lo;
  if (range > 0.0f && std::isfinite(range)) {
    Sort(g);
    LevelSums sums;
    TryAsymmetric(levels, range / static_cast<float>(levels - 1), lo, &best);
    for (int k = -10; k <= 10; ++k) {
      const float inverse = (static_cast<float>(levels - 1) + 0.1f * k) / range;
      ScaledLevels(levels, lo, inverse, &sums);
      float d, m;
      if (AsymmetricRefit(sums, &d, &m)) TryAsymmetric(levels, d, m, &best);
    }
    for (int round = 0; round < 3 && std::isfinite(best.error); ++round) {
      AsymmetricLevels(levels, HalfToFloat(best.d), HalfToFloat(best.m), &sums);
      float d, m;
      if (!AsymmetricRefit(sums, &d, &m)) break;
      const AsymFit before = best;
      TryAsymmetric(levels, d, m, &best);
      if (best.d == before.d && best.m == before.m) break;
    }
  }
  if (!std::isfinite(best.error)) {  // a constant group (or a range below fp16 resolution)
    const float mean = 0.5f * lo + 0.5f * hi;
    best = {0, ToHalfSaturated(mean), 0.0};
  }
  *d_out = best.d;
  *m_out = best.m;
  AsymmetricCodes(g, HalfToFloat(best.d), HalfToFloat(best.m), levels, codes);
}

BaseGroupFitter::LevelSums BaseGroupFitter::AsymmetricLevelsForTest(const GroupData& g, int levels,
                                                                    float d, float m) {
  Sort(g);
  LevelSums sums;
  AsymmetricLevels(levels, d, m, &sums);
  return sums;
}

BaseGroupFitter::LevelSums BaseGroupFitter::SymmetricLevelsForTest(const GroupData& g, int levels,
                                                                   float d, float offset) {
  Sort(g);
  LevelSums sums;
  SymmetricLevels(levels, d, offset, &sums);
  return sums;
}

}  // namespace bitsplit::quant
