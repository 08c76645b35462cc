#include "common/text/json_constraint.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bitsplit::text {
namespace json_constraint_internal {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr int kMaxIntegerDigits = 20;
constexpr int kMaxFractionDigits = 20;
constexpr int kMaxExponentDigits = 3;
constexpr int kMaxIndent = 20;
// How deep the schema document itself may nest (a guard for the compiler's recursion).
constexpr int kMaxSchemaDepth = 128;

enum TypeBit : uint8_t {
  kObjectType = 1,
  kArrayType = 2,
  kStringType = 4,
  kNumberType = 8,
  kIntegerType = 16,
  kBooleanType = 32,
  kNullType = 64,
  kAllTypes = 127,
};

}  // namespace

// A trie over byte strings: enum/const spellings (terminal = the value's index) and the quoted
// keys of an object's properties (terminal = the property's index).
struct TrieNode {
  std::vector<std::pair<uint8_t, uint32_t>> children;
  uint32_t terminal = kNone;
  // Key tries: the property indices whose keys pass through this node, ascending.
  std::vector<uint32_t> properties_below;
};

struct Property {
  std::string name;
  uint32_t node = kNone;
  int min_depth = 0;  // the fewest nested containers a value of `node` needs
};

struct SchemaNode {
  std::string pointer;  // for error messages
  // anyOf, a $ref or a single allOf: the node is the union of `any_of`; no other field applies.
  bool is_union = false;
  std::vector<uint32_t> any_of;
  // The non-union nodes the value may follow (this node itself, or its flattened union).
  std::vector<uint32_t> alternatives;

  uint8_t types = kAllTypes;
  uint32_t literal_root = kNone;  // enum/const: the value is one of these spellings
  int literal_nesting = 0;        // the deepest nesting among the enum values

  // Objects: either a closed, ordered list of properties or free keys.
  bool free_keys = true;
  uint32_t free_value_node = kNone;  // schema of the values under free keys
  int free_value_min_depth = 0;
  bool free_keys_forbidden = false;  // additionalProperties: false without properties: only {}
  std::vector<Property> properties;
  // next_required[i]: the first required property at or after i (properties.size() if none).
  std::vector<uint32_t> next_required;
  uint32_t key_root = kNone;

  // Arrays.
  uint32_t items_node = kNone;
  uint32_t min_items = 0;
  uint32_t max_items = std::numeric_limits<uint32_t>::max();

  // The fewest nested containers a complete object / array of this node needs (itself
  // included); kUnreachable when none can be completed.
  int min_object_depth = 1;
  int min_array_depth = 1;
};

struct Program {
  std::vector<SchemaNode> nodes;
  std::vector<TrieNode> trie;
  uint32_t root = kNone;
  uint32_t boolean_root = kNone;  // "true", "false"
  uint32_t null_root = kNone;     // "null"
  int root_min_depth = 0;
};

namespace {

constexpr int kUnreachable = std::numeric_limits<int>::max() / 4;

enum FrameKind : uint8_t { kRoot, kObject, kArray, kString, kNumber, kLiteral, kKey };

enum RootStage : uint8_t { kRootExpectValue, kRootInValue, kRootDone };

enum ObjectStage : uint8_t {
  kObjectOpen,        // after '{'
  kObjectInKey,       // a key frame is on top
  kObjectAfterKey,    // expects ':'
  kObjectAfterColon,  // expects the value
  kObjectInValue,     // a value frame is on top
  kObjectAfterValue,  // expects ',' or '}'
  kObjectAfterComma,  // expects a key
};

enum ArrayStage : uint8_t { kArrayOpen, kArrayInValue, kArrayAfterValue, kArrayAfterComma };

enum NumberStage : uint8_t {
  kNumberMinus,      // after '-'
  kNumberZero,       // a leading 0
  kNumberInteger,    // [1-9][0-9]*
  kNumberDot,        // after '.'
  kNumberFraction,   // digits after '.'
  kNumberExponent,   // after 'e' / 'E'
  kNumberExpSign,    // after the exponent's sign
  kNumberExpDigits,  // the exponent's digits
};

constexpr uint8_t kNumberIntegerOnly = 1;

// String flags: the low nibble is the UTF-8 state, the high nibble the escape state.
enum Utf8State : uint8_t {
  kUtf8None,
  kUtf8Need1,    // one 80..BF
  kUtf8Need2,    // 80..BF, then one more
  kUtf8Need2E0,  // A0..BF (no overlong three-byte forms), then one more
  kUtf8Need2ED,  // 80..9F (no surrogates), then one more
  kUtf8Need3,    // 80..BF, then two more
  kUtf8Need3F0,  // 90..BF (no overlong four-byte forms), then two more
  kUtf8Need3F4,  // 80..8F (nothing above U+10FFFF), then two more
};
enum EscapeState : uint8_t {
  kEscapeNone = 0,
  kEscapeBackslash = 1,
  kEscapeHex0 = 2,  // after \u: 2 + the hex digits read so far
};

bool IsDigit(uint8_t b) { return b >= '0' && b <= '9'; }
bool IsHexDigit(uint8_t b) {
  return IsDigit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

enum class Gap { kConsumed, kNotWhitespace, kRejected };

// One run per gap: "" | " " | "\n"{1,2} [ \t]{0,20}.
Gap GapByte(uint8_t& whitespace, uint8_t b) {
  if (b != ' ' && b != '\n' && b != '\t' && b != '\r') return Gap::kNotWhitespace;
  const bool indent = b == ' ' || b == '\t';
  switch (whitespace) {
    case 0:
      if (b == ' ') return whitespace = 1, Gap::kConsumed;
      if (b == '\n') return whitespace = 2, Gap::kConsumed;
      return Gap::kRejected;
    case 1:
      return Gap::kRejected;
    case 2:
      if (b == '\n') return whitespace = 3, Gap::kConsumed;
      if (indent) return whitespace = 4, Gap::kConsumed;
      return Gap::kRejected;
    case 3:
      if (indent) return whitespace = 4, Gap::kConsumed;
      return Gap::kRejected;
    default:  // 4 + k: k + 1 indent characters so far
      if (indent && whitespace - 3 < kMaxIndent) return ++whitespace, Gap::kConsumed;
      return Gap::kRejected;
  }
}

uint32_t TrieChild(const Program& program, uint32_t node, uint8_t b) {
  for (const auto& [byte, child] : program.trie[node].children) {
    if (byte == b) return child;
  }
  return kNone;
}

// Whether a key below `node` names a property in [lo, hi] whose value still fits under
// `open_containers` (so that no key leads to a value that cannot be written).
bool HasPropertyIn(const TrieNode& node, const SchemaNode& object, uint32_t lo, uint32_t hi,
                   int open_containers) {
  auto it = std::lower_bound(node.properties_below.begin(), node.properties_below.end(), lo);
  for (; it != node.properties_below.end() && *it <= hi; ++it) {
    if (open_containers + object.properties[*it].min_depth <= kMaxNestingDepth) return true;
  }
  return false;
}

// The properties a closed object may write next: [lo, hi].
std::pair<uint32_t, uint32_t> NextPropertyRange(const SchemaNode& node, uint32_t next) {
  const uint32_t last = std::min<uint32_t>(node.next_required[next],
                                           static_cast<uint32_t>(node.properties.size()) - 1);
  return {next, last};
}

bool MayClose(const SchemaNode& node, uint32_t next) {
  return node.free_keys || node.next_required[next] == node.properties.size();
}

class Machine {
 public:
  explicit Machine(const Program& program) : program_(program) {}

  // Feeds `b` to `stack`, appending every resulting stack to `out` (none when rejected).
  void Step(const FrameStack& stack, uint8_t b, StackSet& out) const {
    FrameStack s = stack;
    while (true) {
      Frame& top = s.top();
      switch (top.kind) {
        case kRoot:
          if (top.stage != kRootExpectValue) return;
          top.stage = kRootInValue;
          StartValue(s, program_.root, b, out);
          return;
        case kObject:
          StepObject(s, b, out);
          return;
        case kArray:
          StepArray(s, b, out);
          return;
        case kString:
          if (StepString(s, b)) out.push_back(s);
          return;
        case kKey:
          if (StepKey(s, b)) out.push_back(s);
          return;
        case kNumber: {
          const NumberResult result = StepNumber(top, b);
          if (result == NumberResult::kConsumed) {
            out.push_back(s);
            return;
          }
          if (result == NumberResult::kRejected) return;
          s.pop();  // the number ended before `b`: the enclosing frame reads it
          ValueDone(s);
          continue;
        }
        case kLiteral: {
          const uint32_t child = TrieChild(program_, top.node, b);
          if (child != kNone) {
            top.node = child;
            const TrieNode& node = program_.trie[child];
            if (node.terminal != kNone && node.children.empty()) {
              s.pop();
              ValueDone(s);
            }
            out.push_back(s);
            return;
          }
          if (program_.trie[top.node].terminal == kNone) return;
          s.pop();  // a complete spelling that others extend (1 beside 12): it ends here
          ValueDone(s);
          continue;
        }
        default:
          return;
      }
    }
  }

  bool IsComplete(const FrameStack& s) const {
    if (s.size() == 1) return s.top().stage == kRootDone;
    if (s.size() != 2) return false;
    const Frame& top = s.top();
    if (top.kind == kNumber) {
      return top.stage == kNumberZero || top.stage == kNumberInteger ||
             top.stage == kNumberFraction || top.stage == kNumberExpDigits;
    }
    return top.kind == kLiteral && program_.trie[top.node].terminal != kNone;
  }

 private:
  enum class NumberResult { kConsumed, kEnded, kRejected };

  // The enclosing container of a value that just ended.
  static void ValueDone(FrameStack& s) {
    Frame& parent = s.top();
    switch (parent.kind) {
      case kRoot:
        parent.stage = kRootDone;
        break;
      case kObject:
        parent.stage = kObjectAfterValue;
        parent.whitespace = 0;
        break;
      case kArray:
        ++parent.count;
        parent.stage = kArrayAfterValue;
        parent.whitespace = 0;
        break;
      default:
        break;
    }
  }

  // `b` is the first byte of a value of `node_id`; the stack's top frame already records that a
  // value is in progress.
  void StartValue(const FrameStack& s, uint32_t node_id, uint8_t b, StackSet& out) const {
    const int open_containers = s.size() - 1;
    for (const uint32_t alternative : program_.nodes[node_id].alternatives) {
      const SchemaNode& node = program_.nodes[alternative];
      Frame frame{};
      if (node.literal_root != kNone) {
        const uint32_t child = TrieChild(program_, node.literal_root, b);
        if (child == kNone) continue;
        FrameStack t = s;
        if (program_.trie[child].terminal != kNone && program_.trie[child].children.empty()) {
          ValueDone(t);
        } else {
          frame.kind = kLiteral;
          frame.node = child;
          t.push(frame);
        }
        out.push_back(t);
        continue;
      }
      uint32_t literal_root = kNone;
      switch (b) {
        case '{':
          if (!(node.types & kObjectType) ||
              open_containers + node.min_object_depth > kMaxNestingDepth) {
            continue;
          }
          frame.kind = kObject;
          frame.node = alternative;
          frame.stage = kObjectOpen;
          break;
        case '[':
          if (!(node.types & kArrayType) ||
              open_containers + node.min_array_depth > kMaxNestingDepth) {
            continue;
          }
          frame.kind = kArray;
          frame.node = alternative;
          frame.stage = kArrayOpen;
          break;
        case '"':
          if (!(node.types & kStringType)) continue;
          frame.kind = kString;
          break;
        case 't':
        case 'f':
          if (!(node.types & kBooleanType)) continue;
          literal_root = program_.boolean_root;
          break;
        case 'n':
          if (!(node.types & kNullType)) continue;
          literal_root = program_.null_root;
          break;
        default:
          if (b != '-' && !IsDigit(b)) continue;
          if (!(node.types & (kNumberType | kIntegerType))) continue;
          frame.kind = kNumber;
          frame.flags = (node.types & kNumberType) ? 0 : kNumberIntegerOnly;
          frame.stage = b == '-' ? kNumberMinus : b == '0' ? kNumberZero : kNumberInteger;
          frame.count = (b == '-') ? 0 : 1;
          break;
      }
      if (literal_root != kNone) {
        frame.kind = kLiteral;
        frame.node = TrieChild(program_, literal_root, b);
        if (frame.node == kNone) continue;
      }
      FrameStack t = s;
      t.push(frame);
      out.push_back(t);
    }
  }

  void StepObject(FrameStack& s, uint8_t b, StackSet& out) const {
    Frame& top = s.top();
    const SchemaNode& node = program_.nodes[top.node];
    switch (top.stage) {
      case kObjectOpen:
      case kObjectAfterComma:
      case kObjectAfterKey:
      case kObjectAfterColon:
      case kObjectAfterValue: {
        const Gap gap = GapByte(top.whitespace, b);
        if (gap == Gap::kConsumed) out.push_back(s);
        if (gap != Gap::kNotWhitespace) return;
        break;
      }
      default:
        return;
    }
    switch (top.stage) {
      case kObjectOpen:
      case kObjectAfterComma:
        if (b == '"') {
          Frame key{};
          const int open_containers = s.size() - 1;
          if (node.free_keys) {
            if (node.free_keys_forbidden ||
                open_containers + node.free_value_min_depth > kMaxNestingDepth) {
              return;
            }
            key.kind = kString;
          } else {
            if (top.count >= node.properties.size()) return;
            const auto [lo, hi] = NextPropertyRange(node, top.count);
            key.kind = kKey;
            key.node = TrieChild(program_, node.key_root, b);
            if (key.node == kNone ||
                !HasPropertyIn(program_.trie[key.node], node, lo, hi, open_containers)) {
              return;
            }
          }
          top.stage = kObjectInKey;
          s.push(key);
          out.push_back(s);
          return;
        }
        if (b == '}' && top.stage == kObjectOpen && MayClose(node, top.count)) {
          s.pop();
          ValueDone(s);
          out.push_back(s);
        }
        return;
      case kObjectAfterKey:
        if (b != ':') return;
        top.stage = kObjectAfterColon;
        top.whitespace = 0;
        out.push_back(s);
        return;
      case kObjectAfterColon: {
        const uint32_t value_node =
            node.free_keys ? node.free_value_node : node.properties[top.count - 1].node;
        top.stage = kObjectInValue;
        StartValue(s, value_node, b, out);
        return;
      }
      case kObjectAfterValue:
        if (b == ',') {
          if (!node.free_keys && top.count >= node.properties.size()) return;
          top.stage = kObjectAfterComma;
          top.whitespace = 0;
          out.push_back(s);
        } else if (b == '}' && MayClose(node, top.count)) {
          s.pop();
          ValueDone(s);
          out.push_back(s);
        }
        return;
      default:
        return;
    }
  }

  void StepArray(FrameStack& s, uint8_t b, StackSet& out) const {
    Frame& top = s.top();
    const SchemaNode& node = program_.nodes[top.node];
    if (top.stage == kArrayInValue) return;
    const Gap gap = GapByte(top.whitespace, b);
    if (gap == Gap::kConsumed) out.push_back(s);
    if (gap != Gap::kNotWhitespace) return;
    if (b == ']' && top.stage != kArrayAfterComma) {
      if (top.count < node.min_items) return;
      s.pop();
      ValueDone(s);
      out.push_back(s);
      return;
    }
    if (top.stage == kArrayAfterValue) {
      if (b != ',' || top.count >= node.max_items) return;
      top.stage = kArrayAfterComma;
      top.whitespace = 0;
      out.push_back(s);
      return;
    }
    if (top.count >= node.max_items) return;
    top.stage = kArrayInValue;
    StartValue(s, node.items_node, b, out);
  }

  // A string value or a free key.
  static bool StepString(FrameStack& s, uint8_t b) {
    Frame& top = s.top();
    const uint8_t utf8 = top.flags & 0x0f;
    const uint8_t escape = top.flags >> 4;
    if (utf8 != kUtf8None) {
      uint8_t lo = 0x80, hi = 0xbf, next = kUtf8None;
      switch (utf8) {
        case kUtf8Need1:
          break;
        case kUtf8Need2:
          next = kUtf8Need1;
          break;
        case kUtf8Need2E0:
          lo = 0xa0, next = kUtf8Need1;
          break;
        case kUtf8Need2ED:
          hi = 0x9f, next = kUtf8Need1;
          break;
        case kUtf8Need3:
          next = kUtf8Need2;
          break;
        case kUtf8Need3F0:
          lo = 0x90, next = kUtf8Need2;
          break;
        case kUtf8Need3F4:
          hi = 0x8f, next = kUtf8Need2;
          break;
        default:
          return false;
      }
      if (b < lo || b > hi) return false;
      top.flags = next;
      return true;
    }
    if (escape == kEscapeBackslash) {
      if (b == 'u') {
        top.flags = kEscapeHex0 << 4;
        return true;
      }
      if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' &&
          b != 't') {
        return false;
      }
      top.flags = 0;
      return true;
    }
    if (escape >= kEscapeHex0) {
      if (!IsHexDigit(b)) return false;
      top.flags = escape == kEscapeHex0 + 3 ? 0 : static_cast<uint8_t>((escape + 1) << 4);
      return true;
    }
    if (b == '"') {
      s.pop();
      Frame& parent = s.top();
      if (parent.kind == kObject && parent.stage == kObjectInKey) {
        parent.stage = kObjectAfterKey;
        parent.whitespace = 0;
      } else {
        ValueDone(s);
      }
      return true;
    }
    if (b == '\\') {
      top.flags = kEscapeBackslash << 4;
      return true;
    }
    if (b < 0x20) return false;
    if (b < 0x80) return true;
    if (b >= 0xc2 && b <= 0xdf) {
      top.flags = kUtf8Need1;
    } else if (b == 0xe0) {
      top.flags = kUtf8Need2E0;
    } else if (b == 0xed) {
      top.flags = kUtf8Need2ED;
    } else if (b >= 0xe1 && b <= 0xef) {
      top.flags = kUtf8Need2;
    } else if (b == 0xf0) {
      top.flags = kUtf8Need3F0;
    } else if (b >= 0xf1 && b <= 0xf3) {
      top.flags = kUtf8Need3;
    } else if (b == 0xf4) {
      top.flags = kUtf8Need3F4;
    } else {
      return false;
    }
    return true;
  }

  // A property name of a closed object, matched against the quoted keys it may write next.
  bool StepKey(FrameStack& s, uint8_t b) const {
    Frame& key = s.top();
    Frame& object = s.below_top();
    const SchemaNode& node = program_.nodes[object.node];
    const uint32_t child = TrieChild(program_, key.node, b);
    if (child == kNone) return false;
    const auto [lo, hi] = NextPropertyRange(node, object.count);
    const TrieNode& trie_node = program_.trie[child];
    if (!HasPropertyIn(trie_node, node, lo, hi, s.size() - 2)) return false;
    if (trie_node.terminal == kNone) {
      key.node = child;
      return true;
    }
    // Quoted keys end in their only unescaped '"': a terminal has no children.
    s.pop();
    object.count = trie_node.terminal + 1;
    object.stage = kObjectAfterKey;
    object.whitespace = 0;
    return true;
  }

  static NumberResult StepNumber(Frame& top, uint8_t b) {
    const bool integer_only = top.flags & kNumberIntegerOnly;
    const bool digit = IsDigit(b);
    auto fraction_or_exponent = [&]() {
      if (integer_only) return NumberResult::kEnded;
      if (b == '.') {
        top.stage = kNumberDot;
        top.count = 0;
        return NumberResult::kConsumed;
      }
      if (b == 'e' || b == 'E') {
        top.stage = kNumberExponent;
        top.count = 0;
        return NumberResult::kConsumed;
      }
      return NumberResult::kEnded;
    };
    switch (top.stage) {
      case kNumberMinus:
        if (!digit) return NumberResult::kRejected;
        top.stage = b == '0' ? kNumberZero : kNumberInteger;
        top.count = 1;
        return NumberResult::kConsumed;
      case kNumberZero:
        if (digit) return NumberResult::kRejected;  // no leading zeros
        return fraction_or_exponent();
      case kNumberInteger:
        if (digit) {
          if (top.count >= kMaxIntegerDigits) return NumberResult::kRejected;
          ++top.count;
          return NumberResult::kConsumed;
        }
        return fraction_or_exponent();
      case kNumberDot:
        if (!digit) return NumberResult::kRejected;
        top.stage = kNumberFraction;
        top.count = 1;
        return NumberResult::kConsumed;
      case kNumberFraction:
        if (digit) {
          if (top.count >= kMaxFractionDigits) return NumberResult::kRejected;
          ++top.count;
          return NumberResult::kConsumed;
        }
        if (b == 'e' || b == 'E') {
          top.stage = kNumberExponent;
          top.count = 0;
          return NumberResult::kConsumed;
        }
        return NumberResult::kEnded;
      case kNumberExponent:
        if (b == '+' || b == '-') {
          top.stage = kNumberExpSign;
          return NumberResult::kConsumed;
        }
        [[fallthrough]];
      case kNumberExpSign:
        if (!digit) return NumberResult::kRejected;
        top.stage = kNumberExpDigits;
        top.count = 1;
        return NumberResult::kConsumed;
      case kNumberExpDigits:
        if (digit) {
          if (top.count >= kMaxExponentDigits) return NumberResult::kRejected;
          ++top.count;
          return NumberResult::kConsumed;
        }
        return NumberResult::kEnded;
      default:
        return NumberResult::kRejected;
    }
  }

  const Program& program_;
};

// Feeds `b` to every stack of `in`; `out` gets the distinct results.
void StepSet(const Machine& machine, const StackSet& in, uint8_t b, StackSet& out) {
  out.clear();
  for (const FrameStack& stack : in) machine.Step(stack, b, out);
  if (out.size() > 1) {
    for (size_t i = 1; i < out.size();) {
      bool duplicate = false;
      for (size_t j = 0; j < i && !duplicate; ++j) duplicate = out[i] == out[j];
      if (duplicate) {
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Schema compilation.

const std::set<std::string, std::less<>>& AnnotationKeywords() {
  static const auto* const keywords = new std::set<std::string, std::less<>>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *keywords;
}

const std::set<std::string, std::less<>>& UnsupportedKeywords() {
  static const auto* const keywords = new std::set<std::string, std::less<>>{
      "pattern",
      "format",
      "minLength",
      "maxLength",
      "minimum",
      "maximum",
      "exclusiveMinimum",
      "exclusiveMaximum",
      "multipleOf",
      "oneOf",
      "not",
      "if",
      "then",
      "else",
      "prefixItems",
      "additionalItems",
      "contains",
      "minContains",
      "maxContains",
      "uniqueItems",
      "unevaluatedItems",
      "unevaluatedProperties",
      "patternProperties",
      "propertyNames",
      "minProperties",
      "maxProperties",
      "dependentRequired",
      "dependentSchemas",
      "dependencies",
      "contentEncoding",
      "contentMediaType",
      "contentSchema",
      "$anchor",
      "$dynamicRef",
      "$dynamicAnchor",
      "$recursiveRef",
      "$recursiveAnchor",
      "$vocabulary",
  };
  return *keywords;
}

const std::set<std::string, std::less<>>& SupportedKeywords() {
  static const auto* const keywords = new std::set<std::string, std::less<>>{
      "type",  "properties", "required", "additionalProperties",
      "items", "minItems",   "maxItems", "enum",
      "const", "anyOf",      "allOf",    "$ref"};
  return *keywords;
}

// RFC 6901: '~' and '/' inside a reference token are escaped.
std::string PointerToken(std::string_view token) {
  std::string escaped;
  for (char c : token) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string ShowPointer(const std::string& pointer) { return pointer.empty() ? "/" : pointer; }

absl::Status Invalid(const std::string& pointer, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON schema at ", ShowPointer(pointer), ": ", std::string(message)));
}

absl::Status Unimplemented(const std::string& pointer, std::string_view message) {
  return absl::UnimplementedError(
      absl::StrCat("JSON schema at ", ShowPointer(pointer), ": ", std::string(message)));
}

int JsonNesting(const Json& value) {
  int deepest = 0;
  if (value.is_object() || value.is_array()) {
    for (const auto& element : value) deepest = std::max(deepest, JsonNesting(element));
    return deepest + 1;
  }
  return 0;
}

bool HasJsonType(const Json& value, uint8_t types) {
  switch (value.type()) {
    case Json::value_t::object:
      return types & kObjectType;
    case Json::value_t::array:
      return types & kArrayType;
    case Json::value_t::string:
      return types & kStringType;
    case Json::value_t::boolean:
      return types & kBooleanType;
    case Json::value_t::null:
      return types & kNullType;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return types & (kNumberType | kIntegerType);
    case Json::value_t::number_float: {
      if (types & kNumberType) return true;
      const double v = value.get<double>();
      return (types & kIntegerType) && std::isfinite(v) && std::trunc(v) == v;
    }
    default:
      return false;
  }
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, Program& program) : root_(root), program_(program) {}

  absl::Status Compile() {
    program_.boolean_root = NewTrieNode();
    AddToTrie(program_.boolean_root, "true", 0);
    AddToTrie(program_.boolean_root, "false", 1);
    program_.null_root = NewTrieNode();
    AddToTrie(program_.null_root, "null", 0);
    auto root = CompileSchema(root_, "", 0);
    if (!root.ok()) return root.status();
    program_.root = *root;
    if (auto status = Finish(); !status.ok()) return status;
    return absl::OkStatus();
  }

  // Any JSON value: node 0 after this.
  uint32_t AnyValueNode() {
    const uint32_t id = NewNode("");
    program_.nodes[id].free_value_node = id;
    program_.nodes[id].items_node = id;
    return id;
  }

  absl::Status Finish() {
    for (uint32_t id = 0; id < program_.nodes.size(); ++id) {
      std::vector<uint32_t> visiting;
      if (auto status = Flatten(id, visiting); !status.ok()) return status;
    }
    ComputeMinDepths();
    for (SchemaNode& node : program_.nodes) {
      for (Property& property : node.properties) property.min_depth = MinDepthOf(property.node);
      if (node.free_keys && node.free_value_node != kNone) {
        node.free_value_min_depth = MinDepthOf(node.free_value_node);
      }
    }
    const SchemaNode& root = program_.nodes[program_.root];
    int root_depth = kUnreachable;
    for (uint32_t alternative : root.alternatives) {
      root_depth = std::min(root_depth, ValueDepth(program_.nodes[alternative]));
    }
    if (root_depth >= kUnreachable) {
      return Invalid("", "the schema admits no finite document");
    }
    if (root_depth > kMaxNestingDepth) {
      return Invalid("",
                     absl::StrCat("every document of the schema nests objects/arrays ", root_depth,
                                  " deep, more than the limit of ", kMaxNestingDepth));
    }
    program_.root_min_depth = root_depth;
    return absl::OkStatus();
  }

  uint32_t NewNode(const std::string& pointer) {
    program_.nodes.emplace_back();
    program_.nodes.back().pointer = pointer;
    return static_cast<uint32_t>(program_.nodes.size() - 1);
  }

 private:
  uint32_t NewTrieNode() {
    program_.trie.emplace_back();
    return static_cast<uint32_t>(program_.trie.size() - 1);
  }

  void AddToTrie(uint32_t root, std::string_view text, uint32_t terminal,
                 bool record_property = false) {
    uint32_t node = root;
    if (record_property) program_.trie[node].properties_below.push_back(terminal);
    for (const char c : text) {
      const uint8_t b = static_cast<uint8_t>(c);
      uint32_t child = TrieChild(program_, node, b);
      if (child == kNone) {
        child = NewTrieNode();
        program_.trie[node].children.emplace_back(b, child);
      }
      node = child;
      if (record_property) program_.trie[node].properties_below.push_back(terminal);
    }
    if (program_.trie[node].terminal == kNone) program_.trie[node].terminal = terminal;
  }

  absl::StatusOr<uint32_t> CompileSchema(const Json& schema, const std::string& pointer,
                                         int depth) {
    const uint32_t id = NewNode(pointer);
    if (auto status = CompileInto(schema, pointer, depth, id); !status.ok()) return status;
    return id;
  }

  absl::StatusOr<uint32_t> CompileReference(const std::string& reference,
                                            const std::string& pointer, int depth) {
    if (reference.empty() || reference[0] != '#') {
      return Unimplemented(pointer, absl::StrCat("$ref \"", reference,
                                                 "\": only references inside the schema "
                                                 "(\"#...\") are supported"));
    }
    const std::string target = reference.substr(1);
    if (auto it = references_.find(target); it != references_.end()) return it->second;
    const Json* resolved = nullptr;
    try {
      const Json::json_pointer json_pointer(target);
      if (root_.contains(json_pointer)) resolved = &root_.at(json_pointer);
    } catch (const Json::exception&) {
      return Invalid(pointer, absl::StrCat("$ref \"", reference, "\" is not a JSON pointer"));
    }
    if (resolved == nullptr) {
      return Invalid(pointer, absl::StrCat("$ref \"", reference, "\" points to nothing"));
    }
    const uint32_t id = NewNode(target);
    references_[target] = id;
    if (auto status = CompileInto(*resolved, target, depth + 1, id); !status.ok()) return status;
    return id;
  }

  absl::Status CompileInto(const Json& schema, const std::string& pointer, int depth, uint32_t id) {
    if (depth > kMaxSchemaDepth) {
      return Invalid(pointer,
                     absl::StrCat("the schema nests deeper than ", kMaxSchemaDepth, " levels"));
    }
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) {
        return Invalid(pointer, "the schema false admits no value");
      }
      MakeUnion(id, {0});
      return absl::OkStatus();
    }
    if (!schema.is_object()) return Invalid(pointer, "a schema must be an object or a boolean");

    std::vector<std::string> constraints;  // the supported keywords present, for conflicts
    for (const auto& [keyword, value] : schema.items()) {
      if (AnnotationKeywords().count(keyword)) continue;
      const std::string at = absl::StrCat(pointer, "/", PointerToken(keyword));
      if (UnsupportedKeywords().count(keyword)) {
        return Unimplemented(at, absl::StrCat("keyword \"", keyword, "\" is not supported"));
      }
      if (!SupportedKeywords().count(keyword)) {
        return Invalid(at, absl::StrCat("unknown keyword \"", keyword, "\""));
      }
      constraints.push_back(keyword);
    }
    auto only_beside = [&](std::string_view keyword,
                           std::initializer_list<std::string_view> allowed) -> absl::Status {
      for (const std::string& other : constraints) {
        if (other == keyword) continue;
        if (std::find(allowed.begin(), allowed.end(), other) != allowed.end()) continue;
        return Unimplemented(absl::StrCat(pointer, "/", PointerToken(other)),
                             absl::StrCat("keyword \"", other, "\" beside \"", std::string(keyword),
                                          "\" is not supported"));
      }
      return absl::OkStatus();
    };

    if (schema.contains("$ref")) {
      if (auto status = only_beside("$ref", {}); !status.ok()) return status;
      const Json& reference = schema["$ref"];
      const std::string at = pointer + "/$ref";
      if (!reference.is_string()) return Invalid(at, "$ref must be a string");
      auto target = CompileReference(reference.get<std::string>(), at, depth);
      if (!target.ok()) return target.status();
      MakeUnion(id, {*target});
      return absl::OkStatus();
    }
    if (schema.contains("anyOf") || schema.contains("allOf")) {
      const bool any_of = schema.contains("anyOf");
      const std::string keyword = any_of ? "anyOf" : "allOf";
      if (auto status = only_beside(keyword, {}); !status.ok()) return status;
      const Json& branches = schema[keyword];
      const std::string at = absl::StrCat(pointer, "/", keyword);
      if (!branches.is_array() || branches.empty()) {
        return Invalid(at, absl::StrCat(keyword, " must be a non-empty array"));
      }
      if (!any_of && branches.size() != 1) {
        return Unimplemented(at, "allOf with more than one schema is not supported");
      }
      std::vector<uint32_t> members;
      for (size_t i = 0; i < branches.size(); ++i) {
        auto member = CompileSchema(branches[i], absl::StrCat(at, "/", i), depth + 1);
        if (!member.ok()) return member.status();
        members.push_back(*member);
      }
      MakeUnion(id, std::move(members));
      return absl::OkStatus();
    }

    uint8_t types = kAllTypes;
    if (schema.contains("type")) {
      auto parsed = ParseTypes(schema["type"], pointer + "/type");
      if (!parsed.ok()) return parsed.status();
      types = *parsed;
    }
    program_.nodes[id].types = types;

    if (schema.contains("enum") || schema.contains("const")) {
      const std::string keyword = schema.contains("enum") ? "enum" : "const";
      if (auto status = only_beside(keyword, {"type", "enum", "const"}); !status.ok()) {
        return status;
      }
      return CompileLiterals(schema, pointer, types, id);
    }

    if (auto status = CompileObject(schema, pointer, depth, id); !status.ok()) return status;
    return CompileArray(schema, pointer, depth, id);
  }

  void MakeUnion(uint32_t id, std::vector<uint32_t> members) {
    program_.nodes[id].is_union = true;
    program_.nodes[id].any_of = std::move(members);
  }

  absl::StatusOr<uint8_t> ParseTypes(const Json& type, const std::string& pointer) {
    static const std::map<std::string, uint8_t, std::less<>> kTypes = {
        {"object", kObjectType}, {"array", kArrayType},     {"string", kStringType},
        {"number", kNumberType}, {"integer", kIntegerType}, {"boolean", kBooleanType},
        {"null", kNullType},
    };
    std::vector<const Json*> names;
    if (type.is_string()) {
      names.push_back(&type);
    } else if (type.is_array() && !type.empty()) {
      for (const Json& name : type) names.push_back(&name);
    } else {
      return Invalid(pointer, "type must be a type name or a non-empty array of them");
    }
    uint8_t types = 0;
    for (const Json* name : names) {
      auto it = name->is_string() ? kTypes.find(name->get<std::string>()) : kTypes.end();
      if (it == kTypes.end()) {
        return Invalid(pointer, absl::StrCat("unknown type ", name->dump(),
                                             " (object, array, string, number, integer, "
                                             "boolean, null)"));
      }
      types |= it->second;
    }
    return types;
  }

  absl::Status CompileLiterals(const Json& schema, const std::string& pointer, uint8_t types,
                               uint32_t id) {
    std::vector<Json> values;
    if (schema.contains("enum")) {
      const Json& values_json = schema["enum"];
      if (!values_json.is_array() || values_json.empty()) {
        return Invalid(pointer + "/enum", "enum must be a non-empty array");
      }
      values.assign(values_json.begin(), values_json.end());
    }
    if (schema.contains("const")) {
      const Json& value = schema["const"];
      if (schema.contains("enum")) {
        const bool listed = std::find(values.begin(), values.end(), value) != values.end();
        values.clear();
        if (listed) values.push_back(value);
      } else {
        values.push_back(value);
      }
    }
    const uint32_t root = NewTrieNode();
    int nesting = 0;
    uint32_t kept = 0;
    for (const Json& value : values) {
      if (!HasJsonType(value, types)) continue;
      AddToTrie(root, value.dump(), kept++);
      nesting = std::max(nesting, JsonNesting(value));
    }
    if (kept == 0) {
      return Invalid(pointer, "no enum/const value has the schema's type: no value is valid");
    }
    program_.nodes[id].literal_root = root;
    program_.nodes[id].literal_nesting = nesting;
    return absl::OkStatus();
  }

  absl::Status CompileObject(const Json& schema, const std::string& pointer, int depth,
                             uint32_t id) {
    const bool has_properties = schema.contains("properties");
    std::vector<Property> properties;
    if (has_properties) {
      const Json& properties_json = schema["properties"];
      const std::string at = pointer + "/properties";
      if (!properties_json.is_object()) return Invalid(at, "properties must be an object");
      for (const auto& [name, subschema] : properties_json.items()) {
        auto node = CompileSchema(subschema, absl::StrCat(at, "/", PointerToken(name)), depth + 1);
        if (!node.ok()) return node.status();
        properties.push_back({name, *node});
      }
    }
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& required_json = schema["required"];
      const std::string at = pointer + "/required";
      if (!required_json.is_array()) return Invalid(at, "required must be an array of names");
      for (const Json& name : required_json) {
        if (!name.is_string()) return Invalid(at, "required must be an array of names");
        required.insert(name.get<std::string>());
      }
    }
    bool free_keys = !has_properties;
    bool free_keys_forbidden = false;
    uint32_t free_value_node = 0;
    if (schema.contains("additionalProperties")) {
      const Json& additional = schema["additionalProperties"];
      const std::string at = pointer + "/additionalProperties";
      const bool closed = additional.is_boolean() && !additional.get<bool>();
      if (has_properties && !closed) {
        return Unimplemented(at,
                             "additionalProperties other than false beside properties is "
                             "not supported");
      }
      if (!has_properties) {
        if (closed) {
          free_keys_forbidden = true;
        } else if (!(additional.is_boolean() && additional.get<bool>())) {
          auto node = CompileSchema(additional, at, depth + 1);
          if (!node.ok()) return node.status();
          free_value_node = *node;
        }
      }
    }
    if (!has_properties && !required.empty()) {
      if (free_keys_forbidden) {
        return Invalid(pointer + "/required",
                       "required properties with additionalProperties false and no "
                       "properties: no object is valid");
      }
      return Unimplemented(pointer + "/required", "required without properties is not supported");
    }
    for (const std::string& name : required) {
      const bool listed = std::any_of(properties.begin(), properties.end(),
                                      [&](const Property& p) { return p.name == name; });
      if (!listed) {
        return Invalid(pointer + "/required",
                       absl::StrCat("required property \"", name,
                                    "\" is not in properties (additional properties are not "
                                    "allowed)"));
      }
    }

    SchemaNode& node = program_.nodes[id];
    node.free_keys = free_keys || free_keys_forbidden;
    node.free_keys_forbidden = free_keys_forbidden;
    node.free_value_node = free_value_node;
    if (!node.free_keys) {
      const uint32_t key_root = NewTrieNode();
      std::vector<uint32_t> next_required(properties.size() + 1, properties.size());
      for (size_t i = properties.size(); i-- > 0;) {
        next_required[i] = required.count(properties[i].name) ? i : next_required[i + 1];
      }
      for (size_t i = 0; i < properties.size(); ++i) {
        AddToTrie(key_root, Json(properties[i].name).dump(), static_cast<uint32_t>(i),
                  /*record_property=*/true);
      }
      node.key_root = key_root;
      node.next_required = std::move(next_required);
      node.properties = std::move(properties);
    }
    return absl::OkStatus();
  }

  absl::Status CompileArray(const Json& schema, const std::string& pointer, int depth,
                            uint32_t id) {
    uint32_t items_node = 0;
    if (schema.contains("items")) {
      const Json& items = schema["items"];
      const std::string at = pointer + "/items";
      if (items.is_array()) {
        return Unimplemented(at, "items as an array of schemas (tuples) is not supported");
      }
      if (items.is_boolean() && !items.get<bool>()) {
        items_node = kNone;  // no element is valid: only []
      } else {
        auto node = CompileSchema(items, at, depth + 1);
        if (!node.ok()) return node.status();
        items_node = *node;
      }
    }
    uint32_t min_items = 0;
    uint32_t max_items = std::numeric_limits<uint32_t>::max();
    for (const char* keyword : {"minItems", "maxItems"}) {
      if (!schema.contains(keyword)) continue;
      const Json& value = schema[keyword];
      const std::string at = absl::StrCat(pointer, "/", keyword);
      if (!value.is_number_unsigned() &&
          !(value.is_number_integer() && value.get<int64_t>() >= 0)) {
        return Invalid(at, absl::StrCat(keyword, " must be a non-negative integer"));
      }
      const uint64_t count = std::min<uint64_t>(value.get<uint64_t>(), 1u << 30);
      (std::string_view(keyword) == "minItems" ? min_items : max_items) =
          static_cast<uint32_t>(count);
    }
    if (min_items > max_items) {
      return Invalid(pointer + "/minItems", "minItems exceeds maxItems: no array is valid");
    }
    if (items_node == kNone) {
      if (min_items > 0) {
        return Invalid(pointer + "/items", "items false with minItems > 0: no array is valid");
      }
      max_items = 0;
      items_node = 0;
    }
    SchemaNode& node = program_.nodes[id];
    node.items_node = items_node;
    node.min_items = min_items;
    node.max_items = max_items;
    return absl::OkStatus();
  }

  absl::Status Flatten(uint32_t id, std::vector<uint32_t>& visiting) {
    SchemaNode& node = program_.nodes[id];
    if (!node.alternatives.empty()) return absl::OkStatus();
    if (!node.is_union) {
      node.alternatives = {id};
      return absl::OkStatus();
    }
    if (std::find(visiting.begin(), visiting.end(), id) != visiting.end()) {
      return Invalid(node.pointer, "anyOf/$ref cycle that never reaches a value");
    }
    visiting.push_back(id);
    std::vector<uint32_t> alternatives;
    for (size_t i = 0; i < program_.nodes[id].any_of.size(); ++i) {
      const uint32_t member = program_.nodes[id].any_of[i];
      if (auto status = Flatten(member, visiting); !status.ok()) return status;
      for (uint32_t alternative : program_.nodes[member].alternatives) {
        if (std::find(alternatives.begin(), alternatives.end(), alternative) ==
            alternatives.end()) {
          alternatives.push_back(alternative);
        }
      }
    }
    visiting.pop_back();
    program_.nodes[id].alternatives = std::move(alternatives);
    return absl::OkStatus();
  }

  int MinDepthOf(uint32_t id) const {
    int depth = kUnreachable;
    for (uint32_t alternative : program_.nodes[id].alternatives) {
      depth = std::min(depth, ValueDepth(program_.nodes[alternative]));
    }
    return depth;
  }

  // The fewest nested containers of a complete value of a non-union node.
  static int ValueDepth(const SchemaNode& node) {
    if (node.literal_root != kNone) return node.literal_nesting;
    if (node.types & (kStringType | kNumberType | kIntegerType | kBooleanType | kNullType)) {
      return 0;
    }
    int depth = kUnreachable;
    if (node.types & kObjectType) depth = std::min(depth, node.min_object_depth);
    if (node.types & kArrayType) depth = std::min(depth, node.min_array_depth);
    return depth;
  }

  // A fixed point from "unreachable" downwards: recursion through required properties or
  // non-empty arrays only counts when it bottoms out.
  void ComputeMinDepths() {
    for (SchemaNode& node : program_.nodes) {
      node.min_object_depth = kUnreachable;
      node.min_array_depth = kUnreachable;
    }
    bool changed = true;
    while (changed) {
      changed = false;
      for (SchemaNode& node : program_.nodes) {
        if (node.is_union || node.literal_root != kNone) continue;
        int object_depth = 1;
        if (!node.free_keys) {
          for (uint32_t i = 0; i < node.properties.size(); ++i) {
            if (node.next_required[i] != i) continue;
            object_depth = std::max(object_depth, 1 + MinDepthOf(node.properties[i].node));
          }
        }
        int array_depth = 1;
        if (node.min_items > 0) array_depth = 1 + MinDepthOf(node.items_node);
        object_depth = std::min(object_depth, kUnreachable);
        array_depth = std::min(array_depth, kUnreachable);
        if (object_depth < node.min_object_depth) {
          node.min_object_depth = object_depth;
          changed = true;
        }
        if (array_depth < node.min_array_depth) {
          node.min_array_depth = array_depth;
          changed = true;
        }
      }
    }
  }

  const Json& root_;
  Program& program_;
  std::map<std::string, uint32_t> references_;
};

absl::StatusOr<std::shared_ptr<const Program>> CompileProgram(const Json& schema) {
  auto program = std::make_shared<Program>();
  SchemaCompiler compiler(schema, *program);
  compiler.AnyValueNode();
  if (auto status = compiler.Compile(); !status.ok()) return status;
  return std::shared_ptr<const Program>(std::move(program));
}

}  // namespace
}  // namespace json_constraint_internal

using json_constraint_internal::FrameStack;
using json_constraint_internal::Machine;
using json_constraint_internal::Program;
using json_constraint_internal::StackSet;

// ---------------------------------------------------------------------------------------------
// JsonConstraint

absl::StatusOr<JsonConstraint> JsonConstraint::FromSchema(const nlohmann::ordered_json& schema) {
  auto program = json_constraint_internal::CompileProgram(schema);
  if (!program.ok()) return program.status();
  return JsonConstraint(*std::move(program));
}

absl::StatusOr<JsonConstraint> JsonConstraint::FromSchema(const nlohmann::json& schema) {
  return FromSchema(nlohmann::ordered_json::parse(schema.dump()));
}

JsonConstraint JsonConstraint::AnyJsonObject() {
  // {"type": "object"}: no properties, so any keys with values of any type.
  auto constraint = FromSchema(nlohmann::ordered_json{{"type", "object"}});
  return *std::move(constraint);
}

JsonConstraintState JsonConstraint::Start() const { return JsonConstraintState(program_.get()); }

// ---------------------------------------------------------------------------------------------
// JsonConstraintState

JsonConstraintState::JsonConstraintState(const Program* program) : program_(program) {
  json_constraint_internal::Frame root{};
  root.kind = json_constraint_internal::kRoot;
  FrameStack stack;
  stack.push(root);
  stacks_.push_back(stack);
}

bool JsonConstraintState::IsComplete() const {
  const Machine machine(*program_);
  for (const FrameStack& stack : stacks_) {
    if (machine.IsComplete(stack)) return true;
  }
  return false;
}

bool JsonConstraintState::Advance(std::string_view bytes) {
  if (ended_) return false;
  const Machine machine(*program_);
  StackSet current;
  size_t i = 0;
  if (stacks_.size() == 1) {
    // The usual case, one configuration: step it in place until (if ever) an anyOf branches.
    FrameStack stack = stacks_.front();
    for (; i < bytes.size(); ++i) {
      current.clear();
      machine.Step(stack, static_cast<uint8_t>(bytes[i]), current);
      if (current.empty()) return false;
      if (current.size() > 1) break;
      stack = current.front();
    }
    if (i == bytes.size()) {
      stacks_.front() = stack;
      return true;
    }
    ++i;  // `current` holds the branches after byte i
  } else {
    current = stacks_;
  }
  StackSet next;
  for (; i < bytes.size(); ++i) {
    json_constraint_internal::StepSet(machine, current, static_cast<uint8_t>(bytes[i]), next);
    if (next.empty()) return false;
    std::swap(current, next);
  }
  stacks_ = std::move(current);
  return true;
}

bool JsonConstraintState::Advance(const TokenVocabulary& vocabulary, int32_t id) {
  if (ended_ || id < 0 || id >= vocabulary.size()) return false;
  if (vocabulary.IsEndOfGeneration(id)) {
    if (!IsComplete()) return false;
    ended_ = true;
    return true;
  }
  const std::string_view piece = vocabulary.piece(id);
  if (piece.empty()) return false;
  return Advance(piece);
}

void JsonConstraintState::Allowed(const TokenVocabulary& vocabulary,
                                  std::vector<uint64_t>& bitmask) const {
  bitmask.assign(vocabulary.mask_words(), 0);
  if (ended_) return;
  if (IsComplete()) {
    for (const int32_t id : vocabulary.end_of_generation_ids()) {
      bitmask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
  }
  // Inside a string, most tokens are plain text: their bits come precomputed, and the walk
  // visits only the subtrees that hold a quote, a backslash, a control byte or a byte that
  // is not plain UTF-8.
  const FrameStack& first = stacks_.front();
  const bool plain_string = stacks_.size() == 1 &&
                            first.top().kind == json_constraint_internal::kString &&
                            first.top().flags == 0;
  if (plain_string) {
    for (size_t i = 0; i < bitmask.size(); ++i) bitmask[i] |= vocabulary.string_safe_mask_[i];
  }
  thread_local std::vector<StackSet> levels;
  if (levels.size() < vocabulary.max_piece_length_ + 1) {
    levels.resize(vocabulary.max_piece_length_ + 1);
  }
  levels[0] = stacks_;
  Walk(vocabulary, 0, 0, plain_string, levels, bitmask);
}

void JsonConstraintState::Walk(const TokenVocabulary& vocabulary, uint32_t node, size_t level,
                               bool skip_string_safe, std::vector<StackSet>& levels,
                               std::vector<uint64_t>& bitmask) const {
  const Machine machine(*program_);
  const TokenVocabulary::TrieNode& parent = vocabulary.trie_[node];
  for (uint32_t c = parent.first_child; c < parent.first_child + parent.child_count; ++c) {
    const TokenVocabulary::TrieNode& child = vocabulary.trie_[c];
    if (skip_string_safe && child.string_safe) continue;
    StackSet& next = levels[level + 1];
    json_constraint_internal::StepSet(machine, levels[level], child.byte, next);
    if (next.empty()) continue;
    for (uint32_t t = child.tokens_begin; t < child.tokens_end; ++t) {
      const int32_t id = vocabulary.sorted_tokens_[t];
      bitmask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
    if (child.child_count > 0) {
      Walk(vocabulary, c, level + 1, skip_string_safe, levels, bitmask);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TokenVocabulary

absl::StatusOr<TokenVocabulary> TokenVocabulary::Create(
    std::vector<std::string> pieces, std::vector<int32_t> end_of_generation_ids) {
  TokenVocabulary vocabulary;
  const size_t size = pieces.size();
  if (size > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("TokenVocabulary: too many tokens");
  }
  vocabulary.pieces_ = std::move(pieces);
  vocabulary.is_end_.assign(size, 0);
  for (const int32_t id : end_of_generation_ids) {
    if (id < 0 || static_cast<size_t>(id) >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("TokenVocabulary: end-of-generation id ", id, " outside [0, ", size, ")"));
    }
    if (!vocabulary.is_end_[static_cast<size_t>(id)]) vocabulary.end_ids_.push_back(id);
    vocabulary.is_end_[static_cast<size_t>(id)] = 1;
  }

  // Tokens that may appear inside JSON, sorted by piece: every trie node's subtree is then a
  // contiguous range, and the tokens ending at a node open it.
  std::vector<int32_t>& sorted = vocabulary.sorted_tokens_;
  for (size_t id = 0; id < size; ++id) {
    if (!vocabulary.pieces_[id].empty() && !vocabulary.is_end_[id]) {
      sorted.push_back(static_cast<int32_t>(id));
      vocabulary.max_piece_length_ =
          std::max(vocabulary.max_piece_length_, vocabulary.pieces_[id].size());
    }
  }
  std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return vocabulary.pieces_[static_cast<size_t>(a)] < vocabulary.pieces_[static_cast<size_t>(b)];
  });

  // Which tokens stay inside a string read from its plain state: a closing quote after them
  // must complete the string. (Pieces that end inside an escape or a character count as not
  // safe; the walk then decides them.)
  auto string_constraint = JsonConstraint::FromSchema(nlohmann::ordered_json{{"type", "string"}});
  if (!string_constraint.ok()) return string_constraint.status();
  JsonConstraintState in_string = string_constraint->Start();
  in_string.Advance("\"");
  std::vector<uint32_t> unsafe_before(sorted.size() + 1, 0);
  vocabulary.string_safe_mask_.assign(vocabulary.mask_words(), 0);
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t id = sorted[i];
    JsonConstraintState copy = in_string;
    const bool safe = copy.Advance(vocabulary.pieces_[static_cast<size_t>(id)]) &&
                      copy.Advance("\"") && copy.IsComplete();
    if (safe) {
      vocabulary.string_safe_mask_[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
    unsafe_before[i + 1] = unsafe_before[i] + (safe ? 0 : 1);
  }

  // Breadth first: a node's children are created together, so they are contiguous.
  struct Pending {
    uint32_t node;
    uint32_t begin;  // range of `sorted` below the node
    uint32_t end;
    uint32_t depth;  // the node's prefix length
  };
  std::vector<TrieNode>& trie = vocabulary.trie_;
  trie.emplace_back();
  std::vector<Pending> queue = {{0, 0, static_cast<uint32_t>(sorted.size()), 0}};
  for (size_t head = 0; head < queue.size(); ++head) {
    const Pending pending = queue[head];
    auto piece_of = [&](uint32_t i) -> const std::string& {
      return vocabulary.pieces_[static_cast<size_t>(sorted[i])];
    };
    uint32_t i = pending.begin;
    while (i < pending.end && piece_of(i).size() == pending.depth) ++i;
    trie[pending.node].tokens_begin = pending.begin;
    trie[pending.node].tokens_end = i;
    trie[pending.node].string_safe = unsafe_before[pending.end] == unsafe_before[pending.begin];
    trie[pending.node].first_child = static_cast<uint32_t>(trie.size());
    while (i < pending.end) {
      const uint8_t b = static_cast<uint8_t>(piece_of(i)[pending.depth]);
      uint32_t j = i;
      while (j < pending.end && static_cast<uint8_t>(piece_of(j)[pending.depth]) == b) ++j;
      const uint32_t child = static_cast<uint32_t>(trie.size());
      trie.emplace_back();
      trie[child].byte = b;
      ++trie[pending.node].child_count;
      queue.push_back({child, i, j, pending.depth + 1});
      i = j;
    }
  }
  return vocabulary;
}

}  // namespace bitsplit::text
