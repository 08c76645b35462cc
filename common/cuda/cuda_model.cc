#include "common/cuda/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/device_info.h"
#include "common/io/ggml_type.h"
#include "common/ops/activation.h"
#include "common/ops/matmul.h"
#include "common/quant/hadamard.h"
#include "common/util/elapsed.h"
#include "common/util/fp16.h"
#include "common/util/status_macros.h"

namespace bitsplit::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using model::AlignVram;
using model::LinearGroup;
using model::LinearGroupId;

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Hands out consecutive kVramAlign-aligned pieces of a slab.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<uint8_t*>(base)) {}
  template <typename T>
  T* Take(uint64_t bytes) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += AlignVram(bytes);
    return p;
  }
  uint64_t used() const { return used_; }

 private:
  uint8_t* base_;
  uint64_t used_ = 0;
};

// The device forward reads the same config flags as LlamaModel::ForwardWith; a value it has no
// kernel for is UNIMPLEMENTED (the drafter's --backend auto then runs the CPU backend).
absl::Status CheckImplemented(const model::ModelConfig& config) {
  const auto refuse = [&](const std::string& what) {
    return absl::UnimplementedError(absl::StrCat("the CUDA backend has no kernel for ", what,
                                                 " of this \"", config.architecture,
                                                 "\" model (use --backend cpu)"));
  };
  switch (config.rope_style) {
    case model::RopeStyle::kAdjacentPairs:
    case model::RopeStyle::kHalves:
      break;
    default:
      return refuse(absl::StrCat("RoPE style ", static_cast<int>(config.rope_style)));
  }
  switch (config.ffn_activation) {
    case model::FfnActivation::kSilu:
    case model::FfnActivation::kGeluTanh:
      break;
    default:
      return refuse(absl::StrCat("FFN activation ", static_cast<int>(config.ffn_activation)));
  }
  if (config.sliding_window < 0 ||
      (config.sliding_window > 0 &&
       static_cast<int64_t>(config.layer_is_local.size()) != config.num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sliding window %d with %d local/global flags for %d layers",
                        config.sliding_window, config.layer_is_local.size(), config.num_layers));
  }
  return absl::OkStatus();
}

}  // namespace

kernels::DeviceMatrix DeviceMatrixOf(const quant::MatrixView& view, const uint8_t* data,
                                     int64_t stride) {
  kernels::DeviceMatrix m;
  m.data = data;
  m.rows = view.rows;
  m.cols = view.cols;
  m.row_stride = stride;
  m.format = view.format;
  m.group = view.group;
  m.layout = quant::GetSplitRowLayout(view.format, view.group, view.cols);
  return m;
}

std::vector<float> RopeTable(const model::ModelConfig& config, const float* freq_factors,
                             int64_t positions) {
  return RopeTable(config, freq_factors, positions, config.rope_freq_base, config.rope_freq_scale);
}

std::vector<float> RopeTable(const model::ModelConfig& config, const float* freq_factors,
                             int64_t positions, float freq_base, float freq_scale) {
  const int64_t pairs = config.rope_dims / 2;
  std::vector<float> table(static_cast<size_t>(2 * positions * pairs));
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(config.rope_dims));
  for (int64_t position = 0; position < positions; ++position) {
    float theta = static_cast<float>(position);
    for (int64_t i = 0; i < pairs; ++i) {
      const float factor = freq_factors != nullptr ? freq_factors[i] : 1.0f;
      const float angle = freq_scale * (theta / factor);
      table[static_cast<size_t>(position * pairs + i)] = std::cos(angle);
      table[static_cast<size_t>((positions + position) * pairs + i)] = std::sin(angle);
      theta *= theta_scale;
    }
  }
  return table;
}

std::vector<uint16_t> GeluTanhTable() {
  std::vector<uint16_t> table(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    table[bits] = Fp32ToFp16(ops::GeluTanh(Fp16ToFp32(static_cast<uint16_t>(bits))));
  }
  return table;
}

// ---- DeviceKvCache -------------------------------------------------------------------------

DeviceKvCache::~DeviceKvCache() {
  if (slab_ != nullptr) cudaFree(slab_);
  if (model_ != nullptr) --model_->live_caches_;
}

absl::Status DeviceKvCache::CommitSlots(std::span<const int32_t> pending_indices) {
  BITSPLIT_RETURN_IF_ERROR(slots_.CheckCommitSlots(pending_indices));
  const int64_t count = static_cast<int64_t>(pending_indices.size());
  if (count > 0) {
    // The indices travel through the model's top-k scratch ([max_batch_rows][64] int32, far more
    // than a path of at most max_batch_rows slots); stream order keeps them intact until the
    // kernel has read them.
    int32_t* indices = model_->d_.top_ids;
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(indices, pending_indices.data(),
                                                  count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                  model_->stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::CommitSlots(keys_, values_, positions_, num_layers_, capacity_ * kv_dim_, kv_dim_,
                             slots_.committed_length(), indices, count, model_->stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
  }
  slots_.SlotsCommitted(count);
  return absl::OkStatus();
}

absl::Status DeviceKvCache::CopyToHost(int64_t layer, int64_t first, int64_t count,
                                       std::vector<float>* keys, std::vector<float>* values) const {
  if (layer < 0 || layer >= num_layers_ || first < 0 || count < 0 || first + count > capacity_) {
    return absl::InvalidArgumentError("KV slots out of range");
  }
  std::vector<uint16_t> halves(static_cast<size_t>(count * kv_dim_));
  for (int side = 0; side < 2; ++side) {
    const uint16_t* source =
        (side == 0 ? this->keys(layer) : this->values(layer)) + first * kv_dim_;
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        halves.data(), source, halves.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    std::vector<float>* out = side == 0 ? keys : values;
    out->resize(halves.size());
    for (size_t i = 0; i < halves.size(); ++i) (*out)[i] = Fp16ToFp32(halves[i]);
  }
  return absl::OkStatus();
}

absl::Status DeviceKvCache::CopyPositionsToHost(int64_t first, int64_t count,
                                                std::vector<int32_t>* positions) const {
  if (positions_ == nullptr) {
    return absl::FailedPreconditionError("this KV cache keeps no slot positions (no window)");
  }
  if (first < 0 || count < 0 || first + count > capacity_) {
    return absl::InvalidArgumentError("KV slots out of range");
  }
  positions->resize(static_cast<size_t>(count));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(positions->data(), positions_ + first,
                                           count * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

// ---- CudaModel: loading ----------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const model::SplitModelFiles& files,
                                                             const CudaModelOptions& options) {
  return Create(files.config(), files.embedding_and_norms(), files.base_linear(),
                files.quantization(), options);
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(
    const model::ModelConfig& config, const model::EmbeddingAndNorms& embedding_and_norms,
    const model::SplitLinearWeights& base, const model::SplitQuantization& quantization,
    const CudaModelOptions& options) {
  BITSPLIT_RETURN_IF_ERROR(CheckImplemented(config));
  std::unique_ptr<CudaModel> model(new CudaModel());
  BITSPLIT_RETURN_IF_ERROR(model->Init(config, embedding_and_norms, base, quantization, options));
  return model;
}

void CudaModel::SetResidualSource(model::ResidualSource* source) {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (registered_ != nullptr) cudaHostUnregister(registered_);
  registered_ = nullptr;
  staging_ = nullptr;
  staging_resolved_ = false;
  staging_registered_ = false;
  residual_ = source;
}

absl::Status CudaModel::EnsureResidualStaging() {
  if (staging_resolved_) return absl::OkStatus();
  BITSPLIT_ASSIGN_OR_RETURN(const model::ResidualStaging* staging,
                            residual_->Staging(options_.max_batch_rows));
  if (staging != nullptr) {
    const cudaError_t registered =
        cudaHostRegister(staging->region.data(), staging->region.size(), cudaHostRegisterDefault);
    if (registered == cudaSuccess) {
      registered_ = staging->region.data();
    } else {
      // Registered by someone else (DMA all the same), or the memory cannot be registered: the
      // copies still work, staged through the driver.
      cudaGetLastError();
    }
    staging_registered_ =
        registered == cudaSuccess || registered == cudaErrorHostMemoryAlreadyRegistered;
  }
  staging_ = staging;
  staging_resolved_ = true;
  return absl::OkStatus();
}

CudaModel::~CudaModel() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (registered_ != nullptr) cudaHostUnregister(registered_);
  for (const CapturedForward& graph : graphs_) cudaGraphExecDestroy(graph.exec);
  if (d_.step != nullptr) cudaFree(d_.step);
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  for (void* slab : {weights_slab_, constants_slab_, scratch_slab_}) {
    if (slab != nullptr) cudaFree(slab);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaModel::Init(const model::ModelConfig& config,
                             const model::EmbeddingAndNorms& embedding_and_norms,
                             const model::SplitLinearWeights& base,
                             const model::SplitQuantization& quantization,
                             const CudaModelOptions& options) {
  config_ = config;
  quantization_ = quantization;
  options_ = options;
  const int devices = CountDevices();
  if (devices == 0) {
    return absl::FailedPreconditionError("the CUDA backend needs a CUDA device; none is visible");
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d does not exist (%d visible)", options.device, devices));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp properties;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, options.device));
  device_name_ = properties.name;
  size_t free_bytes = 0, total_bytes = 0;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));

  // The embedding table goes to the device when the gather kernel reads its type.
  const ops::WeightMatrix& embedding = embedding_and_norms.token_embd;
  embedding_on_device_ = embedding.type == GgmlType::kF32 || embedding.type == GgmlType::kF16 ||
                         embedding.type == GgmlType::kQ8_0;
  embedding_type_ = static_cast<int32_t>(embedding.type);
  embedding_row_bytes_ = embedding.row_bytes;
  host_embedding_ = embedding_and_norms;

  model::VramRequest request;
  request.config = config;
  request.base_format = quantization.base_format;
  request.base_group = quantization.base_group;
  request.embedding_bytes =
      embedding_on_device_ ? static_cast<uint64_t>(embedding.rows * embedding.row_bytes) : 0;
  request.context = options.context;
  request.sessions = options.sessions;
  request.max_batch_rows = options.max_batch_rows;
  const uint64_t budget =
      options.vram_budget > 0 ? options.vram_budget : model::DefaultVramBudget(free_bytes);
  if (budget > free_bytes) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the VRAM budget of %s exceeds the %s free on %s",
                        model::FormatBytes(budget), model::FormatBytes(free_bytes), device_name_));
  }
  absl::StatusOr<model::VramPlan> plan = model::PlanVram(request, budget);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(device_name_, ": ", plan.status().message()));
  }
  plan_ = *plan;
  pool_ = std::make_unique<ThreadPool>(options.host_threads);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  // Base weights: every matrix with rows padded to 4 bytes, in AllLinearGroups order.
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&weights_slab_, plan_.base_weights_bytes));
  Carver weights(weights_slab_);
  for (const LinearGroupId id : model::AllLinearGroups(config)) {
    Group group;
    const std::span<const quant::MatrixView> views = base.group(id);
    if (views.empty() || views.size() > kernels::kMaxGroupMatrices) {
      return absl::InvalidArgumentError(
          absl::StrCat("base weights of ", model::LinearGroupIdString(id), " are missing"));
    }
    group.cols = views[0].cols;
    group.matmul.count = static_cast<int32_t>(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      const quant::MatrixView& view = views[i];
      if (view.format != quantization.base_format || view.group != quantization.base_group ||
          view.cols != group.cols) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: matrix %d is %s/g%d with %d columns; the model's base is %s/g%d",
            model::LinearGroupIdString(id), i, quant::GetSplitFormatInfo(view.format).name,
            view.group, view.cols, quant::GetSplitFormatInfo(quantization.base_format).name,
            quantization.base_group));
      }
      const uint64_t row_bytes = quant::SplitRowBytes(view.format, view.group, view.cols);
      const uint64_t stride = model::DeviceRowStride(view.format, view.group, view.cols);
      uint8_t* data = weights.Take<uint8_t>(stride * static_cast<uint64_t>(view.rows));
      BITSPLIT_CHECK(weights.used() <= plan_.base_weights_bytes);
      BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(data, stride, view.data, view.row_stride,
                                                 row_bytes, static_cast<size_t>(view.rows),
                                                 cudaMemcpyHostToDevice));
      group.matmul.matrices[i] = DeviceMatrixOf(view, data, static_cast<int64_t>(stride));
      group.output_rows[i] = view.rows;
    }
    groups_.push_back(group);
  }

  // Embedding, norms, RoPE table, Hadamard signs.
  const int64_t d = config.d_model;
  const int64_t widest_input = std::max({config.d_model, config.q_dim(), config.d_ff});
  const int64_t pairs = config.rope_dims / 2;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&constants_slab_, plan_.constants_slab_bytes));
  Carver constants(constants_slab_);
  if (embedding_on_device_) {
    uint8_t* table = constants.Take<uint8_t>(plan_.embedding_bytes);
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        table, embedding.data, embedding.rows * embedding.row_bytes, cudaMemcpyHostToDevice));
    embedding_ = table;
  }
  // The per-layer vectors the family reads (LayerVectorSpecs: norms, post-norms, QK-norms,
  // biases), one after another per layer, then the output norm.
  norms_ = constants.Take<float>(plan_.norms_bytes);
  {
    const std::vector<model::LayerVectorSpec> specs = model::LayerVectorSpecs(config);
    if (static_cast<int64_t>(embedding_and_norms.layers.size()) != config.num_layers ||
        embedding_and_norms.output_norm == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the model has vectors for %d layers (and %s output norm); the config "
          "has %d layers",
          embedding_and_norms.layers.size(),
          embedding_and_norms.output_norm == nullptr ? "no" : "an", config.num_layers));
    }
    std::vector<float> norms;
    layer_vectors_.assign(static_cast<size_t>(config.num_layers), model::LayerNorms{});
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      const model::LayerNorms& host = embedding_and_norms.layers[static_cast<size_t>(layer)];
      model::LayerNorms& device = layer_vectors_[static_cast<size_t>(layer)];
      for (const model::LayerVectorSpec& spec : specs) {
        const float* source = host.*spec.field;
        if (source == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("blk.", layer, ".", spec.tensor, " is missing"));
        }
        device.*spec.field = norms_ + norms.size();
        norms.insert(norms.end(), source, source + spec.length);
      }
    }
    output_norm_ = norms_ + norms.size();
    norms.insert(norms.end(), embedding_and_norms.output_norm, embedding_and_norms.output_norm + d);
    BITSPLIT_CHECK(norms.size() * sizeof(float) <= plan_.norms_bytes);
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(norms_, norms.data(), norms.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  // RoPE: cos/sin for every position a session can hold, computed with ops::ApplyRope's own
  // arithmetic (theta *= theta_scale in f32, std::cos/std::sin), so the device rotates exactly:
  // the global layers' base and scale, and with a sliding window also the local layers'.
  {
    const uint64_t table_bytes = AlignVram(options.context * pairs * 2 * sizeof(float));
    const auto upload = [&](float freq_base, float freq_scale, float** cos_table,
                            float** sin_table) -> absl::Status {
      float* rope = constants.Take<float>(table_bytes);
      *cos_table = rope;
      *sin_table = rope + options.context * pairs;
      const std::vector<float> table = RopeTable(config, embedding_and_norms.rope_freq_factors,
                                                 options.context, freq_base, freq_scale);
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(rope, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
      return absl::OkStatus();
    };
    BITSPLIT_RETURN_IF_ERROR(
        upload(config.rope_freq_base, config.rope_freq_scale, &rope_cos_, &rope_sin_));
    if (config.sliding_window > 0) {
      BITSPLIT_RETURN_IF_ERROR(
          upload(config.rope_freq_base_local, 1.0f, &rope_local_cos_, &rope_local_sin_));
    }
  }
  hadamard_masks_ = constants.Take<uint32_t>(plan_.hadamard_bytes);
  {
    std::vector<uint32_t> masks(static_cast<size_t>(widest_input), 0u);
    if (quantization.rotation.enabled()) {
      for (int64_t column = 0; column < widest_input; ++column) {
        masks[static_cast<size_t>(column)] =
            quant::HadamardSign(quantization.rotation.seed, column) < 0.0f ? 0x80000000u : 0u;
      }
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        hadamard_masks_, masks.data(), masks.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  }
  if (config.ffn_activation == model::FfnActivation::kGeluTanh) {
    gelu_table_ = constants.Take<uint16_t>(plan_.activation_table_bytes);
    const std::vector<uint16_t> table = GeluTanhTable();
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        gelu_table_, table.data(), table.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  BITSPLIT_CHECK(constants.used() <= plan_.constants_slab_bytes);

  // Scratch, in ForwardScratchLayout's order.
  const model::ForwardScratchLayout& s = plan_.scratch;
  const uint64_t t = static_cast<uint64_t>(options.max_batch_rows);
  block_stride_max_ = RoundUp((widest_input + 31) / 32, 8);
  const uint64_t bs = static_cast<uint64_t>(block_stride_max_);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_slab_, plan_.scratch_slab_bytes));
  Carver scratch(scratch_slab_);
  d_.tokens = scratch.Take<int32_t>(4 * t);
  d_.positions = scratch.Take<int32_t>(4 * t);
  d_.logit_rows = scratch.Take<int32_t>(4 * t);
  d_.mask = scratch.Take<uint8_t>(2 * t * t);
  d_.x = scratch.Take<float>(s.hidden_state_bytes);
  d_.normed = scratch.Take<float>(s.normed_bytes);
  d_.q = scratch.Take<float>(s.q_bytes);
  d_.k_new = scratch.Take<float>(s.kv_new_bytes / 2);
  d_.v_new = scratch.Take<float>(s.kv_new_bytes / 2);
  d_.attention = scratch.Take<float>(s.attention_bytes);
  d_.gate = scratch.Take<float>(s.gate_up_bytes / 2);
  d_.up = scratch.Take<float>(s.gate_up_bytes / 2);
  d_.projected = scratch.Take<float>(s.projected_bytes);
  d_.rotated = scratch.Take<float>(s.rotated_bytes);
  d_.codes = scratch.Take<int8_t>(t * static_cast<uint64_t>(widest_input));
  d_.act_scales = scratch.Take<float>(4 * t * bs);
  d_.act_sums = scratch.Take<float>(4 * t * bs);
  d_.residual_output = scratch.Take<float>(s.residual_output_bytes);
  d_.logits = scratch.Take<float>(s.logits_bytes);
  d_.scores = scratch.Take<float>(s.scores_bytes);
  if (s.visible_slots_bytes > 0) {
    d_.visible_slots = scratch.Take<int32_t>(4 * t * static_cast<uint64_t>(options.context));
    d_.visible_counts = scratch.Take<int32_t>(4 * t);
  }
  d_.sampling = scratch.Take<double>(s.sampling_bytes);
  d_.top_ids = scratch.Take<int32_t>(t * 64 * 4);
  d_.top_logits = scratch.Take<float>(t * 64 * 4);
  d_.log_normalizers = scratch.Take<double>(8 * t);
  d_.choices = scratch.Take<int32_t>(4 * t);
  d_.choice_positions = scratch.Take<int64_t>(8 * t);
  BITSPLIT_CHECK(scratch.used() == s.total_bytes);
  // The step's prefix length and first slot (16 bytes outside the plan's slabs).
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_.step, 2 * sizeof(int64_t)));

  // Pinned host staging, carved like the scratch.
  const uint64_t pinned_bytes = AlignVram(12 * t + 2 * t * t + 2 * sizeof(int64_t)) +
                                AlignVram(t * static_cast<uint64_t>(widest_input)) +
                                2 * AlignVram(4 * t * bs) + s.residual_output_bytes +
                                AlignVram(4 * t * static_cast<uint64_t>(d));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&pinned_, pinned_bytes, cudaHostAllocDefault));
  Carver pinned(pinned_);
  host_batch_ = pinned.Take<uint8_t>(12 * t + 2 * t * t + 2 * sizeof(int64_t));
  host_codes_ = pinned.Take<int8_t>(t * static_cast<uint64_t>(widest_input));
  host_scales_ = pinned.Take<float>(4 * t * bs);
  host_sums_ = pinned.Take<float>(4 * t * bs);
  host_residual_ = pinned.Take<float>(s.residual_output_bytes);
  host_embedding_rows_ = pinned.Take<float>(4 * t * static_cast<uint64_t>(d));
  BITSPLIT_CHECK(pinned.used() == pinned_bytes);
  events_.resize(static_cast<size_t>(3 * groups_.size()));
  for (cudaEvent_t& event : events_) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceKvCache>> CudaModel::NewKvCache() {
  if (live_caches_.fetch_add(1) >= options_.sessions) {
    --live_caches_;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "all %d KV caches of the VRAM plan are in use (start the drafter with more sessions)",
        options_.sessions));
  }
  std::unique_ptr<DeviceKvCache> cache(new DeviceKvCache());
  cache->model_ = this;  // from here on the destructor returns the count
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&cache->slab_, plan_.kv_bytes_per_session));
  cache->num_layers_ = config_.num_layers;
  cache->kv_dim_ = config_.kv_dim();
  cache->capacity_ = options_.context;
  cache->slots_ = model::KvSlotLedger(options_.context);
  cache->keys_ = static_cast<uint16_t*>(cache->slab_);
  const uint64_t one_side = AlignVram(
      static_cast<uint64_t>(config_.num_layers * options_.context * config_.kv_dim() * 2));
  cache->values_ = cache->keys_ + one_side / 2;
  if (plan_.kv_positions_bytes > 0) {
    cache->positions_ =
        reinterpret_cast<int32_t*>(static_cast<uint8_t*>(cache->slab_) + 2 * one_side);
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemset(cache->positions_, 0, plan_.kv_positions_bytes));
  }
  return cache;
}

// ---- CudaModel: forward ----------------------------------------------------------------------

const CudaModel::Group& CudaModel::GroupOf(LinearGroupId id) const {
  return groups_[static_cast<size_t>(model::LinearGroupIndex(config_, id))];
}

absl::Status CudaModel::ValidateBatch(const model::Batch& batch, const DeviceKvCache& cache) const {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateBatch(batch, config_.vocab_size, cache.pending_length()));
  const int64_t n = batch.size();
  if (n > options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a batch of %d tokens exceeds this drafter's largest forward of %d tokens",
                        n, options_.max_batch_rows));
  }
  const int64_t width = batch.mask_width();
  if (width > 2 * options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a batch mask %d wide exceeds this drafter's limit of %d", width,
                        2 * options_.max_batch_rows));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (batch.positions[i] >= options_.context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch row %d has position %d outside [0, %d)", i, batch.positions[i], options_.context));
    }
  }
  if (batch.num_logit_rows() > options_.max_batch_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d logit rows exceed this drafter's limit of %d", batch.num_logit_rows(),
                        options_.max_batch_rows));
  }
  if (cache.model_ != this) {
    return absl::InvalidArgumentError("the KV cache belongs to another model");
  }
  if (width > cache.capacity() - cache.committed_length()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache full: %d committed + %d new tokens exceed the capacity of %d",
                        cache.committed_length(), width, cache.capacity()));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::Linear(LinearGroupId id, const float* x, int64_t rows,
                               std::span<float* const> outputs, bool verify) {
  const Group& group = GroupOf(id);
  const int64_t cols = group.cols;
  const float* input = x;
  if (quantization_.rotation.enabled()) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.rotated, x, rows * cols * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::HadamardRotate(
        d_.rotated, rows, cols, quantization_.rotation.block, hadamard_masks_,
        quant::HadamardScale(quantization_.rotation.block), stream_));
    input = d_.rotated;
  }
  const int64_t block_stride = RoundUp(cols / 32, 8);
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::QuantizeActivations(
      input, rows, cols, d_.codes, d_.act_scales, d_.act_sums, block_stride, stream_));
  const kernels::DeviceActivations activations{d_.codes, d_.act_scales, d_.act_sums,
                                               rows,     cols,          block_stride};
  const size_t event_base = 3 * static_cast<size_t>(model::LinearGroupIndex(config_, id));
  bool staged = false;
  if (verify) {
    // The activations go to the host first, so the residual can start while the base runs:
    // straight into the residual source's staging memory when it has some for this many rows
    // (else through the copy path, whose source refuses what it cannot hold).
    BITSPLIT_RETURN_IF_ERROR(EnsureResidualStaging());
    staged = staging_ != nullptr && rows <= staging_->max_rows;
    int8_t* codes = staged ? staging_->codes : host_codes_;
    float* scales = staged ? staging_->scales : host_scales_;
    float* sums = staged ? staging_->sums : host_sums_;
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(codes, d_.codes, rows * cols, cudaMemcpyDeviceToHost, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scales, d_.act_scales,
                                                  rows * block_stride * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        sums, d_.act_sums, rows * block_stride * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[event_base], stream_));
  }
  kernels::GroupMatMul matmul = group.matmul;
  for (int i = 0; i < matmul.count; ++i) matmul.outputs[i] = outputs[static_cast<size_t>(i)];
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SplitMatMul(matmul, activations, false, stream_));
  ++timings_.groups;
  if (!verify) return absl::OkStatus();

  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[event_base + 1], stream_));
  const Clock::time_point wait_start = Clock::now();
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[event_base]));
  const Clock::time_point residual_start = Clock::now();
  timings_.wait_gpu_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(residual_start - wait_start).count();
  int64_t total_rows = 0;
  for (int i = 0; i < matmul.count; ++i) total_rows += group.output_rows[i];
  const float* residual_output = host_residual_;
  if (staged) {
    // y = x · Rᵀ lands in the staging memory; the next group's activation copy, queued after
    // this group's output copy on the stream, is what the host waits for before the source
    // writes there again.
    BITSPLIT_RETURN_IF_ERROR(residual_->SubmitStaged(id, rows, cols));
    BITSPLIT_RETURN_IF_ERROR(residual_->WaitStaged(id, *pool_));
    residual_output = staging_->outputs;
  } else {
    quant::QuantizedActivations& h = host_activations_;
    h.rows = rows;
    h.cols = cols;
    h.block_stride = block_stride;
    h.codes.assign(host_codes_, host_codes_ + rows * cols);
    h.scales.assign(host_scales_, host_scales_ + rows * block_stride);
    h.sums.assign(host_sums_, host_sums_ + rows * block_stride);
    float* host_outputs[kernels::kMaxGroupMatrices] = {};
    int64_t offset = 0;
    for (int i = 0; i < matmul.count; ++i) {
      host_outputs[i] = host_residual_ + rows * offset;
      offset += group.output_rows[i];
    }
    std::fill_n(host_residual_, rows * total_rows, 0.0f);
    BITSPLIT_RETURN_IF_ERROR(residual_->Submit(id, host_activations_));
    BITSPLIT_RETURN_IF_ERROR(residual_->Accumulate(
        id, host_activations_, std::span<float* const>(host_outputs, matmul.count), *pool_));
  }
  timings_.residual_ns += NanosSince(residual_start);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[event_base + 2], stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.residual_output, residual_output,
                                                rows * total_rows * sizeof(float),
                                                cudaMemcpyHostToDevice, stream_));
  int64_t offset = 0;
  for (int i = 0; i < matmul.count; ++i) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddInPlace(outputs[static_cast<size_t>(i)],
                                                      d_.residual_output + rows * offset,
                                                      rows * group.output_rows[i], stream_));
    offset += group.output_rows[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaModel::MatMulPassTiming> CudaModel::TimeBaseMatMuls(int64_t rows,
                                                                       int repetitions) {
  if (rows < 1 || rows > options_.max_batch_rows || repetitions < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rows %d must be in [1, %d] and repetitions %d positive", rows,
                        options_.max_batch_rows, repetitions));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  int64_t widest = 0;
  for (const Group& group : groups_) widest = std::max(widest, group.cols);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_.codes, 0, rows * widest, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(d_.act_scales, 0, rows * block_stride_max_ * sizeof(float), stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(d_.act_sums, 0, rows * block_stride_max_ * sizeof(float), stream_));
  MatMulPassTiming timing;
  std::vector<std::pair<const Group*, std::vector<float*>>> passes;
  for (const LinearGroupId id : model::AllLinearGroups(config_)) {
    std::vector<float*> outputs;
    switch (id.group) {
      case LinearGroup::kQkv:
        outputs = {d_.q, d_.k_new, d_.v_new};
        break;
      case LinearGroup::kGateUp:
        outputs = {d_.gate, d_.up};
        break;
      case LinearGroup::kOutputHead:
        outputs = {d_.logits};
        break;
      default:
        outputs = {d_.projected};
        break;
    }
    const Group& group = GroupOf(id);
    for (int i = 0; i < group.matmul.count; ++i) {
      timing.weight_bytes += static_cast<uint64_t>(group.matmul.matrices[i].rows *
                                                   group.matmul.matrices[i].row_stride);
    }
    passes.emplace_back(&group, std::move(outputs));
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  cudaError_t error = cudaEventRecord(start, stream_);
  for (int rep = 0; rep < repetitions && error == cudaSuccess; ++rep) {
    for (const auto& [group, outputs] : passes) {
      const kernels::DeviceActivations x{d_.codes, d_.act_scales, d_.act_sums,
                                         rows,     group->cols,   RoundUp(group->cols / 32, 8)};
      kernels::GroupMatMul matmul = group->matmul;
      for (int i = 0; i < matmul.count; ++i) matmul.outputs[i] = outputs[static_cast<size_t>(i)];
      error = kernels::SplitMatMul(matmul, x, false, stream_);
      if (error != cudaSuccess) break;
    }
  }
  if (error == cudaSuccess) error = cudaEventRecord(stop, stream_);
  if (error == cudaSuccess) error = cudaEventSynchronize(stop);
  float ms = 0.0f;
  if (error == cudaSuccess) error = cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  BITSPLIT_CUDA_RETURN_IF_ERROR(error);
  timing.ms = ms / repetitions;
  return timing;
}

absl::Status CudaModel::Forward(const model::Batch& batch, DeviceKvCache& cache,
                                model::ForwardMode mode) {
  absl::Status status = ForwardImpl(batch, cache, mode);
  if (!status.ok() && stream_ != nullptr) {
    // Let whatever was queued finish before the caller reuses the staging buffers or the cache.
    cudaStreamSynchronize(stream_);
    last_logit_rows_ = 0;
  }
  return status;
}

absl::Status CudaModel::ForwardImpl(const model::Batch& batch, DeviceKvCache& cache,
                                    model::ForwardMode mode) {
  if (mode == model::ForwardMode::kReference) {
    return absl::FailedPreconditionError(
        "the CUDA backend runs split models in draft or verify mode only");
  }
  const bool verify = mode == model::ForwardMode::kVerify;
  if (verify && residual_ == nullptr) {
    return absl::FailedPreconditionError("verify mode needs a residual source (none attached)");
  }
  BITSPLIT_RETURN_IF_ERROR(ValidateBatch(batch, cache));
  const Clock::time_point start = Clock::now();
  timings_ = ForwardTimings{};
  const int64_t n = batch.size();
  const int64_t prefix_length = cache.committed_length();
  const int64_t first_slot = prefix_length + batch.pending_prefix;
  const int64_t width = batch.mask_width();
  const int64_t logit_rows = batch.num_logit_rows();
  BITSPLIT_RETURN_IF_ERROR(cache.BeginPending(batch.pending_prefix + n));

  // The batch, through pinned staging: tokens, positions, logit rows, mask, then the step's
  // prefix length and first slot, at fixed offsets (the device reads the step values from
  // d_.step, so one captured graph serves every step of a shape). The previous forward's copies
  // out of it have completed (a forward ends with a stream sync).
  const int64_t t_max = options_.max_batch_rows;
  uint8_t* staging = host_batch_;
  std::memcpy(staging, batch.tokens.data(), n * sizeof(int32_t));
  std::memcpy(staging + 4 * t_max, batch.positions.data(), n * sizeof(int32_t));
  std::memcpy(staging + 8 * t_max, batch.logit_rows.data(),
              batch.logit_rows.size() * sizeof(int32_t));
  std::memcpy(staging + 12 * t_max, batch.attention_mask.data(), n * width);
  const int64_t step[2] = {prefix_length, first_slot};
  std::memcpy(staging + StepStagingOffset(), step, sizeof(step));
  const ForwardShape shape{n, width, logit_rows, !batch.logit_rows.empty(), cache.keys(0)};
  if (!verify && embedding_on_device_ && cuda_graphs_) {
    BITSPLIT_RETURN_IF_ERROR(LaunchDraftGraph(batch, shape, cache));
  } else {
    BITSPLIT_RETURN_IF_ERROR(EnqueueForward(batch, shape, cache, verify));
  }

  const Clock::time_point sync_start = Clock::now();
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  timings_.wait_gpu_ns += NanosSince(sync_start);
  if (verify) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      float ms = 0.0f;
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&ms, events_[3 * g + 1], events_[3 * g + 2]));
      timings_.gpu_idle_residual_ns += static_cast<int64_t>(std::max(0.0f, ms) * 1e6f);
    }
  }
  last_logit_rows_ = logit_rows;
  timings_.total_ns = NanosSince(start);
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueForward(const model::Batch& batch, const ForwardShape& shape,
                                       DeviceKvCache& cache, bool verify) {
  const model::ModelConfig& c = config_;
  const int64_t n = shape.rows;
  const int64_t width = shape.mask_width;
  const int64_t logit_rows = shape.logit_rows;
  const int64_t t_max = options_.max_batch_rows;
  const uint8_t* staging = host_batch_;
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_.tokens, staging, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      d_.positions, staging + 4 * t_max, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  if (shape.selects_rows) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.logit_rows, staging + 8 * t_max,
                                                  logit_rows * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream_));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_.mask, staging + 12 * t_max, n * width, cudaMemcpyHostToDevice, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.step, staging + StepStagingOffset(),
                                                2 * sizeof(int64_t), cudaMemcpyHostToDevice,
                                                stream_));

  if (embedding_on_device_) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::EmbeddingGather(
        embedding_, embedding_type_, embedding_row_bytes_, c.d_model, d_.tokens, n, d_.x, stream_));
  } else {
    for (int64_t t = 0; t < n; ++t) {
      ops::DequantizeWeightRow(host_embedding_.token_embd, batch.tokens[t],
                               host_embedding_rows_ + t * c.d_model);
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.x, host_embedding_rows_,
                                                  n * c.d_model * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream_));
  }
  if (c.embedding_scale != 1.0f) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::ScaleInPlace(d_.x, n * c.d_model, c.embedding_scale, stream_));
  }
  if (c.sliding_window > 0) {
    // The batch's positions go with its keys, and every row's window is listed once: the local
    // layers all have the same window over the same slots.
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::StorePositions(d_.positions, n, cache.positions(), d_.step + 1, stream_));
    kernels::VisibleSlotsArgs visible;
    visible.mask = d_.mask;
    visible.rows = n;
    visible.prefix_length_on_device = d_.step;
    visible.mask_width = width;
    visible.window = c.sliding_window;
    visible.query_positions = d_.positions;
    visible.slot_positions = cache.positions();
    visible.slots = d_.visible_slots;
    visible.counts = d_.visible_counts;
    visible.slot_stride = options_.context;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::VisibleSlots(visible, stream_));
  }

  kernels::AttentionArgs attention;
  attention.q = d_.q;
  attention.mask = d_.mask;
  attention.out = d_.attention;
  attention.scores = d_.scores;
  attention.rows = n;
  attention.prefix_length_on_device = d_.step;
  attention.mask_width = width;
  attention.score_stride = options_.context;
  attention.num_heads = c.num_heads;
  attention.num_kv_heads = c.num_kv_heads;
  attention.head_dim = c.head_dim;
  attention.scale = c.attention_scale;
  const bool halves = c.rope_style == model::RopeStyle::kHalves;

  // Each step as LlamaModel::ForwardWith takes it, in the same order.
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const model::LayerNorms& vectors = layer_vectors_[static_cast<size_t>(layer)];
    const bool local = c.IsLocalLayer(layer);
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model, vectors.attn_norm,
                                                   c.rms_norm_eps, d_.normed, stream_));
    float* const qkv[] = {d_.q, d_.k_new, d_.v_new};
    BITSPLIT_RETURN_IF_ERROR(Linear({layer, LinearGroup::kQkv}, d_.normed, n, qkv, verify));
    if (c.qkv_bias) {
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          kernels::AddRowVector(d_.q, vectors.q_bias, n, c.q_dim(), stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          kernels::AddRowVector(d_.k_new, vectors.k_bias, n, c.kv_dim(), stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          kernels::AddRowVector(d_.v_new, vectors.v_bias, n, c.kv_dim(), stream_));
    }
    if (c.qk_norm) {  // each head normalized on its own, in place
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.q, nullptr, n * c.num_heads, c.head_dim,
                                                     vectors.attn_q_norm, c.rms_norm_eps, d_.q,
                                                     stream_));
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.k_new, nullptr, n * c.num_kv_heads,
                                                     c.head_dim, vectors.attn_k_norm,
                                                     c.rms_norm_eps, d_.k_new, stream_));
    }
    const float* rope_cos = local ? rope_local_cos_ : rope_cos_;
    const float* rope_sin = local ? rope_local_sin_ : rope_sin_;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(d_.q, n, c.num_heads, c.head_dim, c.rope_dims,
                                                     d_.positions, rope_cos, rope_sin, halves,
                                                     stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(d_.k_new, n, c.num_kv_heads, c.head_dim,
                                                     c.rope_dims, d_.positions, rope_cos, rope_sin,
                                                     halves, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::StoreHalf(d_.k_new, n, c.kv_dim(), cache.keys(layer), d_.step + 1, stream_));
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::StoreHalf(d_.v_new, n, c.kv_dim(), cache.values(layer), d_.step + 1, stream_));
    attention.keys = cache.keys(layer);
    attention.values = cache.values(layer);
    // A local layer sees the window's slots (listed above), a global one the mask's.
    attention.visible_slots = local ? d_.visible_slots : nullptr;
    attention.visible_counts = local ? d_.visible_counts : nullptr;
    attention.visible_stride = local ? options_.context : 0;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::Attention(attention, stream_));
    float* const projected[] = {d_.projected};
    BITSPLIT_RETURN_IF_ERROR(
        Linear({layer, LinearGroup::kAttnOutput}, d_.attention, n, projected, verify));
    if (c.post_norms) {
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.projected, nullptr, n, c.d_model,
                                                     vectors.attn_post_norm, c.rms_norm_eps,
                                                     d_.projected, stream_));
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddInPlace(d_.x, d_.projected, n * c.d_model, stream_));

    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, nullptr, n, c.d_model, vectors.ffn_norm,
                                                   c.rms_norm_eps, d_.normed, stream_));
    float* const gate_up[] = {d_.gate, d_.up};
    BITSPLIT_RETURN_IF_ERROR(Linear({layer, LinearGroup::kGateUp}, d_.normed, n, gate_up, verify));
    switch (c.ffn_activation) {
      case model::FfnActivation::kSilu:
        BITSPLIT_CUDA_RETURN_IF_ERROR(
            kernels::SiluMul(d_.gate, d_.up, n * c.d_ff, d_.gate, stream_));
        break;
      case model::FfnActivation::kGeluTanh:
        BITSPLIT_CUDA_RETURN_IF_ERROR(
            kernels::GeluTanhMul(d_.gate, d_.up, n * c.d_ff, gelu_table_, d_.gate, stream_));
        break;
    }
    BITSPLIT_RETURN_IF_ERROR(Linear({layer, LinearGroup::kDown}, d_.gate, n, projected, verify));
    if (c.post_norms) {
      BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.projected, nullptr, n, c.d_model,
                                                     vectors.ffn_post_norm, c.rms_norm_eps,
                                                     d_.projected, stream_));
    }
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::AddInPlace(d_.x, d_.projected, n * c.d_model, stream_));
  }

  // Output head, for the selected rows (in the order asked, repeats allowed).
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::RmsNorm(d_.x, shape.selects_rows ? d_.logit_rows : nullptr,
                                                 logit_rows, c.d_model, output_norm_,
                                                 c.rms_norm_eps, d_.normed, stream_));
  float* const head[] = {d_.logits};
  BITSPLIT_RETURN_IF_ERROR(Linear(LinearGroupId::Head(), d_.normed, logit_rows, head, verify));

  return absl::OkStatus();
}

absl::Status CudaModel::LaunchDraftGraph(const model::Batch& batch, const ForwardShape& shape,
                                         DeviceKvCache& cache) {
  auto found = std::find_if(graphs_.begin(), graphs_.end(),
                            [&](const CapturedForward& g) { return g.shape == shape; });
  if (found == graphs_.end()) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status status = EnqueueForward(batch, shape, cache, /*verify=*/false);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!status.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      BITSPLIT_RETURN_IF_ERROR(status);
      BITSPLIT_CUDA_RETURN_IF_ERROR(ended);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    BITSPLIT_CUDA_RETURN_IF_ERROR(instantiated);
    if (graphs_.size() >= kMaxCapturedForwards) {
      cudaGraphExecDestroy(graphs_.front().exec);
      graphs_.erase(graphs_.begin());
    }
    graphs_.push_back({shape, exec, timings_.groups});
    found = graphs_.end() - 1;
    ++graphs_captured_;
  }
  timings_.groups = found->groups;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(found->exec, stream_));
  ++graph_launches_;
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(const model::Batch& batch, DeviceKvCache& cache,
                                std::span<float> logits, model::ForwardMode mode) {
  const int64_t needed = batch.num_logit_rows() * config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) < needed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits buffer holds %d floats; %d rows x %d vocab need %d", logits.size(),
                        batch.num_logit_rows(), config_.vocab_size, needed));
  }
  BITSPLIT_RETURN_IF_ERROR(Forward(batch, cache, mode));
  return CopyLogits(logits.subspan(0, static_cast<size_t>(needed)));
}

absl::Status CudaModel::CopyLogits(std::span<float> logits) {
  const int64_t count = last_logit_rows_ * config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) < count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits buffer holds %d floats; the last forward has %d", logits.size(), count));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data(), d_.logits, count * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaModel::ChooseTargets(const model::SamplingParams& sampling,
                                                              std::span<const int64_t> positions) {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  const int64_t rows = last_logit_rows_;
  if (rows == 0) return absl::FailedPreconditionError("no forward has run");
  if (static_cast<int64_t>(positions.size()) != rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d positions for the %d logit rows of the last forward", positions.size(), rows));
  }
  if (sampling.temperature == 0.0f) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        kernels::ArgMaxRows(d_.logits, rows, config_.vocab_size, d_.choices, stream_));
  } else {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_.choice_positions, positions.data(),
                                                  rows * sizeof(int64_t), cudaMemcpyHostToDevice,
                                                  stream_));
    kernels::SamplingArgs args;
    args.logits = d_.logits;
    args.rows = rows;
    args.vocab = config_.vocab_size;
    args.positions = d_.choice_positions;
    args.temperature = sampling.temperature;
    args.top_k = sampling.top_k;
    args.top_p = sampling.top_p;
    args.seed = sampling.seed;
    args.weights = d_.sampling;
    args.choices = d_.choices;
    BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::SampleRows(args, stream_));
  }
  std::vector<int32_t> choices(static_cast<size_t>(rows));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(choices.data(), d_.choices, rows * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return choices;
}

absl::StatusOr<RowTopK> CudaModel::TopK(int32_t k) {
  const int64_t rows = last_logit_rows_;
  if (rows == 0) return absl::FailedPreconditionError("no forward has run");
  if (k < 1 || k > 64 || k > config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("top-k needs 1 <= k <= 64, got ", k));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(kernels::TopKRows(d_.logits, rows, config_.vocab_size, k,
                                                  d_.top_ids, d_.top_logits, d_.log_normalizers,
                                                  stream_));
  RowTopK top;
  top.k = k;
  top.ids.resize(static_cast<size_t>(rows * k));
  top.logits.resize(static_cast<size_t>(rows * k));
  top.log_normalizers.resize(static_cast<size_t>(rows));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.ids.data(), d_.top_ids,
                                                top.ids.size() * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.logits.data(), d_.top_logits,
                                                top.logits.size() * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(top.log_normalizers.data(), d_.log_normalizers,
                                                top.log_normalizers.size() * sizeof(double),
                                                cudaMemcpyDeviceToHost, stream_));
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return top;
}

}  // namespace bitsplit::cuda
