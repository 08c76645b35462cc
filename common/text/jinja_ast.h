#pragma once
// The parsed form of a Jinja template (jinja_parser.cc builds it, jinja.cc renders it).
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/jinja_value.h"

namespace bitsplit::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: the items
    kTuple,    // args: the items (rendered as a list)
    kDict,     // args: key, value, key, value, ...
    kGetAttr,  // args[0].name
    kGetItem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], a missing bound is null
    kCall,     // args[0](args[1:], kwargs)
    kFilter,   // args[0] | name(args[1:], kwargs); args[0] is null in a filter block
    kTest,     // args[0] is [not] name(args[1:])
    kNot,      // not args[0]
    kNegate,   // -args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kTernary,  // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  // 1 + the deepest child's
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body)...; else_body
    kFor,       // for targets in expr [if condition]: body; else_body
    kSet,       // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,  // set targets[0] %}body{% endset (expr: an optional filter applied to it)
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr (a kFilter with null input) over body
    kScope,        // a body rendered in place ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  // Jinja's default: a single newline at the end of the source is not rendered.
  bool keep_trailing_newline = false;
};

// Parses template source; errors name the line ("line 3: unexpected 'endfor'").
absl::StatusOr<Body> ParseTemplate(std::string_view source, const LexOptions& options);

}  // namespace bitsplit::text::jinja
