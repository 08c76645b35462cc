#pragma once
// The search behind QuantizeBaseRow: the fp16 scale (and min) of one group of a base format,
// chosen among grid candidates by the importance-weighted squared error of the stored values.
//
// A candidate's codes are a monotone function of the value (nearest level of (w - m) / d or
// w / d + offset, clamped), so over the group sorted by value each level is one contiguous run.
// The fitter sorts a group once, keeps prefix sums of a, a w and a w^2 in that order, and
// evaluates a candidate from how many values land on each level: the least-squares refits and
// the error sum_k (S_ww - 2 y_k S_w + y_k^2 S_a) of level k's run then cost O(levels) instead of
// passes over the values. The codes of a candidate are the exact per-value expressions (computed
// eight sorted values at a time); only the order of the sums differs from a per-value loop.
#include <cmath>
#include <cstdint>
#include <vector>

namespace bitsplit::quant {

// One group's values w and their non-negative weights a (summing to > 0), n of each; n is a
// multiple of 32.
struct GroupData {
  const float* w;
  const float* a;
  int n;
};

// The most levels a base grid has (4 bits).
inline constexpr int kMaxBaseLevels = 16;

// Fits groups one at a time, reusing its buffers; one per thread.
class BaseGroupFitter {
 public:
  // Symmetric grid y = d * (q - offset), q in 0..levels - 1. Grid search around the
  // range-derived scale (the extreme value on an extreme level; mid-tread grids try either
  // end), each candidate also refitted by least squares, then refit rounds from the winner.
  // Writes the codes and returns the fp16 scale (0 for an all-zero group).
  uint16_t FitSymmetric(const GroupData& g, int levels, float offset, uint8_t* codes);

  // Asymmetric grid y = d * q + m, q in 0..levels - 1, in the spirit of llama.cpp's
  // make_qkx2_quants: candidate inverse scales (levels - 1 + delta) / range, each with a
  // least-squares (d, m) refit, then refit rounds from the winner. Writes the codes and the
  // fp16 d and m (d = 0, m = the midpoint for a constant group).
  void FitAsymmetric(const GroupData& g, int levels, uint8_t* codes, uint16_t* d, uint16_t* m);

  // Sums of a, a w and a w^2 over the values on each level.
  struct LevelSums {
    int levels = 0;
    double a[kMaxBaseLevels];
    double aw[kMaxBaseLevels];
    double aww[kMaxBaseLevels];
  };

  // For tests: sorts `g` (as the fits do), then sums per level the values whose code is
  // clamp(nearbyint((w - m) / d), 0, levels - 1) (asymmetric; d > 0) or
  // clamp(nearbyint(w / d + offset), 0, levels - 1) (symmetric; d != 0).
  LevelSums AsymmetricLevelsForTest(const GroupData& g, int levels, float d, float m);
  LevelSums SymmetricLevelsForTest(const GroupData& g, int levels, float d, float offset);

 private:
  struct AsymFit {
    uint16_t d = 0;
    uint16_t m = 0;
    double error = INFINITY;
  };
  struct SymFit {
    uint16_t d = 0;
    double error = INFINITY;
  };

  void Sort(const GroupData& g);
  // Level sums of the sorted values given below[k] = how many codes are < k (k in
  // 1..levels - 1); increasing: the codes do not decrease along the sorted order, else they do
  // not increase.
  void SumLevels(int levels, bool increasing, const int* below, LevelSums* out) const;
  // The level sums of the codes clamp(nearbyint(transform(w)), 0, levels - 1) (transform maps
  // eight sorted values at a time, __m256 to __m256).
  template <typename Transform>
  void TransformLevels(int levels, bool increasing, Transform transform, LevelSums* out);
  void AsymmetricLevels(int levels, float d, float m, LevelSums* out);
  void ScaledLevels(int levels, float origin, float inverse, LevelSums* out);
  void SymmetricLevels(int levels, float d, float offset, LevelSums* out);

  void TryAsymmetric(int levels, float d, float m, AsymFit* best);
  void TrySymmetric(int levels, float d, float offset, SymFit* best);

  int n_ = 0;
  std::vector<float> sorted_;   // the group's values, ascending
  std::vector<double> prefix_;  // 3 (n + 1): running sums of a, a w, a w^2 in sorted order
  std::vector<uint8_t> codes_;  // scratch: a candidate's codes of the sorted values
  std::vector<int32_t> keys_;   // scratch of the sort: order-preserving bits of each value
  std::vector<int> order_;      // scratch of the sort: the index of the value of each rank
};

}  // namespace bitsplit::quant
