// The target's choice per tree node on the device (Sampler::Choose: greedy argmax, or a seeded
// sample after temperature / top-k / top-p), and the draft's top-k children per row.
//
// Candidates are ordered by (logit desc, id asc), as Sampler sorts them. Instead of sorting the
// vocabulary, every row is searched in that order through one 64-bit key per token,
//   key = (orderable bits of the logit) << 32 | (0xFFFFFFFF - id),
// which is larger exactly when the candidate comes earlier. "The first n candidates" is then
// {key >= K} for some K, and each truncation / draw is a binary search for the largest K whose
// prefix has enough count or probability mass (the high word first, then the low word only when
// several tokens share the logit). Counts are exact; masses are double sums in a fixed tree.

#include <cstdint>

#include "common/cuda/kernels.h"

namespace bitsplit::cuda::kernels {
namespace {

constexpr int kRowThreads = 512;

// -0 and +0 compare equal on the CPU, so they share a key.
__device__ __forceinline__ uint32_t OrderedBits(float value) {
  if (value == 0.0f) value = 0.0f;
  const uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ uint64_t CandidateKey(float logit, int64_t id) {
  return (static_cast<uint64_t>(OrderedBits(logit)) << 32) |
         (0xFFFFFFFFull - static_cast<uint64_t>(id));
}

__device__ __forceinline__ int32_t IdOfKey(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFull - (key & 0xFFFFFFFFull));
}

template <typename T, typename Op>
__device__ T BlockReduce(T value, T* shared, Op op) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

struct Max64 {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
};
struct Min64 {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; }
};
struct SumDouble {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct SumCount {
  __device__ long long operator()(long long a, long long b) const { return a + b; }
};
struct MaxFloat {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void __launch_bounds__(kRowThreads)
    ArgMaxKernel(const float* logits, int64_t vocab, int32_t* choices) {
  __shared__ uint64_t shared[kRowThreads];
  const float* row = logits + blockIdx.x * vocab;
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
    const uint64_t key = CandidateKey(row[i], i);
    best = key > best ? key : best;
  }
  best = BlockReduce(best, shared, Max64());
  if (threadIdx.x == 0) choices[blockIdx.x] = IdOfKey(best);
}

// The row's candidates with key >= floor, searched in candidate order.
struct RowSearch {
  const float* logits;
  const double* weights;
  int64_t vocab;
  uint64_t floor;  // candidates below it are truncated away

  // Count or mass of the candidates with key >= max(bound, floor).
  __device__ long long Count(uint64_t bound, long long* shared) const {
    const uint64_t limit = bound > floor ? bound : floor;
    long long count = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
      count += CandidateKey(logits[i], i) >= limit ? 1 : 0;
    }
    return BlockReduce(count, shared, SumCount());
  }
  __device__ double Mass(uint64_t bound, double* shared) const {
    const uint64_t limit = bound > floor ? bound : floor;
    double mass = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
      if (CandidateKey(logits[i], i) >= limit) mass += weights[i];
    }
    return BlockReduce(mass, shared, SumDouble());
  }

  // The largest key K with holds(K), where holds is monotone (true up to some key) and
  // holds(floor) is true: the key of the candidate at which the prefix first has enough.
  template <typename Holds>
  __device__ uint64_t LargestKey(Holds holds, long long* count_shared) const {
    uint64_t low = 0, high = 0xFFFFFFFFull;  // the high word
    while (low < high) {
      const uint64_t mid = low + (high - low + 1) / 2;
      if (holds(mid << 32)) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    const uint64_t high_word = low << 32;
    // Only ties at this logit need the low word (the ids); a single candidate is the answer.
    const long long tied =
        Count(high_word, count_shared) - Count(high_word + (1ull << 32), count_shared);
    if (tied <= 1 && high_word >= floor) {
      uint64_t key = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
        const uint64_t k = CandidateKey(logits[i], i);
        if ((k >> 32) == (high_word >> 32) && k > key) key = k;
      }
      return BlockReduce(key, reinterpret_cast<uint64_t*>(count_shared), Max64());
    }
    low = 0;
    high = 0xFFFFFFFFull;
    while (low < high) {
      const uint64_t mid = low + (high - low + 1) / 2;
      if (holds(high_word | mid)) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    const uint64_t key = high_word | low;
    return key > floor ? key : floor;
  }
};

__global__ void __launch_bounds__(kRowThreads) SampleKernel(SamplingArgs a) {
  __shared__ double mass_shared[kRowThreads];
  __shared__ long long count_shared[kRowThreads];
  __shared__ float max_shared[kRowThreads];
  const int64_t r = blockIdx.x;
  const float* logits = a.logits + r * a.vocab;
  double* weights = a.weights + r * a.vocab;

  // Sampler::BuildDistribution: weight = exp(logit / temperature - peak).
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < a.vocab; i += kRowThreads)
    local_max = fmaxf(local_max, logits[i]);
  const float max_logit = BlockReduce(local_max, max_shared, MaxFloat());
  const double peak = static_cast<double>(max_logit) / a.temperature;
  for (int64_t i = threadIdx.x; i < a.vocab; i += kRowThreads) {
    weights[i] = exp(static_cast<double>(logits[i]) / a.temperature - peak);
  }
  __syncthreads();

  RowSearch search{logits, weights, a.vocab, 0};
  if (a.top_k > 0 && a.top_k < a.vocab) {
    const long long k = a.top_k;
    search.floor = search.LargestKey(
        [&](uint64_t bound) { return search.Count(bound, count_shared) >= k; }, count_shared);
  }
  double kept = search.Mass(0, mass_shared);
  if (a.top_p < 1.0) {
    // The smallest prefix whose normalized mass reaches top_p.
    const double needed = a.top_p * kept;
    search.floor = search.LargestKey(
        [&](uint64_t bound) { return search.Mass(bound, mass_shared) >= needed; }, count_shared);
    kept = search.Mass(0, mass_shared);
  }
  // The draw: the first candidate whose cumulative probability exceeds u.
  const double target = PhiloxUniform(a.seed, a.positions[r]) * kept;
  int32_t choice;
  if (kept > target) {
    choice = IdOfKey(search.LargestKey(
        [&](uint64_t bound) { return search.Mass(bound, mass_shared) > target; }, count_shared));
  } else {  // u within rounding of 1: the last kept candidate
    uint64_t smallest = ~0ull;
    for (int64_t i = threadIdx.x; i < a.vocab; i += kRowThreads) {
      const uint64_t key = CandidateKey(logits[i], i);
      if (key >= search.floor && key < smallest) smallest = key;
    }
    choice = IdOfKey(BlockReduce(smallest, reinterpret_cast<uint64_t*>(count_shared), Min64()));
  }
  if (threadIdx.x == 0) a.choices[r] = choice;
}

__global__ void __launch_bounds__(kRowThreads)
    TopKKernel(const float* logits, int64_t vocab, int32_t k, int32_t* ids, float* top_logits,
               double* log_normalizers) {
  __shared__ uint64_t key_shared[kRowThreads];
  __shared__ double sum_shared[kRowThreads];
  __shared__ float max_shared[kRowThreads];
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  uint64_t previous = ~0ull;
  for (int32_t j = 0; j < k; ++j) {
    uint64_t best = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
      const uint64_t key = CandidateKey(row[i], i);
      if (key < previous && key > best) best = key;
    }
    best = BlockReduce(best, key_shared, Max64());
    if (threadIdx.x == 0) {
      ids[r * k + j] = IdOfKey(best);
      top_logits[r * k + j] = row[IdOfKey(best)];
    }
    previous = best;
  }
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) local_max = fmaxf(local_max, row[i]);
  const float max_logit = BlockReduce(local_max, max_shared, MaxFloat());
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
    sum += exp(static_cast<double>(__fsub_rn(row[i], max_logit)));
  }
  sum = BlockReduce(sum, sum_shared, SumDouble());
  if (threadIdx.x == 0) log_normalizers[r] = static_cast<double>(max_logit) + log(sum);
}

__global__ void UniformKernel(uint64_t seed, const int64_t* positions, int64_t count, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = PhiloxUniform(seed, positions[i]);
}

}  // namespace

cudaError_t ArgMaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* choices,
                       cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ArgMaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, choices);
  return cudaGetLastError();
}

cudaError_t SampleRows(const SamplingArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (!(args.temperature > 0.0) || !(args.top_p > 0.0 && args.top_p <= 1.0) || args.top_k < 0) {
    return cudaErrorInvalidValue;
  }
  SampleKernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t TopKRows(const float* logits, int64_t rows, int64_t vocab, int32_t k, int32_t* ids,
                     float* top_logits, double* log_normalizers, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (k < 0 || k > 64 || k > vocab) return cudaErrorInvalidValue;
  TopKKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, k, ids,
                                                                      top_logits, log_normalizers);
  return cudaGetLastError();
}

cudaError_t UniformForPositions(uint64_t seed, const int64_t* positions, int64_t count, double* out,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  UniformKernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(seed, positions,
                                                                                count, out);
  return cudaGetLastError();
}

}  // namespace bitsplit::cuda::kernels
