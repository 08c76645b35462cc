// Projected decode speed of models too big for a GPU, from their published shapes: bitsplit's
// split (base on the GPU as PlanVram lays it out, residual in RAM) beside llama.cpp's offload of
// the same model at Q8_0 and Q4_K_M (--cpu-moe for a mixture of experts: every expert in RAM,
// the rest on the GPU; layer offload -ngl for a dense model: the layers that fit on the GPU).
// Arithmetic only, no weights: what each engine must read per token, over the machine's
// bandwidths. Usage and the table: docs/performance.md ("Offloading big models: projections").
//
//   build/bench/offload_projection_bench [--ram-gbps 60] [--vram-gbps 1000] [--context 8192]
//
// bitsplit, per model and card: among the plans "attention, dense FFN and head on base b_a, the
// experts on b_e" (b_e <= b_a, b in {2, 3, 4}; a dense model has b_a alone) that PlanVram fits in
// the card's default budget (one session of --context tokens, 64-row forwards, the embedding
// rows gathered on the host), with the residual that puts base + residual at 8 bits (b2+r6,
// b3+r5, b4+r4: at or below Q8_0's KL on SmolLM2, docs/quality.md), and among the speculation
// shapes (off; a chain of 1 to 8 drafts; a 16-node tree drafted in 4 forwards of 4 rows), the
// fastest. A verify of n rows reads an expert group's experts that n rows touch under uniform
// routing (model::ExpectedDistinctExperts), so on a mixture of experts bigger verifies cost more.
// Tokens per verify are SmolLM2's measured ones (docs/performance.md, acceptance: the 16-node
// tree 1.72 on a b2 base, 4.18 on b4; the chain's acceptance by depth on each), linear in the mean
// base bits of the weights a token reads: an assumption, as no trained model of these shapes runs
// here.
//   time per token = (residual read / RAM + base read / VRAM + draft forwards' base / VRAM) / tau
// llama.cpp, per token: the weights it reads in RAM / RAM + those in VRAM / VRAM (no speculation).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/linear_backend.h"
#include "common/model/vram_plan.h"
#include "common/quant/split_format.h"

namespace bitsplit {
namespace {

using quant::SplitFormat;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// SmolLM2-135M-Instruct, b2_asym/g64 and b4_asym/g64 bases + r8 (docs/performance.md,
// acceptance): tokens per verify of a 16-node tree (k 4), and an 8-chain's acceptance by depth.
constexpr double kTreeTauB2 = 1.72, kTreeTauB4 = 4.18;
constexpr double kChainB2[8] = {0.25, 0.26, 0.17, 0.11, 0, 0, 0, 0};
constexpr double kChainB4[8] = {0.80, 0.78, 0.82, 0.80, 0.81, 0.77, 0.85, 0.74};

// One step's shape: rows verified, draft forwards and their rows.
struct StepShape {
  std::string name;
  double verify_rows = 1, draft_forwards = 0, draft_rows = 0;
  int chain = 0;  // drafts of a chain; 0: the tree (or off when there are no draft forwards)
};
std::vector<StepShape> StepShapes() {
  std::vector<StepShape> shapes = {
      {.name = "off"},
      {.name = "tree 16", .verify_rows = 17, .draft_forwards = 4, .draft_rows = 4}};
  for (int l = 1; l <= 8; ++l) {
    shapes.push_back({.name = "chain " + std::to_string(l),
                      .verify_rows = static_cast<double>(l + 1),
                      .draft_forwards = static_cast<double>(l),
                      .draft_rows = 1,
                      .chain = l});
  }
  return shapes;
}

// Tokens per verify of `shape` for a base of `bits` mean bits (2 to 4).
double Tau(const StepShape& shape, double bits) {
  const double t = (bits - 2) / 2;
  if (shape.draft_forwards == 0) return 1;
  if (shape.chain == 0) return kTreeTauB2 + t * (kTreeTauB4 - kTreeTauB2);
  double tau = 1, reach = 1;
  for (int d = 0; d < shape.chain; ++d) {
    reach *= kChainB2[d] + t * (kChainB4[d] - kChainB2[d]);
    tau += reach;
  }
  return tau;
}

struct Machine {
  double ram_bytes_per_second = 60e9;
  double vram_bytes_per_second = 1e12;
  int64_t context = 8192;
};

// Qwen3-30B-A3B: 48 layers, d_model 2048, 32 q heads over 4 KV heads of 128, QK-norm, 128
// experts of width 768 with 8 used and no dense FFN, untied head, vocab 151936.
model::ModelConfig Qwen3_30B_A3B() {
  model::ModelConfig c;
  c.architecture = "qwen3moe";
  c.num_layers = 48;
  c.d_model = 2048;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = c.rope_dims = 128;
  c.vocab_size = 151936;
  c.context_length = 40960;
  c.d_ff = 6144;  // unused: no dense FFN
  c.dense_ffn = false;
  c.num_experts = 128;
  c.num_experts_used = 8;
  c.d_ff_expert = 768;
  return c;
}

// The gemma4 attention of the 26B-A4B and the 31B: sliding layers of head width 256 with a
// 1024-token window, every sixth layer global with head width 512 over `global_kv` KV heads whose
// values are their keys.
void Gemma4Attention(model::ModelConfig& c, int64_t sliding_kv, int64_t global_kv) {
  c.architecture = "gemma4";
  c.vocab_size = 262144;
  c.context_length = 262144;
  c.head_dim = c.rope_dims = 512;
  c.head_dim_local = c.rope_dims_local = 256;
  c.sliding_window = 1024;
  c.num_kv_heads = sliding_kv;
  c.layer_is_local.assign(static_cast<size_t>(c.num_layers), 1);
  c.layer_kv_heads.assign(static_cast<size_t>(c.num_layers), sliding_kv);
  c.layer_value_is_key.assign(static_cast<size_t>(c.num_layers), 0);
  for (int64_t layer = 5; layer < c.num_layers; layer += 6) {
    c.layer_is_local[static_cast<size_t>(layer)] = 0;
    c.layer_kv_heads[static_cast<size_t>(layer)] = global_kv;
    c.layer_value_is_key[static_cast<size_t>(layer)] = 1;
  }
}

// Gemma 4 26B-A4B: 30 layers, d_model 2816, 16 q heads, sliding 8 KV heads, global 2; a dense FFN
// of 2112 beside 128 experts of 704, 8 used; tied head.
model::ModelConfig Gemma4_26B_A4B() {
  model::ModelConfig c;
  c.num_layers = 30;
  c.d_model = 2816;
  c.num_heads = 16;
  Gemma4Attention(c, 8, 2);
  c.d_ff = 2112;
  c.num_experts = 128;
  c.num_experts_used = 8;
  c.d_ff_expert = 704;
  c.parallel_experts = true;
  c.fused_expert_gate_up = true;
  return c;
}

// Gemma 4 31B: 60 layers, d_model 5376, 32 q heads, sliding 16 KV heads, global 4; dense FFN of
// 21504; tied head.
model::ModelConfig Gemma4_31B() {
  model::ModelConfig c;
  c.num_layers = 60;
  c.d_model = 5376;
  c.num_heads = 32;
  Gemma4Attention(c, 16, 4);
  c.d_ff = 21504;
  return c;
}

int Bits(SplitFormat f) { return quant::GetSplitFormatInfo(f).bits; }
SplitFormat ResidualFor(SplitFormat base) {
  switch (Bits(base)) {
    case 2:
      return SplitFormat::kR6;
    case 3:
      return SplitFormat::kR5;
    default:
      return SplitFormat::kR4;
  }
}

// Per linear group its weights and what a verify and a draft forward read of it.
struct GroupShape {
  model::LinearGroupId id;
  std::vector<std::string> tensors;
  std::vector<int64_t> rows;
  int64_t cols = 0;
  bool experts = false;
  double token_share = 1;  // of its bytes one token reads
};

// The share of a group's bytes a forward of `rows` rows reads.
double ReadShare(const model::ModelConfig& c, const GroupShape& g, double rows) {
  if (!g.experts || rows <= 0) return g.experts ? 0 : 1;
  return model::ExpectedDistinctExperts(c.num_experts, c.num_experts_used, rows) /
         static_cast<double>(c.num_experts);
}

std::vector<GroupShape> Groups(const model::ModelConfig& c) {
  std::vector<GroupShape> groups;
  for (const model::LinearGroupId id : model::AllLinearGroups(c)) {
    GroupShape g{.id = id,
                 .tensors = model::LinearGroupTensorNames(c, id),
                 .rows = model::LinearGroupOutputDims(c, id),
                 .cols = model::LinearGroupInputDim(c, id)};
    if (model::IsExpertGroup(id.group)) {
      g.experts = true;
      g.token_share = static_cast<double>(c.num_experts_used) / static_cast<double>(c.num_experts);
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

struct SplitProjection {
  SplitFormat attention_base, expert_base;
  model::VramPlan plan;
  std::string shape;
  double residual_gib = 0, residual_read_gib = 0, base_read_gib = 0, tau = 0, tokens_per_second = 0;
};

std::optional<SplitProjection> ProjectSplit(const model::ModelConfig& c, uint64_t budget,
                                            SplitFormat attention_base, SplitFormat expert_base,
                                            const Machine& m) {
  const std::vector<GroupShape> groups = Groups(c);
  model::VramRequest request;
  request.config = c;
  request.base_format = attention_base;
  request.base_group = 64;
  request.embedding_bytes = 0;
  request.context = m.context;
  request.sessions = 1;
  request.max_batch_rows = 64;
  double residual = 0, token_weights = 0, token_bits = 0;
  for (const GroupShape& g : groups) {
    const SplitFormat base = g.experts ? expert_base : attention_base;
    for (const std::string& name : g.tensors) request.base_tensor_formats[name] = base;
    for (const int64_t rows : g.rows) {
      const double weights = static_cast<double>(rows) * static_cast<double>(g.cols);
      residual += static_cast<double>(rows) *
                  static_cast<double>(quant::SplitRowBytes(ResidualFor(base), 32, g.cols));
      token_weights += g.token_share * weights;
      token_bits += g.token_share * weights * Bits(base);
    }
  }
  auto plan = model::PlanVram(request, budget);
  if (!plan.ok()) return std::nullopt;
  // Bytes of residual and base a forward of `rows` rows reads.
  auto read = [&](double rows, double& residual_bytes, double& base_bytes) {
    residual_bytes = base_bytes = 0;
    for (const GroupShape& g : groups) {
      const SplitFormat base = g.experts ? expert_base : attention_base;
      const double share = ReadShare(c, g, rows);
      for (const int64_t r : g.rows) {
        base_bytes += share * static_cast<double>(r) *
                      static_cast<double>(model::DeviceRowStride(base, 64, g.cols));
        residual_bytes += share * static_cast<double>(r) *
                          static_cast<double>(quant::SplitRowBytes(ResidualFor(base), 32, g.cols));
      }
    }
  };
  std::optional<SplitProjection> best;
  for (const StepShape& shape : StepShapes()) {
    double residual_read = 0, verify_base = 0, unused = 0, draft_base = 0;
    read(shape.verify_rows, residual_read, verify_base);
    read(shape.draft_rows, unused, draft_base);
    SplitProjection p{.attention_base = attention_base,
                      .expert_base = expert_base,
                      .plan = *plan,
                      .shape = shape.name};
    p.residual_gib = residual / kGiB;
    p.residual_read_gib = residual_read / kGiB;
    p.base_read_gib = verify_base / kGiB;
    p.tau = Tau(shape, token_bits / token_weights);
    const double seconds =
        residual_read / m.ram_bytes_per_second +
        (verify_base + shape.draft_forwards * draft_base) / m.vram_bytes_per_second;
    p.tokens_per_second = p.tau / seconds;
    if (!best || p.tokens_per_second > best->tokens_per_second) best = p;
  }
  return best;
}

// llama.cpp's bits per weight: Q8_0 8.5; Q4_K_M Q4_K (4.5) with Q6_K (6.5625) for ffn_down and
// attn_v in the layers llama-quant.cpp's use_more_bits picks (the first and last eighth, every
// third between).
bool UseMoreBits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}
double LlamaCppBits(bool q4_k_m, const std::string& tensor, int64_t layer, int64_t layers) {
  if (!q4_k_m) return 8.5;
  const bool more =
      tensor.find("ffn_down") != std::string::npos || tensor.find("attn_v") != std::string::npos;
  return more && layer >= 0 && UseMoreBits(layer, layers) ? 6.5625 : 4.5;
}

struct LlamaCppProjection {
  double gpu_gib = 0, ram_gib = 0, ram_read_gib = 0, tokens_per_second = 0;
  int64_t gpu_layers = 0;  // dense: layers on the GPU
};

// --cpu-moe (a mixture of experts) or -ngl (dense): per token, the bytes read from RAM and VRAM.
LlamaCppProjection ProjectLlamaCpp(const model::ModelConfig& c, bool q4_k_m, uint64_t budget,
                                   const Machine& m) {
  const std::vector<GroupShape> groups = Groups(c);
  // fp16 KV of one --context session, and ~1 GiB of compute buffers.
  uint64_t kv = 0;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    kv += 2 * 2 *
          static_cast<uint64_t>(std::min(
              m.context, c.AttentionWindow(layer) > 0 ? c.AttentionWindow(layer) : m.context)) *
          static_cast<uint64_t>(c.KvDim(layer));
  }
  const double available = static_cast<double>(budget) - static_cast<double>(kv) - kGiB;
  std::vector<double> layer_bytes(static_cast<size_t>(c.num_layers), 0.0);
  double head = 0, experts = 0, expert_read = 0;
  for (const GroupShape& g : groups) {
    for (size_t i = 0; i < g.rows.size(); ++i) {
      const double bytes = static_cast<double>(g.rows[i]) * static_cast<double>(g.cols) *
                           LlamaCppBits(q4_k_m, g.tensors[i], g.id.layer, c.num_layers) / 8;
      if (model::IsExpertGroup(g.id.group)) {
        experts += bytes;
        expert_read += g.token_share * bytes;
      } else if (g.id.group == model::LinearGroup::kOutputHead) {
        head += bytes;
      } else {
        layer_bytes[static_cast<size_t>(g.id.layer)] += bytes;
      }
    }
  }
  LlamaCppProjection p;
  double gpu = head, ram = 0, ram_read = 0;
  if (c.has_experts()) {
    for (const double b : layer_bytes) gpu += b;
    ram = ram_read = 0;
    ram += experts;
    ram_read += expert_read;
    p.gpu_layers = c.num_layers;
  } else {
    for (const double b : layer_bytes) {
      if (gpu + b <= available) {
        gpu += b;
        ++p.gpu_layers;
      } else {
        ram += b;
      }
    }
    ram_read = ram;
  }
  p.gpu_gib = gpu / kGiB;
  p.ram_gib = ram / kGiB;
  p.ram_read_gib = ram_read / kGiB;
  p.tokens_per_second = 1.0 / (ram_read / m.ram_bytes_per_second + gpu / m.vram_bytes_per_second);
  return p;
}

int Run(const Machine& m) {
  struct Named {
    const char* name;
    model::ModelConfig config;
  };
  const std::vector<Named> models = {{"Qwen3-30B-A3B", Qwen3_30B_A3B()},
                                     {"gemma4-26B-A4B", Gemma4_26B_A4B()},
                                     {"gemma4-31B", Gemma4_31B()}};
  const std::vector<SplitFormat> bases = {SplitFormat::kB4Asym, SplitFormat::kB3Asym,
                                          SplitFormat::kB2Asym};
  std::printf("RAM %.0f GB/s, VRAM %.0f GB/s, one session of %lld tokens\n\n",
              m.ram_bytes_per_second / 1e9, m.vram_bytes_per_second / 1e9,
              static_cast<long long>(m.context));
  std::printf(
      "| model | card | bitsplit plan (attention / experts) | GPU plan | residual in RAM | shape | "
      "read per verify (residual + base) | tokens/verify | bitsplit tok/s | llama.cpp Q8_0: RAM "
      "read/token, tok/s | llama.cpp Q4_K_M: RAM read/token, tok/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Named& named : models) {
    for (const int card_gb : {16, 24}) {
      // A "16 GB" card holds 16 GiB; the default budget keeps 5% of it for the CUDA runtime.
      const uint64_t budget = model::DefaultVramBudget(static_cast<uint64_t>(card_gb) << 30);
      // The fastest plan at --context tokens, else at the longest context (halving) that fits.
      std::optional<SplitProjection> best;
      Machine fitted = m;
      for (; !best && fitted.context >= 512; fitted.context /= 2) {
        for (const SplitFormat a : bases) {
          for (const SplitFormat e : bases) {
            if (Bits(e) > Bits(a) || (!named.config.has_experts() && e != a)) continue;
            std::optional<SplitProjection> p = ProjectSplit(named.config, budget, a, e, fitted);
            if (p && (!best || p->tokens_per_second > best->tokens_per_second)) best = p;
          }
        }
        if (best) break;
      }
      const std::string card =
          std::to_string(card_gb) + " GB" +
          (best && fitted.context != m.context ? " (" + std::to_string(fitted.context) + " tokens)"
                                               : std::string());
      const LlamaCppProjection q8 = ProjectLlamaCpp(named.config, false, budget, m);
      const LlamaCppProjection q4 = ProjectLlamaCpp(named.config, true, budget, m);
      auto llama = [&](const LlamaCppProjection& p) {
        char text[96];
        std::snprintf(text, sizeof(text), "%.2f GiB, %.1f%s", p.ram_read_gib, p.tokens_per_second,
                      named.config.has_experts()
                          ? ""
                          : (" (" + std::to_string(p.gpu_layers) + " layers on GPU)").c_str());
        return std::string(text);
      };
      if (!best) {
        std::printf("| %s | %s | does not fit | | | | | | | %s | %s |\n", named.name, card.c_str(),
                    llama(q8).c_str(), llama(q4).c_str());
        continue;
      }
      std::printf(
          "| %s | %s | %s+%s / %s+%s | %.2f of %.2f GiB | %.2f GiB | %s | %.2f + %.2f GiB | "
          "%.2f | %.1f | %s | %s |\n",
          named.name, card.c_str(), quant::GetSplitFormatInfo(best->attention_base).name,
          quant::GetSplitFormatInfo(ResidualFor(best->attention_base)).name,
          quant::GetSplitFormatInfo(best->expert_base).name,
          quant::GetSplitFormatInfo(ResidualFor(best->expert_base)).name,
          static_cast<double>(best->plan.total_bytes) / kGiB, static_cast<double>(budget) / kGiB,
          best->residual_gib, best->shape.c_str(), best->residual_read_gib, best->base_read_gib,
          best->tau, best->tokens_per_second, llama(q8).c_str(), llama(q4).c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) {
  bitsplit::Machine m;
  for (int i = 1; i + 1 < argc; i += 2) {
    const double value = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--ram-gbps") == 0 && value > 0) {
      m.ram_bytes_per_second = value * 1e9;
    } else if (std::strcmp(argv[i], "--vram-gbps") == 0 && value > 0) {
      m.vram_bytes_per_second = value * 1e9;
    } else if (std::strcmp(argv[i], "--context") == 0 && value >= 64) {
      m.context = static_cast<int64_t>(value);
    } else {
      std::fprintf(stderr,
                   "usage: offload_projection_bench [--ram-gbps 60] [--vram-gbps 1000] "
                   "[--context 8192]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr,
                 "usage: offload_projection_bench [--ram-gbps G] [--vram-gbps G] "
                 "[--context N]\n");
    return 2;
  }
  return bitsplit::Run(m);
}
