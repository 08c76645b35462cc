#pragma once
// The values a Jinja chat template computes with, with Python's semantics where they show in the
// rendered text: str() of numbers, booleans and None, repr() of strings inside containers,
// json.dumps as transformers' tojson calls it, truthiness and equality (True == 1).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace bitsplit::text::jinja {

class Value;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Callable = std::function<absl::StatusOr<Value>(const CallArgs&)>;

// A Python dict: insertion order is what json.dumps and iteration show. Keys are strings,
// numbers, booleans or None, equal as Python's (1, 1.0 and True are one key).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  // Jinja's namespace(): attributes assignable with {% set ns.name = ... %}; not a mapping.
  bool is_namespace = false;

  const Value* Find(const Value& key) const;
  void Set(Value key, Value value);
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable,
    kGenerator,
  };
  using List = std::vector<Value>;

  // Undefined, remembering what was looked up for the error an operation on it raises.
  Value() : data_(UndefinedName{}) {}
  static Value Undefined(std::string what) { return Value(UndefinedName{std::move(what)}); }
  static Value None() { return Value(NoneTag{}); }
  Value(bool b) : data_(b) {}                           // NOLINT(google-explicit-constructor)
  Value(int i) : data_(int64_t{i}) {}                   // NOLINT(google-explicit-constructor)
  Value(int64_t i) : data_(i) {}                        // NOLINT(google-explicit-constructor)
  Value(double d) : data_(d) {}                         // NOLINT(google-explicit-constructor)
  Value(std::string s) : data_(std::move(s)) {}         // NOLINT(google-explicit-constructor)
  Value(std::string_view s) : data_(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Value(const char* s) : data_(std::string(s)) {}       // NOLINT(google-explicit-constructor)
  Value(List list)                                      // NOLINT(google-explicit-constructor)
      : data_(std::make_shared<const List>(std::move(list))) {}
  Value(Dict dict)  // NOLINT(google-explicit-constructor)
      : data_(std::make_shared<Dict>(std::move(dict))) {}
  Value(Callable callable)  // NOLINT(google-explicit-constructor)
      : data_(std::make_shared<const Callable>(std::move(callable))) {}

  // Markup is a kind of string.
  Kind kind() const {
    if (is_markup()) return Kind::kString;
    if (is_tuple()) return Kind::kList;
    return static_cast<Kind>(data_.index());
  }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python's numbers: bool is an int.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict && !std::get<DictPtr>(data_)->is_namespace; }
  bool is_namespace() const {
    return kind() == Kind::kDict && std::get<DictPtr>(data_)->is_namespace;
  }
  bool is_callable() const { return kind() == Kind::kCallable; }
  // What jinja2's map, select, reject, selectattr, rejectattr and unique return: a Python
  // generator, iterable once, always true, without len() and not JSON serializable.
  bool is_generator() const { return kind() == Kind::kGenerator; }
  static Value Generator(List items);
  // markupsafe's Markup, what |safe and |escape return: a string that, concatenated with + to a
  // plain string, HTML-escapes the plain one (Markup.__add__), even without autoescaping.
  static Value Markup(std::string text) { return Value(MarkupText{std::move(text)}); }
  bool is_markup() const { return std::holds_alternative<MarkupText>(data_); }
  // A Python tuple (a tuple literal, the pairs of items() and dictsort): a list that repr()
  // writes in parentheses and that never equals a list.
  static Value Tuple(List items) {
    return Value(TupleItems{std::make_shared<const List>(std::move(items))});
  }
  bool is_tuple() const { return std::holds_alternative<TupleItems>(data_); }
  // The items not consumed yet, consuming them (a second loop over a generator is empty).
  List ConsumeGenerator() const;
  // The next item (Undefined at the end), as next(iter(g)).
  Value NextOfGenerator() const;

  bool as_bool() const { return std::get<bool>(data_); }
  // ints and bools as an integer.
  int64_t as_int() const { return is_bool() ? int64_t{as_bool()} : std::get<int64_t>(data_); }
  double as_double() const {
    return is_float() ? std::get<double>(data_) : static_cast<double>(as_int());
  }
  const std::string& as_string() const {
    return is_markup() ? std::get<MarkupText>(data_).text : std::get<std::string>(data_);
  }
  const List& as_list() const {
    return is_tuple() ? *std::get<TupleItems>(data_).items : *std::get<ListPtr>(data_);
  }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  // Namespaces are the one mutable value: every copy shares the attributes.
  Dict& mutable_namespace() const { return *std::get<DictPtr>(data_); }
  const Callable& as_callable() const { return *std::get<CallablePtr>(data_); }
  const std::string& undefined_name() const { return std::get<UndefinedName>(data_).name; }

  // Python's bool(x); Undefined is false.
  bool Truthy() const;
  // Python's str(x) (Undefined: ""), as {{ x }} renders it.
  std::string Str() const;
  // Python's repr(x).
  std::string Repr() const;
  // A name for error messages, as Python's type names read ("str", "dict", "NoneType").
  std::string TypeName() const;

 private:
  struct UndefinedName {
    std::string name;
  };
  struct NoneTag {};
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<Dict>;
  using CallablePtr = std::shared_ptr<const Callable>;
  struct GeneratorState {
    List items;
    size_t position = 0;
  };
  using GeneratorPtr = std::shared_ptr<GeneratorState>;
  struct TupleItems {
    ListPtr items;
  };
  struct MarkupText {
    std::string text;
  };

  explicit Value(UndefinedName u) : data_(std::move(u)) {}
  explicit Value(NoneTag n) : data_(n) {}
  explicit Value(GeneratorPtr g) : data_(std::move(g)) {}
  explicit Value(MarkupText m) : data_(std::move(m)) {}
  explicit Value(TupleItems t) : data_(std::move(t)) {}

  // The order of the alternatives is the order of Kind; MarkupText is a kString and TupleItems
  // a kList.
  std::variant<UndefinedName, NoneTag, bool, int64_t, double, std::string, ListPtr, DictPtr,
               CallablePtr, GeneratorPtr, MarkupText, TupleItems>
      data_;
};

// Python's ==, where 1 == 1.0 == True and containers compare element by element.
bool Equals(const Value& a, const Value& b);
// Python's <, for numbers, strings and lists; an error for anything else.
absl::StatusOr<bool> Less(const Value& a, const Value& b);

// Python's repr(float): the shortest digits that read back, "1.0", "1e+16", "inf".
std::string FloatRepr(double value);

struct JsonOptions {
  // json.dumps's indent: none (one line), a count of spaces, or a string.
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(x, ...) as Python writes it; an error for Undefined and callables.
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

// Converts parsed JSON text (e.g. a request's messages) to Values; objects keep their order.
absl::StatusOr<Value> ValueFromJson(std::string_view json_text);

// Code points of UTF-8 text (an invalid byte stands for itself, as U+DC80 + byte would in
// Python's surrogateescape, but keeping its value), and back.
std::vector<uint32_t> DecodeUtf8(std::string_view text);
void AppendUtf8(uint32_t code_point, std::string& out);
std::string EncodeUtf8(const std::vector<uint32_t>& code_points);
// Python's str.isspace() for one code point: what str.strip() and str.split() remove.
bool IsPythonSpace(uint32_t code_point);

}  // namespace bitsplit::text::jinja
