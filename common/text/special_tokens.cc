#include "common/text/special_tokens.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

constexpr int32_t kNoToken = Tokenizer::kNoToken;

}  // namespace

absl::StatusOr<std::unique_ptr<SpecialTokens>> SpecialTokens::Load(
    const gguf::File& file, const Defaults& defaults, std::span<const std::string> tokens,
    std::span<uint32_t> attrs) {
  auto special = std::unique_ptr<SpecialTokens>(new SpecialTokens());
  const int32_t n = static_cast<int32_t>(tokens.size());
  // llama.cpp's defaults, used when the metadata has no id (or an out-of-range one).
  const auto in_range = [n](int32_t id) { return id >= 0 && id < n ? id : kNoToken; };
  special->bos_id_ = in_range(defaults.bos_id);
  special->eos_id_ = in_range(defaults.eos_id);
  special->unk_id_ = in_range(defaults.unk_id);
  int32_t eom_id = kNoToken;
  int32_t fim_pre_id = kNoToken, fim_suf_id = kNoToken, fim_mid_id = kNoToken;
  int32_t fim_pad_id = kNoToken, fim_rep_id = kNoToken, fim_sep_id = kNoToken;
  const std::vector<std::pair<std::string_view, int32_t*>> keys = {
      {"tokenizer.ggml.bos_token_id", &special->bos_id_},
      {"tokenizer.ggml.eos_token_id", &special->eos_id_},
      {"tokenizer.ggml.eot_token_id", &special->eot_id_},
      {"tokenizer.ggml.unknown_token_id", &special->unk_id_},
      {"tokenizer.ggml.eom_token_id", &eom_id},
      {"tokenizer.ggml.fim_pre_token_id", &fim_pre_id},
      {"tokenizer.ggml.fim_suf_token_id", &fim_suf_id},
      {"tokenizer.ggml.fim_mid_token_id", &fim_mid_id},
      {"tokenizer.ggml.fim_pad_token_id", &fim_pad_id},
      {"tokenizer.ggml.fim_rep_token_id", &fim_rep_id},
      {"tokenizer.ggml.fim_sep_token_id", &fim_sep_id},
      {"tokenizer.ggml.prefix_token_id", &fim_pre_id},
      {"tokenizer.ggml.suffix_token_id", &fim_suf_id},
      {"tokenizer.ggml.middle_token_id", &fim_mid_id},
  };
  for (const auto& [key, id] : keys) {
    if (file.Find(key) == nullptr) continue;
    BITSPLIT_ASSIGN_OR_RETURN(const uint64_t value, file.GetUint(key));
    if (value < static_cast<uint64_t>(n)) *id = static_cast<int32_t>(value);
  }

  // Older conversions do not record EOT/FIM ids or mark those tokens as control; llama.cpp
  // recognizes them by their text and forces the control attribute, and so do we (this
  // decides both end-of-generation and special-token splitting).
  struct Detector {
    int32_t* id;
    std::vector<std::string_view> texts;
  };
  const std::vector<Detector> detectors = {
      {&special->eot_id_,
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
        "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}},
      {&eom_id, {"<|eom_id|>"}},
      {&fim_pre_id,
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>"}},
      {&fim_suf_id,
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>"}},
      {&fim_mid_id,
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>"}},
      {&fim_pad_id, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {&fim_rep_id, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&fim_sep_id, {"<|file_sep|>"}},
  };
  for (int32_t id = 0; id < n; ++id) {
    for (const Detector& detector : detectors) {
      if (*detector.id != kNoToken) continue;
      if (std::find(detector.texts.begin(), detector.texts.end(), tokens[id]) !=
          detector.texts.end()) {
        *detector.id = id;
        attrs[id] |= kAttrControl;
      }
    }
  }

  std::vector<int32_t> eog;
  const auto add_eog = [&eog](int32_t id) {
    if (id != kNoToken && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
  };
  add_eog(fim_pad_id);
  add_eog(fim_rep_id);
  add_eog(fim_sep_id);
  static constexpr std::string_view kEogTexts[] = {"<|eot_id|>",
                                                   "<|im_end|>",
                                                   "<|end|>",
                                                   "<|return|>",
                                                   "<|call|>",
                                                   "<|flush|>",
                                                   "<|calls|>",
                                                   "<end_of_turn>",
                                                   "<|endoftext|>",
                                                   "</s>",
                                                   "<|eom_id|>",
                                                   "<EOT>",
                                                   "_<EOT>",
                                                   "[EOT]",
                                                   "[EOS]",
                                                   "<|end_of_text|>",
                                                   "<end_of_utterance>",
                                                   "<eos>",
                                                   "<turn|>",
                                                   "<|tool_response>",
                                                   "<｜end▁of▁sentence｜>",
                                                   "[e~["};
  for (int32_t id = 0; id < n; ++id) {
    if (std::find(std::begin(kEogTexts), std::end(kEogTexts), tokens[id]) != std::end(kEogTexts)) {
      add_eog(id);
      attrs[id] |= kAttrControl;
    }
    // gpt-oss: these structural tokens are always rendered (llama.cpp's override).
    if (tokens[id] == "<|channel|>" || tokens[id] == "<|message|>" || tokens[id] == "<|start|>" ||
        tokens[id] == "<|constrain|>") {
      attrs[id] = kAttrUserDefined;
    }
  }
  add_eog(special->eos_id_);
  add_eog(special->eot_id_);
  add_eog(eom_id);
  // The id of the end-of-generation token with this text, or kNoToken.
  const auto eog_find = [&](std::string_view text) {
    const auto it =
        std::find_if(eog.begin(), eog.end(), [&](int32_t id) { return tokens[id] == text; });
    return it == eog.end() ? kNoToken : *it;
  };
  const auto eog_has = [&](std::string_view text) { return eog_find(text) != kNoToken; };
  // Harmony / solar-open chat formats end a message with <|end|> but keep generating; there the
  // turn ends with <|return|> / <|call|> (or <|calls|> / <|flush|>).
  const int32_t end_id = eog_find("<|end|>");
  if (end_id != kNoToken && ((eog_has("<|return|>") && eog_has("<|call|>")) ||
                             (eog_has("<|calls|>") && eog_has("<|flush|>")))) {
    eog.erase(std::find(eog.begin(), eog.end(), end_id));
    attrs[end_id] = kAttrUserDefined;
  }
  // gemma4 / plamo2 have an ordinary </s>.
  const int32_t s_id = eog_find("</s>");
  if (s_id != kNoToken && (eog_has("<|tool_response>") || eog_has("<|plamo:eos|>"))) {
    eog.erase(std::find(eog.begin(), eog.end(), s_id));
    attrs[s_id] = kAttrNormal;
  }
  std::sort(eog.begin(), eog.end());
  special->eog_set_ = std::unordered_set<int32_t>(eog.begin(), eog.end());
  special->eog_ids_ = std::move(eog);

  for (int32_t id = 0; id < n; ++id) {
    if (attrs[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special->specials_.push_back(
          {id, tokens[id], (attrs[id] & (kAttrControl | kAttrUnknown)) != 0});
    }
  }
  // Longest first, so that a special token containing another one wins.
  std::stable_sort(
      special->specials_.begin(), special->specials_.end(),
      [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });
  return special;
}

std::vector<SpecialTokens::Fragment> SpecialTokens::Partition(std::string_view text,
                                                              bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, text});
  std::vector<Fragment> next;
  for (const Special& special : specials_) {
    // Without parse_special only user-defined tokens are split out (as llama.cpp and HF do).
    if (!parse_special && special.needs_parse_special) continue;
    if (text.find(special.text) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.token != kNoToken) {
        next.push_back(fragment);
        continue;
      }
      std::string_view rest = fragment.text;
      size_t found;
      while ((found = rest.find(special.text)) != std::string_view::npos) {
        if (found > 0) next.push_back({kNoToken, rest.substr(0, found)});
        next.push_back({special.id, rest.substr(found, special.text.size())});
        rest.remove_prefix(found + special.text.size());
      }
      if (!rest.empty()) next.push_back({kNoToken, rest});
    }
    fragments.swap(next);
  }
  return fragments;
}

}  // namespace bitsplit::text
