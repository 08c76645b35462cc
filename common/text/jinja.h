#pragma once
// A Jinja engine for chat templates (GGUF tokenizer.chat_template): the subset of Jinja2 that
// model templates use, rendering what Hugging Face transformers renders with jinja2 for the same
// context, byte for byte: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
// with loop controls, `{% generation %}` blocks, tojson as json.dumps(ensure_ascii=False) and
// the globals raise_exception and strftime_now. tests/text_jinja_test.cc checks it against
// jinja2's renderings of llama.cpp's template collection (tests/oracle/chat_template_corpus.py).
//
// Not supported (an error rather than different text): {% call %} blocks, {% include %} and
// template inheritance, recursive loops, macro varargs/kwargs, format specs in str.format,
// mapping keys and '*' in % formatting, filters and methods outside the set jinja.cc
// implements (UnknownNames lists a template's). Limits, errors as well: macro recursion past
// 100 calls deep, range() past 100000 items, expressions past 1000 levels deep.
//
// Known divergences: upper/lower/title/capitalize change Latin (ASCII, Latin-1, Latin
// Extended-A), Greek and Cyrillic letters only, without Greek's final sigma; str.isprintable()
// (repr() of strings in containers) knows only the common invisible characters; a generator
// (what map, select and the like return) prints as "<generator object>" without Python's
// address, and `in` consumes all of it where Python stops at the first match; range() is a
// list (it prints as one); Markup is kept only through + and the filters that return their
// input; lists are accepted where Python wants a tuple (str.startswith).
//
// A parsed Template is immutable: it may render on several threads at once.
#include <ctime>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/jinja_value.h"

namespace bitsplit::text::jinja {

class Template {
 public:
  struct Options {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
    // What strftime_now() formats; unset: the local time at the call.
    std::optional<std::tm> now;
  };

  // Parses the source; a syntax error or a tag the engine does not support is an
  // INVALID_ARGUMENT naming the line, so that a model's template can be refused when it loads.
  static absl::StatusOr<Template> Parse(std::string_view source, Options options);
  static absl::StatusOr<Template> Parse(std::string_view source) { return Parse(source, {}); }

  // Renders with the variables of `context` (a dict). A template error (raise_exception, an
  // undefined value used where Python raises, a type error) is an INVALID_ARGUMENT naming the
  // line; for raise_exception the message ends with the template's own message.
  absl::StatusOr<std::string> Render(const Value& context) const;

  // The filters and tests the template names that the engine does not implement ("filter
  // 'from_json'"), sorted. jinja2 fails on them only when rendering reaches them; a caller can
  // refuse such a template when it loads instead.
  std::vector<std::string> UnknownNames() const;

 private:
  struct Parsed;
  Template(std::shared_ptr<const Parsed> parsed, Options options)
      : parsed_(std::move(parsed)), options_(std::move(options)) {}

  std::shared_ptr<const Parsed> parsed_;
  Options options_;
};

// The filters and tests Render implements.
const std::set<std::string_view>& SupportedFilters();
const std::set<std::string_view>& SupportedTests();

// Parse and render in one step.
absl::StatusOr<std::string> RenderChatTemplate(std::string_view source, const Value& context);

}  // namespace bitsplit::text::jinja
