#pragma once
// The merge loop that byte-level BPE and SentencePiece share (llama.cpp's
// llm_tokenizer_bpe_session and llm_tokenizer_spm_session differ only in how a pair is ranked).
// Internal to common/text.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <type_traits>
#include <vector>

namespace bitsplit::text {

// The length of the UTF-8 sequence that `lead` starts, from its top four bits only (llama.cpp's
// unicode_len_utf8): a continuation byte counts as a character of its own.
inline size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr std::array<size_t, 16> kLengths = {1, 1, 1, 1, 1, 1, 1, 1,
                                                      1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

// Starts from the UTF-8 characters of `text` (lead-byte lengths, no validation, the last one cut
// at the end of the text) and repeatedly merges the adjacent pair of symbols with the lowest
// priority, the leftmost of equal ones first. `priority(left, right)` gives a pair's priority, or
// std::nullopt for a pair that never merges. Returns the symbols that are left, in order.
template <typename PriorityFn>
std::vector<std::string_view> MergeBigrams(std::string_view text, PriorityFn priority) {
  using Priority =
      typename std::invoke_result_t<PriorityFn, std::string_view, std::string_view>::value_type;
  struct Symbol {
    int prev;
    int next;
    size_t begin;
    size_t length;  // 0 once merged into its left neighbour
  };
  struct Bigram {
    int left;
    int right;
    Priority priority;
    size_t length;  // combined length when queued
  };
  struct LaterFirst {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return b.priority < a.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t length =
        std::min(text.size() - offset, Utf8SequenceLength(static_cast<uint8_t>(text[offset])));
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, offset + length == text.size() ? -1 : index + 1, offset, length});
    offset += length;
  }
  const auto symbol_text = [&](int i) { return text.substr(symbols[i].begin, symbols[i].length); };
  std::priority_queue<Bigram, std::vector<Bigram>, LaterFirst> queue;
  const auto try_queue = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::optional<Priority> rank = priority(symbol_text(left), symbol_text(right));
    if (!rank.has_value()) return;
    queue.push({left, right, *rank, symbols[left].length + symbols[right].length});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_queue(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Symbols only grow, so unchanged lengths mean the pair is still the one that was queued.
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_queue(left.prev, bigram.left);
    try_queue(bigram.left, left.next);
  }

  std::vector<std::string_view> merged;
  for (int i = 0; i < static_cast<int>(symbols.size()); ++i) {
    if (symbols[i].length > 0) merged.push_back(symbol_text(i));
  }
  return merged;
}

}  // namespace bitsplit::text
