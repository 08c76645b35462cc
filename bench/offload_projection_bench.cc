// Projected decode speed of models too big for a GPU, from their published shapes: bitsplit's
// split (offline::PlanOffload, the planner `bitsplit plan` prints: base on the GPU as PlanVram
// lays it out, residual in RAM) beside llama.cpp's offload of the same model at Q8_0 and Q4_K_M
// (--cpu-moe for a mixture of experts: every expert in RAM, the rest on the GPU; layer offload
// -ngl for a dense model: the layers that fit on the GPU), and for gpt-oss its released MXFP4
// experts under --n-cpu-moe (the experts of the layers that fit on the GPU, the rest in RAM).
// Arithmetic only, no weights: what each engine must read per token, over the machine's bandwidths.
// Usage and the table: docs/performance.md ("Offloading big models: projections").
//
//   build/bench/offload_projection_bench [--ram-gbps 60] [--vram-gbps 1000] [--context 8192]
//
// bitsplit, per model and card: the fastest plan of common/offline/offload_plan.h in the card's
// default budget (one session of --context tokens, else the longest context, halving, that fits;
// 64-row forwards; the embedding rows gathered on the host).
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
#include "common/offline/offload_plan.h"
#include "common/quant/split_format.h"

namespace bitsplit {
namespace {

using offline::LinearGroupShape;
using quant::SplitFormat;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Machine {
  offline::OffloadMachine bandwidths;
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

// gpt-oss (gpt-oss-20b: 24 layers and 32 experts; gpt-oss-120b: 36 layers and 128 experts):
// d_model 2880, 64 q heads over 8 KV heads of 64, local layers (window 128) alternating with
// global ones from layer 0, experts of width 2880 with 4 used and no dense FFN, untied head over
// 201,088 tokens, 131,072 tokens of context.
model::ModelConfig GptOss(int64_t layers, int64_t experts) {
  model::ModelConfig c;
  c.architecture = "gpt-oss";
  c.num_layers = layers;
  c.d_model = 2880;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = c.rope_dims = 64;
  c.vocab_size = 201088;
  c.context_length = 131072;
  c.d_ff = 2880;  // unused: no dense FFN
  c.dense_ffn = false;
  c.num_experts = experts;
  c.num_experts_used = 4;
  c.d_ff_expert = 2880;
  c.sliding_window = 128;
  c.layer_is_local.assign(static_cast<size_t>(layers), 0);
  for (int64_t layer = 0; layer < layers; layer += 2)
    c.layer_is_local[static_cast<size_t>(layer)] = 1;
  return c;
}

// llama.cpp's bits per weight: Q8_0 8.5; Q4_K_M Q4_K (4.5) with Q6_K (6.5625) for ffn_down and
// attn_v in the layers llama-quant.cpp's use_more_bits picks (the first and last eighth, every
// third between).
bool UseMoreBits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}
// The released gpt-oss GGUFs keep the experts in MXFP4 (4.25 bits per weight), the rest here
// taken as Q8_0.
enum class LlamaCppQuant { kQ8_0, kQ4_K_M, kMxfp4Experts };
double LlamaCppBits(LlamaCppQuant quant, const std::string& tensor, int64_t layer, int64_t layers) {
  if (quant == LlamaCppQuant::kMxfp4Experts) {
    return tensor.find("_exps") != std::string::npos ? 4.25 : 8.5;
  }
  const bool q4_k_m = quant == LlamaCppQuant::kQ4_K_M;
  if (!q4_k_m) return 8.5;
  const bool more =
      tensor.find("ffn_down") != std::string::npos || tensor.find("attn_v") != std::string::npos;
  return more && layer >= 0 && UseMoreBits(layer, layers) ? 6.5625 : 4.5;
}

struct LlamaCppProjection {
  double gpu_gib = 0, ram_gib = 0, ram_read_gib = 0, tokens_per_second = 0;
  int64_t gpu_layers = 0;  // dense: layers on the GPU; --n-cpu-moe: layers whose experts are
  bool fits = true;        // --n-cpu-moe: the rest of the model fits beside the KV cache
};

// --cpu-moe (a mixture of experts; with `n_cpu_moe`, --n-cpu-moe: the experts of as few layers
// as needed stay in RAM, the others' on the GPU) or -ngl (dense): per token, the bytes read from
// RAM and VRAM.
LlamaCppProjection ProjectLlamaCpp(const model::ModelConfig& c, LlamaCppQuant quant,
                                   uint64_t budget, const Machine& m, bool n_cpu_moe = false) {
  const std::vector<LinearGroupShape> groups = offline::LinearGroupShapes(c);
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
  std::vector<double> layer_experts(static_cast<size_t>(c.num_layers), 0.0);
  std::vector<double> layer_expert_read(static_cast<size_t>(c.num_layers), 0.0);
  double head = 0, experts = 0, expert_read = 0;
  for (const LinearGroupShape& g : groups) {
    for (size_t i = 0; i < g.rows.size(); ++i) {
      const double bytes = static_cast<double>(g.rows[i]) * static_cast<double>(g.cols) *
                           LlamaCppBits(quant, g.tensors[i], g.id.layer, c.num_layers) / 8;
      if (model::IsExpertGroup(g.id.group)) {
        experts += bytes;
        expert_read += g.token_share * bytes;
        layer_experts[static_cast<size_t>(g.id.layer)] += bytes;
        layer_expert_read[static_cast<size_t>(g.id.layer)] += g.token_share * bytes;
      } else if (g.id.group == model::LinearGroup::kOutputHead) {
        head += bytes;
      } else {
        layer_bytes[static_cast<size_t>(g.id.layer)] += bytes;
      }
    }
  }
  LlamaCppProjection p;
  double gpu = head, ram = 0, ram_read = 0;
  if (c.has_experts() && n_cpu_moe) {
    // The last layers' experts go to the GPU while they fit; the first layers' stay in RAM.
    for (const double b : layer_bytes) gpu += b;
    p.fits = gpu <= available;
    for (int64_t layer = c.num_layers - 1; layer >= 0; --layer) {
      const size_t l = static_cast<size_t>(layer);
      if (p.fits && gpu + layer_experts[l] <= available) {
        gpu += layer_experts[l];
        ++p.gpu_layers;
      } else {
        ram += layer_experts[l];
        ram_read += layer_expert_read[l];
      }
    }
  } else if (c.has_experts()) {
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
  p.tokens_per_second = 1.0 / (ram_read / m.bandwidths.ram_bytes_per_second +
                               gpu / m.bandwidths.vram_bytes_per_second);
  return p;
}

int Run(const Machine& m) {
  struct Named {
    const char* name;
    model::ModelConfig config;
  };
  const std::vector<Named> models = {{"Qwen3-30B-A3B", Qwen3_30B_A3B()},
                                     {"gemma4-26B-A4B", Gemma4_26B_A4B()},
                                     {"gemma4-31B", Gemma4_31B()},
                                     {"gpt-oss-20b", GptOss(24, 32)},
                                     {"gpt-oss-120b", GptOss(36, 128)}};
  std::printf("RAM %.0f GB/s, VRAM %.0f GB/s, one session of %lld tokens\n\n",
              m.bandwidths.ram_bytes_per_second / 1e9, m.bandwidths.vram_bytes_per_second / 1e9,
              static_cast<long long>(m.context));
  std::printf(
      "| model | card | bitsplit plan (attention / experts) | GPU plan | residual in RAM | shape | "
      "read per verify (residual + base) | tokens/verify | bitsplit tok/s | llama.cpp Q8_0: RAM "
      "read/token, tok/s | llama.cpp Q4_K_M: RAM read/token, tok/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Named& named : models) {
    const bool gpt_oss = named.config.architecture == "gpt-oss";
    const std::vector<int> cards =
        !gpt_oss
            ? std::vector<int>{16, 24}
            : (named.config.num_experts == 32 ? std::vector<int>{8, 16} : std::vector<int>{24});
    for (const int card_gb : cards) {
      // A "16 GB" card holds 16 GiB; the default budget keeps 5% of it for the CUDA runtime.
      const uint64_t budget = model::DefaultVramBudget(static_cast<uint64_t>(card_gb) << 30);
      // The fastest plan at --context tokens, else at the longest context (halving) that fits.
      offline::OffloadRequest request{.config = named.config,
                                      .vram_budget_bytes = budget,
                                      .context = m.context,
                                      .machine = m.bandwidths};
      absl::StatusOr<offline::OffloadPlan> best = offline::PlanOffload(request);
      while (!best.ok() && request.context > 512) {
        request.context /= 2;
        best = offline::PlanOffload(request);
      }
      const std::string card = std::to_string(card_gb) + " GB" +
                               (best.ok() && request.context != m.context
                                    ? " (" + std::to_string(request.context) + " tokens)"
                                    : std::string());
      const LlamaCppProjection q8 = ProjectLlamaCpp(named.config, LlamaCppQuant::kQ8_0, budget, m);
      const LlamaCppProjection q4 =
          ProjectLlamaCpp(named.config, LlamaCppQuant::kQ4_K_M, budget, m);
      auto llama = [&](const LlamaCppProjection& p) {
        char text[96];
        std::snprintf(text, sizeof(text), "%.2f GiB, %.1f%s", p.ram_read_gib, p.tokens_per_second,
                      named.config.has_experts()
                          ? ""
                          : (" (" + std::to_string(p.gpu_layers) + " layers on GPU)").c_str());
        return std::string(text);
      };
      if (!best.ok()) {
        std::printf("| %s | %s | does not fit: %s | | | | | | | %s | %s |\n", named.name,
                    card.c_str(), std::string(best.status().message()).c_str(), llama(q8).c_str(),
                    llama(q4).c_str());
        continue;
      }
      const auto pair = [](SplitFormat base) {
        return std::string(quant::GetSplitFormatInfo(base).name) + "+" +
               quant::GetSplitFormatInfo(offline::ResidualForBase(base)).name;
      };
      const std::string bases = named.config.has_experts()
                                    ? pair(best->attention_base) + " / " + pair(best->expert_base)
                                    : pair(best->attention_base);
      std::printf(
          "| %s | %s | %s | %.2f of %.2f GiB | %.2f GiB | %s | %.2f + %.2f GiB | %.2f | %.1f | %s "
          "| "
          "%s |\n",
          named.name, card.c_str(), bases.c_str(),
          static_cast<double>(best->vram.total_bytes) / kGiB, static_cast<double>(budget) / kGiB,
          static_cast<double>(best->residual_bytes) / kGiB, best->shape.c_str(),
          best->residual_read_bytes / kGiB, best->base_read_bytes / kGiB, best->tau,
          best->tokens_per_second, llama(q8).c_str(), llama(q4).c_str());
    }
  }
  // gpt-oss as released (MXFP4 experts) under llama.cpp's --n-cpu-moe: the experts of as many
  // layers as fit on the GPU, the first layers' in RAM.
  std::printf(
      "\n| model | card | llama.cpp --n-cpu-moe (MXFP4 experts, Q8_0 rest): expert layers on "
      "GPU | GPU | RAM read/token | tok/s |\n|---|---|---|---|---|---|\n");
  for (const Named& named : models) {
    if (named.config.architecture != "gpt-oss") continue;
    const std::vector<int> cards =
        named.config.num_experts == 32 ? std::vector<int>{8, 16} : std::vector<int>{24};
    for (const int card_gb : cards) {
      const uint64_t budget = model::DefaultVramBudget(static_cast<uint64_t>(card_gb) << 30);
      const LlamaCppProjection p =
          ProjectLlamaCpp(named.config, LlamaCppQuant::kMxfp4Experts, budget, m, true);
      if (!p.fits) {
        std::printf("| %s | %d GB | attention and head do not fit | | | |\n", named.name, card_gb);
        continue;
      }
      std::printf("| %s | %d GB | %lld of %lld | %.2f GiB | %.2f GiB | %.1f |\n", named.name,
                  card_gb, static_cast<long long>(p.gpu_layers),
                  static_cast<long long>(named.config.num_layers), p.gpu_gib, p.ram_read_gib,
                  p.tokens_per_second);
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
      m.bandwidths.ram_bytes_per_second = value * 1e9;
    } else if (std::strcmp(argv[i], "--vram-gbps") == 0 && value > 0) {
      m.bandwidths.vram_bytes_per_second = value * 1e9;
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
