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

using model::AlignVram;
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
    case model::FfnActivation::kSwigluOai:
      break;
    default:
      return refuse(absl::StrCat("FFN activation ", static_cast<int>(config.ffn_activation)));
  }
  // Expert biases are added to whole rows of the gate and up outputs.
  if (config.expert_biases && config.fused_expert_gate_up) {
    return refuse("biases on fused gate|up experts");
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

std::vector<float> RopeTable(const ops::RopeConfig& rope, int64_t positions) {
  const int64_t pairs = rope.rotary_dims / 2;
  std::vector<float> table(static_cast<size_t>(2 * positions * pairs));
  for (int64_t position = 0; position < positions; ++position) {
    ops::RopeCosSin(rope, static_cast<int32_t>(position),
                    &table[static_cast<size_t>(position * pairs)],
                    &table[static_cast<size_t>((positions + position) * pairs)]);
  }
  return table;
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
  size_t free_bytes = 0;
  BITSPLIT_RETURN_IF_ERROR(SelectDevice(&free_bytes));
  BITSPLIT_RETURN_IF_ERROR(PlanMemory(embedding_and_norms, free_bytes));
  pool_ = std::make_unique<ThreadPool>(options.host_threads);
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BITSPLIT_RETURN_IF_ERROR(UploadBaseWeights(base));
  BITSPLIT_RETURN_IF_ERROR(UploadConstants(embedding_and_norms));
  BITSPLIT_RETURN_IF_ERROR(CarveScratch());
  return AllocatePinnedStaging();
}

absl::Status CudaModel::SelectDevice(size_t* free_bytes) {
  const int devices = CountDevices();
  if (devices == 0) {
    return absl::FailedPreconditionError("the CUDA backend needs a CUDA device; none is visible");
  }
  if (options_.device < 0 || options_.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d does not exist (%d visible)", options_.device, devices));
  }
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  cudaDeviceProp properties;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, options_.device));
  device_name_ = properties.name;
  size_t total_bytes = 0;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(free_bytes, &total_bytes));
  return absl::OkStatus();
}

absl::Status CudaModel::PlanMemory(const model::EmbeddingAndNorms& embedding_and_norms,
                                   size_t free_bytes) {
  const model::ModelConfig& config = config_;
  const model::SplitQuantization& quantization = quantization_;
  const CudaModelOptions& options = options_;
  const ops::WeightMatrix& embedding = embedding_and_norms.token_embd;
  embedding_type_ = static_cast<int32_t>(embedding.type);
  embedding_row_bytes_ = embedding.row_bytes;
  host_embedding_ = embedding_and_norms;

  model::VramRequest request;
  request.config = config;
  request.base_format = quantization.base_format;
  request.base_group = quantization.base_group;
  for (const auto& [name, formats] : quantization.tensor_formats) {
    request.base_tensor_formats.emplace(name, formats.base);
  }
  request.context = options.context;
  request.sessions = options.sessions;
  request.max_batch_rows = options.max_batch_rows;
  request.kv_type = options.kv_type;
  const uint64_t budget =
      options.vram_budget > 0 ? options.vram_budget : model::DefaultVramBudget(free_bytes);
  if (budget > free_bytes) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the VRAM budget of %s exceeds the %s free on %s",
                        model::FormatBytes(budget), model::FormatBytes(free_bytes), device_name_));
  }
  // The embedding table goes to the device only when that costs no session (PlacedEmbeddingBytes).
  request.embedding_bytes = model::PlacedEmbeddingBytes(
      request, model::DeviceEmbeddingBytes(embedding.type, embedding.rows, embedding.row_bytes),
      budget, options.max_sessions);
  embedding_on_device_ = request.embedding_bytes > 0;
  if (request.sessions == 0) {
    absl::StatusOr<int64_t> sessions =
        model::VramSessionsThatFit(request, budget, options.max_sessions);
    if (!sessions.ok()) {
      return absl::Status(sessions.status().code(),
                          absl::StrCat(device_name_, ": ", sessions.status().message()));
    }
    request.sessions = *sessions;
    options_.sessions = *sessions;
  }
  absl::StatusOr<model::VramPlan> plan = model::PlanVram(request, budget);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(device_name_, ": ", plan.status().message()));
  }
  plan_ = *plan;
  return absl::OkStatus();
}

absl::Status CudaModel::UploadBaseWeights(const model::SplitLinearWeights& base) {
  const model::SplitQuantization& quantization = quantization_;
  // Base weights: every matrix with rows padded to 4 bytes, in AllLinearGroups order.
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&weights_slab_, plan_.base_weights_bytes));
  Carver weights(weights_slab_);
  for (const LinearGroupId id : model::AllLinearGroups(config_)) {
    Group group;
    const std::span<const quant::MatrixView> views = base.group(id);
    if (views.empty() || views.size() > kernels::kMaxGroupMatrices) {
      return absl::InvalidArgumentError(
          absl::StrCat("base weights of ", model::LinearGroupIdString(id), " are missing"));
    }
    group.cols = views[0].cols;
    group.matmul.count = static_cast<int32_t>(views.size());
    const std::vector<std::string> names = model::LinearGroupTensorNames(config_, id);
    for (size_t i = 0; i < views.size(); ++i) {
      const quant::MatrixView& view = views[i];
      // One kernel runs a group, so its matrices share the format (ValidateTensorFormats).
      const quant::SplitFormat format = quantization.BaseFormatOf(names[i]);
      if (view.format != format || view.format != views[0].format ||
          view.group != quantization.base_group || view.cols != group.cols) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: matrix %d is %s/g%d with %d columns; the model's base is %s/g%d",
                            model::LinearGroupIdString(id), i,
                            quant::GetSplitFormatInfo(view.format).name, view.group, view.cols,
                            quant::GetSplitFormatInfo(format).name, quantization.base_group));
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
  return absl::OkStatus();
}

absl::Status CudaModel::UploadConstants(const model::EmbeddingAndNorms& embedding_and_norms) {
  const model::ModelConfig& config = config_;
  const model::SplitQuantization& quantization = quantization_;
  const CudaModelOptions& options = options_;
  const ops::WeightMatrix& embedding = embedding_and_norms.token_embd;
  // Embedding, norms, RoPE table, Hadamard signs.
  const int64_t d = config.d_model;
  const int64_t widest_input = plan_.scratch.linear_cols;
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
    layer_output_scales_.clear();
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      const model::LayerNorms& host = embedding_and_norms.layers[static_cast<size_t>(layer)];
      model::LayerNorms& device = layer_vectors_[static_cast<size_t>(layer)];
      for (const model::LayerVectorSpec& spec : model::LayerVectorSpecs(config, layer)) {
        const float* source = host.*spec.field;
        if (source == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("blk.", layer, ".", spec.tensor, " is missing"));
        }
        device.*spec.field = norms_ + norms.size();
        norms.insert(norms.end(), source, source + spec.length);
      }
      layer_output_scales_.push_back(config.layer_output_scale ? *host.output_scale : 1.0f);
    }
    output_norm_ = norms_ + norms.size();
    norms.insert(norms.end(), embedding_and_norms.output_norm, embedding_and_norms.output_norm + d);
    BITSPLIT_CHECK(norms.size() * sizeof(float) <= plan_.norms_bytes);
    BITSPLIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(norms_, norms.data(), norms.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  // The routers at f32 (a source of another type dequantized row by row, as ops::MatMul reads
  // it), so that the device's router logits are the CPU's bit for bit.
  if (config.has_experts()) {
    float* routers = constants.Take<float>(plan_.router_bytes);
    const int64_t per_layer = config.num_experts * d;
    std::vector<float> rows(static_cast<size_t>(per_layer));
    routers_.clear();
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      const ops::WeightMatrix& router =
          embedding_and_norms.layers[static_cast<size_t>(layer)].router;
      if (router.data == nullptr || router.rows != config.num_experts || router.cols != d) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "blk.%d.ffn_gate_inp.weight is missing or not [%d, %d]", layer, config.num_experts, d));
      }
      for (int64_t e = 0; e < config.num_experts; ++e) {
        ops::DequantizeWeightRow(router, e, rows.data() + e * d);
      }
      float* device = routers + layer * per_layer;
      BITSPLIT_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(device, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
      routers_.push_back(device);
    }
  }
  // RoPE: cos/sin for every position a session can hold, from ops::RopeCosSin (ops::ApplyRope's
  // own arithmetic), so the device rotates exactly: the global layers' RoPE, and with a sliding
  // window also the local layers' (ModelConfig::LayerRope: their own dims, base and scaling, no
  // frequency factors).
  {
    const auto upload = [&](const ops::RopeConfig& rope, float** cos_table,
                            float** sin_table) -> absl::Status {
      const int64_t pairs = rope.rotary_dims / 2;
      float* table_on_device = constants.Take<float>(options.context * pairs * 2 * sizeof(float));
      *cos_table = table_on_device;
      *sin_table = table_on_device + options.context * pairs;
      const std::vector<float> table = RopeTable(rope, options.context);
      BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMemcpy(
          table_on_device, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
      return absl::OkStatus();
    };
    // One table per kind of layer: every global layer's RoPE is the same, and every local one's.
    const auto first_layer = [&](bool local) {
      for (int64_t layer = 0; layer < config.num_layers; ++layer) {
        if (config.IsLocalLayer(layer) == local) return layer;
      }
      return int64_t{-1};
    };
    const float* factors = embedding_and_norms.rope_freq_factors;
    // A model of local layers only still gets a global table (the plan counts one).
    BITSPLIT_RETURN_IF_ERROR(
        upload(config.LayerRope(std::max<int64_t>(first_layer(false), 0), factors), &rope_cos_,
               &rope_sin_));
    if (config.sliding_window > 0) {
      const int64_t local = first_layer(true);
      if (local >= 0) {
        BITSPLIT_RETURN_IF_ERROR(
            upload(config.LayerRope(local, factors), &rope_local_cos_, &rope_local_sin_));
      }
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
  BITSPLIT_CHECK(constants.used() <= plan_.constants_slab_bytes);
  return absl::OkStatus();
}

absl::Status CudaModel::CarveScratch() {
  const model::ModelConfig& config = config_;
  const CudaModelOptions& options = options_;
  // Scratch, in ForwardScratchLayout's order.
  const model::ForwardScratchLayout& s = plan_.scratch;
  const uint64_t t = static_cast<uint64_t>(options.max_batch_rows);
  const uint64_t linear_rows = static_cast<uint64_t>(s.linear_rows);
  const uint64_t widest_input = static_cast<uint64_t>(s.linear_cols);
  block_stride_max_ = RoundUp((s.linear_cols + 31) / 32, 8);
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
  d_.codes = scratch.Take<int8_t>(linear_rows * widest_input);
  d_.act_scales = scratch.Take<float>(4 * linear_rows * bs);
  d_.act_sums = scratch.Take<float>(4 * linear_rows * bs);
  d_.residual_output = scratch.Take<float>(s.residual_output_bytes);
  d_.logits = scratch.Take<float>(s.logits_bytes);
  d_.scores = scratch.Take<float>(s.scores_bytes);
  if (s.visible_slots_bytes > 0) {
    d_.visible_slots = scratch.Take<int32_t>(4 * t * static_cast<uint64_t>(options.context));
    d_.visible_counts = scratch.Take<int32_t>(4 * t);
  }
  if (s.expert_bytes > 0) {
    const uint64_t routed = t * static_cast<uint64_t>(config.num_experts_used);
    const uint64_t d = static_cast<uint64_t>(config.d_model);
    const uint64_t width = static_cast<uint64_t>(config.d_ff_expert);
    d_.router_logits = scratch.Take<float>(4 * t * static_cast<uint64_t>(config.num_experts));
    d_.experts_normed = scratch.Take<float>(4 * t * d);
    d_.router_input = scratch.Take<float>(4 * t * d);
    d_.expert_of = scratch.Take<int32_t>(4 * routed);
    d_.expert_weights = scratch.Take<float>(4 * routed);
    d_.slot_of = scratch.Take<int32_t>(4 * routed);
    d_.source_row = scratch.Take<int32_t>(4 * routed);
    d_.expert_input = scratch.Take<float>(4 * routed * d);
    d_.expert_gate_up = scratch.Take<float>(4 * routed * 2 * width);
    d_.expert_activation = scratch.Take<float>(4 * routed * width);
    d_.expert_output = scratch.Take<float>(4 * routed * d);
    d_.experts_sum = scratch.Take<float>(4 * t * d);
  }
  d_.sampling = scratch.Take<double>(s.sampling_bytes);
  d_.top_ids = scratch.Take<int32_t>(t * 64 * 4);
  d_.top_logits = scratch.Take<float>(t * 64 * 4);
  d_.log_normalizers = scratch.Take<double>(8 * t);
  d_.choices = scratch.Take<int32_t>(4 * t);
  d_.choice_positions = scratch.Take<int64_t>(8 * t);
  BITSPLIT_CHECK(scratch.used() == s.total_bytes);
  // Each sequence's prefix length and first slot (16 bytes a row, outside the plan's slabs).
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_.step, 2 * t * sizeof(int64_t)));
  return absl::OkStatus();
}

absl::Status CudaModel::AllocatePinnedStaging() {
  const uint64_t t = static_cast<uint64_t>(options_.max_batch_rows);
  const uint64_t bs = static_cast<uint64_t>(block_stride_max_);
  const uint64_t d = static_cast<uint64_t>(config_.d_model);
  const model::ForwardScratchLayout& s = plan_.scratch;
  const uint64_t linear_rows = static_cast<uint64_t>(s.linear_rows);
  const uint64_t widest_input = static_cast<uint64_t>(s.linear_cols);
  // A mixture-of-experts layer's router logits come to the host and its routing goes back.
  const uint64_t routed = t * static_cast<uint64_t>(config_.num_experts_used);
  const uint64_t routing_bytes =
      config_.has_experts() ? AlignVram(4 * t * static_cast<uint64_t>(config_.num_experts)) +
                                  4 * AlignVram(4 * routed)
                            : 0;
  // Pinned host staging, carved like the scratch.
  const uint64_t pinned_bytes = AlignVram(BatchStagingBytes()) +
                                AlignVram(linear_rows * widest_input) +
                                2 * AlignVram(4 * linear_rows * bs) + s.residual_output_bytes +
                                AlignVram(4 * t * d) + routing_bytes;
  BITSPLIT_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&pinned_, pinned_bytes, cudaHostAllocDefault));
  Carver pinned(pinned_);
  host_batch_ = pinned.Take<uint8_t>(BatchStagingBytes());
  host_codes_ = pinned.Take<int8_t>(linear_rows * widest_input);
  host_scales_ = pinned.Take<float>(4 * linear_rows * bs);
  host_sums_ = pinned.Take<float>(4 * linear_rows * bs);
  host_residual_ = pinned.Take<float>(s.residual_output_bytes);
  host_embedding_rows_ = pinned.Take<float>(4 * t * d);
  if (routing_bytes > 0) {
    host_router_logits_ = pinned.Take<float>(4 * t * static_cast<uint64_t>(config_.num_experts));
    host_expert_of_ = pinned.Take<int32_t>(4 * routed);
    host_expert_weights_ = pinned.Take<float>(4 * routed);
    host_slot_of_ = pinned.Take<int32_t>(4 * routed);
    host_source_row_ = pinned.Take<int32_t>(4 * routed);
  }
  BITSPLIT_CHECK(pinned.used() == pinned_bytes);
  events_.resize(static_cast<size_t>(3 * groups_.size()));
  for (cudaEvent_t& event : events_) {
    BITSPLIT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::cuda
