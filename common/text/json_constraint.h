#pragma once
// Structured output: a JSON Schema (or "any JSON object") compiled into a byte-level pushdown
// automaton, and the per-position mask of the tokens that may come next.
//
//   JsonConstraint     compiled once per request from response_format's schema; immutable and
//                      shareable between threads.
//   TokenVocabulary    bound once per model: every token's bytes in a trie, so that a mask walks
//                      each shared prefix once.
//   JsonConstraintState  one per sequence (or per draft-tree node): a small value that copies
//                      cheaply, advances by a token or by bytes, and answers the mask.
//
// Supported schema subset (OpenAI strict mode's, plus optional properties):
//   * type: "object", "array", "string", "number", "integer", "boolean", "null", or a list of
//     them (["string", "null"] is how strict mode spells nullable). No type: any JSON type, each
//     constrained by the keywords that apply to it.
//   * properties / required / additionalProperties. With properties, the object holds only the
//     listed properties (additionalProperties absent or false; true or a schema is
//     UNIMPLEMENTED), written in the schema's order; a property not in required may be left
//     out. Strict mode lists every property in required, so its objects are fully ordered. The
//     order is the schema's only when it comes as nlohmann::ordered_json: nlohmann::json keeps
//     keys sorted, so with it properties go in name order. Without properties, any keys, each
//     value of the additionalProperties schema (absent or true: any value; false: only {}).
//   * items (one schema for every element), minItems, maxItems.
//   * enum and const (beside type and annotations only): the value is written exactly as
//     nlohmann's compact dump spells it (raw UTF-8, no whitespace, keys in the schema's order).
//   * anyOf, allOf with a single schema, $ref to a JSON pointer in the same document ("#",
//     "#/$defs/Name", "#/definitions/Name", ...), recursive schemas.
//   * Annotations are ignored: title, description, default, examples, $schema, $id, $comment,
//     deprecated, readOnly, writeOnly, $defs and definitions (reached through $ref).
//   Refused, naming the keyword and its JSON pointer: keywords that narrow the valid set and are
//   not implemented (pattern, format, minLength, maxLength, minimum, maximum, multipleOf,
//   oneOf, not, allOf of several, prefixItems, uniqueItems, patternProperties, ...) are
//   UNIMPLEMENTED; unknown keywords, malformed values, schemas with no finite document and
//   references that lead nowhere are INVALID_ARGUMENT.
//
// Spelling policy (a subset of the JSON each schema admits, never a superset):
//   * Whitespace: none before the document or after it. Between tokens (after '{', '[', ',',
//     ':', a key, and a value that is followed by ',', '}' or ']'), one optional run of the
//     form " " or "\n" / "\n\n" followed by at most 20 spaces or tabs: llama.cpp's
//     json-schema-to-grammar "space" rule. It admits compact JSON, json.dumps' ", " and ": ",
//     and indented output up to 20 columns, and bounds whitespace a model could spin on.
//   * Integers ("integer" without "number") are -?(0|[1-9][0-9]*): 1.0 and 1e2 are integers to
//     JSON Schema but are not generated.
//   * Numbers: at most 20 integer digits, 20 fraction digits and 3 exponent digits.
//   * Strings: any JSON string; raw bytes must be valid UTF-8 (checked incrementally, so a token
//     may end inside a character), control characters below 0x20 only as escapes, \u followed by
//     any four hex digits.
//   * Nesting: at most 32 objects/arrays deep (kMaxNestingDepth). A container is opened only
//     when the schema's shallowest completion of it fits, so generation never strands.
//
// Ends: IsComplete() is true when the bytes so far are a whole document. End-of-generation tokens
// are allowed exactly then. Since no whitespace may follow the document, an object or array root
// then allows only end tokens; a number root (or an enum with 1 and 12) may still grow.
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace bitsplit::text {

// The deepest nesting of objects and arrays a document may have.
inline constexpr int kMaxNestingDepth = 32;

// The token pieces of one model, arranged for mask computation. Immutable after Create; share it
// between all sequences of the model.
class TokenVocabulary {
 public:
  // `pieces[id]` is the bytes token `id` appends to the text (raw UTF-8 after detokenization,
  // possibly a part of a character). An empty piece marks a token that is never allowed inside
  // JSON (control, special and unused tokens). `end_of_generation_ids` are allowed exactly when
  // the document is complete, whatever their pieces. INVALID_ARGUMENT for an id out of range.
  static absl::StatusOr<TokenVocabulary> Create(std::vector<std::string> pieces,
                                                std::vector<int32_t> end_of_generation_ids);

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  // uint64_t words in a mask: bit t of word t / 64 (LSB first) is token t.
  size_t mask_words() const { return (pieces_.size() + 63) / 64; }
  std::string_view piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  bool IsEndOfGeneration(int32_t id) const {
    return id >= 0 && id < size() && is_end_[static_cast<size_t>(id)];
  }
  const std::vector<int32_t>& end_of_generation_ids() const { return end_ids_; }

 private:
  friend class JsonConstraintState;

  // Children of a node are contiguous (first_child .. first_child + child_count), in byte order.
  // The tokens whose piece ends at a node are sorted_tokens_[tokens_begin, tokens_end).
  struct TrieNode {
    uint32_t first_child = 0;
    uint32_t child_count = 0;
    uint32_t tokens_begin = 0;
    uint32_t tokens_end = 0;
    uint8_t byte = 0;
    // Every token below (and at) this node stays inside a JSON string when read from a string's
    // plain state (no escape or character in progress): the mask precomputes them all.
    bool string_safe = false;
  };

  TokenVocabulary() = default;

  std::vector<std::string> pieces_;
  std::vector<uint8_t> is_end_;
  std::vector<int32_t> end_ids_;
  std::vector<TrieNode> trie_;  // trie_[0]: the root, the empty prefix
  std::vector<int32_t> sorted_tokens_;
  std::vector<uint64_t> string_safe_mask_;
  size_t max_piece_length_ = 0;
};

namespace json_constraint_internal {

struct Program;

// One level of the pushdown automaton. Plain bytes, no padding, so stacks compare with memcmp;
// no member initializers, so that a FrameStack's unused capacity costs nothing to construct
// (create frames as Frame{}).
struct Frame {
  uint32_t node;   // schema node (containers); trie node (enum literals and object keys)
  uint32_t count;  // array: elements so far; object: next property; number: digits so far
  uint8_t kind;
  uint8_t stage;
  uint8_t whitespace;  // progress through the whitespace run of the current gap
  uint8_t flags;       // string: escape and UTF-8 progress; number: integer only
};
static_assert(sizeof(Frame) == 12 && std::is_trivially_default_constructible_v<Frame>);

// The root frame, kMaxNestingDepth containers, and one string/number/literal/key on top.
inline constexpr int kMaxFrames = kMaxNestingDepth + 2;

// A fixed-capacity stack whose copies move only the frames in use.
class FrameStack {
 public:
  FrameStack() = default;
  FrameStack(const FrameStack& other) : size_(other.size_) {
    std::memcpy(frames_.data(), other.frames_.data(), size_ * sizeof(Frame));
  }
  FrameStack& operator=(const FrameStack& other) {
    size_ = other.size_;
    std::memcpy(frames_.data(), other.frames_.data(), size_ * sizeof(Frame));
    return *this;
  }
  bool operator==(const FrameStack& other) const {
    return size_ == other.size_ &&
           std::memcmp(frames_.data(), other.frames_.data(), size_ * sizeof(Frame)) == 0;
  }

  int size() const { return size_; }
  Frame& top() { return frames_[size_ - 1]; }
  const Frame& top() const { return frames_[size_ - 1]; }
  Frame& below_top() { return frames_[size_ - 2]; }
  const Frame& below_top() const { return frames_[size_ - 2]; }
  void push(const Frame& frame) { frames_[size_++] = frame; }
  void pop() { --size_; }

 private:
  uint8_t size_ = 0;
  std::array<Frame, kMaxFrames> frames_;
};

// The automaton's configurations: more than one only while anyOf branches that begin alike
// are all still possible.
using StackSet = absl::InlinedVector<FrameStack, 1>;

}  // namespace json_constraint_internal

class JsonConstraintState;

// A compiled schema. Cheap to copy (shared, immutable); its states keep a pointer into it, so it
// must outlive them.
class JsonConstraint {
 public:
  // The schema's property order is kept (see the header comment).
  static absl::StatusOr<JsonConstraint> FromSchema(const nlohmann::ordered_json& schema);
  // nlohmann::json sorts object keys: properties are then written in name order.
  static absl::StatusOr<JsonConstraint> FromSchema(const nlohmann::json& schema);
  // response_format {"type": "json_object"}: any JSON object.
  static JsonConstraint AnyJsonObject();

  // The state before the document's first byte.
  JsonConstraintState Start() const;

 private:
  explicit JsonConstraint(std::shared_ptr<const json_constraint_internal::Program> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const json_constraint_internal::Program> program_;
};

// Where one sequence stands in its document. A value: copy it to branch (a draft tree copies its
// parent's state into every child); copies never affect each other. Typically one frame stack of
// a few 12-byte frames; not thread-safe, but distinct states may be used from distinct threads.
class JsonConstraintState {
 public:
  // Sets `bitmask` (resized to vocabulary.mask_words()) so that bit t is set iff token t may
  // come next: its bytes all advance the document, or it is an end-of-generation token and the
  // document is complete. Empty pieces are never set.
  void Allowed(const TokenVocabulary& vocabulary, std::vector<uint64_t>& bitmask) const;

  // Advances by token `id`. False, leaving the state unchanged, when the token is not allowed.
  // An end-of-generation token is allowed when IsComplete() and ends the document: afterwards
  // nothing is allowed.
  bool Advance(const TokenVocabulary& vocabulary, int32_t id);
  // Advances by raw bytes. False, leaving the state unchanged, if any byte is rejected.
  bool Advance(std::string_view bytes);

  // The bytes so far are a complete document.
  bool IsComplete() const;
  // An end-of-generation token was accepted.
  bool IsEnded() const { return ended_; }

 private:
  friend class JsonConstraint;
  explicit JsonConstraintState(const json_constraint_internal::Program* program);

  void Walk(const TokenVocabulary& vocabulary, uint32_t node, size_t level, bool skip_string_safe,
            std::vector<json_constraint_internal::StackSet>& levels,
            std::vector<uint64_t>& bitmask) const;

  const json_constraint_internal::Program* program_ = nullptr;
  json_constraint_internal::StackSet stacks_;
  bool ended_ = false;
};

}  // namespace bitsplit::text
