#include "common/model/llama_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  if (cache.num_layers() != config_.num_layers || cache.kv_dim() != config_.kv_dim()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache shaped for %d layers x %d kv dims, the model has %d x %d",
                        cache.num_layers(), cache.kv_dim(), config_.num_layers, config_.kv_dim()));
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

absl::Status LlamaModel::ForwardSequencesWith(LinearBackend& linear,
                                              std::span<const SequenceForward> sequences) {
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
  const ModelConfig& c = config_;
  const EmbeddingAndNorms& w = embedding_and_norms_;
  // Sequence s owns rows [row_begin[s], row_begin[s + 1]) of every activation buffer, and logit
  // rows [logit_begin[s], logit_begin[s + 1]) of the output head.
  std::vector<int64_t> row_begin = {0};
  std::vector<int64_t> logit_begin = {0};
  std::vector<int64_t> first_slot;  // each batch's first cache slot
  for (const SequenceForward& sequence : sequences) {
    row_begin.push_back(row_begin.back() + sequence.batch->size());
    logit_begin.push_back(logit_begin.back() + sequence.batch->num_logit_rows());
    first_slot.push_back(sequence.cache->committed_length() + sequence.batch->pending_prefix);
  }
  for (const SequenceForward& sequence : sequences) {
    BITSPLIT_RETURN_IF_ERROR(
        sequence.cache->BeginPending(sequence.batch->pending_prefix + sequence.batch->size()));
  }
  const int64_t num_tokens = row_begin.back();
  ThreadPool& pool = *pool_;

  std::vector<float> x = Buffer(num_tokens, c.d_model);       // hidden state
  std::vector<float> normed = Buffer(num_tokens, c.d_model);  // RMS-normalized x
  std::vector<float> q = Buffer(num_tokens, c.q_dim());
  std::vector<float> keys = Buffer(num_tokens, c.kv_dim());  // then copied to each cache
  std::vector<float> values = Buffer(num_tokens, c.kv_dim());
  std::vector<float> attention = Buffer(num_tokens, c.q_dim());
  std::vector<float> gate = Buffer(num_tokens, c.d_ff);
  std::vector<float> up = Buffer(num_tokens, c.d_ff);
  std::vector<float> projected = Buffer(num_tokens, c.d_model);  // wo / w_down output
  std::vector<int32_t> positions;                                // [num_tokens]
  for (size_t s = 0; s < sequences.size(); ++s) {
    const Batch& batch = *sequences[s].batch;
    positions.insert(positions.end(), batch.positions.begin(), batch.positions.end());
    for (int64_t t = 0; t < batch.size(); ++t) {
      float* row = x.data() + (row_begin[s] + t) * c.d_model;
      ops::DequantizeWeightRow(w.token_embd, batch.tokens[t], row);
      if (c.embedding_scale != 1.0f) {
        for (int64_t i = 0; i < c.d_model; ++i) row[i] *= c.embedding_scale;
      }
    }
    // The batch's positions go with its keys: sliding-window layers compare them.
    std::copy(batch.positions.begin(), batch.positions.end(),
              sequences[s].cache->positions() + first_slot[s]);
  }

  const ops::AttentionShape attention_shape{.num_heads = c.num_heads,
                                            .num_kv_heads = c.num_kv_heads,
                                            .head_dim = c.head_dim,
                                            .scale = c.attention_scale};

  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const LayerNorms& vectors = w.layers[static_cast<size_t>(layer)];

    // Attention block.
    ops::RmsNorm(x.data(), num_tokens, c.d_model, vectors.attn_norm, c.rms_norm_eps, normed.data());
    float* const qkv_outputs[] = {q.data(), keys.data(), values.data()};
    BITSPLIT_RETURN_IF_ERROR(
        linear.Apply({layer, LinearGroup::kQkv}, normed.data(), num_tokens, qkv_outputs, pool));
    if (c.qkv_bias) {
      AddBias(q.data(), vectors.q_bias, num_tokens, c.q_dim());
      AddBias(keys.data(), vectors.k_bias, num_tokens, c.kv_dim());
      AddBias(values.data(), vectors.v_bias, num_tokens, c.kv_dim());
    }
    if (c.qk_norm) {  // each head normalized on its own
      ops::RmsNorm(q.data(), num_tokens * c.num_heads, c.head_dim, vectors.attn_q_norm,
                   c.rms_norm_eps, q.data());
      ops::RmsNorm(keys.data(), num_tokens * c.num_kv_heads, c.head_dim, vectors.attn_k_norm,
                   c.rms_norm_eps, keys.data());
    }
    const ops::RopeConfig rope{.head_dim = c.head_dim,
                               .rotary_dims = c.rope_dims,
                               .freq_base = c.RopeFreqBase(layer),
                               .freq_scale = c.RopeFreqScale(layer),
                               .freq_factors = w.rope_freq_factors,
                               .style = c.rope_style};
    ops::ApplyRope(q.data(), num_tokens, c.num_heads, positions.data(), rope);
    ops::ApplyRope(keys.data(), num_tokens, c.num_kv_heads, positions.data(), rope);
    for (size_t s = 0; s < sequences.size(); ++s) {
      const Batch& batch = *sequences[s].batch;
      KvCache& cache = *sequences[s].cache;
      const int64_t rows = batch.size();
      const size_t from = static_cast<size_t>(row_begin[s] * c.kv_dim());
      const size_t count = static_cast<size_t>(rows * c.kv_dim());
      std::copy_n(keys.data() + from, count, cache.keys(layer) + first_slot[s] * c.kv_dim());
      std::copy_n(values.data() + from, count, cache.values(layer) + first_slot[s] * c.kv_dim());
      cache.RoundStored(layer, first_slot[s], rows);
      const ops::SlidingWindow window{.size = c.AttentionWindow(layer),
                                      .query_positions = batch.positions.data(),
                                      .slot_positions = cache.positions()};
      ops::AttentionWithContext(q.data() + row_begin[s] * c.q_dim(), rows, cache.keys(layer),
                                cache.values(layer), cache.committed_length(), batch.pending_prefix,
                                batch.attention_mask.data(), attention_shape,
                                attention.data() + row_begin[s] * c.q_dim(), pool, window);
    }
    float* const attention_outputs[] = {projected.data()};
    BITSPLIT_RETURN_IF_ERROR(linear.Apply({layer, LinearGroup::kAttnOutput}, attention.data(),
                                          num_tokens, attention_outputs, pool));
    if (c.post_norms) {
      ops::RmsNorm(projected.data(), num_tokens, c.d_model, vectors.attn_post_norm, c.rms_norm_eps,
                   projected.data());
    }
    AddInPlace(x.data(), projected.data(), num_tokens * c.d_model);

    // Feed-forward block: w_down(act(w_gate x) * w_up x).
    ops::RmsNorm(x.data(), num_tokens, c.d_model, vectors.ffn_norm, c.rms_norm_eps, normed.data());
    float* const gate_up_outputs[] = {gate.data(), up.data()};
    BITSPLIT_RETURN_IF_ERROR(linear.Apply({layer, LinearGroup::kGateUp}, normed.data(), num_tokens,
                                          gate_up_outputs, pool));
    pool.ParallelFor(num_tokens, [&](int64_t begin, int64_t end, int) {
      float* g = gate.data() + begin * c.d_ff;
      const float* u = up.data() + begin * c.d_ff;
      const int64_t n = (end - begin) * c.d_ff;
      switch (c.ffn_activation) {
        case FfnActivation::kSilu:
          ops::SiluMul(g, u, n, g);
          break;
        case FfnActivation::kGeluTanh:
          ops::GeluTanhMul(g, u, n, g);
          break;
      }
    });
    float* const down_outputs[] = {projected.data()};
    BITSPLIT_RETURN_IF_ERROR(
        linear.Apply({layer, LinearGroup::kDown}, gate.data(), num_tokens, down_outputs, pool));
    if (c.post_norms) {
      ops::RmsNorm(projected.data(), num_tokens, c.d_model, vectors.ffn_post_norm, c.rms_norm_eps,
                   projected.data());
    }
    AddInPlace(x.data(), projected.data(), num_tokens * c.d_model);
  }

  // Output head, for the selected rows only (in the order asked, repeats allowed).
  const int64_t num_rows = logit_begin.back();
  std::vector<float> head_input = Buffer(num_rows, c.d_model);
  for (size_t s = 0; s < sequences.size(); ++s) {
    const Batch& batch = *sequences[s].batch;
    for (int64_t r = 0; r < batch.num_logit_rows(); ++r) {
      const int64_t t = batch.logit_rows.empty() ? r : batch.logit_rows[static_cast<size_t>(r)];
      ops::RmsNorm(x.data() + (row_begin[s] + t) * c.d_model, 1, c.d_model, w.output_norm,
                   c.rms_norm_eps, head_input.data() + (logit_begin[s] + r) * c.d_model);
    }
  }
  if (sequences.size() == 1) {  // straight into the caller's buffer
    float* const head_outputs[] = {sequences[0].logits.data()};
    return linear.Apply(LinearGroupId::Head(), head_input.data(), num_rows, head_outputs, pool);
  }
  std::vector<float> logits = Buffer(num_rows, c.vocab_size);
  float* const head_outputs[] = {logits.data()};
  BITSPLIT_RETURN_IF_ERROR(
      linear.Apply(LinearGroupId::Head(), head_input.data(), num_rows, head_outputs, pool));
  for (size_t s = 0; s < sequences.size(); ++s) {
    std::copy_n(logits.data() + logit_begin[s] * c.vocab_size,
                (logit_begin[s + 1] - logit_begin[s]) * c.vocab_size, sequences[s].logits.data());
  }
  return absl::OkStatus();
}

}  // namespace bitsplit::model
