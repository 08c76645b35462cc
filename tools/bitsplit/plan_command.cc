// `bitsplit plan MODEL.gguf --vram SIZE --ram SIZE`: where a model would go on a machine before
// anything is quantized, from the GGUF's metadata and tensor table alone (a file whose tensor data
// is cut off or sparse works): the bases that fit the card, the residual beside them, the
// embedding table's place, KV cache and scratch, how many sessions of what context fit, the RAM
// needed and the projected speed (common/offline/offload_plan.h). Exit 2 with what would fit when
// nothing does, or when the RAM is short.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/ggml_type.h"
#include "common/io/gguf.h"
#include "common/model/config.h"
#include "common/model/vram_plan.h"
#include "common/offline/offload_plan.h"
#include "common/ops/kv_rows.h"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

struct PlanOptions {
  std::string model_path;
  std::string vram;
  std::string ram;
  int64_t context = 8192;
  int64_t sessions = 1;
  int64_t max_batch_rows = 64;
  double ram_gbps = 60;
  double vram_gbps = 1000;
  bool ternary = true;
  std::string kv_type = "f16";
};

// The error after what was printed so far (stdout is buffered, stderr is not).
int Fail(int code, std::string_view message) {
  std::fflush(stdout);
  return ReportError("plan", code, message);
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
double GiB(double bytes) { return bytes / kGiB; }

std::string FormatPair(quant::SplitFormat base, int base_group) {
  return absl::StrFormat("%s/g%d + %s/g32", quant::GetSplitFormatInfo(base).name, base_group,
                         quant::GetSplitFormatInfo(offline::ResidualForBase(base)).name);
}

int RunPlan(const PlanOptions& options) {
  const absl::StatusOr<uint64_t> card = model::ParseBytes(options.vram);
  if (!card.ok()) return Fail(kExitBadInput, absl::StrCat("--vram: ", card.status().message()));
  const absl::StatusOr<uint64_t> ram = model::ParseBytes(options.ram);
  if (!ram.ok()) return Fail(kExitBadInput, absl::StrCat("--ram: ", ram.status().message()));
  if (options.context < 1 || options.sessions < 1 || options.max_batch_rows < 1 ||
      !(options.ram_gbps > 0) || !(options.vram_gbps > 0)) {
    return Fail(kExitBadInput,
                "--context, --sessions, --max-batch-rows, --ram-gbps and --vram-gbps must be "
                "positive");
  }
  const absl::StatusOr<ops::KvType> kv_type = ops::ParseKvType(options.kv_type);
  if (!kv_type.ok()) {
    return Fail(kExitBadInput, absl::StrCat("--kv-type: ", kv_type.status().message()));
  }
  auto file = gguf::File::Open(options.model_path, gguf::TensorData::kMayBeAbsent);
  if (!file.ok()) return Fail(kExitBadInput, std::string(file.status().message()));
  auto config = model::ModelConfigFromGguf(**file);
  if (!config.ok()) return Fail(kExitBadInput, std::string(config.status().message()));
  const model::ModelConfig& c = *config;
  const gguf::TensorInfo* embedding = (*file)->FindTensor("token_embd.weight");
  if (embedding == nullptr || embedding->dims.size() != 2) {
    return Fail(kExitBadInput,
                absl::StrCat(options.model_path, ": no 2-D token_embd.weight in the tensor table"));
  }
  offline::OffloadRequest request{
      .config = c,
      .vram_budget_bytes = model::DefaultVramBudget(*card),
      .embedding_device_bytes = model::DeviceEmbeddingBytes(
          embedding->type, embedding->dims[1],
          static_cast<int64_t>(embedding->num_bytes) / std::max<int64_t>(1, embedding->dims[1])),
      .embedding_table_bytes = embedding->num_bytes,
      .context = options.context,
      .sessions = options.sessions,
      .max_batch_rows = options.max_batch_rows,
      .machine = {.ram_bytes_per_second = options.ram_gbps * 1e9,
                  .vram_bytes_per_second = options.vram_gbps * 1e9},
      .ternary = options.ternary,
      .kv_type = *kv_type};

  double linear_weights = 0;
  for (const offline::LinearGroupShape& g : offline::LinearGroupShapes(c)) {
    for (const int64_t rows : g.rows) linear_weights += static_cast<double>(rows) * g.cols;
  }
  std::printf("model: %s, %lld layers, d_model %lld, %lld/%lld heads, vocab %lld",
              c.architecture.c_str(), static_cast<long long>(c.num_layers),
              static_cast<long long>(c.d_model), static_cast<long long>(c.num_heads),
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.vocab_size));
  if (c.has_experts()) {
    std::printf(", %lld experts of %lld (%lld used)", static_cast<long long>(c.num_experts),
                static_cast<long long>(c.d_ff_expert), static_cast<long long>(c.num_experts_used));
  }
  std::printf("; %.2f B linear weights, embedding %s %.2f GiB\n", linear_weights / 1e9,
              GgmlTypeName(embedding->type).data(), GiB(static_cast<double>(embedding->num_bytes)));
  std::printf(
      "machine: %.2f GiB of VRAM (budget %.2f GiB: the CUDA runtime keeps max(512 MiB, 5%%)), "
      "%.2f GiB of RAM for the model\n",
      GiB(static_cast<double>(*card)), GiB(static_cast<double>(request.vram_budget_bytes)),
      GiB(static_cast<double>(*ram)));

  const absl::StatusOr<offline::OffloadPlan> plan = offline::PlanOffload(request);
  if (!plan.ok()) {
    return Fail(
        plan.status().code() == absl::StatusCode::kResourceExhausted ? kExitBadInput : kExitFailure,
        std::string(plan.status().message()));
  }
  const offline::OffloadPlan& p = *plan;
  std::printf("plan: attention%s and head base %s", c.dense_ffn ? ", dense FFN" : "",
              FormatPair(p.attention_base, 64).c_str());
  if (c.has_experts()) std::printf("; experts base %s", FormatPair(p.expert_base, 64).c_str());
  std::printf("\n");
  const model::VramPlan& v = p.vram;
  std::printf(
      "VRAM: base weights %.2f GiB, embedding/norms/tables %.2f GiB%s, KV cache %lld x %.2f GiB "
      "(%lld tokens, %s), scratch %.2f GiB: %.2f of %.2f GiB\n",
      GiB(static_cast<double>(v.base_weights_bytes)),
      GiB(static_cast<double>(v.constants_slab_bytes)),
      v.embedding_bytes > 0 ? " (embedding on the GPU)" : " (embedding in RAM)",
      static_cast<long long>(v.sessions), GiB(static_cast<double>(v.kv_bytes_per_session)),
      static_cast<long long>(v.context), options.kv_type.c_str(),
      GiB(static_cast<double>(v.scratch_slab_bytes)), GiB(static_cast<double>(v.total_bytes)),
      GiB(static_cast<double>(v.budget_bytes)));
  const auto fits = [&](int64_t context, int64_t sessions) {
    offline::OffloadRequest r = request;
    r.context = context;
    r.sessions = sessions;
    return offline::PlanOffloadWith(r, p.attention_base, p.expert_base).ok();
  };
  // Monotone searches; the request fits, so each result is at least what was asked.
  const int64_t sessions =
      model::LargestFitting(1024, [&](int64_t k) { return fits(options.context, k); });
  const int64_t longest =
      model::LargestFitting(std::max(c.context_length, options.context),
                            [&](int64_t n) { return fits(n, options.sessions); });
  std::printf("  fits: %lld session%s of %lld tokens, or %lld session%s of %lld tokens\n",
              static_cast<long long>(sessions), sessions == 1 ? "" : "s",
              static_cast<long long>(options.context), static_cast<long long>(options.sessions),
              options.sessions == 1 ? "" : "s", static_cast<long long>(longest));
  std::printf(
      "RAM: residual %.2f GiB%s: %.2f of %.2f GiB\n", GiB(static_cast<double>(p.residual_bytes)),
      p.host_embedding_bytes > 0 ? absl::StrFormat(" + embedding table %.2f GiB",
                                                   GiB(static_cast<double>(p.host_embedding_bytes)))
                                       .c_str()
                                 : "",
      GiB(static_cast<double>(p.ram_bytes())), GiB(static_cast<double>(*ram)));
  std::printf(
      "speed, projected at %.0f GB/s RAM and %.0f GB/s VRAM (tokens per verify assumed from "
      "SmolLM2's measured acceptance): %.1f tok/s with %s (%.2f tokens per verify, %.2f GiB of "
      "residual + %.2f GiB of base read per verify); %.1f tok/s without speculation\n",
      options.ram_gbps, options.vram_gbps, p.tokens_per_second, p.shape.c_str(), p.tau,
      GiB(p.residual_read_bytes), GiB(p.base_read_bytes), p.tokens_per_second_without_speculation);
  if (p.ram_bytes() > *ram) {
    return Fail(
        kExitBadInput,
        absl::StrFormat("the plan needs %.2f GiB of RAM for the model; --ram gives %.2f GiB",
                        GiB(static_cast<double>(p.ram_bytes())), GiB(static_cast<double>(*ram))));
  }
  return kExitOk;
}

}  // namespace

Command AddPlanCommand(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "where a model would go on a GPU and in RAM, and how fast it would run, before quantizing: "
      "reads only the GGUF's metadata and tensor table");
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("model", options->model_path, "GGUF file (its tensor data may be absent)")
      ->required();
  sub->add_option("--vram", options->vram, "the GPU's memory: BYTES, or N KiB/MiB/GiB")->required();
  sub->add_option("--ram", options->ram, "system RAM the model may take: BYTES, or N KiB/MiB/GiB")
      ->required();
  sub->add_option("--context", options->context, "tokens per session")->capture_default_str();
  sub->add_option("--sessions", options->sessions, "sessions held at once")->capture_default_str();
  sub->add_option("--max-batch-rows", options->max_batch_rows,
                  "rows of the largest forward (drafter --max-batch-rows)")
      ->capture_default_str();
  sub->add_option("--ram-gbps", options->ram_gbps, "RAM bandwidth of the projection, GB/s")
      ->capture_default_str();
  sub->add_option("--vram-gbps", options->vram_gbps, "VRAM bandwidth of the projection, GB/s")
      ->capture_default_str();
  sub->add_option("--kv-type", options->kv_type,
                  "the KV cache's rows on the GPU: f16 or q8_0 (drafter --kv-type)")
      ->capture_default_str();
  sub->add_flag("--ternary,!--no-ternary", options->ternary,
                "consider the ternary base bt_sym (2.0 bits per weight at group 64, a weak draft) "
                "below b2_asym/b3_asym/b4_asym")
      ->capture_default_str();
  return {sub, [options] { return RunPlan(*options); }};
}

}  // namespace bitsplit::cli
