// speculation_bench: acceptance and speed of speculative decoding on the real model, in process
// (common/speculation/session.h, the code the drafter service runs), over a committed prompt set.
//
//   speculation_bench --split PREFIX[=LABEL] [--split ...] [--q2k DRAFT.gguf]
//                     [--prompts bench/prompts/prompts.jsonl] [--tokens 32] [--threads 2]
//                     [--json OUT.json] [--deep-tree] [--no-own-kv]
//
// For every split model (the verifier = base + residual, computed in process): plain decoding
// (`off`, the verifier alone, one token per step) and speculation with a 16-node tree (k = 4,
// depth <= 8), an 8-token chain and with --deep-tree a 64-node tree (k = 8, depth <= 12), drafted
// by
//   * the model's own base weights reading the verifier's KV (the design),
//   * the base computing its own KV for the prefix (ablation: what KV sharing buys),
//   * llama.cpp's Q2_K quantization of the same source model (--q2k; ablation: what our 2-bit
//     base buys), reading the verifier's KV.
// Every run is greedy, stops at the model's end-of-generation token or after --tokens tokens, and
// is checked to emit exactly the tokens of `off` (the losslessness invariant). Speed is decode
// wall time (prefill excluded) measured side by side in this run; the floor is the bytes one
// verify step reads (base + residual) over the streaming-read bandwidth measured here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/read_bandwidth.h"
#include "common/model/llama_model.h"
#include "common/offline/split_quantizer.h"
#include "common/speculation/cpu_session.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace bitsplit {
namespace {

using model::ForwardMode;
using model::LlamaModel;
using speculation::CpuSpeculativeSession;
using speculation::DraftKv;
using speculation::TreeShape;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "speculation_bench: error: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) Die(std::string(value.status().message()));
  return *std::move(value);
}

void OrDie(const absl::Status& status) {
  if (!status.ok()) Die(std::string(status.message()));
}

constexpr int kMaxDepth = 8;

struct Totals {
  int64_t steps = 0;
  int64_t tokens = 0;  // emitted, up to EOS or the limit
  int64_t walked = 0;  // tokens the verify steps produced (accepted + bonus), EOS included
  double decode_seconds = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  // Conditional acceptance per depth d (index d - 1): accepted[d] / offered[d], where offered
  // counts steps whose walk reached depth d - 1 in a tree that had a node at depth d.
  std::vector<int64_t> offered = std::vector<int64_t>(kMaxDepth, 0);
  std::vector<int64_t> accepted = std::vector<int64_t>(kMaxDepth, 0);
};

struct Draft {
  std::string label;  // "base (shared KV)"
  LlamaModel* model;
  ForwardMode mode;
  DraftKv kv;
};

// Generates greedily from `prompt` until EOS or `max_tokens`; returns the emitted tokens.
std::vector<int32_t> Generate(LlamaModel& target, const Draft& draft, const TreeShape& shape,
                              const std::vector<int32_t>& prompt, int max_tokens,
                              const text::Tokenizer& tokenizer, Totals& totals) {
  auto session = OrDie(CpuSpeculativeSession::Create(
      target, ForwardMode::kVerify, *draft.model, draft.mode,
      {.capacity = static_cast<int64_t>(prompt.size()) + max_tokens + 80, .draft_kv = draft.kv}));
  const std::span<const int32_t> all(prompt);
  OrDie(speculation::PrefillInChunks(*session, all.first(all.size() - 1), 64));
  int32_t root = prompt.back();
  std::vector<int32_t> out;
  const Clock::time_point start = Clock::now();
  bool done = false;
  while (!done) {
    speculation::SessionStep step{.root = root, .shape = shape};
    OrDie(session->Step(step));
    const speculation::DraftTree& tree = step.tree;
    const speculation::WalkResult& walk = step.walk;
    totals.draft_seconds += step.draft_ns * 1e-9;
    totals.verify_seconds += step.verify_ns * 1e-9;
    ++totals.steps;
    totals.walked += static_cast<int64_t>(walk.tokens.size());
    const std::vector<int32_t> depths = speculation::TreeDepths(tree.parents);
    const int tree_depth = *std::max_element(depths.begin(), depths.end());
    const int reached = static_cast<int>(walk.path.size()) - 1;
    for (int d = 1; d <= std::min(tree_depth, kMaxDepth); ++d) {
      if (reached >= d - 1) ++totals.offered[static_cast<size_t>(d - 1)];
      if (reached >= d) ++totals.accepted[static_cast<size_t>(d - 1)];
    }
    for (int32_t token : walk.tokens) {
      if (tokenizer.IsEndOfGeneration(token) || static_cast<int>(out.size()) == max_tokens) {
        done = true;
        break;
      }
      out.push_back(token);
    }
    root = walk.tokens.back();
  }
  totals.decode_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  totals.tokens += static_cast<int64_t>(out.size());
  return out;
}

struct Prompt {
  std::string id;
  std::vector<int32_t> tokens;
};

std::vector<Prompt> LoadPrompts(const std::string& path, const LlamaModel& model) {
  const auto tokenizer = OrDie(text::Tokenizer::FromGguf(model.gguf_metadata()));
  // A pretrained GGUF without a template (gemma-3-270m) gets its family's format, as the
  // coordinator does.
  const text::ChatTemplate::Choice choice =
      OrDie(text::ChatTemplate::FromGgufOrArchitecture(model.gguf_metadata(), *tokenizer));
  if (choice.from_architecture) std::fprintf(stderr, "%s\n", choice.note.c_str());
  const text::ChatTemplate& chat = choice.chat_template;
  std::ifstream in(path);
  if (!in) Die("cannot read " + path);
  std::vector<Prompt> prompts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string id = j.value("id", std::to_string(prompts.size()));
    const std::string text = j.at("prompt").get<std::string>();
    // bench/prompts/README.md: code and prose are continued as raw text, the rest is a chat
    // message (as `bitsplit generate --prompt` / `--chat` would feed them).
    const bool raw = id.rfind("code-", 0) == 0 || id.rfind("prose-", 0) == 0;
    const text::ChatMessage message{.role = "user", .content = text};
    std::vector<int32_t> tokens =
        raw ? tokenizer->Encode(text, /*parse_special=*/false)
            : tokenizer->Encode(OrDie(chat.Render(std::span(&message, 1), true)),
                                /*parse_special=*/true);
    if (tokenizer->add_bos() && tokenizer->bos_id() >= 0) {
      tokens.insert(tokens.begin(), tokenizer->bos_id());
    }
    prompts.push_back({id, std::move(tokens)});
  }
  if (prompts.empty()) Die(path + " holds no prompts");
  return prompts;
}

std::string ShapeName(const TreeShape& shape) {
  if (shape.nodes == 0) return "off";
  if (shape.expansions == 1) return "chain " + std::to_string(shape.nodes);
  return "tree N=" + std::to_string(shape.nodes) + " k=" + std::to_string(shape.expansions);
}

int Run(int argc, char** argv) {
  CLI::App app{"speculation_bench: acceptance and speed of speculative decoding, in process"};
  std::vector<std::string> splits;
  std::string q2k_path, json_path;
  bool deep_tree = false, no_own_kv = false;
  std::string prompts_path = std::string(BITSPLIT_SOURCE_DIR) + "/bench/prompts/prompts.jsonl";
  int tokens = 32, threads = 2, max_prompts = 0;
  app.add_option("--split", splits, "split model PREFIX[=LABEL] (verifier in process)")->required();
  app.add_option("--q2k", q2k_path, "llama.cpp Q2_K GGUF of the same source (draft ablation)");
  app.add_option("--prompts", prompts_path, "JSONL prompt set")->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per prompt (greedy; EOS ends earlier)")
      ->capture_default_str();
  app.add_option("--max-prompts", max_prompts, "use the first N prompts (0 = all)");
  app.add_option("--threads", threads, "engine threads")->capture_default_str();
  app.add_option("--json", json_path, "write the rows as JSON here");
  app.add_flag("--deep-tree", deep_tree, "also a 64-node tree (k = 8, depth <= 12)");
  app.add_flag("--no-own-kv", no_own_kv, "skip the own-KV draft ablation");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<LlamaModel> q2k;
  if (!q2k_path.empty()) q2k = OrDie(LlamaModel::Load(q2k_path, threads));
  nlohmann::json rows = nlohmann::json::array();
  ThreadPool pool(threads);
  const double bandwidth = bench::MeasureReadBandwidth(pool, /*repetitions=*/8);
  std::printf("streaming-read bandwidth BW = %.1f GB/s (%d threads)\n\n", bandwidth / 1e9, threads);

  for (const std::string& spec : splits) {
    const size_t eq = spec.find('=');
    const std::string prefix = spec.substr(0, eq);
    const std::string label = eq == std::string::npos ? prefix : spec.substr(eq + 1);
    auto target = OrDie(LlamaModel::LoadSplit(model::SplitBasePath(prefix),
                                              model::SplitResidualPath(prefix), threads));
    std::vector<Prompt> prompts = LoadPrompts(prompts_path, *target);
    if (max_prompts > 0 && static_cast<int>(prompts.size()) > max_prompts) {
      prompts.resize(static_cast<size_t>(max_prompts));
    }
    const auto tokenizer = OrDie(text::Tokenizer::FromGguf(target->gguf_metadata()));
    // One verify step streams every linear weight, base and residual; the embedding table is
    // only gathered from, and norms are noise.
    uint64_t step_bytes = 0;
    for (const SplitFile* file :
         {&target->split_files()->base(), target->split_files()->residual()}) {
      for (const SplitTensor& tensor : file->tensors()) {
        if (IsSplitTensorFormat(tensor.format)) step_bytes += tensor.num_bytes;
      }
    }
    const double floor_tps = bandwidth / static_cast<double>(step_bytes);
    std::printf("## %s: %s, %zu prompts x <= %d tokens (greedy)\n", label.c_str(),
                model::SplitQuantizationString(target->split_files()->quantization()).c_str(),
                prompts.size(), tokens);
    std::printf("verify step reads %.1f MB (base + residual): floor %.1f verify steps/s\n\n",
                step_bytes / 1e6, floor_tps);
    std::printf(
        "| draft | shape | tokens/verify | acceptance by depth 1..8 | draft ms/step | verify "
        "ms/step | tok/s | vs off |\n|---|---|---|---|---|---|---|---|\n");

    // off first: its tokens are the reference every speculative run must reproduce.
    std::vector<std::vector<int32_t>> reference;
    Totals off;
    const Draft none{"-", target.get(), ForwardMode::kDraft, DraftKv::kShared};
    const TreeShape off_shape{.nodes = 0, .expansions = 1, .max_depth = 1};
    for (const Prompt& p : prompts) {
      reference.push_back(Generate(*target, none, off_shape, p.tokens, tokens, *tokenizer, off));
    }
    const double off_tps = off.tokens / off.decode_seconds;
    auto report = [&](const std::string& draft_label, const TreeShape& shape, const Totals& t) {
      std::string depth_cells;
      nlohmann::json by_depth = nlohmann::json::array();
      for (int d = 0; d < kMaxDepth; ++d) {
        if (t.offered[static_cast<size_t>(d)] == 0) break;
        const double rate = static_cast<double>(t.accepted[static_cast<size_t>(d)]) /
                            static_cast<double>(t.offered[static_cast<size_t>(d)]);
        char cell[16];
        std::snprintf(cell, sizeof(cell), "%s%.2f", d == 0 ? "" : " ", rate);
        depth_cells += cell;
        by_depth.push_back(rate);
      }
      const double tps = t.tokens / t.decode_seconds;
      std::printf("| %s | %s | %.2f | %s | %.1f | %.1f | %.1f | %.2fx |\n", draft_label.c_str(),
                  ShapeName(shape).c_str(), static_cast<double>(t.walked) / t.steps,
                  depth_cells.empty() ? "-" : depth_cells.c_str(), t.draft_seconds * 1e3 / t.steps,
                  t.verify_seconds * 1e3 / t.steps, tps, tps / off_tps);
      std::fflush(stdout);
      rows.push_back({{"model", label},
                      {"draft", draft_label},
                      {"shape", ShapeName(shape)},
                      {"tokens", t.tokens},
                      {"verify_steps", t.steps},
                      {"tokens_per_verify", static_cast<double>(t.walked) / t.steps},
                      {"acceptance_by_depth", by_depth},
                      {"draft_ms_per_step", t.draft_seconds * 1e3 / t.steps},
                      {"verify_ms_per_step", t.verify_seconds * 1e3 / t.steps},
                      {"tokens_per_second", tps},
                      {"vs_off", tps / off_tps},
                      {"floor_verify_steps_per_second", floor_tps},
                      {"bandwidth_gbps", bandwidth / 1e9}});
    };
    report("- (verifier alone)", off_shape, off);

    std::vector<Draft> drafts = {
        {"base, shared KV", target.get(), ForwardMode::kDraft, DraftKv::kShared}};
    if (!no_own_kv) {
      drafts.push_back({"base, own KV", target.get(), ForwardMode::kDraft, DraftKv::kOwn});
    }
    std::vector<TreeShape> shapes = {TreeShape{.nodes = 16, .expansions = 4, .max_depth = 8},
                                     TreeShape{.nodes = 8, .expansions = 1, .max_depth = 8}};
    if (deep_tree) shapes.push_back(TreeShape{.nodes = 64, .expansions = 8, .max_depth = 12});
    if (q2k != nullptr) {
      drafts.push_back(
          {"llama.cpp Q2_K, shared KV", q2k.get(), ForwardMode::kReference, DraftKv::kShared});
    }
    for (const Draft& draft : drafts) {
      for (const TreeShape& shape : shapes) {
        Totals t;
        for (size_t i = 0; i < prompts.size(); ++i) {
          const std::vector<int32_t> out =
              Generate(*target, draft, shape, prompts[i].tokens, tokens, *tokenizer, t);
          if (out != reference[i]) {
            Die("LOSSLESSNESS VIOLATED: " + draft.label + " " + ShapeName(shape) + " on prompt " +
                prompts[i].id + " differs from plain decoding");
          }
        }
        report(draft.label, shape, t);
      }
    }
    std::printf("\n");
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << rows.dump(1) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace bitsplit

int main(int argc, char** argv) { return bitsplit::Run(argc, argv); }
