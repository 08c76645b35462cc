#include "common/text/jinja.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/jinja_ast.h"
#include "common/text/jinja_strings.h"
#include "common/util/status_macros.h"

namespace bitsplit::text::jinja {

struct Template::Parsed {
  Body body;
};

const std::set<std::string_view>& SupportedFilters() {
  static const std::set<std::string_view> kFilters = {
      "abs",    "capitalize", "count",      "d",        "default", "dictsort", "e",
      "escape", "first",      "float",      "format",   "indent",  "int",      "items",
      "join",   "last",       "length",     "list",     "lower",   "map",      "max",
      "min",    "reject",     "rejectattr", "replace",  "reverse", "round",    "safe",
      "select", "selectattr", "sort",       "string",   "sum",     "title",    "tojson",
      "trim",   "unique",     "upper",      "wordcount"};
  return kFilters;
}

const std::set<std::string_view>& SupportedTests() {
  static const std::set<std::string_view> kTests = {
      "boolean", "callable", "defined",  "divisibleby", "eq",          "equalto",
      "even",    "false",    "float",    "ge",          "greaterthan", "gt",
      "in",      "integer",  "iterable", "le",          "lessthan",    "lower",
      "lt",      "mapping",  "ne",       "none",        "number",      "odd",
      "sameas",  "sequence", "string",   "true",        "undefined",   "upper"};
  return kTests;
}

namespace {

absl::Status Error(const std::string& message) { return absl::InvalidArgumentError(message); }

// Errors from builtins learn their line where the expression that called them is evaluated.
absl::Status AtLine(absl::Status status, int line) {
  if (status.ok() || absl::StartsWith(status.message(), "line ")) return status;
  return absl::Status(status.code(), absl::StrCat("line ", line, ": ", status.message()));
}

absl::Status UndefinedError(const Value& value) {
  const std::string& name = value.undefined_name();
  return Error(name.empty() ? "value is undefined" : name);
}

// Arguments bound to a builtin's parameters by position or name, Python style.
class Args {
 public:
  Args(const CallArgs& call, std::vector<std::string_view> names, const std::string& function)
      : values_(names.size()) {
    for (size_t i = 0; i < call.positional.size(); ++i) {
      if (i >= names.size()) {
        error_ = Error(absl::StrCat(function, "() takes at most ", names.size(), " arguments"));
        return;
      }
      values_[i] = call.positional[i];
    }
    for (const auto& [key, value] : call.keyword) {
      auto it = std::find(names.begin(), names.end(), key);
      if (it == names.end()) {
        error_ = Error(absl::StrCat(function, "() got an unexpected keyword argument '", key, "'"));
        return;
      }
      values_[it - names.begin()] = value;
    }
  }
  const absl::Status& status() const { return error_; }
  bool has(size_t i) const { return values_[i].has_value(); }
  const Value& get(size_t i) const { return *values_[i]; }
  Value get_or(size_t i, Value fallback) const { return has(i) ? get(i) : std::move(fallback); }
  bool flag(size_t i, bool fallback) const { return has(i) ? get(i).Truthy() : fallback; }
  std::optional<std::string> opt_string(size_t i) const {
    if (!has(i) || get(i).is_none()) return std::nullopt;
    return get(i).Str();
  }

 private:
  std::vector<std::optional<Value>> values_;
  absl::Status error_;
};

// markupsafe.escape.
std::string HtmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

size_t PyLen(const Value& v) {
  if (v.is_string()) return PyLength(v.as_string());
  if (v.is_list()) return v.as_list().size();
  if (v.is_dict()) return v.as_dict().items.size();
  return 0;
}

// Iteration as Python's iter(): lists, dict keys, the characters of a string; Undefined is
// empty, as jinja2's Undefined iterates.
absl::StatusOr<Value::List> Iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_generator()) return v.ConsumeGenerator();
  if (v.is_undefined()) return Value::List{};
  if (v.is_dict()) {
    Value::List keys;
    for (const auto& [key, item] : v.as_dict().items) keys.emplace_back(key);
    return keys;
  }
  if (v.is_string()) {
    Value::List chars;
    for (uint32_t cp : DecodeUtf8(v.as_string())) {
      std::string c;
      AppendUtf8(cp, c);
      chars.emplace_back(std::move(c));
    }
    return chars;
  }
  return Error(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

// The attribute names that are methods of Python's dict, str and list: jinja2 looks an attribute
// up before an item, so `message.items` is the method even where the dict has an "items" key.
// Methods that mutate are found here and refused when called, as the immutable sandbox does.
bool IsMethodOf(const Value& v, std::string_view name) {
  static const std::vector<std::string_view> kDict = {
      "items", "keys", "values", "get", "pop", "update", "setdefault", "clear", "copy", "popitem"};
  static const std::vector<std::string_view> kString = {
      "strip",    "lstrip",    "rstrip",    "split",    "rsplit",       "startswith",
      "endswith", "upper",     "lower",     "title",    "capitalize",   "replace",
      "format",   "find",      "rfind",     "count",    "join",         "splitlines",
      "isdigit",  "isalpha",   "isalnum",   "isspace",  "isupper",      "islower",
      "index",    "center",    "zfill",     "casefold", "removeprefix", "removesuffix",
      "swapcase", "partition", "rpartition"};
  static const std::vector<std::string_view> kList = {"append", "pop",   "extend", "insert",
                                                      "remove", "clear", "sort",   "reverse",
                                                      "index",  "count", "copy"};
  const std::vector<std::string_view>* names = v.is_dict()     ? &kDict
                                               : v.is_string() ? &kString
                                               : v.is_list()   ? &kList
                                                               : nullptr;
  return names != nullptr && std::find(names->begin(), names->end(), name) != names->end();
}

std::optional<int64_t> NormalizeIndex(int64_t index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  if (index < 0 || index >= static_cast<int64_t>(size)) return std::nullopt;
  return index;
}

struct Frame {
  std::unordered_map<std::string, Value> vars;
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Template::Options& options, const Value& context) : options_(options) {
    if (context.is_dict()) {
      for (const auto& [key, value] : context.as_dict().items) root_.vars[key.Str()] = value;
    }
    chain_.push_back(&root_);
    InstallGlobals();
  }

  absl::Status Render(const Body& body, std::string& out) {
    auto flow = RenderBody(body, out);
    return flow.status();
  }

 private:
  void InstallGlobals() {
    globals_["raise_exception"] = Value(Callable([](const CallArgs& call) -> absl::StatusOr<Value> {
      return Error(call.positional.empty() ? "" : call.positional[0].Str());
    }));
    globals_["strftime_now"] =
        Value(Callable([this](const CallArgs& call) -> absl::StatusOr<Value> {
          if (call.positional.empty()) return Error("strftime_now() needs a format");
          std::tm now;
          if (options_.now) {
            now = *options_.now;
          } else {
            const std::time_t t = std::time(nullptr);
            localtime_r(&t, &now);
          }
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf), call.positional[0].Str().c_str(), &now);
          return Value(std::string(buf, n));
        }));
    globals_["namespace"] = Value(Callable([](const CallArgs& call) -> absl::StatusOr<Value> {
      Dict ns;
      ns.is_namespace = true;
      for (const Value& v : call.positional) {
        if (!v.is_dict()) return Error("namespace() takes a dict or keyword arguments");
        for (const auto& [key, item] : v.as_dict().items) ns.Set(key, item);
      }
      for (const auto& [key, item] : call.keyword) ns.Set(Value(key), item);
      return Value(std::move(ns));
    }));
    globals_["dict"] = Value(Callable([](const CallArgs& call) -> absl::StatusOr<Value> {
      Dict dict;
      for (const Value& v : call.positional) {
        if (!v.is_dict()) return Error("dict() takes a dict or keyword arguments");
        for (const auto& [key, item] : v.as_dict().items) dict.Set(key, item);
      }
      for (const auto& [key, item] : call.keyword) dict.Set(Value(key), item);
      return Value(std::move(dict));
    }));
    globals_["range"] = Value(Callable([](const CallArgs& call) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : call.positional) {
        if (!v.is_int() && !v.is_bool()) return Error("range() takes integers");
      }
      if (call.positional.size() == 1) {
        stop = call.positional[0].as_int();
      } else if (call.positional.size() == 2 || call.positional.size() == 3) {
        start = call.positional[0].as_int();
        stop = call.positional[1].as_int();
        if (call.positional.size() == 3) step = call.positional[2].as_int();
      } else {
        return Error("range() takes 1 to 3 arguments");
      }
      if (step == 0) return Error("range() arg 3 must not be zero");
      Value::List list;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        list.emplace_back(i);
        if (list.size() > 100000) return Error("range too big");
      }
      return Value(std::move(list));
    }));
  }

  Value Lookup(const std::string& name) const {
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it) {
      auto found = (*it)->vars.find(name);
      if (found != (*it)->vars.end()) return found->second;
    }
    if (auto found = globals_.find(name); found != globals_.end()) return found->second;
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  void Assign(const std::string& name, Value value) {
    chain_.back()->vars[name] = std::move(value);
  }

  absl::Status AssignTargets(const std::vector<std::string>& targets, const Value& value) {
    if (targets.size() == 1) {
      Assign(targets[0], value);
      return absl::OkStatus();
    }
    if (!value.is_list() && !value.is_dict() && !value.is_string() && !value.is_generator()) {
      return Error(absl::StrCat("cannot unpack non-iterable ", value.TypeName(), " object"));
    }
    BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(value));
    if (items.size() > targets.size()) {
      return Error(absl::StrCat("too many values to unpack (expected ", targets.size(), ")"));
    }
    if (items.size() < targets.size()) {
      return Error(absl::StrCat("not enough values to unpack (expected ", targets.size(), ", got ",
                                items.size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) Assign(targets[i], items[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> RenderBody(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      auto flow = RenderNode(*node, out);
      if (!flow.ok()) return AtLine(flow.status(), node->line);
      if (*flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> RenderNode(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::Kind::kText:
        out += node.text;
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        out += v.Str();
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          BITSPLIT_ASSIGN_OR_RETURN(Value c, Eval(*condition));
          if (c.Truthy()) return RenderBody(body, out);
        }
        return RenderBody(node.else_body, out);
      case Node::Kind::kFor:
        return RenderFor(node, out);
      case Node::Kind::kSet: {
        BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        if (!node.attribute.empty()) {
          Value target = Lookup(node.targets[0]);
          if (!target.is_namespace()) {
            return Error("cannot assign attribute on non-namespace object");
          }
          target.mutable_namespace().Set(Value(node.attribute), std::move(v));
          return Flow::kNormal;
        }
        BITSPLIT_RETURN_IF_ERROR(AssignTargets(node.targets, v));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        BITSPLIT_ASSIGN_OR_RETURN(Flow flow, RenderBody(node.body, captured));
        (void)flow;
        Value v(std::move(captured));
        if (node.expr) {
          BITSPLIT_ASSIGN_OR_RETURN(v, EvalWithBlockInput(*node.expr, v));
        }
        Assign(node.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        Assign(node.name, MakeMacro(node));
        return Flow::kNormal;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kFilterBlock: {
        std::string captured;
        BITSPLIT_ASSIGN_OR_RETURN(Flow flow, RenderBody(node.body, captured));
        (void)flow;
        BITSPLIT_ASSIGN_OR_RETURN(Value v,
                                  EvalWithBlockInput(*node.expr, Value(std::move(captured))));
        out += v.Str();
        return Flow::kNormal;
      }
      case Node::Kind::kScope:
        return RenderBody(node.body, out);
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> EvalWithBlockInput(const Expr& filter, const Value& input) {
    const Value* saved = block_input_;
    block_input_ = &input;
    auto v = Eval(filter);
    block_input_ = saved;
    return v;
  }

  absl::StatusOr<Flow> RenderFor(const Node& node, std::string& out) {
    BITSPLIT_ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    BITSPLIT_ASSIGN_OR_RETURN(Value::List all, Iterate(iterable));
    Frame frame;
    chain_.push_back(&frame);
    struct Pop {
      std::vector<Frame*>& chain;
      ~Pop() { chain.pop_back(); }
    } pop{chain_};
    Value::List items;
    if (node.condition) {
      for (const Value& item : all) {
        BITSPLIT_RETURN_IF_ERROR(AssignTargets(node.targets, item));
        BITSPLIT_ASSIGN_OR_RETURN(Value keep, Eval(*node.condition));
        if (keep.Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      // What one iteration sets, the next does not see: jinja2 starts each from the loop's
      // enclosing scope.
      frame.vars.clear();
      BITSPLIT_RETURN_IF_ERROR(AssignTargets(node.targets, items[i]));
      Dict loop;
      loop.items = {{"index0", Value(i)},
                    {"index", Value(i + 1)},
                    {"revindex0", Value(n - i - 1)},
                    {"revindex", Value(n - i)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"depth", Value(1)},
                    {"depth0", Value(0)},
                    {"previtem", i > 0 ? items[i - 1] : Value::Undefined("no previous item")},
                    {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("no next item")}};
      loop.items.emplace_back("cycle",
                              Value(Callable([i](const CallArgs& call) -> absl::StatusOr<Value> {
                                if (call.positional.empty())
                                  return Error("no items for cycling given");
                                return call.positional[i % call.positional.size()];
                              })));
      frame.vars["loop"] = Value(std::move(loop));
      BITSPLIT_ASSIGN_OR_RETURN(Flow flow, RenderBody(node.body, out));
      if (flow == Flow::kBreak) break;
    }
    if (n == 0) {
      BITSPLIT_ASSIGN_OR_RETURN(Flow flow, RenderBody(node.else_body, out));
      (void)flow;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& node) {
    return Value(Callable([this, &node](const CallArgs& call) -> absl::StatusOr<Value> {
      // A macro that recurses over its data (a JSON schema, say) is bounded, as Python's
      // recursion limit bounds jinja2, before it exhausts the stack.
      if (macro_depth_ >= kMaxMacroDepth) return Error("maximum macro recursion depth exceeded");
      ++macro_depth_;
      struct Unwind {
        int& depth;
        ~Unwind() { --depth; }
      } unwind{macro_depth_};
      if (call.positional.size() > node.params.size()) {
        return Error(absl::StrCat("macro '", node.name, "' takes not more than ",
                                  node.params.size(), " argument(s)"));
      }
      Frame frame;
      std::vector<Frame*> saved = chain_;
      chain_ = {&root_, &frame};
      struct Restore {
        std::vector<Frame*>& chain;
        std::vector<Frame*> saved;
        ~Restore() { chain = saved; }
      } restore{chain_, saved};
      for (size_t i = 0; i < node.params.size(); ++i) {
        // Named members, not a structured binding: clang before 16 cannot capture one.
        const std::string& name = node.params[i].first;
        const auto& default_value = node.params[i].second;
        if (i < call.positional.size()) {
          frame.vars[name] = call.positional[i];
          continue;
        }
        auto kw = std::find_if(call.keyword.begin(), call.keyword.end(),
                               [&](const auto& p) { return p.first == name; });
        if (kw != call.keyword.end()) {
          frame.vars[name] = kw->second;
        } else if (default_value) {
          BITSPLIT_ASSIGN_OR_RETURN(frame.vars[name], Eval(*default_value));
        } else {
          frame.vars[name] = Value::Undefined(absl::StrCat("'", name, "' is undefined"));
        }
      }
      for (const auto& keyword : call.keyword) {
        const std::string& key = keyword.first;
        if (std::none_of(node.params.begin(), node.params.end(),
                         [&](const auto& p) { return p.first == key; })) {
          return Error(
              absl::StrCat("macro '", node.name, "' takes no keyword argument '", key, "'"));
        }
      }
      std::string out;
      BITSPLIT_ASSIGN_OR_RETURN(Flow flow, RenderBody(node.body, out));
      (void)flow;
      return Value(std::move(out));
    }));
  }

  // ---- expressions ----

  absl::StatusOr<Value> Eval(const Expr& e) {
    auto v = EvalInner(e);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Value::List list;
        for (const ExprPtr& item : e.args) {
          BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*item));
          list.push_back(std::move(v));
        }
        if (e.kind == Expr::Kind::kTuple) return Value::Tuple(std::move(list));
        return Value(std::move(list));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          BITSPLIT_ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          BITSPLIT_ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
          if (!key.is_string() && !key.is_number() && !key.is_none()) {
            return Error(absl::StrCat("unhashable type: '", key.TypeName(), "'"));
          }
          dict.Set(std::move(key), std::move(value));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        BITSPLIT_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
        return GetAttr(object, e.name);
      }
      case Expr::Kind::kGetItem: {
        BITSPLIT_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
        BITSPLIT_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(object, key);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall: {
        BITSPLIT_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
        BITSPLIT_ASSIGN_OR_RETURN(CallArgs call, EvalArgs(e));
        if (callee.is_undefined()) return UndefinedError(callee);
        if (!callee.is_callable()) {
          return Error(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
        }
        return callee.as_callable()(call);
      }
      case Expr::Kind::kFilter: {
        Value input;
        if (e.args[0]) {
          BITSPLIT_ASSIGN_OR_RETURN(input, Eval(*e.args[0]));
        } else {
          input = *block_input_;
        }
        BITSPLIT_ASSIGN_OR_RETURN(CallArgs call, EvalArgs(e));
        return ApplyFilter(e.name, input, call);
      }
      case Expr::Kind::kTest: {
        BITSPLIT_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0]));
        BITSPLIT_ASSIGN_OR_RETURN(CallArgs call, EvalArgs(e));
        BITSPLIT_ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, input, call.positional));
        return Value(result != e.negated);
      }
      case Expr::Kind::kNot: {
        BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value(!v.Truthy());
      }
      case Expr::Kind::kNegate: {
        BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_float()) return Value(-v.as_double());
        if (v.is_int() || v.is_bool()) return Value(-v.as_int());
        if (v.is_undefined()) return UndefinedError(v);
        return Error(absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
      }
      case Expr::Kind::kBinary: {
        BITSPLIT_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        BITSPLIT_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return Binary(e.name, a, b);
      }
      case Expr::Kind::kAnd: {
        BITSPLIT_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (!a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kOr: {
        BITSPLIT_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kCompare: {
        BITSPLIT_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          BITSPLIT_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          BITSPLIT_ASSIGN_OR_RETURN(bool holds, Compare(e.ops[i], left, right));
          if (!holds) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kTernary: {
        BITSPLIT_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
        if (c.Truthy()) return Eval(*e.args[1]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined("the conditional expression had no else");
      }
    }
    return Error("unknown expression");
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e) {
    CallArgs call;
    for (size_t i = 1; i < e.args.size(); ++i) {
      BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      call.positional.push_back(std::move(v));
    }
    for (const auto& [name, expr] : e.kwargs) {
      BITSPLIT_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      call.keyword.emplace_back(name, std::move(v));
    }
    return call;
  }

  // jinja2's getattr: the attribute (a method) first, then the item.
  absl::StatusOr<Value> GetAttr(const Value& object, const std::string& name) {
    if (object.is_undefined()) return UndefinedError(object);
    if (object.is_namespace()) {
      if (const Value* v = object.as_dict().Find(Value(name))) return *v;
      return MissingAttribute(object, Value(name));
    }
    if (IsMethodOf(object, name)) return BoundMethod(object, name);
    if (object.is_dict()) {
      if (const Value* v = object.as_dict().Find(Value(name))) return *v;
    }
    return MissingAttribute(object, Value(name));
  }

  // jinja2's object_type_repr: None is "None", anything else "<type> object".
  static std::string ObjectTypeRepr(const Value& object) {
    return object.is_none() ? "None" : object.TypeName() + " object";
  }

  // The Undefined of a failed lookup, with jinja2's message for when it is used.
  static Value MissingAttribute(const Value& object, const Value& key) {
    if (key.is_string()) {
      return Value::Undefined(
          absl::StrCat("'", ObjectTypeRepr(object), "' has no attribute ", key.Repr()));
    }
    return Value::Undefined(absl::StrCat(ObjectTypeRepr(object), " has no element ", key.Repr()));
  }

  // jinja2's getitem: the item first, then the attribute.
  absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
    if (object.is_undefined()) return UndefinedError(object);
    if (object.is_dict()) {
      if (const Value* v = object.as_dict().Find(key)) return *v;
    }
    if (key.is_string()) {
      if (object.is_namespace()) {
        if (const Value* v = object.as_dict().Find(key)) return *v;
      }
      if (!object.is_namespace() && IsMethodOf(object, key.as_string())) {
        return BoundMethod(object, key.as_string());
      }
      return MissingAttribute(object, key);
    }
    if (key.is_int() || key.is_bool()) {
      if (object.is_list()) {
        if (auto i = NormalizeIndex(key.as_int(), object.as_list().size())) {
          return object.as_list()[*i];
        }
      } else if (object.is_string()) {
        const std::vector<uint32_t> cps = DecodeUtf8(object.as_string());
        if (auto i = NormalizeIndex(key.as_int(), cps.size())) {
          std::string c;
          AppendUtf8(cps[*i], c);
          return Value(std::move(c));
        }
      }
    }
    return MissingAttribute(object, key);
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    BITSPLIT_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
    std::optional<int64_t> bounds[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      BITSPLIT_ASSIGN_OR_RETURN(Value b, Eval(*e.args[k + 1]));
      if (b.is_none()) continue;
      if (!b.is_int() && !b.is_bool()) return Error("slice indices must be integers or None");
      bounds[k] = b.as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return Error("slice step cannot be zero");
    std::vector<Value> elements;
    std::vector<uint32_t> cps;
    int64_t n;
    if (object.is_list()) {
      n = static_cast<int64_t>(object.as_list().size());
    } else if (object.is_string()) {
      cps = DecodeUtf8(object.as_string());
      n = static_cast<int64_t>(cps.size());
    } else if (object.is_undefined()) {
      return UndefinedError(object);
    } else {
      return Error(absl::StrCat("'", object.TypeName(), "' object is not subscriptable"));
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> b, int64_t fallback) {
      if (!b) return fallback;
      int64_t v = *b;
      if (v < 0) {
        v += n;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= n) {
        v = step < 0 ? n - 1 : n;
      }
      return v;
    };
    const int64_t start = clamp(bounds[0], step < 0 ? n - 1 : 0);
    const int64_t stop = clamp(bounds[1], step < 0 ? -1 : n);
    Value::List list;
    std::vector<uint32_t> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (object.is_list()) {
        list.push_back(object.as_list()[i]);
      } else {
        picked.push_back(cps[i]);
      }
    }
    if (object.is_list()) return Value(std::move(list));
    return Value(EncodeUtf8(picked));
  }

  absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value(a.Str() + b.Str());
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    const bool numbers = a.is_number() && b.is_number();
    const bool floats = numbers && (a.is_float() || b.is_float());
    auto type_error = [&]() {
      return Error(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
    };
    if (op == "+") {
      if (a.is_string() && b.is_string() && (a.is_markup() || b.is_markup())) {
        const std::string left = a.is_markup() ? a.as_string() : HtmlEscape(a.as_string());
        const std::string right = b.is_markup() ? b.as_string() : HtmlEscape(b.as_string());
        return Value::Markup(left + right);
      }
      if (numbers)
        return floats ? Value(a.as_double() + b.as_double()) : Value(a.as_int() + b.as_int());
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        Value::List list = a.as_list();
        list.insert(list.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(list));
      }
      if (a.is_string() || a.is_list()) {
        const std::string type = a.is_string() ? "str" : a.is_tuple() ? "tuple" : "list";
        return Error(
            absl::StrCat("can only concatenate ", type, " (not \"", b.TypeName(), "\") to ", type));
      }
      return type_error();
    }
    if (op == "-") {
      if (!numbers) return type_error();
      return floats ? Value(a.as_double() - b.as_double()) : Value(a.as_int() - b.as_int());
    }
    if (op == "*") {
      if (numbers)
        return floats ? Value(a.as_double() * b.as_double()) : Value(a.as_int() * b.as_int());
      const Value* seq = a.is_string() || a.is_list() ? &a : &b;
      const Value* count = seq == &a ? &b : &a;
      if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
        if (seq->is_string()) {
          std::string out;
          for (int64_t i = 0; i < count->as_int(); ++i) out += seq->as_string();
          return Value(std::move(out));
        }
        Value::List list;
        for (int64_t i = 0; i < count->as_int(); ++i) {
          list.insert(list.end(), seq->as_list().begin(), seq->as_list().end());
        }
        return Value(std::move(list));
      }
      return type_error();
    }
    if (!numbers) {
      if (op == "%" && a.is_string()) {
        // A tuple supplies the arguments; anything else (a list too) is the one argument.
        return PercentFormat(a.as_string(), b.is_tuple() ? b.as_list() : Value::List{b});
      }
      return type_error();
    }
    if (op == "/") {
      if (b.as_double() == 0) return Error("division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) return Error("integer division or modulo by zero");
      if (floats) {
        const double q = std::floor(a.as_double() / b.as_double());
        return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
      }
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (!floats && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    return type_error();
  }

  absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string()) {
        return Error(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    }
    if (container.is_generator()) {
      // Consumes the generator (all of it, where Python stops at the first match).
      return Contains(Value(container.ConsumeGenerator()), item);
    }
    if (container.is_list()) {
      for (const Value& v : container.as_list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    }
    if (container.is_dict()) {
      return container.as_dict().Find(item) != nullptr;
    }
    if (container.is_undefined()) return false;
    return Error(absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equals(a, b);
    if (op == "!=") return !Equals(a, b);
    if (op == "in") return Contains(b, a);
    if (op == "notin") {
      BITSPLIT_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    if (op == "<") return Less(a, b);
    if (op == ">") return Less(b, a);
    if (op == "<=") {
      BITSPLIT_ASSIGN_OR_RETURN(bool greater, Less(b, a));
      return !greater;
    }
    if (op == ">=") {
      BITSPLIT_ASSIGN_OR_RETURN(bool less, Less(a, b));
      return !less;
    }
    return Error(absl::StrCat("unknown comparison ", op));
  }

  // ---- methods ----

  Value BoundMethod(const Value& object, const std::string& name) {
    return Value(Callable([this, object, name](const CallArgs& call) -> absl::StatusOr<Value> {
      return CallMethod(object, name, call);
    }));
  }

  absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name,
                                   const CallArgs& call) {
    if (object.is_dict()) return DictMethod(object, name, call);
    if (object.is_string()) return StringMethod(object.as_string(), name, call);
    if (object.is_list()) {
      if (name == "index" || name == "count") {
        if (call.positional.size() != 1) return Error(absl::StrCat(name, "() takes 1 argument"));
        int64_t count = 0;
        const auto& list = object.as_list();
        for (size_t i = 0; i < list.size(); ++i) {
          if (!Equals(list[i], call.positional[0])) continue;
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++count;
        }
        if (name == "index") return Error("value is not in list");
        return Value(count);
      }
      if (name == "copy") return object;
    }
    return Error(absl::StrCat("access to attribute '", name, "' of '", object.TypeName(),
                              "' object is unsafe."));
  }

  absl::StatusOr<Value> DictMethod(const Value& object, const std::string& name,
                                   const CallArgs& call) {
    const Dict& dict = object.as_dict();
    if (name == "get") {
      Args args(call, {"key", "default"}, "get");
      BITSPLIT_RETURN_IF_ERROR(args.status());
      if (!args.has(0)) return Error("get() takes at least 1 argument");
      if (const Value* v = dict.Find(args.get(0))) return *v;
      return args.get_or(1, Value::None());
    }
    if (name == "items") {
      Value::List items;
      for (const auto& [key, value] : dict.items) items.push_back(Value::Tuple({key, value}));
      return Value(std::move(items));
    }
    if (name == "keys") {
      Value::List keys;
      for (const auto& [key, value] : dict.items) keys.emplace_back(key);
      return Value(std::move(keys));
    }
    if (name == "values") {
      Value::List values;
      for (const auto& [key, value] : dict.items) values.push_back(value);
      return Value(std::move(values));
    }
    if (name == "copy") return object;
    return Error(absl::StrCat("access to attribute '", name, "' of 'dict' object is unsafe."));
  }

  static absl::StatusOr<std::string> StringArg(const Args& args, size_t i, const std::string& fn) {
    if (!args.has(i) || !args.get(i).is_string()) {
      return Error(absl::StrCat(fn, "() argument must be str"));
    }
    return args.get(i).as_string();
  }

  absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name,
                                     const CallArgs& call) {
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Args args(call, {"chars"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      const StripSide side = name == "strip"    ? StripSide::kBoth
                             : name == "lstrip" ? StripSide::kLeft
                                                : StripSide::kRight;
      return Value(PyStrip(s, args.opt_string(0), side));
    }
    if (name == "split" || name == "rsplit") {
      Args args(call, {"sep", "maxsplit"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      const std::optional<std::string> sep = args.opt_string(0);
      if (sep && sep->empty()) return Error("empty separator");
      const long long maxsplit = args.has(1) ? args.get(1).as_int() : -1;
      Value::List list;
      for (auto& piece : name == "split" ? PySplit(s, sep, maxsplit) : PyRSplit(s, sep, maxsplit)) {
        list.emplace_back(std::move(piece));
      }
      return Value(std::move(list));
    }
    if (name == "startswith" || name == "endswith") {
      if (call.positional.size() != 1) return Error(absl::StrCat(name, "() takes 1 argument"));
      const Value& arg = call.positional[0];
      Value::List candidates = arg.is_list() ? arg.as_list() : Value::List{arg};
      for (const Value& c : candidates) {
        if (!c.is_string()) return Error(absl::StrCat(name, "() argument must be str"));
        if (name == "startswith" ? absl::StartsWith(s, c.as_string())
                                 : absl::EndsWith(s, c.as_string())) {
          return Value(true);
        }
      }
      return Value(false);
    }
    if (name == "upper") return Value(PyUpper(s));
    if (name == "lower" || name == "casefold") return Value(PyLower(s));
    if (name == "title") return Value(PyTitle(s));
    if (name == "capitalize") return Value(PyCapitalize(s));
    if (name == "replace") {
      Args args(call, {"old", "new", "count"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(std::string old, StringArg(args, 0, name));
      BITSPLIT_ASSIGN_OR_RETURN(std::string replacement, StringArg(args, 1, name));
      return Value(PyReplace(s, old, replacement, args.has(2) ? args.get(2).as_int() : -1));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      Args args(call, {"sub"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(std::string sub, StringArg(args, 0, name));
      if (name == "count") return Value(static_cast<int64_t>(PyCount(s, sub)));
      const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name == "index") return Error("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(PyLength(std::string_view(s).substr(0, at))));
    }
    if (name == "join") {
      if (call.positional.size() != 1) return Error("join() takes 1 argument");
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(call.positional[0]));
      std::vector<std::string> parts;
      for (const Value& v : items) {
        if (!v.is_string()) return Error("sequence item: expected str instance");
        parts.push_back(v.as_string());
      }
      return Value(absl::StrJoin(parts, s));
    }
    if (name == "splitlines") {
      Value::List list;
      for (auto& line : PySplitlines(s)) list.emplace_back(std::move(line));
      return Value(std::move(list));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      Args args(call, {"affix"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(std::string affix, StringArg(args, 0, name));
      if (name == "removeprefix" && absl::StartsWith(s, affix))
        return Value(s.substr(affix.size()));
      if (name == "removesuffix" && absl::EndsWith(s, affix)) {
        return Value(s.substr(0, s.size() - affix.size()));
      }
      return Value(s);
    }
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
        name == "isupper" || name == "islower") {
      return Value(StringPredicate(s, name));
    }
    if (name == "format") return Format(s, call);
    return Error(absl::StrCat("str.", name, "() is not supported"));
  }

  static bool StringPredicate(const std::string& s, const std::string& name) {
    if (s.empty()) return false;
    bool any_cased = false;
    for (uint32_t cp : DecodeUtf8(s)) {
      const bool digit = cp >= '0' && cp <= '9';
      const bool upper = IsUpperLetter(cp);
      const bool lower = IsLowerLetter(cp);
      if (name == "isdigit" && !digit) return false;
      if (name == "isalpha" && !(upper || lower)) return false;
      if (name == "isalnum" && !(upper || lower || digit)) return false;
      if (name == "isspace" && !IsPythonSpace(cp)) return false;
      if (name == "isupper" && lower) return false;
      if (name == "islower" && upper) return false;
      any_cased = any_cased || upper || lower;
    }
    return (name != "isupper" && name != "islower") || any_cased;
  }

  // str.format with {}, {0} and {name} fields and the !s/!r conversions.
  absl::StatusOr<Value> Format(const std::string& s, const CallArgs& call) {
    std::string out;
    size_t next_auto = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '}') {
        if (i + 1 < s.size() && s[i + 1] == '}') ++i;
        out.push_back('}');
        continue;
      }
      if (c != '{') {
        out.push_back(c);
        continue;
      }
      if (i + 1 < s.size() && s[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      const size_t close = s.find('}', i);
      if (close == std::string::npos) return Error("Single '{' encountered in format string");
      std::string field = s.substr(i + 1, close - i - 1);
      i = close;
      char conversion = 's';
      if (size_t bang = field.find('!'); bang != std::string::npos) {
        conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
        field.resize(bang);
      }
      if (field.find(':') != std::string::npos)
        return Error("str.format: format specs are not supported");
      Value v;
      if (field.empty()) {
        if (next_auto >= call.positional.size()) return Error("Replacement index out of range");
        v = call.positional[next_auto++];
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t index = std::stoul(field);
        if (index >= call.positional.size()) return Error("Replacement index out of range");
        v = call.positional[index];
      } else {
        auto kw = std::find_if(call.keyword.begin(), call.keyword.end(),
                               [&](const auto& p) { return p.first == field; });
        if (kw == call.keyword.end()) return Error(absl::StrCat("KeyError: '", field, "'"));
        v = kw->second;
      }
      out += conversion == 'r' ? v.Repr() : v.Str();
    }
    return Value(std::move(out));
  }

  // Python's printf-style str % args for the conversions s r a d i u x X o f F e E g G and %%,
  // with flags, width and precision; mapping keys and '*' widths are refused.
  static absl::StatusOr<Value> PercentFormat(const std::string& format, const Value::List& args) {
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < format.size(); ++i) {
      if (format[i] != '%') {
        out.push_back(format[i]);
        continue;
      }
      if (++i >= format.size()) return Error("incomplete format");
      if (format[i] == '%') {
        out.push_back('%');
        continue;
      }
      if (format[i] == '(' || format[i] == '*') {
        return Error("% formatting with mapping keys or '*' is not supported");
      }
      std::string flags;
      while (i < format.size() && std::string_view("-+ 0#").find(format[i]) != std::string::npos) {
        flags.push_back(format[i++]);
      }
      std::string width;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9')
        width.push_back(format[i++]);
      std::optional<size_t> precision;
      if (i < format.size() && format[i] == '.') {
        std::string digits;
        for (++i; i < format.size() && format[i] >= '0' && format[i] <= '9'; ++i) {
          digits.push_back(format[i]);
        }
        precision = digits.empty() ? 0 : std::stoul(digits);
      }
      while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
      if (i >= format.size()) return Error("incomplete format");
      const char conversion = format[i];
      if (next >= args.size()) return Error("not enough arguments for format string");
      const Value& arg = args[next++];
      if (conversion == 's' || conversion == 'r' || conversion == 'a') {
        std::vector<uint32_t> cps = DecodeUtf8(conversion == 's' ? arg.Str() : arg.Repr());
        if (precision && cps.size() > *precision) cps.resize(*precision);
        const size_t w = width.empty() ? 0 : std::stoul(width);
        const std::string padding(w > cps.size() ? w - cps.size() : 0, ' ');
        const bool left = flags.find('-') != std::string::npos;
        out += (left ? "" : padding) + EncodeUtf8(cps) + (left ? padding : "");
        continue;
      }
      const bool integer = std::string_view("diuxXo").find(conversion) != std::string::npos;
      const bool real = std::string_view("fFeEgG").find(conversion) != std::string::npos;
      if (!integer && !real) {
        return Error(
            absl::StrCat("unsupported format character '", std::string(1, conversion), "'"));
      }
      const bool needs_integer = conversion == 'x' || conversion == 'X' || conversion == 'o';
      if (!arg.is_number() || (needs_integer && arg.is_float())) {
        return Error(absl::StrCat("%", std::string(1, conversion),
                                  " format: ", needs_integer ? "an integer" : "a real number",
                                  " is required, not ", arg.TypeName()));
      }
      if (conversion == 'o' && flags.find('#') != std::string::npos) {
        return Error("%#o is not supported");
      }
      std::string spec = "%" + flags + width;
      if (precision) spec += "." + std::to_string(*precision);
      char buf[512];
      if (integer) {
        const long long n = arg.is_float() ? static_cast<long long>(arg.as_double()) : arg.as_int();
        spec += std::string("ll") + (conversion == 'i' || conversion == 'u' ? 'd' : conversion);
        std::snprintf(buf, sizeof(buf), spec.c_str(), n);
      } else {
        spec.push_back(conversion);
        std::snprintf(buf, sizeof(buf), spec.c_str(), arg.as_double());
      }
      out += buf;
    }
    if (next < args.size()) return Error("not all arguments converted during string formatting");
    return Value(std::move(out));
  }

  // ---- tests ----

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v,
                                 const std::vector<Value>& args) {
    auto arg = [&]() -> absl::StatusOr<Value> {
      if (args.empty()) return Error(absl::StrCat("test '", name, "' needs an argument"));
      return args[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") {
      return v.is_list() || v.is_dict() || v.is_string() || v.is_generator() || v.is_undefined();
    }
    if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "callable") return v.is_callable();
    if (name == "eq" || name == "equalto" || name == "sameas") {
      BITSPLIT_ASSIGN_OR_RETURN(Value other, arg());
      return Equals(v, other);
    }
    if (name == "ne") {
      BITSPLIT_ASSIGN_OR_RETURN(Value other, arg());
      return !Equals(v, other);
    }
    if (name == "lt" || name == "lessthan" || name == "gt" || name == "greaterthan" ||
        name == "le" || name == "ge") {
      BITSPLIT_ASSIGN_OR_RETURN(Value other, arg());
      const std::string op = name == "lt" || name == "lessthan"      ? "<"
                             : name == "gt" || name == "greaterthan" ? ">"
                             : name == "le"                          ? "<="
                                                                     : ">=";
      return Compare(op, v, other);
    }
    if (name == "in") {
      BITSPLIT_ASSIGN_OR_RETURN(Value other, arg());
      return Contains(other, v);
    }
    if (name == "odd" || name == "even") {
      if (!v.is_int() && !v.is_bool()) return Error("odd/even need an integer");
      return (v.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      BITSPLIT_ASSIGN_OR_RETURN(Value other, arg());
      if (other.as_int() == 0) return Error("integer division or modulo by zero");
      return v.as_int() % other.as_int() == 0;
    }
    if (name == "lower" || name == "upper") {
      return StringPredicate(v.Str(), name == "lower" ? "islower" : "isupper");
    }
    return Error(absl::StrCat("No test named '", name, "' found."));
  }

  // ---- filters ----

  // The attribute getter of map/selectattr/sort: dotted names, each an item lookup.
  absl::StatusOr<Value> Attribute(const Value& v, const std::string& path) {
    Value current = v;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      Value key = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; })
                      ? Value(static_cast<int64_t>(std::stoll(part)))
                      : Value(part);
      BITSPLIT_ASSIGN_OR_RETURN(current, GetItem(current, key));
      if (dot == std::string::npos) return current;
      start = dot + 1;
    }
  }

  // Sort keys as jinja2 builds them: strings lowered unless case_sensitive.
  static Value SortKey(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value(PyLower(v.as_string()));
    return v;
  }

  std::function<absl::StatusOr<Value>(const Value&)> KeyOf(std::optional<std::string> attribute,
                                                           bool case_sensitive) {
    return [this, attribute, case_sensitive](const Value& item) -> absl::StatusOr<Value> {
      if (!attribute) return SortKey(item, case_sensitive);
      absl::StatusOr<Value> k = Attribute(item, *attribute);
      if (!k.ok()) return k;
      return SortKey(*k, case_sensitive);
    };
  }

  absl::StatusOr<Value::List> SortedBy(
      Value::List items, bool reverse,
      const std::function<absl::StatusOr<Value>(const Value&)>& key) {
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& item : items) {
      BITSPLIT_ASSIGN_OR_RETURN(Value k, key(item));
      keyed.emplace_back(std::move(k), std::move(item));
    }
    absl::Status error;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      auto less = reverse ? Less(b.first, a.first) : Less(a.first, b.first);
      if (!less.ok()) {
        error = less.status();
        return false;
      }
      return *less;
    });
    BITSPLIT_RETURN_IF_ERROR(error);
    Value::List out;
    for (auto& [k, item] : keyed) out.push_back(std::move(item));
    return out;
  }

  absl::StatusOr<Value> Select(const Value& input, const CallArgs& call, bool by_attribute,
                               bool keep_when) {
    // jinja2 selects from a false value (None, an empty list) nothing, without iterating it.
    if (!input.Truthy()) return Value::Generator({});
    BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(input));
    size_t first_test_arg = by_attribute ? 1 : 0;
    if (by_attribute && call.positional.empty()) return Error("selectattr needs an attribute");
    std::optional<std::string> test;
    if (call.positional.size() > first_test_arg) test = call.positional[first_test_arg].Str();
    std::vector<Value> test_args(
        call.positional.begin() + std::min(call.positional.size(), first_test_arg + 1),
        call.positional.end());
    Value::List out;
    for (const Value& item : items) {
      Value subject = item;
      if (by_attribute) {
        BITSPLIT_ASSIGN_OR_RETURN(subject, Attribute(item, call.positional[0].Str()));
      }
      bool passes;
      if (test) {
        BITSPLIT_ASSIGN_OR_RETURN(passes, ApplyTest(*test, subject, test_args));
      } else {
        passes = subject.Truthy();
      }
      if (passes == keep_when) out.push_back(item);
    }
    return Value::Generator(std::move(out));
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const CallArgs& call) {
    if (name == "length" || name == "count") {
      if (!v.is_string() && !v.is_list() && !v.is_dict() && !v.is_undefined()) {
        return Error(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
      }
      return Value(static_cast<int64_t>(PyLen(v)));
    }
    if (name == "trim") {
      Args args(call, {"chars"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      return Value(PyStrip(v.Str(), args.opt_string(0), StripSide::kBoth));
    }
    if (name == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      Args args(call, {"ensure_ascii", "indent", "separators", "sort_keys"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      JsonOptions options;
      options.ensure_ascii = args.flag(0, false);
      options.sort_keys = args.flag(3, false);
      if (args.has(1) && !args.get(1).is_none()) {
        const Value& indent = args.get(1);
        if (indent.is_string()) {
          options.indent = indent.as_string();
        } else {
          options.indent = std::string(std::max<int64_t>(0, indent.as_int()), ' ');
        }
        options.item_separator = ",";
      }
      if (args.has(2) && !args.get(2).is_none()) {
        const Value& separators = args.get(2);
        if (!separators.is_list() || separators.as_list().size() != 2) {
          return Error("tojson separators must be a pair");
        }
        options.item_separator = separators.as_list()[0].Str();
        options.key_separator = separators.as_list()[1].Str();
      }
      if (v.is_undefined()) return Error("Object of type Undefined is not JSON serializable");
      BITSPLIT_ASSIGN_OR_RETURN(std::string json, ToJson(v, options));
      return Value(std::move(json));
    }
    if (name == "join") {
      Args args(call, {"d", "attribute"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      std::string out;
      const std::string separator = args.has(0) ? args.get(0).Str() : "";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += separator;
        Value item = items[i];
        if (args.has(1)) {
          BITSPLIT_ASSIGN_OR_RETURN(item, Attribute(item, args.get(1).Str()));
        }
        out += item.Str();
      }
      return Value(std::move(out));
    }
    if (name == "first" || name == "last") {
      if (v.is_generator()) {
        if (name == "last") return Error("'generator' object is not reversible");
        return v.NextOfGenerator();
      }
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      if (items.empty())
        return Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty."));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "default" || name == "d") {
      Args args(call, {"default_value", "boolean"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      const bool use_default = args.flag(1, false) ? !v.Truthy() : v.is_undefined();
      return use_default ? args.get_or(0, Value("")) : v;
    }
    if (name == "list") {
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      return Value(std::move(items));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value(Value::List{});
      if (!v.is_dict()) return Error("Can only get item pairs from a mapping.");
      return DictMethod(v, "items", {});
    }
    if (name == "map") {
      if (!v.Truthy()) return Value::Generator({});
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      Value::List out;
      std::optional<std::string> attribute;
      std::optional<Value> fallback;
      for (const auto& [key, value] : call.keyword) {
        if (key == "attribute") attribute = value.Str();
        if (key == "default") fallback = value;
      }
      for (const Value& item : items) {
        if (attribute) {
          BITSPLIT_ASSIGN_OR_RETURN(Value mapped, Attribute(item, *attribute));
          if (mapped.is_undefined() && fallback) mapped = *fallback;
          out.push_back(std::move(mapped));
          continue;
        }
        if (call.positional.empty()) return Error("map needs a filter name or an attribute");
        CallArgs rest;
        rest.positional.assign(call.positional.begin() + 1, call.positional.end());
        BITSPLIT_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(call.positional[0].Str(), item, rest));
        out.push_back(std::move(mapped));
      }
      return Value::Generator(std::move(out));
    }
    if (name == "selectattr") return Select(v, call, true, true);
    if (name == "rejectattr") return Select(v, call, true, false);
    if (name == "select") return Select(v, call, false, true);
    if (name == "reject") return Select(v, call, false, false);
    if (name == "upper") return Value(PyUpper(v.Str()));
    if (name == "lower") return Value(PyLower(v.Str()));
    if (name == "capitalize") return Value(PyCapitalize(v.Str()));
    if (name == "title") return Value(JinjaTitle(v.Str()));
    if (name == "replace") {
      Args args(call, {"old", "new", "count"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      if (!args.has(0) || !args.has(1)) return Error("replace needs old and new");
      return Value(PyReplace(v.Str(), args.get(0).Str(), args.get(1).Str(),
                             args.has(2) && !args.get(2).is_none() ? args.get(2).as_int() : -1));
    }
    if (name == "string") return Value(v.Str());
    if (name == "safe") return v.is_markup() ? v : Value::Markup(v.Str());
    if (name == "escape" || name == "e") {
      return v.is_markup() ? v : Value::Markup(HtmlEscape(v.Str()));
    }
    if (name == "int" || name == "float") {
      Args args(call, {"default", "base"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      const Value fallback = args.get_or(0, name == "int" ? Value(0) : Value(0.0));
      double d;
      if (v.is_number()) {
        d = v.as_double();
        if (name == "int") return v.is_float() ? Value(static_cast<int64_t>(d)) : Value(v.as_int());
        return Value(d);
      }
      if (!v.is_string()) return fallback;
      const std::string text = PyStrip(v.as_string(), std::nullopt, StripSide::kBoth);
      try {
        size_t used = 0;
        if (name == "int") {
          const long long i = std::stoll(text, &used);
          if (used == text.size()) return Value(static_cast<int64_t>(i));
        }
        d = std::stod(text, &used);
        if (used != text.size()) return fallback;
      } catch (...) {
        return fallback;
      }
      return name == "int" ? Value(static_cast<int64_t>(d)) : Value(d);
    }
    if (name == "abs") {
      if (v.is_float()) return Value(std::fabs(v.as_double()));
      if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      return Error("abs needs a number");
    }
    if (name == "dictsort") {
      Args args(call, {"case_sensitive", "by", "reverse"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      if (!v.is_dict()) return Error("dictsort needs a mapping");
      BITSPLIT_ASSIGN_OR_RETURN(Value items, DictMethod(v, "items", {}));
      const bool case_sensitive = args.flag(0, false);
      const int by = args.has(1) && args.get(1).Str() == "value" ? 1 : 0;
      BITSPLIT_ASSIGN_OR_RETURN(Value::List sorted,
                                SortedBy(items.as_list(), args.flag(2, false),
                                         [&](const Value& pair) -> absl::StatusOr<Value> {
                                           return SortKey(pair.as_list()[by], case_sensitive);
                                         }));
      return Value(std::move(sorted));
    }
    if (name == "sort") {
      Args args(call, {"reverse", "case_sensitive", "attribute"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      const bool case_sensitive = args.flag(1, false);
      const std::optional<std::string> attribute = args.opt_string(2);
      BITSPLIT_ASSIGN_OR_RETURN(Value::List sorted, SortedBy(std::move(items), args.flag(0, false),
                                                             KeyOf(attribute, case_sensitive)));
      return Value(std::move(sorted));
    }
    if (name == "unique") {
      Args args(call, {"case_sensitive", "attribute"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      Value::List out;
      std::vector<Value> seen;
      for (const Value& item : items) {
        Value k = item;
        if (args.opt_string(1)) {
          BITSPLIT_ASSIGN_OR_RETURN(k, Attribute(item, *args.opt_string(1)));
        }
        k = SortKey(k, args.flag(0, false));
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, k); })) {
          continue;
        }
        seen.push_back(k);
        out.push_back(item);
      }
      return Value::Generator(std::move(out));
    }
    if (name == "min" || name == "max") {
      Args args(call, {"case_sensitive", "attribute"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      if (items.empty())
        return Value::Undefined(absl::StrCat("No aggregated item, sequence was empty."));
      const std::optional<std::string> attribute = args.opt_string(1);
      BITSPLIT_ASSIGN_OR_RETURN(
          Value::List sorted,
          SortedBy(std::move(items), name == "max", KeyOf(attribute, args.flag(0, false))));
      return sorted.front();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::vector<uint32_t> cps = DecodeUtf8(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value(EncodeUtf8(cps));
      }
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      std::reverse(items.begin(), items.end());
      return Value(std::move(items));
    }
    if (name == "sum") {
      Args args(call, {"attribute", "start"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      BITSPLIT_ASSIGN_OR_RETURN(Value::List items, Iterate(v));
      Value total = args.get_or(1, Value(0));
      for (const Value& item : items) {
        Value term = item;
        if (args.opt_string(0)) {
          BITSPLIT_ASSIGN_OR_RETURN(term, Attribute(item, *args.opt_string(0)));
        }
        BITSPLIT_ASSIGN_OR_RETURN(total, Binary("+", total, term));
      }
      return total;
    }
    if (name == "indent") {
      Args args(call, {"width", "first", "blank"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      std::string indentation = "    ";
      if (args.has(0)) {
        indentation = args.get(0).is_string()
                          ? args.get(0).as_string()
                          : std::string(std::max<int64_t>(0, args.get(0).as_int()), ' ');
      }
      // jinja2 appends a newline before splitting, so a trailing newline is not indented.
      const std::vector<std::string> lines = PySplitlines(v.Str() + "\n");
      std::string out;
      if (args.flag(2, false)) {
        out = absl::StrJoin(lines, "\n" + indentation);
      } else {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (i > 0) out += "\n" + (lines[i].empty() ? "" : indentation);
          out += lines[i];
        }
      }
      if (args.flag(1, false)) out = indentation + out;
      return Value(std::move(out));
    }
    if (name == "format") {
      if (!call.keyword.empty()) return Error("format with keyword arguments is not supported");
      return PercentFormat(v.Str(), call.positional);
    }
    if (name == "wordcount") {
      return Value(static_cast<int64_t>(PySplit(v.Str(), std::nullopt, -1).size()));
    }
    if (name == "round") {
      Args args(call, {"precision", "method"}, name);
      BITSPLIT_RETURN_IF_ERROR(args.status());
      if (!v.is_number()) return Error("round needs a number");
      const double scale = std::pow(10.0, args.has(0) ? args.get(0).as_int() : 0);
      return Value(std::nearbyint(v.as_double() * scale) / scale);
    }
    return Error(absl::StrCat("No filter named '", name, "' found."));
  }

  const Template::Options& options_;
  Frame root_;
  std::unordered_map<std::string, Value> globals_;
  std::vector<Frame*> chain_;
  const Value* block_input_ = nullptr;
  static constexpr int kMaxMacroDepth = 100;
  int macro_depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source, Options options) {
  LexOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  auto body = ParseTemplate(source, lex);
  if (!body.ok()) return body.status();
  auto parsed = std::make_shared<Parsed>();
  parsed->body = std::move(*body);
  return Template(std::move(parsed), std::move(options));
}

absl::StatusOr<std::string> Template::Render(const Value& context) const {
  if (!context.is_dict()) return absl::InvalidArgumentError("the context must be a dict");
  Renderer renderer(options_, context);
  std::string out;
  if (auto status = renderer.Render(parsed_->body, out); !status.ok()) return status;
  return out;
}

namespace {

void CollectUnknown(const Expr* e, std::set<std::string>& unknown) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kFilter && !SupportedFilters().count(e->name)) {
    unknown.insert("filter '" + e->name + "'");
  }
  if (e->kind == Expr::Kind::kTest && !SupportedTests().count(e->name)) {
    unknown.insert("test '" + e->name + "'");
  }
  for (const ExprPtr& child : e->args) CollectUnknown(child.get(), unknown);
  for (const auto& [name, child] : e->kwargs) CollectUnknown(child.get(), unknown);
}

void CollectUnknown(const Body& body, std::set<std::string>& unknown) {
  for (const NodePtr& node : body) {
    CollectUnknown(node->expr.get(), unknown);
    CollectUnknown(node->condition.get(), unknown);
    for (const auto& [condition, branch] : node->branches) {
      CollectUnknown(condition.get(), unknown);
      CollectUnknown(branch, unknown);
    }
    for (const auto& [name, default_value] : node->params) {
      CollectUnknown(default_value.get(), unknown);
    }
    CollectUnknown(node->body, unknown);
    CollectUnknown(node->else_body, unknown);
  }
}

}  // namespace

std::vector<std::string> Template::UnknownNames() const {
  std::set<std::string> unknown;
  CollectUnknown(parsed_->body, unknown);
  return std::vector<std::string>(unknown.begin(), unknown.end());
}

absl::StatusOr<std::string> RenderChatTemplate(std::string_view source, const Value& context) {
  auto parsed = Template::Parse(source);
  if (!parsed.ok()) return parsed.status();
  return parsed->Render(context);
}

}  // namespace bitsplit::text::jinja
