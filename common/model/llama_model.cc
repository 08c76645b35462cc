#include "common/model/llama_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/expert_routing.h"
#include "common/ops/activation.h"
#include "common/ops/attention.h"
#include "common/ops/matmul.h"
#include "common/ops/rmsnorm.h"
#include "common/ops/rope.h"
#include "common/util/status_macros.h"

namespace bitsplit::model {
namespace {

// x += delta, elementwise.
void AddInPlace(float* x, const float* delta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += delta[i];
}

// rows x [n] += bias [n].
void AddBias(float* x, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) AddInPlace(x + r * n, bias, n);
}

// Grouped expert rows [rows, width] += the bias row of each row's expert (bias [experts, width]).
void AddExpertBias(std::span<const ExpertRows> segments, const float* bias, int64_t width,
                   float* rows) {
  for (const ExpertRows& segment : segments) {
    AddBias(rows + static_cast<int64_t>(segment.first_row) * width,
            bias + static_cast<int64_t>(segment.expert) * width, segment.count, width);
  }
}

std::vector<float> Buffer(int64_t rows, int64_t cols) {
  return std::vector<float>(static_cast<size_t>(rows * cols));
}

}  // namespace

Batch Batch::Causal(std::span<const int32_t> tokens, int32_t first_position) {
  Batch batch;
  const size_t n = tokens.size();
  batch.tokens.assign(tokens.begin(), tokens.end());
  batch.positions.resize(n);
  batch.attention_mask.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    batch.positions[i] = first_position + static_cast<int32_t>(i);
    for (size_t j = 0; j <= i; ++j) batch.attention_mask[i * n + j] = 1;
  }
  return batch;
}

absl::StatusOr<Batch> Batch::Tree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                                  int32_t first_position) {
  const size_t n = tokens.size();
  if (parents.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tree has %d tokens but %d parents", n, parents.size()));
  }
  Batch batch;
  batch.tokens.assign(tokens.begin(), tokens.end());
  batch.positions.resize(n);
  batch.attention_mask.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t parent = parents[i];
    if (parent < -1 || parent >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tree node %d has parent %d; parents must precede their children (or be -1)", i, parent));
    }
    batch.attention_mask[i * n + i] = 1;
    if (parent < 0) {
      batch.positions[i] = first_position;
      continue;
    }
    const size_t p = static_cast<size_t>(parent);
    batch.positions[i] = batch.positions[p] + 1;
    // The ancestors of i are p and p's ancestors.
    for (size_t j = 0; j <= p; ++j) {
      batch.attention_mask[i * n + j] = batch.attention_mask[p * n + j];
    }
  }
  return batch;
}

std::string_view ForwardModeName(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kReference:
      return "reference";
    case ForwardMode::kDraft:
      return "draft";
    case ForwardMode::kVerify:
      return "verify";
  }
  return "unknown";
}

absl::StatusOr<ForwardMode> ParseForwardMode(std::string_view name) {
  for (ForwardMode mode : {ForwardMode::kReference, ForwardMode::kDraft, ForwardMode::kVerify}) {
    if (name == ForwardModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown forward mode \"",
                                                 absl::string_view(name.data(), name.size()),
                                                 "\" (expected reference, draft or verify)"));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                             int num_threads) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  BITSPLIT_ASSIGN_OR_RETURN(model->gguf_file_, gguf::File::Open(path));
  BITSPLIT_ASSIGN_OR_RETURN(model->config_, ModelConfigFromGguf(*model->gguf_file_));
  BITSPLIT_ASSIGN_OR_RETURN(model->gguf_weights_,
                            ModelWeightsFromGguf(*model->gguf_file_, model->config_));
  model->gguf_metadata_ = model->gguf_file_.get();
  model->embedding_and_norms_ = EmbeddingAndNormsOf(model->gguf_weights_);
  model->backends_[static_cast<size_t>(ForwardMode::kReference)] =
      std::make_unique<GgufLinearBackend>(model->gguf_weights_);
  model->default_mode_ = ForwardMode::kReference;
  model->pool_ = std::make_unique<ThreadPool>(num_threads);
  return model;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::LoadSplit(const std::string& base_path,
                                                                  const std::string& residual_path,
                                                                  int num_threads) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  BITSPLIT_ASSIGN_OR_RETURN(model->split_files_, SplitModelFiles::Open(base_path, residual_path));
  const SplitModelFiles& files = *model->split_files_;
  model->gguf_metadata_ = &files.gguf_metadata();
  model->config_ = files.config();
  model->embedding_and_norms_ = files.embedding_and_norms();
  const HadamardRotation rotation = files.quantization().rotation;
  model->backends_[static_cast<size_t>(ForwardMode::kDraft)] =
      std::make_unique<SplitLinearBackend>(files.base_linear(), rotation, nullptr);
  model->default_mode_ = ForwardMode::kDraft;
  if (files.residual_linear() != nullptr) {
    model->residual_source_ = std::make_unique<InProcessResidual>(*files.residual_linear());
    model->backends_[static_cast<size_t>(ForwardMode::kVerify)] =
        std::make_unique<SplitLinearBackend>(files.base_linear(), rotation,
                                             model->residual_source_.get());
    model->default_mode_ = ForwardMode::kVerify;
  }
  model->pool_ = std::make_unique<ThreadPool>(num_threads);
  return model;
}

absl::Status LlamaModel::SetResidualSource(ResidualSource* source) {
  if (split_files_ == nullptr) {
    return absl::FailedPreconditionError("only a split model has a residual");
  }
  auto& verify = backends_[static_cast<size_t>(ForwardMode::kVerify)];
  if (source == nullptr) {
    verify.reset();
    default_mode_ = ForwardMode::kDraft;
    return absl::OkStatus();
  }
  verify = std::make_unique<SplitLinearBackend>(split_files_->base_linear(),
                                                split_files_->quantization().rotation, source);
  default_mode_ = ForwardMode::kVerify;
  return absl::OkStatus();
}

absl::Status ValidateBatch(const Batch& batch, int64_t vocab_size, int64_t pending_length) {
  const int64_t n = batch.size();
  if (n == 0) return absl::InvalidArgumentError("batch is empty");
  if (static_cast<int64_t>(batch.positions.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch has %d tokens but %d positions", n, batch.positions.size()));
  }
  const int64_t width = batch.mask_width();
  if (batch.pending_prefix < 0 ||
      (batch.pending_prefix > 0 && batch.pending_prefix != pending_length)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch extends %d pending KV slots but the cache holds %d",
                        batch.pending_prefix, pending_length));
  }
  if (static_cast<int64_t>(batch.attention_mask.size()) != n * width) {
    return absl::InvalidArgumentError(
        absl::StrFormat("attention mask has %d entries; a batch of %d tokens needs %d x %d",
                        batch.attention_mask.size(), n, n, width));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t token = batch.tokens[i];
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d at batch row %d is outside the vocabulary [0, %d)", token, i, vocab_size));
    }
    if (batch.positions[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("batch row %d has negative position %d", i, batch.positions[i]));
    }
    if (batch.attention_mask[i * width + batch.pending_prefix + i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("batch row %d does not attend to itself (mask[%d][%d] is 0)", i, i, i));
    }
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit row %d is outside the batch [0, %d)", row, n));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::ValidateBatch(const Batch& batch, const KvCache& cache,
                                       size_t logits_size) const {
  BITSPLIT_RETURN_IF_ERROR(model::ValidateBatch(batch, config_.vocab_size, cache.pending_length()));
  const int64_t width = batch.mask_width();
  if (cache.layer_kv_dims() != KvCache::LayerKvDims(config_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache shaped for %d layers x %d kv dims (layer 0), the model has %d x %d",
        cache.num_layers(), cache.kv_dim(0), config_.num_layers, config_.KvDim(0)));
  }
  if (width > cache.capacity() - cache.committed_length()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache full: %d committed + %d new tokens exceed the capacity of %d",
                        cache.committed_length(), width, cache.capacity()));
  }
  const int64_t needed = batch.num_logit_rows() * config_.vocab_size;
  if (static_cast<int64_t>(logits_size) < needed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits buffer holds %d floats; %d rows x %d vocab need %d", logits_size,
                        batch.num_logit_rows(), config_.vocab_size, needed));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const Batch& batch, KvCache& cache, std::span<float> logits,
                                 ForwardMode mode) {
  const SequenceForward sequence{.batch = &batch, .cache = &cache, .logits = logits};
  return ForwardSequences(std::span<const SequenceForward>(&sequence, 1), mode);
}

absl::Status LlamaModel::ForwardWith(LinearBackend& linear, const Batch& batch, KvCache& cache,
                                     std::span<float> logits) {
  const SequenceForward sequence{.batch = &batch, .cache = &cache, .logits = logits};
  return ForwardSequencesWith(linear, std::span<const SequenceForward>(&sequence, 1));
}

absl::Status LlamaModel::ForwardSequences(std::span<const SequenceForward> sequences,
                                          ForwardMode mode) {
  LinearBackend* linear = backend(mode);
  if (linear == nullptr) {
    const std::string_view name = ForwardModeName(mode);
    return absl::FailedPreconditionError(absl::StrCat(
        "this model cannot run in ", absl::string_view(name.data(), name.size()), " mode (",
        split_files_ == nullptr ? "a GGUF model runs in reference mode only"
                                : "verify mode needs the residual file",
        ")"));
  }
  return ForwardSequencesWith(*linear, sequences);
}

// Where one sequence's rows are in a forward's activations.
struct LlamaModel::SequenceSlice {
  const Batch* batch = nullptr;
  KvCache* cache = nullptr;
  std::span<float> logits;
  int64_t first_row = 0;  // of every activation buffer
  int64_t rows = 0;
  int64_t first_logit_row = 0;  // of the output head
  int64_t first_slot = 0;       // the batch's first K/V slot in its cache
};

// One forward's sequences and activations: every sequence's rows concatenated, so each linear
// group runs once on all of them.
struct LlamaModel::ForwardPass {
  ForwardPass(const ModelConfig& c, LinearBackend& backend,
              std::span<const SequenceForward> sequences)
      : linear(backend) {
    for (const SequenceForward& sequence : sequences) {
      const Batch& batch = *sequence.batch;
      slices.push_back({.batch = &batch,
                        .cache = sequence.cache,
                        .logits = sequence.logits,
                        .first_row = rows,
                        .rows = batch.size(),
                        .first_logit_row = logit_rows,
                        .first_slot = sequence.cache->committed_length() + batch.pending_prefix});
      positions.insert(positions.end(), batch.positions.begin(), batch.positions.end());
      rows += batch.size();
      logit_rows += batch.num_logit_rows();
    }
    x = Buffer(rows, c.d_model);
    normed = Buffer(rows, c.d_model);
    q = Buffer(rows, c.MaxQDim());
    keys = Buffer(rows, c.MaxKvDim());
    values = Buffer(rows, c.MaxKvDim());
    attention = Buffer(rows, c.MaxQDim());
    if (c.dense_ffn) {
      gate = Buffer(rows, c.d_ff);
      up = Buffer(rows, c.d_ff);
    }
    if (c.has_experts()) {
      const int64_t routed = rows * c.num_experts_used;
      router_logits = Buffer(rows, c.num_experts);
      expert_weights = Buffer(rows, c.num_experts_used);
      expert_of.resize(static_cast<size_t>(routed));
      expert_input = Buffer(routed, c.d_model);
      expert_gate = Buffer(routed, c.d_ff_expert);
      expert_up = Buffer(routed, c.d_ff_expert);
      if (c.fused_expert_gate_up) expert_gate_up = Buffer(routed, 2 * c.d_ff_expert);
      expert_output = Buffer(routed, c.d_model);
      experts_sum = Buffer(rows, c.d_model);
      if (c.parallel_experts) {
        experts_normed = Buffer(rows, c.d_model);
        router_input = Buffer(rows, c.d_model);
      }
    }
    projected = Buffer(rows, c.d_model);
  }

  LinearBackend& linear;
  std::vector<SequenceSlice> slices;
  int64_t rows = 0;
  int64_t logit_rows = 0;
  std::vector<int32_t> positions;  // [rows]
  std::vector<float> x;            // the hidden state
  std::vector<float> normed;       // RMS-normalized x
  // Attention activations, each row as wide as the current layer's shape.
  std::vector<float> q;
  std::vector<float> keys;  // then copied to each sequence's cache
  std::vector<float> values;
  std::vector<float> attention;
  std::vector<float> gate;  // the dense FFN's
  std::vector<float> up;
  std::vector<float> projected;  // wo / the FFN's output
  // Mixture of experts: each row's num_experts_used choices, in the order they are added.
  std::vector<float> router_logits;   // [rows, num_experts]
  std::vector<float> expert_weights;  // [rows, num_experts_used]
  std::vector<int32_t> expert_of;     // [rows * num_experts_used]
  // [rows * num_experts_used, width], grouped by expert:
  std::vector<float> expert_input;    // d_model
  std::vector<float> expert_gate;     // d_ff_expert
  std::vector<float> expert_up;       // d_ff_expert
  std::vector<float> expert_gate_up;  // 2 * d_ff_expert, the fused tensor's output
  std::vector<float> expert_output;   // d_model
  std::vector<float> experts_sum;     // [rows, d_model]: the weighted sum of each row's experts
  // parallel_experts: the experts' input pre_ffw_norm_2(x) and the router's input.
  std::vector<float> experts_normed;  // [rows, d_model]
  std::vector<float> router_input;    // [rows, d_model]
};

absl::Status LlamaModel::ForwardSequencesWith(LinearBackend& linear,
                                              std::span<const SequenceForward> sequences) {
  BITSPLIT_RETURN_IF_ERROR(ValidateSequences(sequences));
  for (const SequenceForward& sequence : sequences) {
    BITSPLIT_RETURN_IF_ERROR(
        sequence.cache->BeginPending(sequence.batch->pending_prefix + sequence.batch->size()));
  }
  ForwardPass pass(config_, linear, sequences);
  EmbedTokens(pass);
  PrepareSlidingWindow(pass);
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    BITSPLIT_RETURN_IF_ERROR(AttentionBlock(layer, pass));
    BITSPLIT_RETURN_IF_ERROR(FeedForwardBlock(layer, pass));
  }
  return OutputHead(pass);
}

absl::Status LlamaModel::ValidateSequences(std::span<const SequenceForward> sequences) const {
  if (sequences.empty()) return absl::InvalidArgumentError("no sequence to run");
  for (size_t s = 0; s < sequences.size(); ++s) {
    const SequenceForward& sequence = sequences[s];
    BITSPLIT_CHECK(sequence.batch != nullptr && sequence.cache != nullptr);
    for (size_t other = 0; other < s; ++other) {
      if (sequences[other].cache == sequence.cache) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sequences %d and %d share one KV cache", other, s));
      }
    }
    absl::Status valid = ValidateBatch(*sequence.batch, *sequence.cache, sequence.logits.size());
    if (!valid.ok()) {
      if (sequences.size() == 1) return valid;
      return absl::Status(valid.code(), absl::StrCat("sequence ", s, ": ", valid.message()));
    }
  }
  return absl::OkStatus();
}

void LlamaModel::EmbedTokens(ForwardPass& pass) const {
  const ModelConfig& c = config_;
  for (const SequenceSlice& slice : pass.slices) {
    for (int64_t t = 0; t < slice.rows; ++t) {
      float* row = pass.x.data() + (slice.first_row + t) * c.d_model;
      ops::DequantizeWeightRow(embedding_and_norms_.token_embd, slice.batch->tokens[t], row);
      if (c.embedding_scale != 1.0f) {
        for (int64_t i = 0; i < c.d_model; ++i) row[i] *= c.embedding_scale;
      }
    }
  }
}

void LlamaModel::PrepareSlidingWindow(ForwardPass& pass) const {
  // The batch's positions go with its keys: sliding-window layers compare them. The cache keeps
  // positions for every model, and AttentionWithContext lists each row's window itself.
  for (const SequenceSlice& slice : pass.slices) {
    std::copy(slice.batch->positions.begin(), slice.batch->positions.end(),
              slice.cache->positions() + slice.first_slot);
  }
}

absl::Status LlamaModel::AttentionBlock(int32_t layer, ForwardPass& pass) {
  const ModelConfig& c = config_;
  const LayerNorms& vectors = embedding_and_norms_.layers[static_cast<size_t>(layer)];
  const int64_t n = pass.rows;
  const int64_t head_dim = c.HeadDim(layer);
  const int64_t kv_heads = c.NumKvHeads(layer);
  ops::RmsNorm(pass.x.data(), n, c.d_model, vectors.attn_norm, c.rms_norm_eps, pass.normed.data());
  float* const qkv[] = {pass.q.data(), pass.keys.data(), pass.values.data()};
  const size_t matrices = c.ValueIsKey(layer) ? 2 : 3;
  BITSPLIT_RETURN_IF_ERROR(pass.linear.Apply({layer, LinearGroup::kQkv}, pass.normed.data(), n,
                                             std::span<float* const>(qkv, matrices), *pool_));
  if (c.ValueIsKey(layer)) {  // v is k's projection, before k's norm and RoPE
    std::copy_n(pass.keys.data(), n * c.KvDim(layer), pass.values.data());
  }
  if (c.qkv_bias) {
    AddBias(pass.q.data(), vectors.q_bias, n, c.QDim(layer));
    AddBias(pass.keys.data(), vectors.k_bias, n, c.KvDim(layer));
    AddBias(pass.values.data(), vectors.v_bias, n, c.KvDim(layer));
  }
  if (c.qk_norm) {  // each head normalized on its own
    ops::RmsNorm(pass.q.data(), n * c.num_heads, head_dim, vectors.attn_q_norm, c.rms_norm_eps,
                 pass.q.data());
    ops::RmsNorm(pass.keys.data(), n * kv_heads, head_dim, vectors.attn_k_norm, c.rms_norm_eps,
                 pass.keys.data());
  }
  if (c.value_norm) {
    ops::RmsNorm(pass.values.data(), n * kv_heads, head_dim, nullptr, c.rms_norm_eps,
                 pass.values.data());
  }
  const ops::RopeConfig rope = c.LayerRope(layer, embedding_and_norms_.rope_freq_factors);
  ops::ApplyRope(pass.q.data(), n, c.num_heads, pass.positions.data(), rope);
  ops::ApplyRope(pass.keys.data(), n, kv_heads, pass.positions.data(), rope);
  StoreKvAndAttend(layer, pass);
  float* const projected[] = {pass.projected.data()};
  BITSPLIT_RETURN_IF_ERROR(pass.linear.Apply({layer, LinearGroup::kAttnOutput},
                                             pass.attention.data(), n, projected, *pool_));
  if (c.attn_output_bias) AddBias(pass.projected.data(), vectors.o_bias, n, c.d_model);
  AddToHiddenState(vectors.attn_post_norm, pass);
  return absl::OkStatus();
}

void LlamaModel::StoreKvAndAttend(int32_t layer, ForwardPass& pass) {
  const ModelConfig& c = config_;
  const int64_t kv_dim = c.KvDim(layer);
  const int64_t q_dim = c.QDim(layer);
  const ops::AttentionShape shape{
      .num_heads = c.num_heads,
      .num_kv_heads = c.NumKvHeads(layer),
      .head_dim = c.HeadDim(layer),
      .scale = c.attention_scale,
      .sinks = embedding_and_norms_.layers[static_cast<size_t>(layer)].attn_sinks};
  // Each sequence's keys and values go to its own cache, and its rows attend over it.
  for (const SequenceSlice& slice : pass.slices) {
    const Batch& batch = *slice.batch;
    KvCache& cache = *slice.cache;
    const size_t from = static_cast<size_t>(slice.first_row * kv_dim);
    cache.StoreRows(layer, slice.first_slot, slice.rows, pass.keys.data() + from,
                    pass.values.data() + from);
    const ops::SlidingWindow window{.size = c.AttentionWindow(layer),
                                    .query_positions = batch.positions.data(),
                                    .slot_positions = cache.positions()};
    ops::AttentionWithContext(pass.q.data() + slice.first_row * q_dim, slice.rows,
                              cache.keys(layer), cache.values(layer), cache.committed_length(),
                              batch.pending_prefix, batch.attention_mask.data(), shape,
                              pass.attention.data() + slice.first_row * q_dim, *pool_, window);
  }
}

absl::Status LlamaModel::FeedForwardBlock(int32_t layer, ForwardPass& pass) {
  const ModelConfig& c = config_;
  const LayerNorms& vectors = embedding_and_norms_.layers[static_cast<size_t>(layer)];
  const int64_t n = pass.rows;
  ops::RmsNorm(pass.x.data(), n, c.d_model, vectors.ffn_norm, c.rms_norm_eps, pass.normed.data());
  if (c.dense_ffn) {
    float* const gate_up[] = {pass.gate.data(), pass.up.data()};
    BITSPLIT_RETURN_IF_ERROR(
        pass.linear.Apply({layer, LinearGroup::kGateUp}, pass.normed.data(), n, gate_up, *pool_));
    GatedActivation(n, c.d_ff, pass.gate.data(), pass.up.data());
    float* const projected[] = {pass.projected.data()};
    BITSPLIT_RETURN_IF_ERROR(
        pass.linear.Apply({layer, LinearGroup::kDown}, pass.gate.data(), n, projected, *pool_));
  }
  if (c.has_experts()) {
    const float* experts_input = pass.normed.data();
    const float* router_input = pass.normed.data();
    if (c.parallel_experts) {
      // As llama.cpp's gemma4 graph: the experts read pre_ffw_norm_2(x), the router
      // RMSNorm(x) / sqrt(d_model) * ffn_gate_inp.scale (three roundings, in that order).
      ops::RmsNorm(pass.x.data(), n, c.d_model, vectors.experts_pre_norm, c.rms_norm_eps,
                   pass.experts_normed.data());
      ops::RmsNorm(pass.x.data(), n, c.d_model, nullptr, c.rms_norm_eps, pass.router_input.data());
      const float inverse_sqrt_d = 1.0f / std::sqrt(static_cast<float>(c.d_model));
      for (int64_t t = 0; t < n; ++t) {
        float* row = pass.router_input.data() + t * c.d_model;
        for (int64_t i = 0; i < c.d_model; ++i) {
          row[i] = row[i] * inverse_sqrt_d * vectors.router_input_scale[i];
        }
      }
      experts_input = pass.experts_normed.data();
      router_input = pass.router_input.data();
    }
    BITSPLIT_RETURN_IF_ERROR(ExpertsBlock(layer, experts_input, router_input, pass));
    if (c.parallel_experts) {  // post_ffw_norm_1(dense) + post_ffw_norm_2(experts)
      ops::RmsNorm(pass.projected.data(), n, c.d_model, vectors.dense_post_norm, c.rms_norm_eps,
                   pass.projected.data());
      ops::RmsNorm(pass.experts_sum.data(), n, c.d_model, vectors.experts_post_norm, c.rms_norm_eps,
                   pass.experts_sum.data());
      AddInPlace(pass.projected.data(), pass.experts_sum.data(), n * c.d_model);
    } else {
      pass.projected.swap(pass.experts_sum);
    }
  }
  AddToHiddenState(vectors.ffn_post_norm, pass);
  if (c.layer_output_scale) {
    const float scale = *vectors.output_scale;
    for (float& value : pass.x) value *= scale;
  }
  return absl::OkStatus();
}

void LlamaModel::GatedActivation(int64_t rows, int64_t width, float* gate, const float* up) const {
  pool_->ParallelFor(rows, [&](int64_t begin, int64_t end, int) {
    float* g = gate + begin * width;
    const float* u = up + begin * width;
    const int64_t count = (end - begin) * width;
    switch (config_.ffn_activation) {
      case FfnActivation::kSilu:
        ops::SiluMul(g, u, count, g);
        break;
      case FfnActivation::kGeluTanh:
        ops::GeluTanhMul(g, u, count, g);
        break;
      case FfnActivation::kSwigluOai:
        ops::SwigluOaiMul(g, u, count, g);
        break;
    }
  });
}

void LlamaModel::RouteToExperts(int32_t layer, const float* router_input, ForwardPass& pass) {
  const LayerNorms& vectors = embedding_and_norms_.layers[static_cast<size_t>(layer)];
  ops::MatMul(router_input, pass.rows, vectors.router, pass.router_logits.data(), *pool_);
  if (vectors.router_bias != nullptr) {
    AddBias(pass.router_logits.data(), vectors.router_bias, pass.rows, config_.num_experts);
  }
  RouteRows(config_, pass.router_logits.data(), pass.rows, pass.expert_of, pass.expert_weights);
}

absl::Status LlamaModel::ExpertsBlock(int32_t layer, const float* input, const float* router_input,
                                      ForwardPass& pass) {
  const ModelConfig& c = config_;
  const LayerNorms& vectors = embedding_and_norms_.layers[static_cast<size_t>(layer)];
  const int64_t k = c.num_experts_used;
  const int64_t width = c.d_ff_expert;
  RouteToExperts(layer, router_input, pass);
  // The (row, choice) pairs grouped by expert, so that each expert runs once on all its rows.
  const int64_t routed = pass.rows * k;
  const ExpertGrouping grouping = GroupByExpert(pass.expert_of, c.num_experts, k);
  const std::span<const ExpertRows> segments = grouping.segments;
  for (int64_t slot = 0; slot < routed; ++slot) {
    std::copy_n(input + grouping.source_row[static_cast<size_t>(slot)] * c.d_model, c.d_model,
                pass.expert_input.data() + slot * c.d_model);
  }
  if (c.fused_expert_gate_up) {  // each row: the expert's gate outputs, then its up outputs
    float* const gate_up[] = {pass.expert_gate_up.data()};
    BITSPLIT_RETURN_IF_ERROR(pass.linear.ApplyExperts(layer, LinearGroup::kExpertGateUp,
                                                      pass.expert_input.data(), routed, segments,
                                                      gate_up, *pool_));
    for (int64_t r = 0; r < routed; ++r) {
      const float* row = pass.expert_gate_up.data() + r * 2 * width;
      std::copy_n(row, width, pass.expert_gate.data() + r * width);
      std::copy_n(row + width, width, pass.expert_up.data() + r * width);
    }
  } else {
    float* const gate_up[] = {pass.expert_gate.data(), pass.expert_up.data()};
    BITSPLIT_RETURN_IF_ERROR(pass.linear.ApplyExperts(layer, LinearGroup::kExpertGateUp,
                                                      pass.expert_input.data(), routed, segments,
                                                      gate_up, *pool_));
  }
  if (c.expert_biases) {
    AddExpertBias(segments, vectors.expert_gate_bias, width, pass.expert_gate.data());
    AddExpertBias(segments, vectors.expert_up_bias, width, pass.expert_up.data());
  }
  GatedActivation(routed, width, pass.expert_gate.data(), pass.expert_up.data());
  float* const down[] = {pass.expert_output.data()};
  BITSPLIT_RETURN_IF_ERROR(pass.linear.ApplyExperts(
      layer, LinearGroup::kExpertDown, pass.expert_gate.data(), routed, segments, down, *pool_));
  if (c.expert_biases) {
    AddExpertBias(segments, vectors.expert_down_bias, c.d_model, pass.expert_output.data());
  }
  // Each row's experts scaled (gemma4's per-expert scale), weighted and added in the order they
  // were chosen (batch-invariant).
  for (int64_t t = 0; t < pass.rows; ++t) {
    float* out = pass.experts_sum.data() + t * c.d_model;
    for (int64_t i = 0; i < k; ++i) {
      const size_t pair = static_cast<size_t>(t * k + i);
      const float weight = pass.expert_weights[pair];
      const float* expert = pass.expert_output.data() + grouping.slot_of[pair] * c.d_model;
      // Without a per-expert scale it is 1, and x * 1.0f is x exactly.
      const float scale = vectors.expert_output_scale != nullptr
                              ? vectors.expert_output_scale[pass.expert_of[pair]]
                              : 1.0f;
      for (int64_t j = 0; j < c.d_model; ++j) {
        const float value = expert[j] * scale * weight;
        out[j] = i == 0 ? value : out[j] + value;
      }
    }
  }
  return absl::OkStatus();
}

void LlamaModel::AddToHiddenState(const float* post_norm, ForwardPass& pass) const {
  const ModelConfig& c = config_;
  const int64_t n = pass.rows;
  if (c.post_norms) {
    ops::RmsNorm(pass.projected.data(), n, c.d_model, post_norm, c.rms_norm_eps,
                 pass.projected.data());
  }
  AddInPlace(pass.x.data(), pass.projected.data(), n * c.d_model);
}

absl::Status LlamaModel::OutputHead(ForwardPass& pass) {
  const ModelConfig& c = config_;
  // The selected rows only, in the order asked (repeats allowed).
  std::vector<float> head_input = Buffer(pass.logit_rows, c.d_model);
  for (const SequenceSlice& slice : pass.slices) {
    const Batch& batch = *slice.batch;
    for (int64_t r = 0; r < batch.num_logit_rows(); ++r) {
      const int64_t t = batch.logit_rows.empty() ? r : batch.logit_rows[static_cast<size_t>(r)];
      ops::RmsNorm(pass.x.data() + (slice.first_row + t) * c.d_model, 1, c.d_model,
                   embedding_and_norms_.output_norm, c.rms_norm_eps,
                   head_input.data() + (slice.first_logit_row + r) * c.d_model);
    }
  }
  // Straight into the caller's buffer when there is one sequence.
  std::vector<float> joined;
  if (pass.slices.size() > 1) joined = Buffer(pass.logit_rows, c.vocab_size);
  float* const logits = pass.slices.size() == 1 ? pass.slices[0].logits.data() : joined.data();
  float* const head[] = {logits};
  BITSPLIT_RETURN_IF_ERROR(
      pass.linear.Apply(LinearGroupId::Head(), head_input.data(), pass.logit_rows, head, *pool_));
  if (c.final_logit_softcap > 0.0f) {
    const float cap = c.final_logit_softcap;
    // As llama.cpp: scaled by 1/cap (a multiply), tanh, scaled by cap.
    for (int64_t i = 0; i < pass.logit_rows * c.vocab_size; ++i) {
      logits[i] = std::tanh(logits[i] * (1.0f / cap)) * cap;
    }
  }
  if (pass.slices.size() == 1) return absl::OkStatus();
  for (const SequenceSlice& slice : pass.slices) {
    std::copy_n(joined.data() + slice.first_logit_row * c.vocab_size,
                slice.batch->num_logit_rows() * c.vocab_size, slice.logits.data());
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
