#include "common/text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace bitsplit::text::jinja {

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (Equals(k, key)) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

std::vector<uint32_t> DecodeUtf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    int extra = byte >= 0xf0 ? 3 : byte >= 0xe0 ? 2 : byte >= 0xc0 ? 1 : 0;
    uint32_t cp = extra == 3 ? byte & 0x07 : extra == 2 ? byte & 0x0f : byte & 0x1f;
    bool valid = extra > 0 && byte < 0xf8 && i + extra < text.size();
    if (valid) {
      for (int k = 1; k <= extra; ++k) {
        const auto next = static_cast<unsigned char>(text[i + k]);
        if ((next & 0xc0) != 0x80) {
          valid = false;
          break;
        }
        cp = (cp << 6) | (next & 0x3f);
      }
    }
    if (!valid) {
      out.push_back(byte);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& code_points) {
  std::string out;
  for (uint32_t cp : code_points) AppendUtf8(cp, out);
  return out;
}

bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

namespace {

// Python's str.isprintable(), for the characters templates and chats contain: control
// characters, separators other than the space, and the common invisible format characters are
// not printable.
bool IsPrintable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f)) {
    return false;
  }
  if ((cp >= 0x205f && cp <= 0x2064) || cp == 0x3000 || cp == 0xfeff) return false;
  return true;
}

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : DecodeUtf8(s)) {
    if (cp == '\\' || cp == static_cast<uint32_t>(quote)) {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!IsPrintable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    } else {
      AppendUtf8(cp, out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string ContainerRepr(const Value& value) {
  std::string out;
  if (value.is_list()) {
    out = value.is_tuple() ? "(" : "[";
    bool first = true;
    for (const Value& item : value.as_list()) {
      if (!first) out += ", ";
      first = false;
      out += item.Repr();
    }
    if (value.is_tuple()) return out + (value.as_list().size() == 1 ? ",)" : ")");
    return out + "]";
  }
  out = value.is_namespace() ? "<Namespace {" : "{";
  bool first = true;
  for (const auto& [key, item] : value.as_dict().items) {
    if (!first) out += ", ";
    first = false;
    out += key.Repr() + ": " + item.Repr();
  }
  return out + (value.is_namespace() ? "}>" : "}");
}

}  // namespace

std::string FloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02", shortest digits that read back
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  exponent < 0 ? -exponent : exponent);
    return out + exp_buf;
  }
  if (exponent < 0) {
    return out + "0." + std::string(-exponent - 1, '0') + digits;
  }
  const size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

Value Value::Generator(List items) {
  auto state = std::make_shared<GeneratorState>();
  state->items = std::move(items);
  return Value(std::move(state));
}

Value::List Value::ConsumeGenerator() const {
  GeneratorState& state = *std::get<GeneratorPtr>(data_);
  List rest(state.items.begin() + state.position, state.items.end());
  state.position = state.items.size();
  return rest;
}

Value Value::NextOfGenerator() const {
  GeneratorState& state = *std::get<GeneratorPtr>(data_);
  if (state.position == state.items.size()) return Undefined("generator exhausted");
  return state.items[state.position++];
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_double() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return is_namespace() || !as_dict().items.empty();
    case Kind::kCallable:
    case Kind::kGenerator:
      return true;
  }
  return false;
}

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return FloatRepr(as_double());
    case Kind::kString:
      return StringRepr(as_string());
    case Kind::kList:
    case Kind::kDict:
      return ContainerRepr(*this);
    case Kind::kCallable:
      return "<function>";
    case Kind::kGenerator:
      return "<generator object>";
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return is_namespace() ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
    case Kind::kGenerator:
      return "generator";
  }
  return "";
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.as_dict() == &b.as_dict();
      const auto& x = a.as_dict().items;
      if (x.size() != b.as_dict().items.size()) return false;
      for (const auto& [key, value] : x) {
        const Value* other = b.as_dict().Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    case Value::Kind::kGenerator:
      return false;
    default:
      return false;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

namespace {

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (uint32_t cp : DecodeUtf8(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char buf[16];
    if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    } else {
      AppendUtf8(cp, out);
    }
  }
  out.push_back('"');
}

absl::Status AppendJson(const Value& value, const JsonOptions& options, int depth,
                        std::string& out) {
  auto newline = [&](int level) {
    if (!options.indent) return;
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *options.indent;
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      out += value.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      out += std::to_string(value.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = value.as_double();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : FloatRepr(d);
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(value.as_string(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const auto& list = value.as_list();
      if (list.empty()) {
        out += "[]";
        return absl::OkStatus();
      }
      out.push_back('[');
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += options.item_separator;
        newline(depth + 1);
        if (auto status = AppendJson(list[i], options, depth + 1, out); !status.ok()) {
          return status;
        }
      }
      newline(depth);
      out.push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      auto items = value.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return absl::OkStatus();
      }
      if (options.sort_keys) {
        // As sorted(d.items()): by the keys themselves, so 2 before 10.
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
          auto less = Less(a.first, b.first);
          return less.ok() && *less;
        });
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += options.item_separator;
        newline(depth + 1);
        // json.dumps writes other keys as JSON strings of their JSON form (1 -> "1").
        const Value& key = items[i].first;
        if (key.is_string()) {
          AppendJsonString(key.as_string(), options.ensure_ascii, out);
        } else if (key.is_number() || key.is_none()) {
          auto text = ToJson(key, options);
          if (!text.ok()) return text.status();
          AppendJsonString(*text, options.ensure_ascii, out);
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("keys must be str, int, float, bool or None, not ", key.TypeName()));
        }
        out += options.key_separator;
        if (auto status = AppendJson(items[i].second, options, depth + 1, out); !status.ok()) {
          return status;
        }
      }
      newline(depth);
      out.push_back('}');
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Object of type ", value.TypeName(), " is not JSON serializable"));
}

Value FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value::List list;
      for (const auto& item : json) list.push_back(FromJson(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items())
        dict.items.emplace_back(Value(key), FromJson(item));
      return Value(std::move(dict));
    }
    default:
      return Value::None();
  }
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  if (auto status = AppendJson(value, options, 0, out); !status.ok()) return status;
  return out;
}

absl::StatusOr<Value> ValueFromJson(std::string_view json_text) {
  auto json = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return FromJson(json);
}

}  // namespace bitsplit::text::jinja
