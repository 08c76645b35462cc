// Bytes -> gguf::File::Parse -> every typed getter -> model config (with and without the tensor
// table) -> weight views -> tokenizer and chat template: what `bitsplit generate` and the
// services do with a model file before the first forward pass.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/weights.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace bitsplit;

void TouchMatrix(const ops::WeightMatrix& matrix) {
  fuzz::Touch(matrix.data, static_cast<uint64_t>(matrix.rows * matrix.row_bytes));
}

void TouchVector(const float* vector, int64_t length) {
  if (vector != nullptr) fuzz::Touch(vector, static_cast<uint64_t>(length) * sizeof(float));
}

void CheckWeights(const model::ModelWeights& weights, const model::ModelConfig& config) {
  TouchMatrix(weights.token_embd);
  TouchMatrix(weights.output);
  TouchVector(weights.output_norm, config.d_model);
  TouchVector(weights.rope_freq_factors, config.rope_dims / 2);
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const model::LayerWeights& layer = weights.layers[i];
    for (const auto& spec : model::LayerVectorSpecs(config, static_cast<int64_t>(i))) {
      TouchVector(layer.vectors.*spec.field, spec.length);
    }
    for (const ops::WeightMatrix* m :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down,
          &layer.vectors.router, &layer.experts_down}) {
      TouchMatrix(*m);
    }
    for (const ops::WeightMatrix& m : layer.experts_gate_up) TouchMatrix(m);
    for (const auto* experts : {&layer.expert_gate_up, &layer.expert_down}) {
      for (const auto& matrices : *experts) {
        for (const ops::WeightMatrix& m : matrices) TouchMatrix(m);
      }
    }
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    (void)config.AttentionWindow(layer);
    (void)config.RopeFreqBase(layer);
    (void)config.KvDim(layer);
    (void)config.RopeDims(layer);
  }
}

void CheckTokenizer(const gguf::File& file) {
  auto tokenizer = text::Tokenizer::FromGguf(file);
  if (!tokenizer.ok()) return;
  const text::Tokenizer& t = **tokenizer;
  for (std::string_view sample : {"Hello, world! <|im_start|>user\n123 \xff\xfe", " a  b\n\n c"}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = t.Tokenize(sample, special, special);
      (void)t.Decode(ids, special);
      (void)t.Detokenize(ids, special, special);
    }
  }
  for (int32_t id : {0, t.vocab_size() - 1, t.vocab_size(), -1}) (void)t.TokenToPiece(id, true);
  auto chat = text::ChatTemplate::FromGgufOrArchitecture(file, t);
  if (chat.ok()) {
    const text::ChatMessage messages[] = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}};
    if (auto prompt = chat->chat_template.Render(messages, true); prompt.ok()) {
      (void)t.Encode(*prompt, true);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = gguf::File::Parse(data, size, "fuzz.gguf");
  if (!file.ok()) return 0;
  const gguf::File& f = **file;
  for (const gguf::MetadataEntry& entry : f.metadata()) {
    (void)f.GetString(entry.key);
    (void)f.GetUint(entry.key);
    (void)f.GetInt(entry.key);
    (void)f.GetFloat(entry.key);
    (void)f.GetBool(entry.key);
    (void)f.GetStringArray(entry.key);
    (void)f.GetIntArray(entry.key);
    (void)f.GetFloatArray(entry.key);
  }
  for (const gguf::TensorInfo& tensor : f.tensors()) {
    fuzz::Touch(tensor.data, tensor.num_bytes);
    if (f.FindTensor(tensor.name) == nullptr) __builtin_trap();  // names are indexed
  }
  // A split model's base file reads its config this way, before its own tensor table.
  (void)model::ModelConfigFromGgufMetadata(f, 49152);
  auto config = model::ModelConfigFromGguf(f);
  if (config.ok()) {
    auto weights = model::ModelWeightsFromGguf(f, *config);
    if (weights.ok()) CheckWeights(*weights, *config);
  }
  CheckTokenizer(f);
  return 0;
}
