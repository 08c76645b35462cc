#include "common/text/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text/bigram_merge.h"
#include "common/text/sentencepiece.h"
#include "common/util/status_macros.h"

namespace bitsplit::text {
namespace {

// UTF-8 helpers that mirror llama.cpp's unicode.cpp, so that odd input tokenizes identically.

constexpr uint32_t kReplacementChar = 0xFFFD;

// Decodes the code point at `pos` and advances past it. Like llama.cpp's unicode_cpt_from_utf8
// this checks continuation bytes but not overlong forms or surrogates; a bad sequence yields
// U+FFFD and skips one byte. Values above U+10FFFF (which llama.cpp cannot re-encode and throws
// on) are treated as a bad sequence too.
uint32_t DecodeLenient(std::string_view s, size_t& pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const auto continuation = [&](size_t i) { return i < s.size() && (at(i) & 0xC0) == 0x80; };
  const uint8_t lead = at(pos);
  uint32_t cp;
  size_t length;
  if (!(lead & 0x80)) {
    cp = lead;
    length = 1;
  } else if (!(lead & 0x40)) {
    ++pos;
    return kReplacementChar;
  } else if (!(lead & 0x20)) {
    if (!continuation(pos + 1)) {
      ++pos;
      return kReplacementChar;
    }
    cp = ((lead & 0x1F) << 6) | (at(pos + 1) & 0x3F);
    length = 2;
  } else if (!(lead & 0x10)) {
    if (!continuation(pos + 1) || !continuation(pos + 2)) {
      ++pos;
      return kReplacementChar;
    }
    cp = ((lead & 0x0F) << 12) | ((at(pos + 1) & 0x3F) << 6) | (at(pos + 2) & 0x3F);
    length = 3;
  } else if (!(lead & 0x08)) {
    if (!continuation(pos + 1) || !continuation(pos + 2) || !continuation(pos + 3)) {
      ++pos;
      return kReplacementChar;
    }
    cp = ((lead & 0x07) << 18) | ((at(pos + 1) & 0x3F) << 12) | ((at(pos + 2) & 0x3F) << 6) |
         (at(pos + 3) & 0x3F);
    length = 4;
    if (cp > 0x10FFFF) {
      ++pos;
      return kReplacementChar;
    }
  } else {
    ++pos;
    return kReplacementChar;
  }
  pos += length;
  return cp;
}

// Plain UTF-8 encoding (surrogates included, as llama.cpp's unicode_cpt_to_utf8 does).
void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp <= 0x7F) {
    out.push_back(static_cast<char>(cp));
  } else if (cp <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// llama.cpp decodes text to code points and re-encodes every pre-tokenized word, so what BPE
// sees is the re-encoded text (`canonical`). PCRE2 needs strictly valid UTF-8, so `for_regex`
// is the same text with surrogates (which the lenient decoder lets through) replaced by U+FFFF:
// same byte length, and like a surrogate it is neither letter, number nor space.
void Canonicalize(std::string_view text, std::string& canonical, std::string& for_regex) {
  canonical.clear();
  for_regex.clear();
  canonical.reserve(text.size());
  for_regex.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = DecodeLenient(text, pos);
    AppendUtf8(cp, canonical);
    AppendUtf8(cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFF : cp, for_regex);
  }
}

// GPT-2's reversible byte <-> printable code point mapping: printable Latin-1 bytes map to
// themselves, the rest to U+0100 onwards in byte order.
struct ByteMapping {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 0x144> codepoint_to_byte;

  ByteMapping() {
    codepoint_to_byte.fill(-1);
    int next = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable =
          (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      const uint32_t cp = printable ? byte : next++;
      AppendUtf8(cp, byte_to_utf8[byte]);
      codepoint_to_byte[cp] = static_cast<int16_t>(byte);
    }
  }
};

const ByteMapping& Bytes() {
  static const ByteMapping* const mapping = new ByteMapping();
  return *mapping;
}

// Pre-tokenizer patterns. llama.cpp runs a list of regexes in sequence: each one cuts every
// piece left by the previous one into its matches and the unmatched gaps between them. For
// the GPT-2 and Llama-3 patterns llama.cpp uses hand-written matchers whose \s is the Unicode
// White_Space set (it includes U+0085, which PCRE2's \s does not), so the patterns below spell
// that set out. Each regex only ever sees its own piece, so a lookahead at a piece's end sees
// end-of-text, as in llama.cpp.

#define BITSPLIT_WS                                                                           \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
  "\\x{205F}\\x{3000}"
// Letters and numbers assigned in Unicode 15.0/15.1, which llama.cpp's tables have and PCRE2
// builds before 10.43 (Unicode 14) do not: without them CJK Ext H/I, Kawi, Nag Mundari, ...
// would count as punctuation-like "other" characters. The union is harmless once PCRE2 knows
// them. (Generated by comparing llama.cpp's unicode-data.cpp with PCRE2 10.42 over all code
// points; no other letter/number/space differences exist.)
#define BITSPLIT_LETTER                                                                       \
  "\\p{L}\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}" \
  "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}"       \
  "\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define BITSPLIT_NUMBER "\\p{N}\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define BITSPLIT_PUNCT "\\p{P}\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}"

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?[" BITSPLIT_LETTER "]+| ?[" BITSPLIT_NUMBER
    "]+| ?[^" BITSPLIT_WS BITSPLIT_LETTER BITSPLIT_NUMBER "]+|[" BITSPLIT_WS "]+(?![^" BITSPLIT_WS
    "])|[" BITSPLIT_WS "]+";

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+   (ASCII-only case folding, as llama.cpp's adaptation)
constexpr const char* kLlama3Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n" BITSPLIT_LETTER
        BITSPLIT_NUMBER "]?[" BITSPLIT_LETTER "]+|[" BITSPLIT_NUMBER
    "]{1,3}| ?[^" BITSPLIT_WS BITSPLIT_LETTER BITSPLIT_NUMBER "]+[\\r\\n]*|[" BITSPLIT_WS
    "]*[\\r\\n]+|[" BITSPLIT_WS "]+(?![^" BITSPLIT_WS "])|[" BITSPLIT_WS "]+";

// Qwen2: Llama-3's pattern with single digits (\p{N} instead of \p{N}{1,3}); llama.cpp's
// hand-written matcher for it is its Llama-3 matcher with that one change.
constexpr const char* kQwen2Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n" BITSPLIT_LETTER
        BITSPLIT_NUMBER "]?[" BITSPLIT_LETTER "]+|[" BITSPLIT_NUMBER
    "]| ?[^" BITSPLIT_WS BITSPLIT_LETTER BITSPLIT_NUMBER "]+[\\r\\n]*|[" BITSPLIT_WS
    "]*[\\r\\n]+|[" BITSPLIT_WS "]+(?![^" BITSPLIT_WS "])|[" BITSPLIT_WS "]+";

// GPT-4o (o200k: gpt-oss, Llama 4), as llama.cpp runs it: tokenizer.json's
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?|...
// with its cased letter classes rewritten as letters that are not a-z, then letters that are not
// A-Z (llama.cpp's regex has no case categories: every letter outside ASCII is both):
// [^\r\n\p{L}\p{N}]?((?=\p{L})[^a-z])*((?=\p{L})[^A-Z])+('s|'t|'re|'ve|'m|'ll|'d)?|
// [^\r\n\p{L}\p{N}]?((?=\p{L})[^a-z])+((?=\p{L})[^A-Z])*('s|'t|'re|'ve|'m|'ll|'d)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+   (contractions in ASCII case)
#define BITSPLIT_CONTRACTION "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
#define BITSPLIT_NOT_LOWER "(?:(?=[" BITSPLIT_LETTER "])[^a-z])"
#define BITSPLIT_NOT_UPPER "(?:(?=[" BITSPLIT_LETTER "])[^A-Z])"
constexpr const char* kGpt4oPattern =
    "[^\\r\\n" BITSPLIT_LETTER BITSPLIT_NUMBER "]?" BITSPLIT_NOT_LOWER "*" BITSPLIT_NOT_UPPER
    "+" BITSPLIT_CONTRACTION "|[^\\r\\n" BITSPLIT_LETTER BITSPLIT_NUMBER "]?" BITSPLIT_NOT_LOWER
    "+" BITSPLIT_NOT_UPPER "*" BITSPLIT_CONTRACTION "|[" BITSPLIT_NUMBER
    "]{1,3}| ?[^" BITSPLIT_WS BITSPLIT_LETTER BITSPLIT_NUMBER "]+[\\r\\n/]*|[" BITSPLIT_WS
    "]*[\\r\\n]+|[" BITSPLIT_WS "]+(?![^" BITSPLIT_WS "])|[" BITSPLIT_WS "]+";
#undef BITSPLIT_NOT_UPPER
#undef BITSPLIT_NOT_LOWER
#undef BITSPLIT_CONTRACTION

constexpr const char* kDigitPattern = "[" BITSPLIT_NUMBER "]";
// Runs of newlines and runs of anything else (llama.cpp's custom newline splitter, which this
// pattern selects, cuts the same runs).
constexpr const char* kNewlineRunPattern = "[^\\n]+|[\\n]+";
constexpr const char* kDigitRunPattern = "[" BITSPLIT_NUMBER "]+";
constexpr const char* kPunctuationRunPattern = "[" BITSPLIT_PUNCT "$+<=>^~|]+";

#undef BITSPLIT_PUNCT
#undef BITSPLIT_NUMBER
#undef BITSPLIT_LETTER
#undef BITSPLIT_WS

// One of llama.cpp's BPE pre-tokenizers (llama_vocab::impl::load: the tokenizer.ggml.pre names
// that select it and the flags it sets).
struct PreTokenizerSpec {
  std::vector<std::string_view> names;
  std::vector<std::string_view> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
  bool force_add_bos = false;
  bool clean_spaces = true;  // llama.cpp's default for BPE
  // SentencePiece-style vocabularies: spaces escaped to U+2581, no GPT-2 byte mapping, "<0xNN>"
  // byte fallback, and a newline-only word taken whole (llama.cpp's GEMMA4 pre-tokenizer type).
  bool sentencepiece_spelling = false;
};

const std::vector<PreTokenizerSpec>& PreTokenizerSpecs() {
  static const auto* const specs = new std::vector<PreTokenizerSpec>{
      {.names = {"default"},
       .patterns = {kPunctuationRunPattern, kGpt2Pattern, kDigitRunPattern, "[0-9][0-9][0-9]"}},
      // llama.cpp calls it "gpt-2"; "gpt2" is accepted as the same thing.
      {.names = {"gpt-2", "gpt2"}, .patterns = {kGpt2Pattern}},
      {.names = {"llama3", "llama-v3", "llama-bpe"},
       .patterns = {kLlama3Pattern},
       .ignore_merges = true,
       .add_bos = true},
      {.names = {"qwen2", "deepseek-r1-qwen"}, .patterns = {kQwen2Pattern}, .clean_spaces = false},
      {.names = {"gpt-4o", "llama4", "kanana2", "talkie"},
       .patterns = {kGpt4oPattern},
       .clean_spaces = false},
      // Digits are split one by one before the GPT-2 pattern.
      {.names = {"smollm"}, .patterns = {kDigitPattern, kGpt2Pattern}, .clean_spaces = false},
      {.names = {"starcoder", "refact", "codeshell"}, .patterns = {kDigitPattern, kGpt2Pattern}},
      // The merges run over whole lines. llama.cpp forces this pre-tokenizer for
      // tokenizer.ggml.model "gemma4" and always adds BOS for it.
      {.names = {"gemma4", "granite-embed-multi-311m"},
       .patterns = {kNewlineRunPattern},
       .force_add_bos = true,
       .sentencepiece_spelling = true},
  };
  return *specs;
}

}  // namespace

class BpeEncoder::PreTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      const std::vector<std::string_view>& patterns) {
    auto result = std::unique_ptr<PreTokenizer>(new PreTokenizer());
    for (std::string_view pattern : patterns) {
      int error = 0;
      PCRE2_SIZE error_offset = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
      if (code == nullptr) {
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(error, message.data(), message.size());
        return absl::InternalError(
            absl::StrFormat("pre-tokenizer regex does not compile at offset %d: %s", error_offset,
                            reinterpret_cast<const char*>(message.data())));
      }
      // JIT is a pure speed-up; without it (unsupported build) the interpreter gives the same
      // matches.
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
      result->stages_.push_back(code);
    }
    return result;
  }

  ~PreTokenizer() {
    for (pcre2_code* code : stages_) pcre2_code_free(code);
  }

  // Cuts valid UTF-8 `text` into words, as [begin, end) byte ranges in order.
  std::vector<std::pair<size_t, size_t>> Split(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> pieces;
    if (text.empty()) return pieces;
    pieces.emplace_back(0, text.size());
    std::vector<std::pair<size_t, size_t>> next;
    for (pcre2_code* code : stages_) {
      pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
      BITSPLIT_CHECK(match != nullptr);
      next.clear();
      for (const auto& [begin, end] : pieces) SplitPiece(code, match, text, begin, end, next);
      pcre2_match_data_free(match);
      pieces.swap(next);
    }
    return pieces;
  }

 private:
  PreTokenizer() = default;

  static void SplitPiece(pcre2_code* code, pcre2_match_data* match, std::string_view text,
                         size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
    const size_t length = end - begin;
    size_t offset = 0;
    while (offset < length) {
      int rc = pcre2_match(code, subject, length, offset, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        // A resource limit (JIT stack, match limit) rather than an answer: retry with the
        // interpreter, which keeps its backtracking state on the heap.
        rc = pcre2_match(code, subject, length, offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match,
                         nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one unmatched piece
      // Still failing: give the next character a piece of its own instead of guessing.
      if (rc < 0) {
        const size_t next = offset + Utf8SequenceLength(static_cast<uint8_t>(subject[offset]));
        out.emplace_back(begin + offset, begin + next);
        offset = next;
        continue;
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t match_begin = ovector[0];
      size_t match_end = ovector[1];
      if (match_end == match_begin) {
        // None of our patterns can match empty; step over a character to be safe anyway.
        if (match_begin >= length) break;
        match_end = match_begin + Utf8SequenceLength(static_cast<uint8_t>(subject[match_begin]));
      }
      if (match_begin > offset) out.emplace_back(begin + offset, begin + match_begin);
      out.emplace_back(begin + match_begin, begin + match_end);
      offset = match_end;
    }
    if (offset < length) out.emplace_back(begin + offset, end);
  }

  std::vector<pcre2_code*> stages_;
};

absl::StatusOr<std::unique_ptr<BpeEncoder>> BpeEncoder::Create(
    const gguf::File& file, std::string_view pre_name,
    const std::unordered_map<std::string_view, int32_t>& token_ids) {
  const std::string& where = file.name();
  const PreTokenizerSpec* spec = nullptr;
  std::string known_names;
  for (const PreTokenizerSpec& candidate : PreTokenizerSpecs()) {
    for (std::string_view name : candidate.names) {
      if (!known_names.empty()) known_names += ", ";
      known_names += name;
      if (name == pre_name) spec = &candidate;
    }
  }
  if (spec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: unknown pre-tokenizer tokenizer.ggml.pre = '%s' (supported: %s)",
                        where, pre_name, known_names));
  }
  auto encoder = std::unique_ptr<BpeEncoder>(new BpeEncoder(token_ids));
  BITSPLIT_ASSIGN_OR_RETURN(encoder->pre_tokenizer_, PreTokenizer::Create(spec->patterns));
  encoder->ignore_merges_ = spec->ignore_merges;
  encoder->add_bos_ = spec->add_bos || spec->force_add_bos;
  encoder->force_add_bos_ = spec->force_add_bos;
  encoder->clean_spaces_ = spec->clean_spaces;
  encoder->escape_whitespace_ = spec->sentencepiece_spelling;
  encoder->byte_encode_ = !spec->sentencepiece_spelling;
  encoder->whole_newline_words_ = spec->sentencepiece_spelling;

  BITSPLIT_ASSIGN_OR_RETURN(const std::vector<std::string> merges,
                            file.GetStringArray("tokenizer.ggml.merges"));
  encoder->merge_ranks_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // Split at the first space after the first byte, like llama.cpp; the first rank of a
    // repeated pair wins.
    const std::string& merge = merges[rank];
    const size_t space = merge.find(' ', 1);
    std::string key = space == std::string::npos ? " " : merge;
    encoder->merge_ranks_.emplace(std::move(key), static_cast<int>(rank));
  }
  return encoder;
}

BpeEncoder::BpeEncoder(const std::unordered_map<std::string_view, int32_t>& token_ids)
    : token_ids_(token_ids) {}

BpeEncoder::~BpeEncoder() = default;

void BpeEncoder::Encode(std::string_view text, std::vector<int32_t>& out) const {
  // Escaped before the UTF-8 is checked, as llama.cpp does (a space is never part of a
  // multi-byte sequence, so the order changes nothing).
  const std::string escaped = escape_whitespace_ ? EscapeWhitespace(text) : std::string();
  if (escape_whitespace_) text = escaped;
  std::string canonical;
  std::string for_regex;
  Canonicalize(text, canonical, for_regex);
  for (const auto& [begin, end] : pre_tokenizer_->Split(for_regex)) {
    EncodeWord(std::string_view(canonical).substr(begin, end - begin), out);
  }
}

void BpeEncoder::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  static constexpr size_t kMaxCachedWords = 1 << 16;
  // Words are short but for gemma4's, which are whole lines: caching those could hold on to
  // gigabytes of prompts, and a line rarely repeats.
  static constexpr size_t kMaxCachedWordBytes = 256;
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = word_cache_.find(std::string(word));
    if (it != word_cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::string encoded;
  if (byte_encode_) {
    encoded.reserve(word.size() * 2);
    for (char byte : word) encoded += Bytes().byte_to_utf8[static_cast<uint8_t>(byte)];
  } else {
    encoded = word;
  }
  std::vector<int32_t> ids;
  const auto whole = token_ids_.find(encoded);
  const bool take_whole =
      whole != token_ids_.end() &&
      (ignore_merges_ ||
       (whole_newline_words_ && encoded.find_first_not_of('\n') == std::string::npos));
  if (take_whole) {
    ids.push_back(whole->second);
  } else {
    ids = BytePairMerge(encoded);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (!cacheable) return;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (word_cache_.size() >= kMaxCachedWords) word_cache_.clear();
  word_cache_.emplace(word, std::move(ids));
}

int BpeEncoder::MergeRank(std::string_view left, std::string_view right) const {
  std::string key;
  key.reserve(left.size() + 1 + right.size());
  key.append(left).append(1, ' ').append(right);
  const auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

std::vector<int32_t> BpeEncoder::BytePairMerge(std::string_view word) const {
  // llama.cpp's llm_tokenizer_bpe_session: the pair with the lowest merge rank merges first.
  const auto rank = [this](std::string_view left, std::string_view right) -> std::optional<int> {
    const int merge_rank = MergeRank(left, right);
    if (merge_rank < 0) return std::nullopt;
    return merge_rank;
  };
  std::vector<int32_t> ids;
  for (std::string_view symbol : MergeBigrams(word, rank)) {
    const auto it = token_ids_.find(symbol);
    if (it != token_ids_.end()) {
      ids.push_back(it->second);
      continue;
    }
    // No such token: each byte of its text becomes the token of that one byte, or its "<0xNN>"
    // token without the byte mapping, where the vocabulary has it (as llama.cpp does).
    for (char byte : symbol) {
      const auto byte_token = byte_encode_
                                  ? token_ids_.find(std::string_view(&byte, 1))
                                  : token_ids_.find(ByteTokenText(static_cast<uint8_t>(byte)));
      if (byte_token != token_ids_.end()) ids.push_back(byte_token->second);
    }
  }
  return ids;
}

std::string DecodeByteLevel(std::string_view token_text) {
  std::string out;
  size_t pos = 0;
  while (pos < token_text.size()) {
    const uint32_t cp = DecodeLenient(token_text, pos);
    const ByteMapping& bytes = Bytes();
    if (cp < bytes.codepoint_to_byte.size() && bytes.codepoint_to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(bytes.codepoint_to_byte[cp]));
      continue;
    }
    std::string utf8;
    AppendUtf8(cp, utf8);
    absl::StrAppend(&out, "[UNK_BYTE_0x");
    for (char c : utf8) absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(c));
    out.append(token_text).append("]");
  }
  return out;
}

void CleanSpaces(std::string& text) {
  const auto pass = [&text](auto&& step) {
    const size_t length = text.size();
    size_t total = length > 0 ? 1 : 0;
    for (size_t i = 1; i < length; ++i) step(i, total);
    text.resize(total);
  };
  // " ?", " !", " .", " ," lose the space.
  pass([&text](size_t& i, size_t& total) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  });
  // " ' " becomes "'".
  pass([&text](size_t& i, size_t& total) {
    const char x = text[i];
    if (x == '\'' && i + 1 < text.size() && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  });
  // " 's", " 'm", " 're", " 've" lose the space.
  pass([&text](size_t& i, size_t& total) {
    const char x = text[i];
    const size_t length = text.size();
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < length) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (i + 2 < length) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  });
}

}  // namespace bitsplit::text
