// Writes the seed corpora of the fuzz targets into OUT/<target>/ (scripts/fuzz.sh runs it before
// fuzzing): small valid inputs of every shape the targets read, built here rather than
// committed, from synthetic models and from the real SmolLM2 file's metadata.
//
//   make_fuzz_seeds OUT [SMOLLM2_GGUF]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "bitsplit/v1/generation.pb.h"
#include "common/io/gguf.h"
#include "common/io/shm_channel.h"
#include "common/io/split_file.h"
#include "common/quant/split_format.h"
#include "common/util/status_macros.h"
#include "tests/testing/gguf_builder.h"

namespace {

using namespace bitsplit;
using testing::GgufBuilder;

void Write(const std::filesystem::path& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "make_fuzz_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}
void Write(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  Write(path, bytes.data(), bytes.size());
}
void Write(const std::filesystem::path& path, const std::string& bytes) {
  Write(path, bytes.data(), bytes.size());
}

// A tiny gemma4 MoE: layer 0 local (4 heads of 16 over 2 KV heads), layer 1 global (4 heads of
// 32 over 1 KV head, no attn_v), each a dense FFN beside 4 fused-gate|up experts of width 16, 2
// used; no tokenizer (the config and weight parsers are what it seeds).
std::vector<uint8_t> TinyGemma4Moe() {
  constexpr int kD = 64, kFf = 96, kVocab = 48, kExperts = 4, kExpertWidth = 16;
  GgufBuilder b;
  const std::string p = "gemma4.";
  b.AddString("general.architecture", "gemma4");
  b.AddUint32(p + "block_count", 2);
  b.AddUint32(p + "context_length", 256);
  b.AddUint32(p + "embedding_length", kD);
  b.AddUint32(p + "feed_forward_length", kFf);
  b.AddUint32(p + "attention.head_count", 4);
  b.AddUint32Array(p + "attention.head_count_kv", {2, 1});
  b.AddUint32(p + "attention.key_length", 32);
  b.AddUint32(p + "attention.value_length", 32);
  b.AddUint32(p + "attention.key_length_swa", 16);
  b.AddUint32(p + "attention.value_length_swa", 16);
  b.AddUint32(p + "rope.dimension_count", 32);
  b.AddUint32(p + "rope.dimension_count_swa", 16);
  b.AddUint32(p + "attention.sliding_window", 8);
  b.AddArray(p + "attention.sliding_window_pattern", gguf::ValueType::kBool,
             std::vector<uint8_t>{1, 0});
  b.AddFloat32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  b.AddFloat32(p + "final_logit_softcapping", 30.0f);
  b.AddUint32(p + "expert_count", kExperts);
  b.AddUint32(p + "expert_used_count", 2);
  b.AddUint32(p + "expert_feed_forward_length", kExpertWidth);
  const std::vector<float> ones(kFf, 1.0f);
  const std::vector<float> d_ones(ones.begin(), ones.begin() + kD);
  b.AddTensor("token_embd.weight", GgmlType::kQ8_0, {kD, kVocab});
  b.AddF32Tensor("output_norm.weight", {kD}, d_ones);
  b.AddF32Tensor("rope_freqs.weight", {16}, std::vector<float>(16, 1.0f));
  for (int i = 0; i < 2; ++i) {
    const std::string l = "blk." + std::to_string(i) + ".";
    // Local: 2 KV heads of 16; global: 1 of 32. Either way 32 wide.
    const uint64_t head = i == 0 ? 16 : 32, kv = 32;
    for (const char* norm : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm",
                             "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"}) {
      b.AddF32Tensor(l + norm + ".weight", {kD}, d_ones);
    }
    b.AddTensor(l + "attn_q.weight", GgmlType::kQ8_0, {kD, 4 * head});
    b.AddTensor(l + "attn_k.weight", GgmlType::kQ8_0, {kD, kv});
    if (i == 0) b.AddTensor(l + "attn_v.weight", GgmlType::kQ8_0, {kD, kv});
    b.AddTensor(l + "attn_output.weight", GgmlType::kF16, {4 * head, kD});
    b.AddF32Tensor(l + "attn_q_norm.weight", {head}, d_ones);
    b.AddF32Tensor(l + "attn_k_norm.weight", {head}, d_ones);
    b.AddF32Tensor(l + "layer_output_scale.weight", {1}, {0.5f});
    b.AddTensor(l + "ffn_gate.weight", GgmlType::kQ8_0, {kD, kFf});
    b.AddTensor(l + "ffn_up.weight", GgmlType::kQ8_0, {kD, kFf});
    b.AddTensor(l + "ffn_down.weight", GgmlType::kF16, {kFf, kD});
    b.AddTensor(l + "ffn_gate_inp.weight", GgmlType::kF32, {kD, kExperts});
    b.AddF32Tensor(l + "ffn_gate_inp.scale", {kD}, d_ones);
    b.AddTensor(l + "ffn_gate_up_exps.weight", GgmlType::kQ8_0, {kD, 2 * kExpertWidth, kExperts});
    b.AddTensor(l + "ffn_down_exps.weight", GgmlType::kF16, {kExpertWidth, kD, kExperts});
    b.AddF32Tensor(l + "ffn_down_exps.scale", {kExperts}, std::vector<float>(kExperts, 1.0f));
  }
  return b.Build();
}

// Gemma 4's tokenizer alone (tokenizer.ggml.model "gemma4": U+2581-spelled tokens, "<0xNN>" byte
// fallback, a newline-run token, merges) in a gemma4 GGUF without tensors, so that the chat
// format falls back to gemma4's turns.
std::vector<uint8_t> Gemma4Tokenizer() {
  GgufBuilder b;
  b.AddString("general.architecture", "gemma4");
  const std::string space = "\xe2\x96\x81";  // U+2581
  std::vector<std::string> tokens = {"<pad>",   "<eos>",  "<bos>", "<unk>", "<|turn>",
                                     "<turn|>", "\n",     "\n\n",  space,   space + "a",
                                     "<0x0A>",  "<0xC3>", "<0xFF>"};
  std::vector<int32_t> types = {3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 6, 6, 6};
  for (int i = 0; tokens.size() < 48; ++i) {
    tokens.push_back("t" + std::to_string(i));
    types.push_back(1);
  }
  b.AddString("tokenizer.ggml.model", "gemma4");
  b.AddStringArray("tokenizer.ggml.tokens", tokens);
  b.AddInt32Array("tokenizer.ggml.token_type", types);
  b.AddStringArray("tokenizer.ggml.merges", {space + " a", "t 1", "\n \n"});
  b.AddUint32("tokenizer.ggml.bos_token_id", 2);
  b.AddUint32("tokenizer.ggml.eos_token_id", 1);
  return b.Build();
}

// A tiny model of `architecture` with its family's tensors and a small tokenizer.
std::vector<uint8_t> TinyModel(const std::string& architecture, bool spm) {
  constexpr int kLayers = 2, kD = 64, kFf = 128, kVocab = 48;
  GgufBuilder b;
  const std::string p = architecture + ".";
  b.AddString("general.architecture", architecture);
  b.AddUint32(p + "block_count", kLayers);
  b.AddUint32(p + "context_length", 256);
  b.AddUint32(p + "embedding_length", kD);
  b.AddUint32(p + "feed_forward_length", kFf);
  b.AddUint32(p + "attention.head_count", 4);
  b.AddUint32(p + "attention.head_count_kv", 2);
  b.AddFloat32(p + "rope.freq_base", 10000.0f);
  b.AddFloat32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (architecture == "gemma3") {
    b.AddUint32(p + "attention.sliding_window", 8);
    b.AddUint32(p + "attention.sliding_window_pattern", 2);
  }
  const bool experts = architecture == "qwen3moe";  // 4 experts of width 32, 2 used
  if (experts) {
    b.AddUint32(p + "expert_count", 4);
    b.AddUint32(p + "expert_used_count", 2);
    b.AddUint32(p + "expert_feed_forward_length", 32);
  }
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  while (tokens.size() < 40)
    tokens.push_back(std::string(1, static_cast<char>('a' + tokens.size() - 5)));
  for (const char* t : {"ab", "abc",
                        "\xe2\x96\x81"
                        "a",
                        "<0x0A>", " ",
                        "\xc4\xa0"
                        "a",
                        "Hello", "!"}) {
    tokens.push_back(t);
  }
  tokens.resize(kVocab - 1);
  tokens.push_back("<end_of_turn>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2;
  types[1] = types[2] = types[3] = types[4] = types.back() = 3;
  b.AddString("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  if (!spm) b.AddString("tokenizer.ggml.pre", "smollm");
  b.AddStringArray("tokenizer.ggml.tokens", tokens);
  b.AddInt32Array("tokenizer.ggml.token_type", types);
  if (spm) {
    std::vector<float> scores(tokens.size());
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
    b.AddFloat32Array("tokenizer.ggml.scores", scores);
  } else {
    b.AddStringArray("tokenizer.ggml.merges", {"a b", "ab c", "H e"});
  }
  b.AddUint32("tokenizer.ggml.bos_token_id", 1);
  b.AddUint32("tokenizer.ggml.eos_token_id", 2);
  if (!spm) {
    b.AddString("tokenizer.chat_template",
                "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  }
  const std::vector<float> ones(kFf, 1.0f);
  const std::vector<float> d_ones(ones.begin(), ones.begin() + kD);
  b.AddTensor("token_embd.weight", GgmlType::kQ8_0, {kD, kVocab});
  b.AddF32Tensor("output_norm.weight", {kD}, d_ones);
  for (int i = 0; i < kLayers; ++i) {
    const std::string l = "blk." + std::to_string(i) + ".";
    b.AddF32Tensor(l + "attn_norm.weight", {kD}, d_ones);
    b.AddTensor(l + "attn_q.weight", GgmlType::kQ4_1, {kD, kD});
    b.AddTensor(l + "attn_k.weight", GgmlType::kQ4_1, {kD, 32});
    b.AddTensor(l + "attn_v.weight", GgmlType::kQ4_1, {kD, 32});
    b.AddTensor(l + "attn_output.weight", GgmlType::kF16, {kD, kD});
    b.AddF32Tensor(l + "ffn_norm.weight", {kD}, d_ones);
    if (experts) {
      b.AddTensor(l + "ffn_gate_inp.weight", GgmlType::kF32, {kD, 4});
      b.AddTensor(l + "ffn_gate_exps.weight", GgmlType::kQ8_0, {kD, 32, 4});
      b.AddTensor(l + "ffn_up_exps.weight", GgmlType::kQ8_0, {kD, 32, 4});
      b.AddTensor(l + "ffn_down_exps.weight", GgmlType::kQ8_0, {32, kD, 4});
    } else {
      b.AddTensor(l + "ffn_gate.weight", GgmlType::kQ8_0, {kD, kFf});
      b.AddTensor(l + "ffn_up.weight", GgmlType::kQ8_0, {kD, kFf});
      b.AddTensor(l + "ffn_down.weight", GgmlType::kQ8_0, {kFf, kD});
    }
    if (architecture == "gemma3") {
      b.AddF32Tensor(l + "post_attention_norm.weight", {kD}, d_ones);
      b.AddF32Tensor(l + "post_ffw_norm.weight", {kD}, d_ones);
    }
    if (architecture == "gemma3" || architecture == "qwen3" || experts) {
      b.AddF32Tensor(l + "attn_q_norm.weight", {16}, d_ones);
      b.AddF32Tensor(l + "attn_k_norm.weight", {16}, d_ones);
    }
    if (architecture == "qwen2") {
      b.AddF32Tensor(l + "attn_q.bias", {kD}, d_ones);
      b.AddF32Tensor(l + "attn_k.bias", {32}, d_ones);
      b.AddF32Tensor(l + "attn_v.bias", {32}, d_ones);
    }
  }
  return b.Build();
}

// GGUF encoding of one metadata value, arrays cut to `max_elements`.
void Encode(const gguf::Value& value, size_t max_elements, std::vector<uint8_t>& out) {
  const auto put = [&out](const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    out.insert(out.end(), bytes, bytes + size);
  };
  using VT = gguf::ValueType;
  const uint64_t* u = std::get_if<uint64_t>(&value.data);
  const int64_t* s = std::get_if<int64_t>(&value.data);
  const double* f = std::get_if<double>(&value.data);
  switch (value.type) {
    case VT::kUint8:
    case VT::kInt8:
    case VT::kBool: {
      const uint8_t v = u ? uint8_t(*u) : s ? uint8_t(*s) : uint8_t(std::get<bool>(value.data));
      put(&v, 1);
      break;
    }
    case VT::kUint16:
    case VT::kInt16: {
      const uint16_t v = u ? uint16_t(*u) : uint16_t(*s);
      put(&v, 2);
      break;
    }
    case VT::kUint32:
    case VT::kInt32: {
      const uint32_t v = u ? uint32_t(*u) : uint32_t(*s);
      put(&v, 4);
      break;
    }
    case VT::kUint64:
    case VT::kInt64: {
      const uint64_t v = u ? *u : uint64_t(*s);
      put(&v, 8);
      break;
    }
    case VT::kFloat32: {
      const float v = float(*f);
      put(&v, 4);
      break;
    }
    case VT::kFloat64:
      put(f, 8);
      break;
    case VT::kString: {
      const std::string& text = std::get<std::string>(value.data);
      const uint64_t length = text.size();
      put(&length, 8);
      put(text.data(), text.size());
      break;
    }
    case VT::kArray: {
      const gguf::Array& array = std::get<gguf::Array>(value.data);
      const uint32_t type = static_cast<uint32_t>(array.element_type);
      const uint64_t count = std::min(array.elements.size(), max_elements);
      put(&type, 4);
      put(&count, 8);
      for (uint64_t i = 0; i < count; ++i) Encode(array.elements[i], max_elements, out);
      break;
    }
  }
}

// The real file's metadata, arrays cut short, no tensors.
std::vector<uint8_t> RealMetadata(const gguf::File& file, size_t max_elements) {
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  const uint64_t tensors = 0, count = file.metadata().size();
  out.insert(out.end(), reinterpret_cast<const uint8_t*>(&tensors),
             reinterpret_cast<const uint8_t*>(&tensors) + 8);
  out.insert(out.end(), reinterpret_cast<const uint8_t*>(&count),
             reinterpret_cast<const uint8_t*>(&count) + 8);
  for (const gguf::MetadataEntry& entry : file.metadata()) {
    const uint64_t length = entry.key.size();
    const uint32_t type = static_cast<uint32_t>(entry.value.type);
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&length),
               reinterpret_cast<const uint8_t*>(&length) + 8);
    out.insert(out.end(), entry.key.begin(), entry.key.end());
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&type),
               reinterpret_cast<const uint8_t*>(&type) + 4);
    Encode(entry.value, max_elements, out);
  }
  return out;
}

std::string Request(const std::function<void(v1::GenerateRequest&)>& fill) {
  v1::GenerateRequest request;
  fill(request);
  return request.SerializeAsString();
}

std::vector<uint8_t> ShmInput(std::vector<uint32_t> words, uint8_t mode = 0) {
  std::vector<uint8_t> out = {mode};
  for (uint32_t w : words) {
    out.insert(out.end(), reinterpret_cast<uint8_t*>(&w), reinterpret_cast<uint8_t*>(&w) + 4);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds OUT [SMOLLM2_GGUF]\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  const std::string real =
      argc > 2 ? argv[2]
               : std::string(BITSPLIT_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  for (const char* target :
       {"gguf_config_fuzz", "split_file_fuzz", "generate_request_fuzz", "shm_request_fuzz"}) {
    std::filesystem::create_directories(out / target);
  }

  const auto gguf_dir = out / "gguf_config_fuzz";
  Write(gguf_dir / "tiny_llama_bpe.gguf", TinyModel("llama", false));
  Write(gguf_dir / "tiny_gemma3_spm.gguf", TinyModel("gemma3", true));
  Write(gguf_dir / "tiny_qwen2.gguf", TinyModel("qwen2", false));
  Write(gguf_dir / "tiny_qwen3.gguf", TinyModel("qwen3", false));
  Write(gguf_dir / "tiny_qwen3moe.gguf", TinyModel("qwen3moe", false));
  Write(gguf_dir / "tiny_gemma4moe.gguf", TinyGemma4Moe());
  Write(gguf_dir / "gemma4_tokenizer.gguf", Gemma4Tokenizer());
  auto source = gguf::File::Open(real);
  if (source.ok()) {
    Write(gguf_dir / "smollm2_metadata_64.gguf", RealMetadata(**source, 64));
    Write(gguf_dir / "smollm2_metadata_8.gguf", RealMetadata(**source, 8));
  } else {
    std::fprintf(stderr, "make_fuzz_seeds: no real-model seeds: %s\n",
                 std::string(source.status().message()).c_str());
  }

  // A split file as the quantizer lays one out: the source metadata as an I8 blob, a ggml
  // embedding, an F32 norm and split-format linear weights.
  const auto split_dir = out / "split_file_fuzz";
  {
    const std::vector<uint8_t> tiny = TinyModel("llama", false);
    auto tiny_file = gguf::File::Parse(tiny.data(), tiny.size());
    std::vector<uint8_t> metadata(tiny.begin(), tiny.begin() + (*tiny_file)->metadata_end_offset());
    std::memset(metadata.data() + 8, 0, 8);  // tensor count
    const RowSizeOracle oracle = [](uint32_t id, uint32_t group,
                                    int64_t cols) -> absl::StatusOr<uint64_t> {
      BITSPLIT_RETURN_IF_ERROR(
          quant::ValidateSplitLayout(static_cast<quant::SplitFormat>(id), group, cols));
      return quant::SplitRowBytes(static_cast<quant::SplitFormat>(id), group, cols);
    };
    const std::string path = (split_dir / "tiny.base.bsplit").string();
    auto writer = SplitFileWriter::Create(path, SplitFileKind::kBase, SplitFingerprint{},
                                          {{"bitsplit", {{"version", 2}}}}, oracle);
    struct Entry {
      std::string name;
      uint32_t format, group;
      std::vector<int64_t> dims;
    };
    const std::vector<Entry> entries = {
        {"gguf.metadata",
         GgmlTensorFormat(GgmlType::kI8),
         0,
         {static_cast<int64_t>(metadata.size())}},
        {"token_embd.weight", GgmlTensorFormat(GgmlType::kQ8_0), 0, {64, 48}},
        {"output_norm.weight", GgmlTensorFormat(GgmlType::kF32), 0, {64}},
        {"blk.0.attn_q.weight",
         SplitTensorFormat(static_cast<uint32_t>(quant::SplitFormat::kB2Asym)),
         64,
         {64, 64}},
        {"blk.0.attn_k.weight",
         SplitTensorFormat(static_cast<uint32_t>(quant::SplitFormat::kR8)),
         32,
         {64, 32}}};
    std::vector<uint64_t> sizes;
    for (const Entry& e : entries) {
      auto bytes = (*writer)->DeclareTensor(e.name, e.format, e.group, e.dims);
      if (!bytes.ok()) {
        std::fprintf(stderr, "make_fuzz_seeds: %s: %s\n", e.name.c_str(),
                     std::string(bytes.status().message()).c_str());
        return 1;
      }
      sizes.push_back(*bytes);
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      std::vector<uint8_t> data(sizes[i], 0);
      if (i == 0) data = metadata;
      (void)(*writer)->WriteTensorData(entries[i].name, data.data(), data.size());
    }
    if (absl::Status status = (*writer)->Finish(); !status.ok()) {
      std::fprintf(stderr, "make_fuzz_seeds: %s\n", std::string(status.message()).c_str());
      return 1;
    }
  }

  const auto request_dir = out / "generate_request_fuzz";
  Write(request_dir / "prompt", Request([](v1::GenerateRequest& r) {
          r.set_prompt("Once upon a time");
          r.set_max_tokens(16);
        }));
  Write(request_dir / "chat", Request([](v1::GenerateRequest& r) {
          auto* m = r.mutable_chat()->add_messages();
          m->set_role("system");
          m->set_content("Be brief.");
          m = r.mutable_chat()->add_messages();
          m->set_role("user");
          m->set_content("What is the capital of France? <|im_end|>");
          r.set_temperature(0.8f);
          r.set_top_k(40);
          r.set_top_p(0.95f);
          r.set_seed(7);
          r.add_stop("\n\n");
          r.add_stop_token_ids(2);
          r.set_logprobs(3);
          r.mutable_speculation()->set_mode(v1::SpeculationSettings::MODE_TREE);
          r.mutable_speculation()->set_nodes(15);
        }));
  Write(request_dir / "token_ids", Request([](v1::GenerateRequest& r) {
          for (int id : {1, 504, 3260, 28, 49151}) r.mutable_token_ids()->add_ids(id);
          r.mutable_speculation()->set_mode(v1::SpeculationSettings::MODE_ADAPTIVE);
        }));
  Write(request_dir / "off", Request([](v1::GenerateRequest& r) {
          r.set_prompt("\xff\xfe bad utf-8 \xe2\x82");
          r.mutable_speculation()->set_mode(v1::SpeculationSettings::MODE_OFF);
          r.set_max_tokens(4096);
        }));

  const auto shm_dir = out / "shm_request_fuzz";
  // SmolLM2's service: 64 rows, widest input 1536, widest output 3072 (gate + up).
  Write(shm_dir / "smollm2_qkv", ShmInput({64, 1536, 3072, 64, 1, 0, 0, 8, 576}));
  Write(shm_dir / "smollm2_down", ShmInput({64, 1536, 3072, 16, 2, 29, 3, 16, 1536}));
  Write(shm_dir / "head", ShmInput({8, 576, 49152, 8, 3, 0xffffffffu, 4, 1, 576}));
  Write(shm_dir / "raw_header",
        ShmInput({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,    0, 0, 0, 0, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8192, 1, 0, 0, 1, 32},
                 1));
  std::printf("seeds written to %s\n", out.c_str());
  return 0;
}
