// The CUDA kernels against the CPU implementations they mirror, on random inputs: bit for bit
// where the kernel reproduces the CPU's arithmetic (rotation, activation quantization, split
// matmul for all nine formats, embedding gather, RoPE in both pairings, bias adds and scaling,
// GeGLU, the sliding window's slot lists and positions, attention scores order, argmax, top-k,
// the RNG), by NMSE where it cannot (RMSNorm's, also per head, and softmax's double sums in a
// tree, expf), and batch invariance (a row alone equals the same row inside a batch; a tree node
// its causal path, with and without a window). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef BITSPLIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "common/cuda/cuda_model.h"
#include "common/cuda/device_info.h"
#include "common/cuda/kernels.h"
#include "common/model/expert_routing.h"
#include "common/model/kv_cache.h"
#include "common/model/sampler.h"
#include "common/model/vram_plan.h"
#include "common/ops/activation.h"
#include "common/ops/attention.h"
#include "common/ops/matmul.h"
#include "common/ops/rmsnorm.h"
#include "common/ops/rope.h"
#include "common/ops/softmax.h"
#include "common/quant/ggml_blocks.h"
#include "common/quant/hadamard.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/util/fp16.h"
#include "common/util/thread_pool.h"
#include "tests/testing/metrics.h"
#endif

namespace bitsplit::cuda {
namespace {

#ifndef BITSPLIT_HAVE_CUDA
TEST(CudaKernelsTest, SkippedWithoutCuda) {
  GTEST_SKIP() << "built without BITSPLIT_CUDA (no nvcc found at configure time)";
}
#else

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CountDevices() == 0) {
      GTEST_SKIP() << "CUDA code compiled, but no CUDA device is visible on this machine";
    }
  }
};

// A device copy of a host vector (and back).
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> ToHost() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

using testing::Nmse;

void ExpectBitsEqual(const std::vector<float>& actual, const std::vector<float>& expected,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    uint32_t a, e;
    std::memcpy(&a, &actual[i], 4);
    std::memcpy(&e, &expected[i], 4);
    ASSERT_EQ(a, e) << what << " differs at " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

// Device activations of a CPU QuantizedActivations.
struct DeviceQuantized {
  DeviceVector<int8_t> codes;
  DeviceVector<float> scales;
  DeviceVector<float> sums;
  kernels::DeviceActivations view;
  explicit DeviceQuantized(const quant::QuantizedActivations& x)
      : codes(x.codes), scales(x.scales), sums(x.sums) {
    view = {codes.get(), scales.get(), sums.get(), x.rows, x.cols, x.block_stride};
  }
};

// A split-format matrix of random weights quantized by the CPU quantizers.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  quant::MatrixView view;
};

HostMatrix RandomMatrix(quant::SplitFormat format, int group, int64_t rows, int64_t cols,
                        uint32_t seed) {
  HostMatrix m;
  const size_t row_bytes = quant::SplitRowBytes(format, group, cols);
  m.bytes.resize(row_bytes * rows);
  const std::vector<float> w = RandomFloats(static_cast<size_t>(rows * cols), seed, 0.05f);
  const quant::SplitFormatInfo& info = quant::GetSplitFormatInfo(format);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w.data() + r * cols;
    uint8_t* out = m.bytes.data() + r * row_bytes;
    if (format == quant::SplitFormat::kQ8_0) {
      quant::QuantizeQ8_0SplitRow(row, cols, out);
    } else if (info.is_residual) {
      EXPECT_TRUE(quant::QuantizeResidualRow(format, group, row, cols, out).ok());
    } else {
      EXPECT_TRUE(quant::QuantizeBaseRow(format, group, row, nullptr, cols, out).ok());
    }
  }
  m.view = *quant::MakeMatrixView(format, group, rows, cols, m.bytes.data(), m.bytes.size());
  return m;
}

// The matrix on the device with rows padded as the CUDA backend pads them.
struct DeviceMatrixCopy {
  DeviceVector<uint8_t> bytes;
  kernels::DeviceMatrix matrix;
  explicit DeviceMatrixCopy(const quant::MatrixView& v)
      : bytes(model::DeviceRowStride(v.format, v.group, v.cols) * v.rows) {
    const size_t stride = model::DeviceRowStride(v.format, v.group, v.cols);
    const size_t row_bytes = quant::SplitRowBytes(v.format, v.group, v.cols);
    EXPECT_EQ(cudaMemcpy2D(bytes.get(), stride, v.data, v.row_stride, row_bytes, v.rows,
                           cudaMemcpyHostToDevice),
              cudaSuccess);
    matrix = cuda::DeviceMatrixOf(v, bytes.get(), static_cast<int64_t>(stride));
  }
};

// One matrix's SplitMatMul on the device: y = x · Wᵀ into `out` (added to it with accumulate).
cudaError_t OneMatrixMatMul(const kernels::DeviceMatrix& matrix,
                            const kernels::DeviceActivations& x, float* out, bool accumulate) {
  kernels::GroupMatMul group;
  group.matrices[0] = matrix;
  group.outputs[0] = out;
  group.count = 1;
  return kernels::SplitMatMul(group, x, accumulate, nullptr);
}

TEST_F(CudaKernelsTest, HadamardRotationMatchesCpuBitForBit) {
  for (const int block : {8, 64, 128, 1024}) {
    const int64_t rows = 5, cols = 2048;
    std::vector<float> x = RandomFloats(rows * cols, 11 + block);
    std::vector<uint32_t> masks(cols);
    for (int64_t c = 0; c < cols; ++c) {
      masks[c] = quant::HadamardSign(7, c) < 0 ? 0x80000000u : 0u;
    }
    DeviceVector<float> device(x);
    DeviceVector<uint32_t> device_masks(masks);
    ASSERT_CUDA(kernels::HadamardRotate(device.get(), rows, cols, block, device_masks.get(),
                                        quant::HadamardScale(block), nullptr));
    quant::HadamardRotateRowsReference(x.data(), rows, cols, block, 7);
    ExpectBitsEqual(device.ToHost(), x, "block " + std::to_string(block));
  }
}

TEST_F(CudaKernelsTest, ActivationQuantizationMatchesCpuBitForBit) {
  const int64_t rows = 7, cols = 320;  // 10 blocks: block stride 16, six padding blocks
  std::vector<float> x = RandomFloats(rows * cols, 3);
  for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;        // an all-zero block
  for (int j = 0; j < 32; ++j) x[64 + j] = 1e-38f * j;  // 1/s overflows: stored as zeros
  x[100] = 1e30f;                                       // a huge outlier
  quant::QuantizedActivations expected;
  quant::QuantizeActivationsReference(x.data(), rows, cols, &expected);
  DeviceVector<float> input(x);
  DeviceVector<int8_t> codes(rows * cols);
  DeviceVector<float> scales(rows * expected.block_stride), sums(rows * expected.block_stride);
  ASSERT_CUDA(kernels::QuantizeActivations(input.get(), rows, cols, codes.get(), scales.get(),
                                           sums.get(), expected.block_stride, nullptr));
  EXPECT_EQ(codes.ToHost(), expected.codes);
  ExpectBitsEqual(scales.ToHost(), expected.scales, "scales");
  ExpectBitsEqual(sums.ToHost(), expected.sums, "sums");
}

struct FormatCase {
  quant::SplitFormat format;
  int group;
};

std::vector<FormatCase> AllFormatCases() {
  std::vector<FormatCase> cases;
  for (int f = 0; f < quant::kNumSplitFormats; ++f) {
    const auto format = static_cast<quant::SplitFormat>(f);
    if (format == quant::SplitFormat::kQ8_0) {
      cases.push_back({format, 32});
      continue;
    }
    for (const int group : {32, 64, 128, 160}) cases.push_back({format, group});
  }
  return cases;
}

TEST_F(CudaKernelsTest, SplitMatMulMatchesReferenceBitForBitForEveryFormat) {
  // 320 columns: 10 groups of 32 (a full run of 8 and a partial one), 5 of 64, 2 of 160 (the
  // kernel's any-group-size path); 1280: whole runs of 64 and 128 (the kernels compiled for the
  // group size) and a partial run after them. 37 rows leave a partial CUDA block.
  const int64_t rows = 37;
  for (const FormatCase& c : AllFormatCases()) {
    for (const int64_t cols : {int64_t{320}, int64_t{1280}}) {
      if (cols % c.group != 0) continue;
      const HostMatrix m = RandomMatrix(c.format, c.group, rows, cols, 100 + c.group);
      const DeviceMatrixCopy device_matrix(m.view);
      for (const int64_t tokens : {1, 3, 9, 16}) {
        const std::vector<float> x = RandomFloats(tokens * cols, 5 + tokens);
        quant::QuantizedActivations qx;
        quant::QuantizeActivations(x.data(), tokens, cols, &qx);
        const DeviceQuantized dx(qx);
        for (const bool accumulate : {false, true}) {
          std::vector<float> expected = RandomFloats(tokens * rows, 9);
          DeviceVector<float> out(expected);
          quant::MatMulReference(m.view, qx, expected.data(), accumulate);
          ASSERT_CUDA(OneMatrixMatMul(device_matrix.matrix, dx.view, out.get(), accumulate));
          ExpectBitsEqual(out.ToHost(), expected,
                          std::string(quant::GetSplitFormatInfo(c.format).name) + "/g" +
                              std::to_string(c.group) + " cols " + std::to_string(cols) +
                              " T=" + std::to_string(tokens) + (accumulate ? " accumulate" : ""));
        }
      }
    }
  }
}

// The ternary base: 7-byte sub-blocks start at every offset mod 4 (the kernel loads their bytes
// one by one), and bytes that the quantizer never writes (every value 0..255, not only the 243
// encodings) still decode to the reference's trits.
TEST_F(CudaKernelsTest, SplitMatMulTernaryOnEveryByteValueAndAlignment) {
  const int64_t rows = 19, cols = 7 * 32;
  for (const int group : {32, 224}) {
    HostMatrix m = RandomMatrix(quant::SplitFormat::kBTern, group, rows, cols, 55);
    const quant::SplitRowLayout layout =
        quant::GetSplitRowLayout(quant::SplitFormat::kBTern, group, cols);
    const size_t row_bytes = quant::SplitRowBytes(quant::SplitFormat::kBTern, group, cols);
    int value = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < layout.scale_offset; ++i) {
        m.bytes[r * row_bytes + i] = static_cast<uint8_t>(value++ % 256);
      }
    }
    const DeviceMatrixCopy device_matrix(m.view);
    for (const int64_t tokens : {1, 5}) {
      const std::vector<float> x = RandomFloats(tokens * cols, 60 + tokens);
      quant::QuantizedActivations qx;
      quant::QuantizeActivations(x.data(), tokens, cols, &qx);
      const DeviceQuantized dx(qx);
      std::vector<float> expected(tokens * rows);
      DeviceVector<float> out(expected);
      quant::MatMulReference(m.view, qx, expected.data(), false);
      ASSERT_CUDA(OneMatrixMatMul(device_matrix.matrix, dx.view, out.get(), false));
      ExpectBitsEqual(out.ToHost(), expected,
                      "bt_sym/g" + std::to_string(group) + " T=" + std::to_string(tokens));
    }
  }
}

TEST_F(CudaKernelsTest, SplitMatMulGroupOfThreeMatricesMatchesEachAlone) {
  const int64_t cols = 256;
  const int64_t row_counts[] = {64, 16, 40};
  std::vector<HostMatrix> host;
  std::vector<std::unique_ptr<DeviceMatrixCopy> > device;
  for (int i = 0; i < 3; ++i) {
    host.push_back(RandomMatrix(quant::SplitFormat::kB2Asym, 64, row_counts[i], cols, 40 + i));
    device.push_back(std::make_unique<DeviceMatrixCopy>(host.back().view));
  }
  const int64_t tokens = 11;
  const std::vector<float> x = RandomFloats(tokens * cols, 8);
  quant::QuantizedActivations qx;
  quant::QuantizeActivations(x.data(), tokens, cols, &qx);
  const DeviceQuantized dx(qx);
  kernels::GroupMatMul group;
  std::vector<std::unique_ptr<DeviceVector<float> > > outs;
  for (int i = 0; i < 3; ++i) {
    outs.push_back(std::make_unique<DeviceVector<float> >(tokens * row_counts[i]));
    group.matrices[i] = device[i]->matrix;
    group.outputs[i] = outs[i]->get();
  }
  group.count = 3;
  ASSERT_CUDA(kernels::SplitMatMul(group, dx.view, false, nullptr));
  for (int i = 0; i < 3; ++i) {
    std::vector<float> expected(tokens * row_counts[i]);
    quant::MatMulReference(host[i].view, qx, expected.data(), false);
    ExpectBitsEqual(outs[i]->ToHost(), expected, "matrix " + std::to_string(i));
  }
}

TEST_F(CudaKernelsTest, SplitMatMulRowAloneEqualsRowInABatch) {
  const int64_t rows = 96, cols = 512;
  const HostMatrix m = RandomMatrix(quant::SplitFormat::kB3Sym, 64, rows, cols, 77);
  const DeviceMatrixCopy device_matrix(m.view);
  const std::vector<float> x = RandomFloats(16 * cols, 21);
  quant::QuantizedActivations batch;
  quant::QuantizeActivations(x.data(), 16, cols, &batch);
  const DeviceQuantized dbatch(batch);
  DeviceVector<float> batch_out(16 * rows);
  kernels::GroupMatMul group;
  group.matrices[0] = device_matrix.matrix;
  group.outputs[0] = batch_out.get();
  group.count = 1;
  ASSERT_CUDA(kernels::SplitMatMul(group, dbatch.view, false, nullptr));
  const std::vector<float> batched = batch_out.ToHost();
  for (const int64_t t : {0, 5, 15}) {
    quant::QuantizedActivations one;
    quant::QuantizeActivations(x.data() + t * cols, 1, cols, &one);
    const DeviceQuantized done(one);
    DeviceVector<float> out(rows);
    group.outputs[0] = out.get();
    ASSERT_CUDA(kernels::SplitMatMul(group, done.view, false, nullptr));
    ExpectBitsEqual(
        out.ToHost(),
        std::vector<float>(batched.begin() + t * rows, batched.begin() + (t + 1) * rows),
        "row " + std::to_string(t));
  }
}

TEST_F(CudaKernelsTest, EmbeddingGatherMatchesCpuDequantizer) {
  const int64_t vocab = 50, cols = 96;
  const std::vector<float> table = RandomFloats(vocab * cols, 4);
  const std::vector<int32_t> tokens = {0, 49, 7, 7, 23};
  for (const GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    std::vector<uint8_t> bytes;
    int64_t row_bytes = 0;
    if (type == GgmlType::kF32) {
      row_bytes = cols * 4;
      bytes.resize(vocab * row_bytes);
      std::memcpy(bytes.data(), table.data(), bytes.size());
    } else if (type == GgmlType::kF16) {
      row_bytes = cols * 2;
      bytes.resize(vocab * row_bytes);
      for (int64_t i = 0; i < vocab * cols; ++i) {
        const uint16_t h = Fp32ToFp16(table[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    } else {
      row_bytes = cols / 32 * 34;
      bytes.resize(vocab * row_bytes);
      for (int64_t r = 0; r < vocab; ++r) {
        quant::QuantizeQ8_0Row(table.data() + r * cols, cols, bytes.data() + r * row_bytes);
      }
    }
    auto matrix = ops::MakeWeightMatrix(type, bytes.data(), vocab, cols, "table");
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    std::vector<float> expected(tokens.size() * cols);
    for (size_t t = 0; t < tokens.size(); ++t) {
      ops::DequantizeWeightRow(*matrix, tokens[t], expected.data() + t * cols);
    }
    DeviceVector<uint8_t> device_table(bytes);
    DeviceVector<int32_t> device_tokens(tokens);
    DeviceVector<float> out(tokens.size() * cols);
    ASSERT_CUDA(kernels::EmbeddingGather(device_table.get(), static_cast<int32_t>(type), row_bytes,
                                         cols, device_tokens.get(),
                                         static_cast<int64_t>(tokens.size()), out.get(), nullptr));
    ExpectBitsEqual(out.ToHost(), expected, GgmlTypeName(type));
  }
}

TEST_F(CudaKernelsTest, RmsNormIsCloseToCpuAndBatchInvariant) {
  const int64_t rows = 9, n = 4096;
  const std::vector<float> x = RandomFloats(rows * n, 12, 3.0f);
  const std::vector<float> weight = RandomFloats(n, 13);
  std::vector<float> expected(rows * n);
  ops::RmsNorm(x.data(), rows, n, weight.data(), 1e-5f, expected.data());
  DeviceVector<float> dx(x), dw(weight), out(rows * n), one(n);
  ASSERT_CUDA(kernels::RmsNorm(dx.get(), nullptr, rows, n, dw.get(), 1e-5f, out.get(), nullptr));
  const std::vector<float> actual = out.ToHost();
  EXPECT_LT(Nmse(actual, expected), 1e-13);
  // Row 6 alone, selected through source_rows, gives the same bits as inside the batch.
  DeviceVector<int32_t> source(std::vector<int32_t>{6});
  ASSERT_CUDA(kernels::RmsNorm(dx.get(), source.get(), 1, n, dw.get(), 1e-5f, one.get(), nullptr));
  ExpectBitsEqual(one.ToHost(), std::vector<float>(actual.begin() + 6 * n, actual.begin() + 7 * n),
                  "row 6");
  // Weightless (gemma4's value norm): x / rms, no multiply.
  ops::RmsNorm(x.data(), rows, n, nullptr, 1e-5f, expected.data());
  ASSERT_CUDA(kernels::RmsNorm(dx.get(), nullptr, rows, n, nullptr, 1e-5f, out.get(), nullptr));
  EXPECT_LT(Nmse(out.ToHost(), expected), 1e-13);
}

// Both pairings (adjacent, NEOX halves), a global base with linear scaling and frequency
// factors, a local layer's base, YaRN (gpt-oss's factor 32 over 4,096), whole and partial
// rotation: bit for bit.
TEST_F(CudaKernelsTest, RopeMatchesCpuBitForBit) {
  const std::vector<float> factors = RandomFloats(32, 2, 0.1f);
  std::vector<float> positive_factors(32);
  for (int i = 0; i < 32; ++i) positive_factors[i] = 1.0f + std::fabs(factors[i]);
  const int64_t table_positions = 5000;
  const int64_t rows = 6, heads = 3;
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 4999, 17};
  DeviceVector<int32_t> dpositions(positions);
  const auto rope = [](ops::RopeStyle style, int64_t rotary_dims, float base, float scale,
                       const float* factors) {
    return ops::RopeConfig{.head_dim = 64,
                           .rotary_dims = rotary_dims,
                           .freq_base = base,
                           .freq_scale = scale,
                           .freq_factors = factors,
                           .style = style};
  };
  ops::RopeConfig yarn = rope(ops::RopeStyle::kHalves, 64, 150000.0f, 1.0f / 32.0f, nullptr);
  yarn.ext_factor = 1.0f;
  yarn.attn_factor = 1.0f;
  yarn.yarn_original_context = 4096;
  const ops::RopeConfig cases[] = {
      rope(ops::RopeStyle::kAdjacentPairs, 64, 500000.0f, 0.5f, positive_factors.data()),
      rope(ops::RopeStyle::kHalves, 64, 500000.0f, 0.5f, positive_factors.data()),
      rope(ops::RopeStyle::kHalves, 64, 10000.0f, 1.0f, nullptr),  // a local layer's table
      rope(ops::RopeStyle::kHalves, 32, 1000000.0f, 1.0f, nullptr),
      rope(ops::RopeStyle::kAdjacentPairs, 32, 10000.0f, 1.0f, nullptr),
      yarn,
  };
  for (const ops::RopeConfig& c : cases) {
    const int64_t pairs = c.rotary_dims / 2;
    const std::vector<float> table = RopeTable(c, table_positions);
    std::vector<float> x = RandomFloats(rows * heads * 64, 31);
    DeviceVector<float> dx(x), dtable(table);
    ASSERT_CUDA(kernels::ApplyRope(dx.get(), rows, heads, 64, c.rotary_dims, dpositions.get(),
                                   dtable.get(), dtable.get() + table_positions * pairs,
                                   c.style == ops::RopeStyle::kHalves, nullptr));
    ops::ApplyRope(x.data(), rows, heads, positions.data(), c);
    ExpectBitsEqual(dx.ToHost(), x,
                    "rope " + std::string(c.style == ops::RopeStyle::kHalves ? "halves" : "pairs") +
                        " dims " + std::to_string(c.rotary_dims) + " base " +
                        std::to_string(c.freq_base) + (c.ext_factor != 0.0f ? " yarn" : ""));
  }
}

TEST_F(CudaKernelsTest, BiasAddAndScaleMatchCpuBitForBit) {
  const int64_t rows = 5, n = 320;
  const std::vector<float> x = RandomFloats(rows * n, 21, 2.0f), bias = RandomFloats(n, 22);
  std::vector<float> expected = x;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) expected[r * n + i] += bias[i];
  }
  DeviceVector<float> dx(x), db(bias);
  ASSERT_CUDA(kernels::AddRowVector(dx.get(), db.get(), rows, n, nullptr));
  ExpectBitsEqual(dx.ToHost(), expected, "bias");
  const float scale = std::sqrt(640.0f);  // gemma's embedding scale
  for (float& v : expected) v *= scale;
  ASSERT_CUDA(kernels::ScaleInPlace(dx.get(), rows * n, scale, nullptr));
  ExpectBitsEqual(dx.ToHost(), expected, "scale");
}

// QK-norm is RMSNorm over each head (rows = tokens x heads, n = head_dim), in place.
TEST_F(CudaKernelsTest, PerHeadRmsNormInPlaceIsCloseToCpu) {
  for (const int64_t head_dim : {32, 128, 256}) {
    const int64_t tokens = 7, heads = 8, rows = tokens * heads;
    const std::vector<float> x = RandomFloats(rows * head_dim, 14, 5.0f);
    const std::vector<float> weight = RandomFloats(head_dim, 15);
    std::vector<float> expected(x.size());
    ops::RmsNorm(x.data(), rows, head_dim, weight.data(), 1e-6f, expected.data());
    DeviceVector<float> dx(x), dw(weight);
    ASSERT_CUDA(
        kernels::RmsNorm(dx.get(), nullptr, rows, head_dim, dw.get(), 1e-6f, dx.get(), nullptr));
    EXPECT_LT(Nmse(dx.ToHost(), expected), 1e-13) << "head_dim " << head_dim;
  }
}

// Keys and values as the device stores them (fp16), back in f32 for the CPU op.
std::vector<uint16_t> Halves(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Fp32ToFp16(v[i]);
  return out;
}

// `halves` as the rows of an f16 KV cache, kv_dim wide.
ops::KvRows HalfRows(const std::vector<uint16_t>& halves, int64_t kv_dim) {
  return {reinterpret_cast<const uint8_t*>(halves.data()), ops::KvType::kF16, kv_dim * 2};
}

TEST_F(CudaKernelsTest, AttentionMatchesCpuOnTheSameHalfKvAndTreeNodesEqualTheirPaths) {
  const int64_t heads = 8, kv_heads = 2, head_dim = 64, slots = 80;
  const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
  const int64_t prefix = 37, context = 3, tokens = 4, width = context + tokens;
  const std::vector<float> keys = RandomFloats(slots * kv_dim, 41);
  const std::vector<float> values = RandomFloats(slots * kv_dim, 42);
  const std::vector<float> q = RandomFloats(tokens * q_dim, 43);
  // A tree: pending slots 0..2 are a chain; batch tokens 0,1 extend slot 2, token 2 extends
  // token 0, token 3 sees slot 0 only.
  const std::vector<uint8_t> mask = {
      1, 1, 1, 1, 0, 0, 0,  //
      1, 1, 1, 0, 1, 0, 0,  //
      1, 1, 1, 1, 0, 1, 0,  //
      1, 0, 0, 0, 0, 0, 1,  //
  };
  const ops::AttentionShape shape{heads, kv_heads, head_dim, 1.0f / 8.0f};
  ThreadPool pool(1);
  std::vector<float> expected(tokens * q_dim);
  // The CPU reads the same halves the device does, from an f16 cache's rows.
  const std::vector<uint16_t> keys16 = Halves(keys), values16 = Halves(values);
  ops::AttentionWithContext(q.data(), tokens, HalfRows(keys16, kv_dim), HalfRows(values16, kv_dim),
                            prefix, context, mask.data(), shape, expected.data(), pool);

  DeviceVector<float> dq(q), out(tokens * q_dim), scores(tokens * heads * slots);
  DeviceVector<uint16_t> dk(keys16), dv(values16);
  DeviceVector<uint8_t> dmask(mask);
  kernels::AttentionArgs args;
  args.q = dq.get();
  args.keys = reinterpret_cast<const uint8_t*>(dk.get());
  args.values = reinterpret_cast<const uint8_t*>(dv.get());
  args.mask = dmask.get();
  args.out = out.get();
  args.scores = scores.get();
  args.rows = tokens;
  args.prefix_length = prefix;
  args.mask_width = width;
  args.score_stride = slots;
  args.num_heads = heads;
  args.num_kv_heads = kv_heads;
  args.head_dim = head_dim;
  args.scale = shape.scale;
  ASSERT_CUDA(kernels::Attention(args, nullptr));
  const std::vector<float> actual = out.ToHost();
  EXPECT_LT(Nmse(actual, expected), 1e-12);

  // With attention sinks (gpt-oss), around the scores' scale: as the CPU's.
  {
    const std::vector<float> sinks = RandomFloats(heads, 44, 2.0f);
    ops::AttentionShape with_sinks = shape;
    with_sinks.sinks = sinks.data();
    std::vector<float> expected_sinks(tokens * q_dim);
    ops::AttentionWithContext(q.data(), tokens, HalfRows(keys16, kv_dim),
                              HalfRows(values16, kv_dim), prefix, context, mask.data(), with_sinks,
                              expected_sinks.data(), pool);
    DeviceVector<float> dsinks(sinks);
    args.sinks = dsinks.get();
    ASSERT_CUDA(kernels::Attention(args, nullptr));
    args.sinks = nullptr;
    EXPECT_LT(Nmse(out.ToHost(), expected_sinks), 1e-12);
    EXPECT_GT(Nmse(expected_sinks, expected), 1e-6);  // the sinks change the result
  }

  // Token 2's visible sequence (prefix, slots 0-2, token 0, itself) run as a causal chain at
  // slots prefix..prefix+4 gives the same bits.
  std::vector<float> chain_keys = keys, chain_values = values;
  const int64_t path[] = {prefix + 0, prefix + 1, prefix + 2, prefix + 3, prefix + 5};
  for (int i = 0; i < 5; ++i) {
    std::copy_n(keys.begin() + path[i] * kv_dim, kv_dim,
                chain_keys.begin() + (prefix + i) * kv_dim);
    std::copy_n(values.begin() + path[i] * kv_dim, kv_dim,
                chain_values.begin() + (prefix + i) * kv_dim);
  }
  DeviceVector<uint16_t> ck(Halves(chain_keys)), cv(Halves(chain_values));
  DeviceVector<float> cq(std::vector<float>(q.begin() + 2 * q_dim, q.begin() + 3 * q_dim));
  DeviceVector<uint8_t> cmask(std::vector<uint8_t>{1});
  DeviceVector<float> cout(q_dim);
  args.q = cq.get();
  args.keys = reinterpret_cast<const uint8_t*>(ck.get());
  args.values = reinterpret_cast<const uint8_t*>(cv.get());
  args.mask = cmask.get();
  args.out = cout.get();
  args.rows = 1;
  args.prefix_length = prefix + 4;
  args.mask_width = 1;
  ASSERT_CUDA(kernels::Attention(args, nullptr));
  ExpectBitsEqual(cout.ToHost(),
                  std::vector<float>(actual.begin() + 2 * q_dim, actual.begin() + 3 * q_dim),
                  "tree node vs its causal path");

  // The same over q8_0 rows: the CPU reads the bytes the device reads.
  std::vector<uint8_t> keys8(slots * ops::KvRowBytes(ops::KvType::kQ8_0, kv_dim));
  std::vector<uint8_t> values8(keys8.size());
  ops::EncodeKvRows(ops::KvType::kQ8_0, keys.data(), slots, kv_dim, keys8.data());
  ops::EncodeKvRows(ops::KvType::kQ8_0, values.data(), slots, kv_dim, values8.data());
  const int64_t row8 = ops::KvRowBytes(ops::KvType::kQ8_0, kv_dim);
  std::vector<float> expected8(tokens * q_dim);
  ops::AttentionWithContext(q.data(), tokens, {keys8.data(), ops::KvType::kQ8_0, row8},
                            {values8.data(), ops::KvType::kQ8_0, row8}, prefix, context,
                            mask.data(), shape, expected8.data(), pool);
  DeviceVector<uint8_t> dk8(keys8), dv8(values8);
  DeviceVector<float> out8(tokens * q_dim);
  args.q = dq.get();
  args.keys = dk8.get();
  args.values = dv8.get();
  args.storage = kernels::KvStorage::kQ8_0;
  args.mask = dmask.get();
  args.out = out8.get();
  args.rows = tokens;
  args.prefix_length = prefix;
  args.mask_width = width;
  ASSERT_CUDA(kernels::Attention(args, nullptr));
  EXPECT_LT(Nmse(out8.ToHost(), expected8), 1e-12);
}

TEST_F(CudaKernelsTest, SiluMulIsCloseToCpu) {
  const int64_t n = 100000;
  const std::vector<float> gate = RandomFloats(n, 51, 4.0f), up = RandomFloats(n, 52);
  std::vector<float> expected(n);
  ops::SiluMul(gate.data(), up.data(), n, expected.data());
  DeviceVector<float> dg(gate), du(up);
  ASSERT_CUDA(kernels::GatedActivationRows(
      dg.get(), du.get(), 1, n, n, kernels::GatedActivation::kSilu, 0.0f, 0.0f, dg.get(), nullptr));
  const std::vector<float> actual = dg.ToHost();
  EXPECT_LT(Nmse(actual, expected), 1e-12);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-6f * std::fabs(expected[i]) + 1e-30f) << i;
  }
}

// gpt-oss's clamped SwiGLU: ops::SwigluOaiMul within expf's ulps, clamps included (gates and ups
// beyond +-7).
TEST_F(CudaKernelsTest, SwigluOaiMulIsCloseToCpu) {
  const int64_t n = 100000;
  const std::vector<float> gate = RandomFloats(n, 54, 12.0f), up = RandomFloats(n, 55, 12.0f);
  std::vector<float> expected(n);
  ops::SwigluOaiMul(gate.data(), up.data(), n, expected.data());
  DeviceVector<float> dg(gate), du(up);
  ASSERT_CUDA(kernels::GatedActivationRows(
      dg.get(), du.get(), 1, n, n, kernels::GatedActivation::kSwigluOai, ops::kSwigluOaiAlpha,
      ops::kSwigluOaiLimit, dg.get(), nullptr));
  const std::vector<float> actual = dg.ToHost();
  EXPECT_LT(Nmse(actual, expected), 1e-12);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-6f * std::fabs(expected[i]) + 1e-30f) << i;
  }
}

// GeGLU in f32: ops::GeluTanhMul within a few ulp (the device's tanhf is within 2 ulp; where
// 1 + tanh cancels for negative gates the error is |gate|·|up|·2^-21 at most), on every fp16 value
// in (-12, 12), random gates of several scales, and large ones.
TEST_F(CudaKernelsTest, GeluTanhMulMatchesCpuWithinF32Rounding) {
  std::vector<float> gate;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float x = Fp16ToFp32(static_cast<uint16_t>(bits));
    if (std::isfinite(x) && std::fabs(x) < 12.0f) gate.push_back(x);
  }
  for (const float scale : {0.5f, 3.0f, 8.0f}) {
    const std::vector<float> more = RandomFloats(50000, 53 + static_cast<uint32_t>(scale), scale);
    gate.insert(gate.end(), more.begin(), more.end());
  }
  for (const float edge : {-10.0f, 10.0f, -1e4f, 1e4f, 0.0f, -0.0f}) gate.push_back(edge);
  const int64_t n = static_cast<int64_t>(gate.size());
  const std::vector<float> up = RandomFloats(gate.size(), 57);
  std::vector<float> expected(gate.size());
  ops::GeluTanhMul(gate.data(), up.data(), n, expected.data());
  DeviceVector<float> dg(gate), du(up);
  ASSERT_CUDA(kernels::GatedActivationRows(dg.get(), du.get(), 1, n, n,
                                           kernels::GatedActivation::kGeluTanh, 0.0f, 0.0f,
                                           dg.get(), nullptr));
  const std::vector<float> actual = dg.ToHost();
  EXPECT_LT(Nmse(actual, expected), 1e-12);
  for (int64_t i = 0; i < n; ++i) {
    const float bound = std::fabs(gate[i]) * std::fabs(up[i]) * std::ldexp(1.0f, -21) + 1e-30f;
    ASSERT_NEAR(actual[i], expected[i], bound) << "gate " << gate[i];
  }
}

// An expert's fused gate|up rows ([rows][gate | up]) give the bits of the same values laid out as
// two separate matrices, for every activation.
TEST_F(CudaKernelsTest, GatedActivationOnFusedRowsEqualsSeparateRows) {
  const int64_t rows = 37, width = 96;
  const std::vector<float> gate = RandomFloats(rows * width, 58, 4.0f);
  const std::vector<float> up = RandomFloats(rows * width, 59);
  std::vector<float> fused(static_cast<size_t>(2 * rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(gate.begin() + r * width, width, fused.begin() + 2 * r * width);
    std::copy_n(up.begin() + r * width, width, fused.begin() + 2 * r * width + width);
  }
  DeviceVector<float> dg(gate), du(up), dfused(fused), separate_out(gate.size()),
      fused_out(gate.size());
  for (const auto activation :
       {kernels::GatedActivation::kSilu, kernels::GatedActivation::kGeluTanh,
        kernels::GatedActivation::kSwigluOai}) {
    ASSERT_CUDA(kernels::GatedActivationRows(dg.get(), du.get(), rows, width, width, activation,
                                             ops::kSwigluOaiAlpha, ops::kSwigluOaiLimit,
                                             separate_out.get(), nullptr));
    ASSERT_CUDA(kernels::GatedActivationRows(dfused.get(), dfused.get() + width, rows, width,
                                             2 * width, activation, ops::kSwigluOaiAlpha,
                                             ops::kSwigluOaiLimit, fused_out.get(), nullptr));
    ExpectBitsEqual(fused_out.ToHost(), separate_out.ToHost(), "gated activation");
  }
  EXPECT_EQ(kernels::GatedActivationRows(dg.get(), du.get(), rows, width, width - 1,
                                         kernels::GatedActivation::kSilu, 0.0f, 0.0f,
                                         separate_out.get(), nullptr),
            cudaErrorInvalidValue);
}

// The router's logits equal ops::MatMul of the router (f32 and an f16 router dequantized to f32)
// bit for bit, for any number of rows.
TEST_F(CudaKernelsTest, RouterLogitsEqualCpuMatMulBitForBit) {
  const int64_t rows = 19, experts = 16, cols = 200;  // a tail of 0 in the last 8-group
  const std::vector<float> x = RandomFloats(rows * cols, 71);
  const std::vector<float> router = RandomFloats(experts * cols, 72, 0.1f);
  std::vector<uint16_t> router_f16(router.size());
  for (size_t i = 0; i < router.size(); ++i) router_f16[i] = Fp32ToFp16(router[i]);
  ThreadPool pool(2);
  for (const bool half : {false, true}) {
    auto matrix =
        half ? ops::MakeWeightMatrix(GgmlType::kF16, router_f16.data(), experts, cols, "router")
             : ops::MakeWeightMatrix(GgmlType::kF32, router.data(), experts, cols, "router");
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    std::vector<float> expected(static_cast<size_t>(rows * experts));
    ops::MatMul(x.data(), rows, *matrix, expected.data(), pool);
    std::vector<float> dequantized(static_cast<size_t>(experts * cols));
    for (int64_t e = 0; e < experts; ++e) {
      ops::DequantizeWeightRow(*matrix, e, dequantized.data() + e * cols);
    }
    DeviceVector<float> dx(x), dr(dequantized), dlogits(expected.size());
    ASSERT_CUDA(
        kernels::RouterLogits(dx.get(), rows, dr.get(), experts, cols, dlogits.get(), nullptr));
    ExpectBitsEqual(dlogits.ToHost(), expected, half ? "f16 router" : "f32 router");
    // One row alone: the same bits as in the batch.
    DeviceVector<float> one(static_cast<size_t>(experts));
    ASSERT_CUDA(
        kernels::RouterLogits(dx.get() + 5 * cols, 1, dr.get(), experts, cols, one.get(), nullptr));
    ExpectBitsEqual(
        one.ToHost(),
        std::vector<float>(expected.begin() + 5 * experts, expected.begin() + 6 * experts),
        "row 5 alone");
  }
}

// Routing tables from model::RouteRows / GroupByExpert drive the gather and the weighted sum:
// each row's result is its own k experts' outputs, scaled, weighted and added in the order
// chosen, computed here from the definition.
TEST_F(CudaKernelsTest, GatherAndWeightedExpertSumFollowTheRouting) {
  const int64_t rows = 9, k = 3, experts = 8, n = 40;
  model::ModelConfig config;
  config.num_experts = experts;
  config.num_experts_used = k;
  const std::vector<float> logits = RandomFloats(rows * experts, 81, 3.0f);
  std::vector<int32_t> expert_of(static_cast<size_t>(rows * k));
  std::vector<float> weights(expert_of.size());
  model::RouteRows(config, logits.data(), rows, expert_of, weights);
  const model::ExpertGrouping grouping = model::GroupByExpert(expert_of, experts, k);
  const std::vector<float> x = RandomFloats(rows * n, 82);
  DeviceVector<float> dx(x), gathered(static_cast<size_t>(rows * k * n));
  DeviceVector<int32_t> source(grouping.source_row);
  ASSERT_CUDA(kernels::GatherRows(dx.get(), source.get(), rows * k, n, gathered.get(), nullptr));
  const std::vector<float> rows_out = gathered.ToHost();
  for (int64_t pair = 0; pair < rows * k; ++pair) {
    const int64_t slot = grouping.slot_of[static_cast<size_t>(pair)];
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(rows_out[static_cast<size_t>(slot * n + j)],
                x[static_cast<size_t>(pair / k * n + j)]);
    }
  }
  // Expert outputs: the gathered rows times (1 + slot), distinct per grouped row.
  std::vector<float> expert_out(rows_out);
  for (int64_t slot = 0; slot < rows * k; ++slot) {
    for (int64_t j = 0; j < n; ++j) expert_out[static_cast<size_t>(slot * n + j)] *= 1.0f + slot;
  }
  const std::vector<float> scales = RandomFloats(experts, 83);
  for (const bool scaled : {false, true}) {
    std::vector<float> expected(static_cast<size_t>(rows * n));
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t c = 0; c < k; ++c) {
          const size_t pair = static_cast<size_t>(t * k + c);
          const float scale = scaled ? scales[static_cast<size_t>(expert_of[pair])] : 1.0f;
          const float value = expert_out[static_cast<size_t>(grouping.slot_of[pair] * n + j)] *
                              scale * weights[pair];
          sum = c == 0 ? value : sum + value;
        }
        expected[static_cast<size_t>(t * n + j)] = sum;
      }
    }
    DeviceVector<float> dout_experts(expert_out), dweights(weights), dscales(scales),
        dsum(expected.size());
    DeviceVector<int32_t> dslot(grouping.slot_of), dexpert(expert_of);
    const kernels::WeightedExpertSumArgs args{.expert_out = dout_experts.get(),
                                              .slot_of = dslot.get(),
                                              .expert_of = dexpert.get(),
                                              .weights = dweights.get(),
                                              .expert_scales = scaled ? dscales.get() : nullptr,
                                              .rows = rows,
                                              .k = k,
                                              .n = n,
                                              .out = dsum.get()};
    ASSERT_CUDA(kernels::WeightedExpertSum(args, nullptr));
    ExpectBitsEqual(dsum.ToHost(), expected, scaled ? "with expert scales" : "without");
  }
}

// gemma4's router input scaling: (x * scale) * vector[i], two roundings in that order.
TEST_F(CudaKernelsTest, ScaleRowsByVectorRoundsAsTheCpuForward) {
  const int64_t rows = 7, n = 300;
  const std::vector<float> x = RandomFloats(rows * n, 91, 5.0f), v = RandomFloats(n, 92);
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  std::vector<float> expected(x);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      float& value = expected[static_cast<size_t>(r * n + i)];
      value = value * scale * v[static_cast<size_t>(i)];
    }
  }
  DeviceVector<float> dx(x), dv(v);
  ASSERT_CUDA(kernels::ScaleRowsByVector(dx.get(), rows, n, scale, dv.get(), nullptr));
  ExpectBitsEqual(dx.ToHost(), expected, "router input");
}

// The final logit soft-cap, cap * tanh(x / cap) in llama.cpp's order, against the CPU forward's
// formula: within a few ulp of cap (the device's tanhf is within 2 ulp), saturating at +-cap.
TEST_F(CudaKernelsTest, SoftCapMatchesCpuWithinTanhRounding) {
  constexpr float kCap = 30.0f;
  std::vector<float> x = RandomFloats(100000, 61, 40.0f);
  for (const float edge : {0.0f, -0.0f, 1e4f, -1e4f, 30.0f, -30.0f}) x.push_back(edge);
  std::vector<float> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) expected[i] = std::tanh(x[i] * (1.0f / kCap)) * kCap;
  DeviceVector<float> dx(x);
  ASSERT_CUDA(kernels::SoftCap(dx.get(), static_cast<int64_t>(x.size()), kCap, nullptr));
  const std::vector<float> actual = dx.ToHost();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], kCap * std::ldexp(1.0f, -21)) << "x " << x[i];
    ASSERT_LE(std::fabs(actual[i]), kCap) << "x " << x[i];
  }
}

// The slots ops::AttentionWithContext visits for one token under a window (for the test).
std::vector<int32_t> CpuVisibleSlots(int64_t token, int64_t prefix, int64_t width,
                                     const std::vector<uint8_t>& mask, int64_t window,
                                     const std::vector<int32_t>& query_positions,
                                     const std::vector<int32_t>& slot_positions) {
  std::vector<int32_t> slots;
  const auto in_window = [&](int64_t slot) {
    return window == 0 || query_positions[token] - slot_positions[slot] < window;
  };
  for (int64_t s = 0; s < prefix; ++s) {
    if (in_window(s)) slots.push_back(static_cast<int32_t>(s));
  }
  for (int64_t j = 0; j < width; ++j) {
    if (mask[token * width + j] != 0 && in_window(prefix + j)) {
      slots.push_back(static_cast<int32_t>(prefix + j));
    }
  }
  return slots;
}

// Sliding-window attention: the positions stored into the cache's slots, each row's visible
// list (= the CPU's, exactly), attention over it (= ops::AttentionWithContext with the window up
// to the softmax sum's order), and a tree node = its causal path, bit for bit, past the window.
TEST_F(CudaKernelsTest, SlidingWindowAttentionMatchesCpuAndTreeNodesEqualTheirPaths) {
  const int64_t heads = 4, kv_heads = 2, head_dim = 64, slots = 700;
  const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
  const int64_t prefix = 600, context = 3, tokens = 4, width = context + tokens;
  const std::vector<float> keys = RandomFloats(slots * kv_dim, 141);
  const std::vector<float> values = RandomFloats(slots * kv_dim, 142);
  const std::vector<float> q = RandomFloats(tokens * q_dim, 143);
  // The tree of the attention test above: pending slots 0..2 a chain at positions 600..602,
  // batch tokens 0, 1 extend it (603), token 2 extends token 0 (604), token 3 extends slot 0
  // (601).
  const std::vector<uint8_t> mask = {
      1, 1, 1, 1, 0, 0, 0,  //
      1, 1, 1, 0, 1, 0, 0,  //
      1, 1, 1, 1, 0, 1, 0,  //
      1, 0, 0, 0, 0, 0, 1,  //
  };
  const std::vector<int32_t> batch_positions = {603, 603, 604, 601};
  std::vector<int32_t> slot_positions(slots, 0);
  for (int64_t s = 0; s < prefix + context; ++s) slot_positions[s] = static_cast<int32_t>(s);
  const ops::AttentionShape shape{heads, kv_heads, head_dim, 1.0f / 8.0f};
  const std::vector<uint16_t> keys16 = Halves(keys), values16 = Halves(values);
  ThreadPool pool(1);

  DeviceVector<float> dq(q), out(tokens * q_dim), scores(tokens * heads * slots);
  DeviceVector<uint16_t> dk(keys16), dv(values16);
  DeviceVector<uint8_t> dmask(mask);
  DeviceVector<int32_t> dbatch_positions(batch_positions), dslot_positions(slot_positions);
  DeviceVector<int32_t> list(tokens * slots), counts(tokens);
  DeviceVector<int64_t> first_slot(std::vector<int64_t>{prefix + context});
  ASSERT_CUDA(kernels::StorePositions(dbatch_positions.get(), tokens, dslot_positions.get(),
                                      first_slot.get(), nullptr));
  std::vector<int32_t> cpu_slot_positions = slot_positions;
  std::copy(batch_positions.begin(), batch_positions.end(),
            cpu_slot_positions.begin() + prefix + context);
  EXPECT_EQ(dslot_positions.ToHost(), cpu_slot_positions);

  // Window 1 (only the token itself), a window inside the pending chain, one reaching into the
  // prefix, one covering everything, and none.
  for (const int64_t window : {1, 3, 300, 4096, 0}) {
    kernels::VisibleSlotsArgs visible;
    visible.mask = dmask.get();
    visible.rows = tokens;
    visible.prefix_length = prefix;
    visible.mask_width = width;
    visible.window = window;
    visible.query_positions = dbatch_positions.get();
    visible.slot_positions = dslot_positions.get();
    visible.slots = list.get();
    visible.counts = counts.get();
    visible.slot_stride = slots;
    ASSERT_CUDA(kernels::VisibleSlots(visible, nullptr));
    const std::vector<int32_t> device_list = list.ToHost(), device_counts = counts.ToHost();
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<int32_t> expected =
          CpuVisibleSlots(t, prefix, width, mask, window, batch_positions, cpu_slot_positions);
      ASSERT_EQ(device_counts[t], static_cast<int32_t>(expected.size()))
          << "window " << window << " token " << t;
      EXPECT_EQ(std::vector<int32_t>(device_list.begin() + t * slots,
                                     device_list.begin() + t * slots + device_counts[t]),
                expected)
          << "window " << window << " token " << t;
    }

    std::vector<float> expected(tokens * q_dim);
    const ops::SlidingWindow cpu_window{.size = window,
                                        .query_positions = batch_positions.data(),
                                        .slot_positions = cpu_slot_positions.data()};
    ops::AttentionWithContext(q.data(), tokens, HalfRows(keys16, kv_dim),
                              HalfRows(values16, kv_dim), prefix, context, mask.data(), shape,
                              expected.data(), pool, cpu_window);
    kernels::AttentionArgs args;
    args.q = dq.get();
    args.keys = reinterpret_cast<const uint8_t*>(dk.get());
    args.values = reinterpret_cast<const uint8_t*>(dv.get());
    args.mask = dmask.get();
    args.out = out.get();
    args.scores = scores.get();
    args.rows = tokens;
    args.prefix_length = prefix;
    args.mask_width = width;
    args.score_stride = slots;
    args.num_heads = heads;
    args.num_kv_heads = kv_heads;
    args.head_dim = head_dim;
    args.scale = shape.scale;
    args.visible_slots = list.get();
    args.visible_counts = counts.get();
    args.visible_stride = slots;
    ASSERT_CUDA(kernels::Attention(args, nullptr));
    const std::vector<float> actual = out.ToHost();
    EXPECT_LT(Nmse(actual, expected), 1e-12) << "window " << window;
    if (window == 0) {  // the list path = the mask path, bit for bit
      args.visible_slots = nullptr;
      args.visible_counts = nullptr;
      DeviceVector<float> mask_out(tokens * q_dim);
      args.out = mask_out.get();
      ASSERT_CUDA(kernels::Attention(args, nullptr));
      ExpectBitsEqual(mask_out.ToHost(), actual, "listed vs masked");
      continue;
    }

    // Token 2 (position 604) alone as a causal chain: its path (pending 0-2, token 0, itself)
    // copied to slots prefix..prefix+4 with the same positions, the earlier prefix unchanged.
    std::vector<float> chain_keys = keys, chain_values = values;
    std::vector<int32_t> chain_positions = slot_positions;
    const int64_t path[] = {prefix + 0, prefix + 1, prefix + 2, prefix + 3, prefix + 5};
    for (int i = 0; i < 5; ++i) {
      std::copy_n(keys.begin() + path[i] * kv_dim, kv_dim,
                  chain_keys.begin() + (prefix + i) * kv_dim);
      std::copy_n(values.begin() + path[i] * kv_dim, kv_dim,
                  chain_values.begin() + (prefix + i) * kv_dim);
      chain_positions[prefix + i] = cpu_slot_positions[path[i]];
    }
    DeviceVector<uint16_t> ck(Halves(chain_keys)), cv(Halves(chain_values));
    DeviceVector<float> cq(std::vector<float>(q.begin() + 2 * q_dim, q.begin() + 3 * q_dim));
    DeviceVector<uint8_t> cmask(std::vector<uint8_t>{1});
    DeviceVector<int32_t> cpos(std::vector<int32_t>{604}), cslots(chain_positions);
    DeviceVector<int32_t> clist(slots), ccount(1);
    DeviceVector<float> cout(q_dim);
    visible.mask = cmask.get();
    visible.rows = 1;
    visible.prefix_length = prefix + 4;
    visible.mask_width = 1;
    visible.query_positions = cpos.get();
    visible.slot_positions = cslots.get();
    visible.slots = clist.get();
    visible.counts = ccount.get();
    ASSERT_CUDA(kernels::VisibleSlots(visible, nullptr));
    args.q = cq.get();
    args.keys = reinterpret_cast<const uint8_t*>(ck.get());
    args.values = reinterpret_cast<const uint8_t*>(cv.get());
    args.mask = cmask.get();
    args.out = cout.get();
    args.rows = 1;
    args.prefix_length = prefix + 4;
    args.mask_width = 1;
    args.visible_slots = clist.get();
    args.visible_counts = ccount.get();
    ASSERT_CUDA(kernels::Attention(args, nullptr));
    ExpectBitsEqual(cout.ToHost(),
                    std::vector<float>(actual.begin() + 2 * q_dim, actual.begin() + 3 * q_dim),
                    "window " + std::to_string(window) + ": tree node vs its causal path");
  }
}

// f16 and q8_0 rows: the device store encodes as the host cache does, byte for byte, and the
// commit moves rows as KvCache::CommitSlots does.
TEST_F(CudaKernelsTest, KvStoreAndCommitSlotsMatchTheHostCache) {
  const int64_t layers = 3, capacity = 12, kv_dim = 64, committed = 2;
  for (const ops::KvType type : {ops::KvType::kF16, ops::KvType::kQ8_0}) {
    SCOPED_TRACE(std::string(ops::KvTypeName(type)));
    const kernels::KvStorage storage =
        type == ops::KvType::kF16 ? kernels::KvStorage::kF16 : kernels::KvStorage::kQ8_0;
    auto cache = model::KvCache::Create(layers, kv_dim, capacity, type);
    ASSERT_TRUE(cache.ok());
    const int64_t row_bytes = cache->row_bytes(0);
    ASSERT_EQ(row_bytes, kernels::KvStorageRowBytes(storage, kv_dim));
    const int64_t layer_bytes = capacity * row_bytes;
    DeviceVector<uint8_t> dk(layers * layer_bytes), dv(layers * layer_bytes);
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<float> keys = RandomFloats(capacity * kv_dim, 300 + l, 3.0f);
      const std::vector<float> values = RandomFloats(capacity * kv_dim, 400 + l, 0.5f);
      cache->StoreRows(l, 0, capacity, keys.data(), values.data());
      // The device stores rows 2.. at slot 2 (read from device memory), rows 0-1 at slot 0.
      DeviceVector<float> dkeys(keys), dvalues(values);
      for (const int64_t first : {int64_t{0}, int64_t{2}}) {
        DeviceVector<int64_t> slot(std::vector<int64_t>{first});
        const int64_t rows = first == 0 ? 2 : capacity - 2;
        ASSERT_CUDA(kernels::StoreKvRows(dkeys.get() + first * kv_dim, rows, kv_dim, storage,
                                         dk.get() + l * layer_bytes, slot.get(), nullptr));
        ASSERT_CUDA(kernels::StoreKvRows(dvalues.get() + first * kv_dim, rows, kv_dim, storage,
                                         dv.get() + l * layer_bytes, slot.get(), nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
    }
    const auto expect_same = [&](const char* what) {
      const std::vector<uint8_t> k = dk.ToHost(), v = dv.ToHost();
      for (int64_t l = 0; l < layers; ++l) {
        EXPECT_EQ(std::memcmp(k.data() + l * layer_bytes, cache->keys(l).data, layer_bytes), 0)
            << what << " keys of layer " << l;
        EXPECT_EQ(std::memcmp(v.data() + l * layer_bytes, cache->values(l).data, layer_bytes), 0)
            << what << " values of layer " << l;
      }
    };
    expect_same("stored");
    std::vector<int32_t> positions(capacity);
    for (int64_t slot = 0; slot < capacity; ++slot) {
      positions[slot] = static_cast<int32_t>(1000 + 7 * slot);
      cache->positions()[slot] = positions[slot];
    }
    ASSERT_TRUE(cache->BeginPending(committed).ok());
    ASSERT_TRUE(cache->Commit(committed).ok());
    ASSERT_TRUE(cache->BeginPending(9).ok());
    const std::vector<int32_t> path = {0, 2, 3, 7};  // slot 2+2 is both a source and a target
    ASSERT_TRUE(cache->CommitSlots(path).ok());
    DeviceVector<int32_t> dpath(path), dpositions(positions);
    ASSERT_CUDA(kernels::CommitSlots(dk.get(), dv.get(), dpositions.get(), layers, layer_bytes,
                                     row_bytes, committed, dpath.get(), 4, nullptr));
    const std::vector<int32_t> moved = dpositions.ToHost();
    for (int64_t slot = 0; slot < committed + 4; ++slot) {
      EXPECT_EQ(moved[slot], cache->positions()[slot]) << slot;
    }
    expect_same("committed");
  }
}

std::vector<float> LogitRows(int64_t rows, int64_t vocab, uint32_t seed, bool with_ties) {
  std::vector<float> logits = RandomFloats(rows * vocab, seed, 3.0f);
  if (with_ties) {
    for (int64_t r = 0; r < rows; ++r) {
      // Quantized logits: many exact ties, including at the maximum.
      for (int64_t i = 0; i < vocab; ++i) {
        float& l = logits[r * vocab + i];
        l = std::round(l * 2.0f) / 2.0f;
      }
    }
  }
  return logits;
}

TEST_F(CudaKernelsTest, ArgMaxPicksTheLowestIdAmongEquals) {
  const int64_t rows = 20, vocab = 3001;
  const std::vector<float> logits = LogitRows(rows, vocab, 61, /*with_ties=*/true);
  DeviceVector<float> dl(logits);
  DeviceVector<int32_t> choices(rows);
  ASSERT_CUDA(kernels::ArgMaxRows(dl.get(), rows, vocab, choices.get(), nullptr));
  const std::vector<int32_t> actual = choices.ToHost();
  model::Sampler sampler;
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const float> row(logits.data() + r * vocab, vocab);
    EXPECT_EQ(actual[r], sampler.Choose(row, {}, 0)) << r;
    EXPECT_EQ(actual[r], ops::ArgMax(row.data(), vocab));
  }
}

TEST_F(CudaKernelsTest, UniformDrawsMatchTheCpuGenerator) {
  const std::vector<int64_t> positions = {0, 1, 2, 1000, (int64_t{1} << 32) + 5, 123456789012};
  DeviceVector<int64_t> dp(positions);
  DeviceVector<double> out(positions.size());
  for (const uint64_t seed : {0ull, 42ull, 0xFFFFFFFFFFFFull}) {
    ASSERT_CUDA(kernels::UniformForPositions(seed, dp.get(), positions.size(), out.get(), nullptr));
    const std::vector<double> actual = out.ToHost();
    for (size_t i = 0; i < positions.size(); ++i) {
      EXPECT_EQ(actual[i], model::UniformForPosition(seed, positions[i]));
    }
  }
}

TEST_F(CudaKernelsTest, SamplingChoosesWhatTheCpuSamplerChooses) {
  const int64_t rows = 48;
  model::Sampler sampler;
  int compared = 0;
  for (const int64_t vocab : {1000, 49152}) {
    for (const bool ties : {false, true}) {
      const std::vector<float> logits = LogitRows(rows, vocab, 70 + vocab, ties);
      DeviceVector<float> dl(logits);
      DeviceVector<double> weights(rows * vocab);
      DeviceVector<int32_t> choices(rows);
      std::vector<int64_t> positions(rows);
      for (int64_t r = 0; r < rows; ++r) positions[r] = 17 + 3 * r;
      DeviceVector<int64_t> dp(positions);
      const model::SamplingParams cases[] = {
          {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 1},
          {.temperature = 0.7f, .top_k = 40, .top_p = 1.0f, .seed = 2},
          {.temperature = 1.3f, .top_k = 0, .top_p = 0.9f, .seed = 3},
          {.temperature = 0.8f, .top_k = 50, .top_p = 0.5f, .seed = 4},
          {.temperature = 2.0f, .top_k = 1, .top_p = 1.0f, .seed = 5},
          {.temperature = 0.05f, .top_k = 0, .top_p = 0.01f, .seed = 6},
      };
      for (const model::SamplingParams& p : cases) {
        kernels::SamplingArgs args;
        args.logits = dl.get();
        args.rows = rows;
        args.vocab = vocab;
        args.positions = dp.get();
        args.temperature = p.temperature;
        args.top_k = p.top_k;
        args.top_p = p.top_p;
        args.seed = p.seed;
        args.weights = weights.get();
        args.choices = choices.get();
        ASSERT_CUDA(kernels::SampleRows(args, nullptr));
        const std::vector<int32_t> actual = choices.ToHost();
        for (int64_t r = 0; r < rows; ++r) {
          const std::span<const float> row(logits.data() + r * vocab, vocab);
          EXPECT_EQ(actual[r], sampler.Choose(row, p, positions[r]))
              << "vocab " << vocab << " ties " << ties << " temperature " << p.temperature
              << " top_k " << p.top_k << " top_p " << p.top_p << " row " << r;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 2 * 6 * rows);
}

TEST_F(CudaKernelsTest, TopKMatchesCpuOrderAndNormalizer) {
  const int64_t rows = 6, vocab = 5000;
  for (const bool ties : {false, true}) {
    const std::vector<float> logits = LogitRows(rows, vocab, 90, ties);
    for (const int32_t k : {1, 4, 64}) {
      DeviceVector<float> dl(logits);
      DeviceVector<int32_t> ids(rows * k);
      DeviceVector<float> top(rows * k);
      DeviceVector<double> normalizers(rows);
      ASSERT_CUDA(kernels::TopKRows(dl.get(), rows, vocab, k, ids.get(), top.get(),
                                    normalizers.get(), nullptr));
      const std::vector<int32_t> actual_ids = ids.ToHost();
      const std::vector<float> actual_top = top.ToHost();
      const std::vector<double> actual_norm = normalizers.ToHost();
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits.data() + r * vocab;
        std::vector<int32_t> expected(vocab);
        for (int32_t i = 0; i < vocab; ++i) expected[i] = i;
        std::stable_sort(expected.begin(), expected.end(),
                         [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        for (int32_t j = 0; j < k; ++j) {
          EXPECT_EQ(actual_ids[r * k + j], expected[j]) << "row " << r << " rank " << j;
          EXPECT_EQ(actual_top[r * k + j], row[expected[j]]);
        }
        const float max_logit = row[expected[0]];
        double sum = 0.0;
        for (int64_t i = 0; i < vocab; ++i)
          sum += std::exp(static_cast<double>(row[i] - max_logit));
        EXPECT_NEAR(actual_norm[r], max_logit + std::log(sum),
                    1e-12 * std::fabs(max_logit) + 1e-12);
      }
    }
  }
}

TEST_F(CudaKernelsTest, LaunchersRejectBadArguments) {
  kernels::GroupMatMul empty;
  kernels::DeviceActivations x;
  x.rows = 1;
  EXPECT_EQ(kernels::SplitMatMul(empty, x, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::TopKRows(nullptr, 1, 10, 65, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  kernels::SamplingArgs args;
  args.rows = 1;
  args.temperature = 0.0;
  EXPECT_EQ(kernels::SampleRows(args, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::EmbeddingGather(nullptr, 2, 0, 32, nullptr, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::ApplyRope(nullptr, 1, 1, 64, 65, nullptr, nullptr, nullptr, true, nullptr),
            cudaErrorInvalidValue);
  kernels::VisibleSlotsArgs visible;
  visible.rows = 1;
  EXPECT_EQ(kernels::VisibleSlots(visible, nullptr), cudaErrorInvalidValue);
  // q8_0 rows hold whole blocks of 32 per head.
  EXPECT_EQ(
      kernels::StoreKvRows(nullptr, 1, 48, kernels::KvStorage::kQ8_0, nullptr, nullptr, nullptr),
      cudaErrorInvalidValue);
  kernels::AttentionArgs attention;
  attention.rows = 1;
  attention.num_heads = attention.num_kv_heads = 1;
  attention.head_dim = 48;
  attention.storage = kernels::KvStorage::kQ8_0;
  EXPECT_EQ(kernels::Attention(attention, nullptr), cudaErrorInvalidValue);
}

#endif  // BITSPLIT_HAVE_CUDA

}  // namespace
}  // namespace bitsplit::cuda
