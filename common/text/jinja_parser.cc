// The lexer follows jinja2's (jinja2/lexer.py): newlines normalized, whitespace control with
// '-', trim_blocks (one newline after a block or comment tag) and lstrip_blocks (spaces and tabs
// before a block or comment tag that starts its line); the parser follows jinja2's precedence
// (jinja2/parser.py), so that the same source means the same thing.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/text/jinja_ast.h"

namespace bitsplit::text::jinja {
namespace {

enum class TokenType {
  kText,
  kBlockBegin,
  kBlockEnd,
  kVarBegin,
  kVarEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line;
};

absl::Status ErrorAt(int line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

// jinja2's newline_re: \r\n, \r and \n are line breaks (U+2028 and the other separators of
// str.splitlines() are not).
size_t LineBreakLength(std::string_view s, size_t i) {
  if (s[i] == '\r') return i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
  return s[i] == '\n' ? 1 : 0;
}

// Every line break as \n, the final one dropped unless kept, as jinja2's lexer does.
std::string NormalizeNewlines(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  bool ended_with_break = false;
  for (size_t i = 0; i < source.size();) {
    if (size_t n = LineBreakLength(source, i); n > 0) {
      out.push_back('\n');
      i += n;
      ended_with_break = true;
    } else {
      out.push_back(source[i]);
      ++i;
      ended_with_break = false;
    }
  }
  if (ended_with_break && !keep_trailing_newline) out.pop_back();
  return out;
}

std::string RstripPython(std::string_view text) {
  std::vector<uint32_t> cps = DecodeUtf8(text);
  while (!cps.empty() && IsPythonSpace(cps.back())) cps.pop_back();
  return EncodeUtf8(cps);
}

// The length of the Python-whitespace prefix of text (in bytes).
size_t PythonSpacePrefix(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    if (i + len > text.size()) break;
    const std::vector<uint32_t> cp = DecodeUtf8(text.substr(i, len));
    if (cp.size() != 1 || !IsPythonSpace(cp[0])) break;
    i += len;
  }
  return i;
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options)
      : src_(std::move(source)), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        Emit(TokenType::kText, text, pos_);
        break;
      }
      const char opener = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = RstripPython(text);
      } else if (sign != '+' && options_.lstrip_blocks && opener != '{') {
        const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_begin > 0 || line_starting) &&
            text.find_first_not_of(" \t", line_begin) == std::string::npos) {
          text.resize(line_begin);
        }
      }
      Emit(TokenType::kText, text, pos_);
      pos_ = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      absl::Status status;
      if (opener == '#') {
        status = LexComment();
      } else if (opener == '%' && IsRawBegin()) {
        status = LexRaw();
      } else {
        status = LexTag(opener == '%');
      }
      if (!status.ok()) return status;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({TokenType::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void Emit(TokenType type, std::string value, size_t at) {
    if (type == TokenType::kText && value.empty()) return;
    tokens_.push_back({type, std::move(value), LineAt(at)});
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  // After a tag's closing delimiter: '-' strips all whitespace, trim_blocks one newline.
  void AfterTagEnd(bool minus, bool trims) {
    if (minus) {
      pos_ += PythonSpacePrefix(std::string_view(src_).substr(pos_));
    } else if (trims && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  absl::Status LexComment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return ErrorAt(LineAt(pos_), "unclosed comment");
    const bool minus = end > pos_ && src_[end - 1] == '-';
    pos_ = end + 2;
    AfterTagEnd(minus, true);
    return absl::OkStatus();
  }

  static size_t SkipSpaces(std::string_view s, size_t i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
    return i;
  }

  bool IsRawBegin() const {
    size_t i = SkipSpaces(src_, pos_);
    if (src_.compare(i, 3, "raw") != 0) return false;
    i = SkipSpaces(src_, i + 3);
    return src_.compare(i, 2, "%}") == 0 || src_.compare(i, 3, "-%}") == 0;
  }

  absl::Status LexRaw() {
    size_t i = SkipSpaces(src_, SkipSpaces(src_, pos_) + 3);
    const bool begin_minus = src_[i] == '-';
    pos_ = i + (begin_minus ? 3 : 2);
    if (begin_minus) pos_ += PythonSpacePrefix(std::string_view(src_).substr(pos_));
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t j = at + 2;
      const bool end_minus = j < src_.size() && src_[j] == '-';
      if (end_minus || (j < src_.size() && src_[j] == '+')) ++j;
      j = SkipSpaces(src_, j);
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j = SkipSpaces(src_, j + 6);
      const bool close_minus = src_.compare(j, 3, "-%}") == 0;
      if (!close_minus && src_.compare(j, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      if (end_minus) text = RstripPython(text);
      Emit(TokenType::kText, text, pos_);
      pos_ = j + (close_minus ? 3 : 2);
      AfterTagEnd(close_minus, true);
      return absl::OkStatus();
    }
    return ErrorAt(LineAt(pos_), "missing endraw");
  }

  absl::Status LexTag(bool block) {
    Emit(block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", pos_);
    int braces = 0;  // '{' of dict literals, so that their '}' does not end the tag
    while (true) {
      pos_ = SkipSpaces(src_, pos_);
      if (pos_ >= src_.size()) return ErrorAt(LineAt(pos_), "unclosed tag");
      const std::string_view rest = std::string_view(src_).substr(pos_);
      const std::string_view close = block ? "%}" : "}}";
      if (braces == 0 && (rest.starts_with(close) || (rest.size() > 2 && rest[0] == '-' &&
                                                      rest.substr(1).starts_with(close)))) {
        const bool minus = rest[0] == '-';
        Emit(block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", pos_);
        pos_ += close.size() + (minus ? 1 : 0);
        AfterTagEnd(minus, block);
        return absl::OkStatus();
      }
      const char c = rest[0];
      if (IsNameStart(c)) {
        size_t n = 1;
        while (n < rest.size() && (IsNameStart(rest[n]) || IsDigit(rest[n]))) ++n;
        Emit(TokenType::kName, std::string(rest.substr(0, n)), pos_);
        pos_ += n;
      } else if (IsDigit(c)) {
        size_t n = 0;
        while (n < rest.size() && (IsDigit(rest[n]) || rest[n] == '_')) ++n;
        bool is_float = false;
        if (n + 1 < rest.size() && rest[n] == '.' && IsDigit(rest[n + 1])) {
          is_float = true;
          ++n;
          while (n < rest.size() && (IsDigit(rest[n]) || rest[n] == '_')) ++n;
        }
        if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t m = n + 1;
          if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
          if (m < rest.size() && IsDigit(rest[m])) {
            is_float = true;
            n = m;
            while (n < rest.size() && IsDigit(rest[n])) ++n;
          }
        }
        std::string number(rest.substr(0, n));
        std::erase(number, '_');
        Emit(is_float ? TokenType::kFloat : TokenType::kInt, number, pos_);
        pos_ += n;
      } else if (c == '\'' || c == '"') {
        auto literal = LexString(c);
        if (!literal.ok()) return literal.status();
      } else {
        static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
        size_t n = 1;
        for (std::string_view op : kTwoChar) {
          if (rest.starts_with(op)) n = 2;
        }
        if (n == 1 && std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
          return ErrorAt(LineAt(pos_),
                         absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        if (c == '{') ++braces;
        if (c == '}') --braces;
        Emit(TokenType::kOp, std::string(rest.substr(0, n)), pos_);
        pos_ += n;
      }
    }
  }

  // A quoted string with Python's unicode-escape decoding of its backslashes, as jinja2 reads it.
  absl::StatusOr<bool> LexString(char quote) {
    const size_t start = pos_;
    std::string value;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) return ErrorAt(LineAt(start), "unterminated string");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        value.push_back(c);
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      auto hex = [&](int digits) -> std::optional<uint32_t> {
        if (i + digits > src_.size()) return std::nullopt;
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          const char h = src_[i + k];
          v <<= 4;
          if (IsDigit(h)) {
            v |= h - '0';
          } else if (h >= 'a' && h <= 'f') {
            v |= h - 'a' + 10;
          } else if (h >= 'A' && h <= 'F') {
            v |= h - 'A' + 10;
          } else {
            return std::nullopt;
          }
        }
        i += digits;
        return v;
      };
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case '\n':
          break;  // a backslash at the end of a line joins the lines
        case 'x':
        case 'u':
        case 'U': {
          auto v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (!v) return ErrorAt(LineAt(start), "truncated \\x, \\u or \\U escape in a string");
          AppendUtf8(*v, value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              v = v * 8 + (src_[i++] - '0');
            }
            AppendUtf8(v, value);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    Emit(TokenType::kString, value, start);
    pos_ = i + 1;
    return true;
  }

  std::string src_;
  LexOptions options_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    auto body = ParseBody({}, end);
    if (!body.ok()) return body.status();
    return std::move(*body);
  }

 private:
  const Token& Cur() const { return tokens_[index_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  void Next() {
    if (index_ + 1 < tokens_.size()) ++index_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == TokenType::kOp && Cur().value == op; }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kEof:
        return "end of template";
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }
  absl::Status Unexpected() const {
    return ErrorAt(Cur().line, absl::StrCat("unexpected ", Describe(Cur())));
  }
  absl::Status ExpectOp(const std::string& op) {
    if (!IsOp(op)) {
      return ErrorAt(Cur().line, absl::StrCat("expected '", op, "', got ", Describe(Cur())));
    }
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) {
      return ErrorAt(Cur().line,
                     absl::StrCat("expected end of statement block, got ", Describe(Cur())));
    }
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) {
      return ErrorAt(Cur().line, absl::StrCat("expected a name, got ", Describe(Cur())));
    }
    std::string name = Cur().value;
    Next();
    return name;
  }

  // Parses nodes until a block tag named in `ends` (left unconsumed after its {%, its name in
  // `found`) or the end of the template (only allowed when `ends` is empty).
  absl::StatusOr<Body> ParseBody(const std::set<std::string>& ends, std::string& found) {
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == TokenType::kEof) {
        if (!ends.empty()) {
          return ErrorAt(
              t.line, absl::StrCat("unexpected end of template, expected '", *ends.begin(), "'"));
        }
        return body;
      }
      if (t.type == TokenType::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = t.line;
        node->text = t.value;
        body.push_back(std::move(node));
        Next();
        continue;
      }
      if (t.type == TokenType::kVarBegin) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = t.line;
        Next();
        auto expr = ParseTuple(true);
        if (!expr.ok()) return expr.status();
        node->expr = std::move(*expr);
        if (Cur().type != TokenType::kVarEnd) {
          return ErrorAt(Cur().line,
                         absl::StrCat("expected end of print statement, got ", Describe(Cur())));
        }
        Next();
        body.push_back(std::move(node));
        continue;
      }
      if (t.type != TokenType::kBlockBegin) return Unexpected();
      const Token& keyword = Peek();
      if (keyword.type == TokenType::kName && ends.count(keyword.value)) {
        found = keyword.value;
        Next();  // {%; the caller consumes the name
        return body;
      }
      Next();
      auto node = ParseStatement();
      if (!node.ok()) return node.status();
      body.push_back(std::move(*node));
    }
  }

  absl::StatusOr<Body> ParseBlockUntil(const std::set<std::string>& ends, std::string& found) {
    auto body = ParseBody(ends, found);
    if (!body.ok()) return body.status();
    Next();  // the end tag's name
    return body;
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    auto node = std::make_unique<Node>();
    node->line = Cur().line;
    NestingGuard guard(depth_);
    if (depth_ > kMaxNesting) return ErrorAt(node->line, "blocks nested too deeply");
    if (Cur().type != TokenType::kName) return Unexpected();
    const std::string keyword = Cur().value;
    Next();
    std::string found;
    if (keyword == "if") {
      node->kind = Node::Kind::kIf;
      while (true) {
        auto condition = ParseExpression(true);
        if (!condition.ok()) return condition.status();
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        auto body = ParseBlockUntil({"elif", "else", "endif"}, found);
        if (!body.ok()) return body.status();
        node->branches.emplace_back(std::move(*condition), std::move(*body));
        if (found != "elif") break;
      }
      if (found == "else") {
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        auto body = ParseBlockUntil({"endif"}, found);
        if (!body.ok()) return body.status();
        node->else_body = std::move(*body);
      }
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "for") {
      node->kind = Node::Kind::kFor;
      while (true) {
        auto name = ExpectName();
        if (!name.ok()) return name.status();
        node->targets.push_back(*name);
        if (!IsOp(",")) break;
        Next();
      }
      if (!IsName("in")) return ErrorAt(Cur().line, "expected 'in' in a for loop");
      Next();
      auto iterable = ParseTuple(false);
      if (!iterable.ok()) return iterable.status();
      node->expr = std::move(*iterable);
      if (IsName("if")) {
        Next();
        auto condition = ParseExpression(true);
        if (!condition.ok()) return condition.status();
        node->condition = std::move(*condition);
      }
      if (IsName("recursive")) return ErrorAt(Cur().line, "recursive loops are not supported");
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      auto body = ParseBlockUntil({"else", "endfor"}, found);
      if (!body.ok()) return body.status();
      node->body = std::move(*body);
      if (found == "else") {
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        auto else_body = ParseBlockUntil({"endfor"}, found);
        if (!else_body.ok()) return else_body.status();
        node->else_body = std::move(*else_body);
      }
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "set") {
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      node->targets.push_back(*name);
      if (IsOp(".")) {
        Next();
        auto attribute = ExpectName();
        if (!attribute.ok()) return attribute.status();
        node->attribute = *attribute;
      } else {
        while (IsOp(",")) {
          Next();
          auto more = ExpectName();
          if (!more.ok()) return more.status();
          node->targets.push_back(*more);
        }
      }
      if (IsOp("=")) {
        Next();
        node->kind = Node::Kind::kSet;
        auto value = ParseTuple(true);
        if (!value.ok()) return value.status();
        node->expr = std::move(*value);
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        return node;
      }
      if (!node->attribute.empty() || node->targets.size() != 1) {
        return ErrorAt(node->line, "a block set assigns one name");
      }
      node->kind = Node::Kind::kSetBlock;
      if (IsOp("|")) {
        auto filter = ParseFilterChain(nullptr);
        if (!filter.ok()) return filter.status();
        node->expr = std::move(*filter);
      }
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      auto body = ParseBlockUntil({"endset"}, found);
      if (!body.ok()) return body.status();
      node->body = std::move(*body);
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "macro") {
      node->kind = Node::Kind::kMacro;
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      node->name = *name;
      if (auto s = ExpectOp("("); !s.ok()) return s;
      while (!IsOp(")")) {
        if (!node->params.empty()) {
          if (auto s = ExpectOp(","); !s.ok()) return s;
          if (IsOp(")")) break;
        }
        auto param = ExpectName();
        if (!param.ok()) return param.status();
        ExprPtr default_value;
        if (IsOp("=")) {
          Next();
          auto value = ParseExpression(true);
          if (!value.ok()) return value.status();
          default_value = std::move(*value);
        }
        node->params.emplace_back(*param, std::move(default_value));
      }
      Next();
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      auto body = ParseBlockUntil({"endmacro"}, found);
      if (!body.ok()) return body.status();
      node->body = std::move(*body);
      if (Cur().type == TokenType::kName) Next();  // {% endmacro name %}
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      node->kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "filter") {
      node->kind = Node::Kind::kFilterBlock;
      auto filter = ParseFilterChain(nullptr, /*leading_pipe=*/false);
      if (!filter.ok()) return filter.status();
      node->expr = std::move(*filter);
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      auto body = ParseBlockUntil({"endfilter"}, found);
      if (!body.ok()) return body.status();
      node->body = std::move(*body);
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    if (keyword == "generation") {
      node->kind = Node::Kind::kScope;
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      auto body = ParseBlockUntil({"endgeneration"}, found);
      if (!body.ok()) return body.status();
      node->body = std::move(*body);
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      return node;
    }
    return ErrorAt(node->line, absl::StrCat("unknown or unsupported tag '", keyword, "'"));
  }

  // Children go in through these, which keep each node's depth: rendering and destroying an
  // expression recurse once per level, so a template deeper than kMaxExpressionDepth (a chain of
  // ten thousand '+', say) is refused before it is built further.
  void Attach(Expr& parent, ExprPtr child) {
    if (child) parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxExpressionDepth) too_deep_ = true;
    parent.args.push_back(std::move(child));
  }
  void AttachKeyword(Expr& parent, std::string name, ExprPtr child) {
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxExpressionDepth) too_deep_ = true;
    parent.kwargs.emplace_back(std::move(name), std::move(child));
  }
  absl::Status CheckDepth(int line) const {
    return too_deep_ ? ErrorAt(line, "expression nested too deeply") : absl::OkStatus();
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool AtTupleEnd() const {
    const Token& t = Cur();
    return t.type == TokenType::kBlockEnd || t.type == TokenType::kVarEnd ||
           t.type == TokenType::kEof || (t.type == TokenType::kOp && t.value == ")") ||
           (t.type == TokenType::kName && t.value == "if");
  }

  // Comma-separated expressions: one without a comma is itself, more are a tuple.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        saw_comma = true;
        if (AtTupleEnd()) break;
      }
      auto item = ParseExpression(with_condexpr);
      if (!item.ok()) return item.status();
      items.push_back(std::move(*item));
    }
    if (!saw_comma) return std::move(items[0]);
    auto tuple = Make(Expr::Kind::kTuple, line);
    for (ExprPtr& item : items) Attach(*tuple, std::move(item));
    return tuple;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (!with_condexpr) return ParseOr();
    auto expr = ParseOr();
    if (!expr.ok()) return expr;
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      auto condition = ParseOr();
      if (!condition.ok()) return condition;
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        auto e = ParseExpression(true);
        if (!e.ok()) return e;
        otherwise = std::move(*e);
      }
      auto ternary = Make(Expr::Kind::kTernary, line);
      Attach(*ternary, std::move(*condition));
      Attach(*ternary, std::move(*expr));
      Attach(*ternary, std::move(otherwise));
      *expr = std::move(ternary);
    }
    return expr;
  }

  // `operand (keyword operand)*`, left-associative: the levels of `or` and `and`.
  absl::StatusOr<ExprPtr> ParseKeywordLevel(std::string_view keyword, Expr::Kind kind,
                                            absl::StatusOr<ExprPtr> (Parser::*operand)()) {
    auto left = (this->*operand)();
    if (!left.ok()) return left;
    while (IsName(keyword)) {
      const int line = Cur().line;
      Next();
      auto right = (this->*operand)();
      if (!right.ok()) return right;
      auto e = Make(kind, line);
      Attach(*e, std::move(*left));
      Attach(*e, std::move(*right));
      *left = std::move(e);
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseOr() {
    return ParseKeywordLevel("or", Expr::Kind::kOr, &Parser::ParseAnd);
  }
  absl::StatusOr<ExprPtr> ParseAnd() {
    return ParseKeywordLevel("and", Expr::Kind::kAnd, &Parser::ParseNot);
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Cur().line;
      NestingGuard guard(depth_);
      if (depth_ > kMaxNesting) return ErrorAt(line, "expressions nested too deeply");
      Next();
      auto operand = ParseNot();
      if (!operand.ok()) return operand;
      auto e = Make(Expr::Kind::kNot, line);
      Attach(*e, std::move(*operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    auto first = ParseMath1();
    if (!first.ok()) return first;
    ExprPtr compare;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      auto operand = ParseMath1();
      if (!operand.ok()) return operand;
      if (!compare) {
        compare = Make(Expr::Kind::kCompare, line);
        Attach(*compare, std::move(*first));
      }
      compare->ops.push_back(op);
      Attach(*compare, std::move(*operand));
    }
    if (compare) return compare;
    return first;
  }

  absl::StatusOr<ExprPtr> ParseBinaryLevel(std::initializer_list<std::string_view> ops,
                                           absl::StatusOr<ExprPtr> (Parser::*operand)()) {
    auto left = (this->*operand)();
    if (!left.ok()) return left;
    while (Cur().type == TokenType::kOp &&
           std::find(ops.begin(), ops.end(), Cur().value) != ops.end()) {
      auto e = Make(Expr::Kind::kBinary, Cur().line);
      e->name = Cur().value;
      Next();
      auto right = (this->*operand)();
      if (!right.ok()) return right;
      Attach(*e, std::move(*left));
      Attach(*e, std::move(*right));
      *left = std::move(e);
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat);
  }
  absl::StatusOr<ExprPtr> ParseConcat() { return ParseBinaryLevel({"~"}, &Parser::ParseMath2); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseBinaryLevel({"**"}, &Parser::ParseUnaryFiltered);
  }
  absl::StatusOr<ExprPtr> ParseUnaryFiltered() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    const int line = Cur().line;
    NestingGuard guard(depth_);
    if (depth_ > kMaxNesting) return ErrorAt(line, "expressions nested too deeply");
    if (auto status = CheckDepth(line); !status.ok()) return status;
    absl::StatusOr<ExprPtr> node;
    if (IsOp("-")) {
      Next();
      auto operand = ParseUnary(false);
      if (!operand.ok()) return operand;
      auto e = Make(Expr::Kind::kNegate, line);
      Attach(*e, std::move(*operand));
      node = std::move(e);
    } else if (IsOp("+")) {
      Next();
      node = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    if (!node.ok()) return node;
    node = ParsePostfix(std::move(*node));
    if (!node.ok() || !with_filter) return node;
    return ParseFilterExpr(std::move(*node));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token t = Cur();
    if (t.type == TokenType::kName) {
      Next();
      if (t.value == "true" || t.value == "True") return Literal(Value(true), t.line);
      if (t.value == "false" || t.value == "False") return Literal(Value(false), t.line);
      if (t.value == "none" || t.value == "None") return Literal(Value::None(), t.line);
      auto e = Make(Expr::Kind::kName, t.line);
      e->name = t.value;
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string value;
      while (Cur().type == TokenType::kString) {
        value += Cur().value;
        Next();
      }
      return Literal(Value(std::move(value)), t.line);
    }
    if (t.type == TokenType::kInt) {
      Next();
      return Literal(Value(static_cast<int64_t>(std::stoll(t.value))), t.line);
    }
    if (t.type == TokenType::kFloat) {
      Next();
      return Literal(Value(std::stod(t.value)), t.line);
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        auto empty = Make(Expr::Kind::kTuple, t.line);
        return empty;
      }
      auto inner = ParseTuple(true);
      if (!inner.ok()) return inner;
      if (auto s = ExpectOp(")"); !s.ok()) return s;
      return inner;
    }
    if (IsOp("[")) {
      Next();
      auto list = Make(Expr::Kind::kList, t.line);
      while (!IsOp("]")) {
        if (!list->args.empty()) {
          if (auto s = ExpectOp(","); !s.ok()) return s;
          if (IsOp("]")) break;
        }
        auto item = ParseExpression(true);
        if (!item.ok()) return item;
        Attach(*list, std::move(*item));
      }
      Next();
      return list;
    }
    if (IsOp("{")) {
      Next();
      auto dict = Make(Expr::Kind::kDict, t.line);
      while (!IsOp("}")) {
        if (!dict->args.empty()) {
          if (auto s = ExpectOp(","); !s.ok()) return s;
          if (IsOp("}")) break;
        }
        auto key = ParseExpression(true);
        if (!key.ok()) return key;
        if (auto s = ExpectOp(":"); !s.ok()) return s;
        auto value = ParseExpression(true);
        if (!value.ok()) return value;
        Attach(*dict, std::move(*key));
        Attach(*dict, std::move(*value));
      }
      Next();
      return dict;
    }
    return Unexpected();
  }

  ExprPtr Literal(Value value, int line) {
    auto e = Make(Expr::Kind::kLiteral, line);
    e->literal = std::move(value);
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (auto status = CheckDepth(line); !status.ok()) return status;
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kInt) {
          auto e = Make(Expr::Kind::kGetItem, line);
          Attach(*e, std::move(node));
          Attach(*e, Literal(Value(static_cast<int64_t>(std::stoll(Cur().value))), line));
          Next();
          node = std::move(e);
          continue;
        }
        auto name = ExpectName();
        if (!name.ok()) return name.status();
        auto e = Make(Expr::Kind::kGetAttr, line);
        e->name = *name;
        Attach(*e, std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        Next();
        auto e = ParseSubscript(std::move(node), line);
        if (!e.ok()) return e;
        node = std::move(*e);
      } else if (IsOp("(")) {
        auto e = ParseCall(std::move(node));
        if (!e.ok()) return e;
        node = std::move(*e);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr object, int line) {
    std::vector<ExprPtr> bounds;
    bool is_slice = false;
    auto parse_bound = [&]() -> absl::Status {
      if (IsOp(":") || IsOp("]")) {
        bounds.push_back(nullptr);
        return absl::OkStatus();
      }
      auto e = ParseExpression(true);
      if (!e.ok()) return e.status();
      bounds.push_back(std::move(*e));
      return absl::OkStatus();
    };
    if (auto s = parse_bound(); !s.ok()) return s;
    while (IsOp(":") && bounds.size() < 3) {
      is_slice = true;
      Next();
      if (auto s = parse_bound(); !s.ok()) return s;
    }
    if (auto s = ExpectOp("]"); !s.ok()) return s;
    if (!is_slice) {
      if (!bounds[0]) return ErrorAt(line, "empty subscript");
      auto e = Make(Expr::Kind::kGetItem, line);
      Attach(*e, std::move(object));
      Attach(*e, std::move(bounds[0]));
      return e;
    }
    auto e = Make(Expr::Kind::kSlice, line);
    Attach(*e, std::move(object));
    bounds.resize(3);
    for (auto& b : bounds) Attach(*e, std::move(b));
    return e;
  }

  // Arguments after '(': positional, then name=value.
  absl::Status ParseArgs(Expr& target) {
    if (auto s = ExpectOp("("); !s.ok()) return s;
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        if (auto s = ExpectOp(","); !s.ok()) return s;
        if (IsOp(")")) break;
      }
      first = false;
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().value == "=") {
        std::string name = Cur().value;
        Next();
        Next();
        auto value = ParseExpression(true);
        if (!value.ok()) return value.status();
        AttachKeyword(target, std::move(name), std::move(*value));
        continue;
      }
      if (!target.kwargs.empty()) {
        return ErrorAt(Cur().line, "a positional argument follows a keyword argument");
      }
      auto value = ParseExpression(true);
      if (!value.ok()) return value.status();
      Attach(target, std::move(*value));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall, Cur().line);
    Attach(*e, std::move(callee));
    if (auto s = ParseArgs(*e); !s.ok()) return s;
    return e;
  }

  // One filter after '|' (already consumed): name[(args)].
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr input) {
    const int line = Cur().line;
    auto name = ExpectName();
    if (!name.ok()) return name.status();
    std::string full = *name;
    while (IsOp(".")) {
      Next();
      auto more = ExpectName();
      if (!more.ok()) return more.status();
      full += "." + *more;
    }
    auto e = Make(Expr::Kind::kFilter, line);
    e->name = full;
    Attach(*e, std::move(input));
    if (IsOp("(")) {
      if (auto s = ParseArgs(*e); !s.ok()) return s;
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool leading_pipe = true) {
    if (leading_pipe) {
      if (auto s = ExpectOp("|"); !s.ok()) return s;
    }
    auto node = ParseFilter(std::move(input));
    while (node.ok() && IsOp("|")) {
      if (auto status = CheckDepth(Cur().line); !status.ok()) return status;
      Next();
      node = ParseFilter(std::move(*node));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (auto status = CheckDepth(Cur().line); !status.ok()) return status;
      if (IsOp("|")) {
        Next();
        auto e = ParseFilter(std::move(node));
        if (!e.ok()) return e;
        node = std::move(*e);
      } else if (IsName("is")) {
        const int line = Cur().line;
        Next();
        auto e = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          e->negated = true;
          Next();
        }
        auto name = ExpectName();
        if (!name.ok()) return name.status();
        e->name = *name;
        Attach(*e, std::move(node));
        const Token& t = Cur();
        if (IsOp("(")) {
          if (auto s = ParseArgs(*e); !s.ok()) return s;
        } else if ((t.type == TokenType::kName && t.value != "else" && t.value != "or" &&
                    t.value != "and") ||
                   t.type == TokenType::kString || t.type == TokenType::kInt ||
                   t.type == TokenType::kFloat || IsOp("(") || IsOp("[") || IsOp("{")) {
          auto arg = ParsePrimary();
          if (!arg.ok()) return arg;
          arg = ParsePostfix(std::move(*arg));
          if (!arg.ok()) return arg;
          Attach(*e, std::move(*arg));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        auto e = ParseCall(std::move(node));
        if (!e.ok()) return e;
        node = std::move(*e);
      } else {
        return node;
      }
    }
  }

  // The parser recurses once per nesting level; a bound keeps a hostile template from
  // exhausting the stack.
  static constexpr int kMaxNesting = 200;
  static constexpr int kMaxExpressionDepth = 1000;
  struct NestingGuard {
    explicit NestingGuard(int& depth) : depth(depth) { ++depth; }
    ~NestingGuard() { --depth; }
    int& depth;
  };

  std::vector<Token> tokens_;
  size_t index_ = 0;
  int depth_ = 0;
  bool too_deep_ = false;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source, const LexOptions& options) {
  Lexer lexer(NormalizeNewlines(source, options.keep_trailing_newline), options);
  auto tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(std::move(*tokens));
  return parser.ParseAll();
}

}  // namespace bitsplit::text::jinja
