// The Jinja engine (common/text/jinja.h): its pieces against expectations written from Python's
// and jinja2's documented behaviour, then llama.cpp's template collection against jinja2's own
// renderings (tests/fixtures/chat_templates/corpus.json, written by
// tests/oracle/chat_template_corpus.py), byte for byte.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "common/text/jinja.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"

namespace bitsplit::text::jinja {
namespace {

std::string Render(std::string_view source, std::string_view context_json = "{}") {
  auto context = ValueFromJson(context_json);
  EXPECT_TRUE(context.ok()) << context.status();
  auto rendered = RenderChatTemplate(source, *context);
  EXPECT_TRUE(rendered.ok()) << rendered.status() << "\n" << source;
  return rendered.ok() ? *rendered : "<error>";
}

absl::Status RenderError(std::string_view source, std::string_view context_json = "{}") {
  auto context = ValueFromJson(context_json);
  EXPECT_TRUE(context.ok()) << context.status();
  auto rendered = RenderChatTemplate(source, *context);
  EXPECT_FALSE(rendered.ok()) << "rendered: " << *rendered;
  return rendered.ok() ? absl::OkStatus() : rendered.status();
}

TEST(JinjaValueTest, PythonStrOfScalarsAndContainers) {
  EXPECT_EQ(Render("{{ 1 }}|{{ -3 }}|{{ 1.5 }}|{{ 2.0 }}|{{ true }}|{{ False }}|{{ none }}"),
            "1|-3|1.5|2.0|True|False|None");
  EXPECT_EQ(Render("{{ [1, 'a', none, true, 0.25] }}"), "[1, 'a', None, True, 0.25]");
  EXPECT_EQ(Render("{{ {'k': \"it's\", 'n': [\"x\\n\"]} }}"), "{'k': \"it's\", 'n': ['x\\n']}");
  EXPECT_EQ(Render("{{ missing }}|{{ d.nothing }}", R"({"d": {}})"), "|");
}

TEST(JinjaValueTest, FloatReprAsPython) {
  EXPECT_EQ(FloatRepr(0.1), "0.1");
  EXPECT_EQ(FloatRepr(1.0), "1.0");
  EXPECT_EQ(FloatRepr(-2.5), "-2.5");
  EXPECT_EQ(FloatRepr(1e16), "1e+16");
  EXPECT_EQ(FloatRepr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(FloatRepr(0.0001), "0.0001");
  EXPECT_EQ(FloatRepr(0.00001), "1e-05");
  EXPECT_EQ(FloatRepr(1.5e-7), "1.5e-07");
  EXPECT_EQ(FloatRepr(123.456), "123.456");
}

TEST(JinjaValueTest, ToJsonAsJsonDumps) {
  EXPECT_EQ(Render("{{ {'b': [1, 2.5, none, true], 'a': 'Zürich \"q\"\\n'} | tojson }}"),
            "{\"b\": [1, 2.5, null, true], \"a\": \"Zürich \\\"q\\\"\\n\"}");
  EXPECT_EQ(Render("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(Render("{{ {'b': 1, 'a': 2} | tojson(separators=(',', ':'), sort_keys=true) }}"),
            "{\"a\":2,\"b\":1}");
  EXPECT_EQ(Render("{{ 'é' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
  // The context's order is kept, as Python dicts keep insertion order.
  EXPECT_EQ(Render("{{ x | tojson }}", R"({"x": {"z": 1, "a": 2}})"), "{\"z\": 1, \"a\": 2}");
  EXPECT_FALSE(RenderError("{{ missing | tojson }}").ok());
}

TEST(JinjaLexerTest, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("  {% if true %}\nx\n  {% endif %}\ny"), "x\ny");
  EXPECT_EQ(Render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(Render("a\n  {%- if true %}b{% endif -%}\n\nc"), "abc");
  // Expressions are neither trimmed nor lstripped; a comment is a block for both.
  EXPECT_EQ(Render("  {{ 'x' }}\n  {# note #}\ny"), "  x\ny");
  // '+' keeps the indentation; one final newline of the source is not rendered.
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}\n"), "  x");
  EXPECT_EQ(Render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
  EXPECT_EQ(Render("{{ '}}' }}"), "}}");
  EXPECT_EQ(Render("{{ {'a': 1}['a'] }}"), "1");
}

TEST(JinjaEvalTest, ArithmeticAndComparisonAsPython) {
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 1 / 2 }} {{ 2 ** 10 }}"),
            "3 -4 1 2 0.5 1024");
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ 'a' + 'b' }} {{ 1 ~ 'x' ~ none }} {{ [1] + [2] }}"),
            "7 ab 1xNone [1, 2]");
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }}"),
            "True True True True");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}"),
            "True False True");
  EXPECT_EQ(Render("{{ 'y' if 0 else 'n' }} {{ none or 'd' }} {{ 0 and 1 }} {{ not [] }}"),
            "n d 0 True");
  EXPECT_FALSE(RenderError("{{ 'a' + {} }}").ok());
  EXPECT_FALSE(RenderError("{{ missing + 1 }}").ok());
}

// Dict literals may have numbers as keys (ByteDance-Seed-OSS's budget table); json.dumps
// writes them as strings, sorted as numbers.
TEST(JinjaEvalTest, NonStringDictKeys) {
  EXPECT_EQ(
      Render("{% set d = {0: 'a', 512: 'b', 'k': 1} %}{{ d[512] }}|{{ d | tojson }}|{{ d }}|"
             "{% for k, v in {10: 1, 2: 2} | dictsort %}{{ k }},{% endfor %}|"
             "{{ {1: 'x'}[true] }}|{{ 512 in d }}|{{ {2: 1, 10: 2} | tojson(sort_keys=true) }}"),
      "b|{\"0\": \"a\", \"512\": \"b\", \"k\": 1}|{0: 'a', 512: 'b', 'k': 1}|2,10,|x|True|"
      "{\"2\": 1, \"10\": 2}");
}

TEST(JinjaEvalTest, SubscriptsSlicesAndAttributes) {
  const char* context = R"({"m": [{"role": "user", "content": "hi"}, {"role": "assistant"}]})";
  EXPECT_EQ(Render("{{ [1, 2, 3, 4][1:] }} {{ 'héllo'[::-1] }} {{ [1, 2, 3][-1] }} {{ 'abc'[1] }}"),
            "[2, 3, 4] olléh 3 b");
  EXPECT_EQ(Render("{{ m[0].role }} {{ m[0]['content'] }} {{ m[1].content is defined }}", context),
            "user hi False");
  EXPECT_EQ(Render("{{ m[-1].get('content', 'none') }} {{ m[0].get('role') }}", context),
            "none user");
  EXPECT_EQ(Render("{% for k, v in m[0].items() %}{{ k }}={{ v }};{% endfor %}", context),
            "role=user;content=hi;");
  const absl::Status undefined = RenderError("{{ m[1].content.strip() }}", context);
  EXPECT_TRUE(absl::StrContains(undefined.message(), "has no attribute 'content'")) << undefined;
  // The sandbox refuses mutation as ImmutableSandboxedEnvironment does.
  EXPECT_FALSE(RenderError("{% set l = [] %}{{ l.append(1) }}").ok());
}

TEST(JinjaEvalTest, LoopsAndScopes) {
  EXPECT_EQ(Render("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}:{{ x }}"
                   "{% if not loop.last %},{% endif %}{% else %}empty{% endfor %}"),
            "1:1,2:3");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in 'ab' %}{{ loop.index0 }}{{ x }}{{ loop.length }}"
                   "{{ loop.first }}{% endfor %}"),
            "0a2True1b2False");
  EXPECT_EQ(Render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}"
                   "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // A set inside a loop does not leak out of it; a namespace attribute does.
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = ns.x + 1 %}"
                   "{% endfor %}{{ ns.x }}"),
            "2");
  EXPECT_EQ(Render("{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}"), "set in if");
  EXPECT_EQ(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Render("{% set block %} x {{ 1 }} {% endset %}[{{ block }}]"), "[ x 1 ]");
  EXPECT_EQ(Render("{% filter upper %}ab{{ 'c' }}{% endfilter %}"), "ABC");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaEvalTest, Macros) {
  EXPECT_EQ(Render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"
                   "{{ m(a=4) }}"),
            "[1B][23][4B]");
  // A macro sees the template's variables but not the caller's loop variables.
  EXPECT_EQ(Render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ i }}{% endmacro %}"
                   "{% for i in [1] %}{{ m() }}{% endfor %}"),
            "G");
}

TEST(JinjaEvalTest, StringMethods) {
  EXPECT_EQ(Render("{{ '  a b \u3000'.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|"
                   "{{ 'a  '.rstrip() }}"),
            "a b|a|a|a");
  EXPECT_EQ(Render("{{ 'a,b,,c'.split(',') }}|{{ ' x  y '.split() }}|{{ 'a b c'.split(' ', 1) }}|"
                   "{{ 'a-b-c'.rsplit('-', 1) }}"),
            "['a', 'b', '', 'c']|['x', 'y']|['a', 'b c']|['a-b', 'c']");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} "
                   "{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} "
                   "{{ 'hELLO'.capitalize() }} {{ 'aXbX'.replace('X', '-') }}"),
            "True True HELLO hello Hello World Hello a-b-");
  EXPECT_EQ(Render("{{ '{}-{}'.format(1, 'a') }} {{ '{0}{0}{name}'.format('x', name='y') }} "
                   "{{ '-'.join(['a', 'b']) }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }}"),
            "1-a xxy a-b 1 2");
}

TEST(JinjaEvalTest, Filters) {
  const char* context =
      R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "code"},
                    {"type": "function", "function": {"name": "g"}}],
          "d": {"b": 2, "A": 1}})";
  EXPECT_EQ(Render("{{ tools | selectattr('type', 'equalto', 'function') | map(attribute="
                   "'function.name') | join(', ') }}",
                   context),
            "f, g");
  EXPECT_EQ(Render("{{ tools | rejectattr('type', 'eq', 'function') | list | length }}", context),
            "1");
  EXPECT_EQ(Render("{{ [1, none, 0, 2] | select | list }} {{ ['a', 'b'] | reject('in', ['a']) | "
                   "list }}"),
            "[1, 2] ['b']");
  EXPECT_EQ(Render("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} "
                   "{% for k, v in d | items %}{{ k }}{% endfor %}",
                   context),
            "A1b2 bA");
  EXPECT_EQ(
      Render("{{ missing | default('x') }} {{ none | default('x') }} "
             "{{ '' | default('x', true) }} {{ [3, 1, 2] | sort | first }} "
             "{{ [3, 1, 2] | last }} {{ ['b', 'a', 'b'] | unique | list }} {{ [2, 1] | min }}"),
      "x None x 1 2 ['b', 'a'] 1");
  EXPECT_EQ(Render("{{ '  t  ' | trim }}|{{ 'x' | upper }}|{{ 'ab' | capitalize }}|{{ 5 | string "
                   "| length }}|{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ 'a\nb\n' | indent(2) }}|"
                   "{{ 'a\nb' | indent(2, first=true) }}"),
            "t|X|Ab|1|43|0|a\n  b\n|  a\n  b");
  EXPECT_EQ(Render("{{ 'a\"b' | replace('\"', '&quot;') }} {{ 'x' | safe }} {{ [1, 2] | count }}"),
            "a&quot;b x 2");
  EXPECT_FALSE(RenderError("{{ 'x' | no_such_filter }}").ok());
}

// map, select, reject, selectattr, rejectattr and unique give generators, as jinja2's do.
TEST(JinjaEvalTest, FilterGeneratorsAsPython) {
  EXPECT_EQ(Render("{% set g = [1, 2, 3] | select %}{{ g | first }}{{ g | list }}{{ g | list }}"),
            "1[2, 3][]");
  EXPECT_EQ(Render("{{ none | selectattr('x') | list }}{{ none | map(attribute='x') | list }}"),
            "[][]");
  EXPECT_EQ(Render("{% if [] | select %}yes{% endif %}"), "yes");
  EXPECT_TRUE(absl::StrContains(RenderError("{{ [1, 2] | map('string') | tojson }}").message(),
                                "Object of type generator is not JSON serializable"));
  EXPECT_FALSE(RenderError("{{ [] | select | length }}").ok());
  EXPECT_FALSE(RenderError("{{ [1, 2] | map('string') | last }}").ok());
}

// |safe makes markupsafe's Markup, whose + escapes a plain string; ~ does not.
TEST(JinjaEvalTest, MarkupConcatenationEscapes) {
  EXPECT_EQ(
      Render("{{ '<b>'|safe + '<i>' }}|{{ '<i>' + '<b>'|safe }}|{{ '<b>'|safe ~ '<i>' }}|"
             "{{ '<a>' | e }}|{{ ('x'|safe + 'y') is string }}|{{ {'q': '\"'} | tojson | safe }}"),
      "<b>&lt;i&gt;|&lt;i&gt;<b>|<b><i>|&lt;a&gt;|True|{\"q\": \"\\\"\"}");
}

TEST(JinjaEvalTest, Tests) {
  EXPECT_EQ(Render("{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}"
                   "{{ 1 is number }}{{ none is none }}{{ x is undefined }}{{ true is boolean }}"
                   "{{ false is false }}{{ 1 is true }}{{ 'a' is sequence }}{{ 2 is not none }}"
                   "{{ 3 is odd }}{{ 'x' is eq 'x' }}{{ 1 is in [1] }}{{ 1.5 is float }}"),
            "TrueTrueFalseTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaGlobalsTest, RaiseExceptionNamespaceRangeStrftime) {
  const absl::Status raised = RenderError("ok\n{{ raise_exception('System role not supported') }}");
  EXPECT_TRUE(absl::EndsWith(raised.message(), "System role not supported")) << raised;
  EXPECT_TRUE(absl::StartsWith(raised.message(), "line 2: ")) << raised;
  EXPECT_EQ(Render("{{ range(3) | list }} {{ range(1, 7, 2) | join(',') }}"), "[0, 1, 2] 1,3,5");
  Template::Options options;
  std::tm date = {};
  date.tm_year = 2026 - 1900;
  date.tm_mon = 0;
  date.tm_mday = 15;
  const std::time_t t = timegm(&date);
  gmtime_r(&t, &date);
  options.now = date;
  auto parsed = Template::Parse("{{ strftime_now('%d %B %Y, %A') }}", options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto rendered = parsed->Render(Value(Dict{}));
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "15 January 2026, Thursday");
}

TEST(JinjaParseTest, DeepNestingAndRecursionAreErrorsNotCrashes) {
  EXPECT_FALSE(
      Template::Parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").ok());
  std::string long_chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) long_chain += "+1";
  EXPECT_FALSE(Template::Parse(long_chain + " }}").ok());
  EXPECT_FALSE(Template::Parse("{{ x" + std::string(50000, '|') + " }}").ok());
  std::string filters = "{{ x";
  for (int i = 0; i < 50000; ++i) filters += "|trim";
  EXPECT_FALSE(Template::Parse(filters + " }}").ok());
  EXPECT_FALSE(Template::Parse("{{ " + std::string(100000, '-') + "1 }}").ok());
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_FALSE(Template::Parse(nots + "1 }}").ok());
  std::string sum = "{{ 1";
  for (int i = 0; i < 300; ++i) sum += " + 1";
  EXPECT_EQ(Render(sum + " }}"), "301");
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% endif %}";
  EXPECT_FALSE(Template::Parse(nested_ifs).ok());
  EXPECT_TRUE(absl::StrContains(
      RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").message(),
      "recursion"));
  EXPECT_EQ(Render("{% macro f(n) %}{% if n < 50 %}{{ f(n + 1) }}{% else %}{{ n }}{% endif %}"
                   "{% endmacro %}{{ f(0) }}"),
            "50");
}

// Every filter and test SupportedFilters/SupportedTests name is one Render dispatches, and
// UnknownNames finds the others anywhere in the template.
TEST(JinjaParseTest, SupportedNamesMatchTheRendererAndUnknownNamesAreFound) {
  for (std::string_view filter : SupportedFilters()) {
    auto rendered = RenderChatTemplate("{{ 'x' | " + std::string(filter) + " }}", Value(Dict{}));
    EXPECT_TRUE(rendered.ok() || !absl::StrContains(rendered.status().message(), "No filter"))
        << filter << ": " << rendered.status();
  }
  for (std::string_view test : SupportedTests()) {
    auto rendered = RenderChatTemplate("{{ 'x' is " + std::string(test) + " }}", Value(Dict{}));
    EXPECT_TRUE(rendered.ok() || !absl::StrContains(rendered.status().message(), "No test"))
        << test << ": " << rendered.status();
  }
  auto parsed = Template::Parse(
      "{% macro m(a=x | shout) %}{% endmacro %}{% if y %}{{ z | from_json | trim }}"
      "{% elif w is prime %}{% endif %}{% for i in l if i is odd %}{% endfor %}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->UnknownNames(),
            (std::vector<std::string>{"filter 'from_json'", "filter 'shout'", "test 'prime'"}));
}

TEST(JinjaParseTest, SyntaxErrorsNameTheLine) {
  for (const char* source :
       {"{% if x %}\nno end", "a\n{{ 1 + }}", "{% for x %}{% endfor %}", "{% endif %}",
        "{{ 'unterminated }}", "{% call m() %}{% endcall %}", "{{ x | }}"}) {
    auto parsed = Template::Parse(source);
    ASSERT_FALSE(parsed.ok()) << source;
    EXPECT_TRUE(absl::StartsWith(parsed.status().message(), "line ")) << parsed.status();
  }
}

// ---- llama.cpp's templates against jinja2 ----

// The templates whose every case renders exactly as jinja2 does (output byte for byte; an error
// where jinja2 raised, with jinja2's message). A template leaves this list only by an
// edit that says why.
const std::set<std::string>& ExpectedIdentical() {
  static const std::set<std::string> kTemplates = {
      "Apertus-8B-Instruct.jinja",
      "Apriel-1.6-15b-Thinker-fixed.jinja",
      "Bielik-11B-v3.0-Instruct.jinja",
      "ByteDance-Seed-OSS.jinja",
      "Cohere2MoE.jinja",
      "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
      "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
      "GLM-4.6.jinja",
      "GLM-4.7-Flash.jinja",
      "GigaChat3-10B-A1.8B.jinja",
      "GigaChat3.1-10B-A1.8B.jinja",
      "HuggingFaceTB-SmolLM3-3B.jinja",
      "Kimi-K2-Instruct.jinja",
      "Kimi-K2-Thinking.jinja",
      "Kimi-K3.jinja",
      "LFM2-8B-A1B.jinja",
      "LFM2.5-8B-A1B.jinja",
      "LFM2.5-Instruct.jinja",
      "MiMo-VL.jinja",
      "MiniMax-M1.jinja",
      "MiniMax-M2.jinja",
      "MiniMax-M3.jinja",
      "Mistral-Small-3.2-24B-Instruct-2506.jinja",
      "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
      "NVIDIA-Nemotron-Nano-v2.jinja",
      "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
      "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
      "Qwen-QwQ-32B.jinja",
      "Qwen-Qwen2.5-7B-Instruct.jinja",
      "Qwen-Qwen3-0.6B.jinja",
      "Qwen3-Coder.jinja",
      "Qwen3.5-4B.jinja",
      "Reka-Edge.jinja",
      "Spark2.5.jinja",
      "StepFun3.5-Flash.jinja",
      "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
      "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
      "deepseek-ai-DeepSeek-V3.1.jinja",
      "deepseek-ai-DeepSeek-V3.2.jinja",
      "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
      "deepseek-ai-DeepSeek-V4.jinja",
      "fireworks-ai-llama-3-firefunction-v2.jinja",
      "google-gemma-2-2b-it.jinja",
      "google-gemma-4-31B-it-interleaved.jinja",
      "google-gemma-4-31B-it.jinja",
      "ibm-granite-granite-3.3-2B-Instruct.jinja",
      "ibm-granite-granite-4.0.jinja",
      "ibm-granite-granite-4.1.jinja",
      "inclusionai-ling-3.0-flash.jinja",
      "llama-cpp-deepseek-r1.jinja",
      "llama-cpp-rwkv-world.jinja",
      "meetkai-functionary-medium-v3.1.jinja",
      "meetkai-functionary-medium-v3.2.jinja",
      "meta-llama-Llama-3.1-8B-Instruct.jinja",
      "meta-llama-Llama-3.2-3B-Instruct.jinja",
      "meta-llama-Llama-3.3-70B-Instruct.jinja",
      "microsoft-Phi-3.5-mini-instruct.jinja",
      "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
      "mistralai-Mistral-Nemo-Instruct-2407.jinja",
      "moonshotai-Kimi-K2.jinja",
      "muse-glimmer.jinja",
      "openai-gpt-oss-120b.jinja",
      "openbmb-MiniCPM5-1B.jinja",
      "poolside-Laguna-S-2.1.jinja",
      "poolside-Laguna-XS-2.1.jinja",
      "poolside-Laguna-XS.2.jinja",
      "tencent-Hy3.jinja",
      "unsloth-Apriel-1.5.jinja",
      "unsloth-mistral-Devstral-Small-2507.jinja",
      "upstage-Solar-Open-100B.jinja",
  };
  return kTemplates;
}

struct CaseResult {
  bool identical = false;
  std::string detail;
};

TEST(JinjaCorpusTest, LlamaCppTemplatesRenderAsJinja2) {
  std::ifstream in(testing::SourcePath("tests/fixtures/chat_templates/corpus.json"));
  ASSERT_TRUE(in.good()) << "tests/fixtures/chat_templates/corpus.json";
  const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(in);
  const std::string date_text = corpus["strftime_now_date"].get<std::string>();
  std::tm date = {};
  ASSERT_EQ(std::sscanf(date_text.c_str(), "%d-%d-%d", &date.tm_year, &date.tm_mon, &date.tm_mday),
            3);
  date.tm_year -= 1900;
  date.tm_mon -= 1;
  const std::time_t t = timegm(&date);
  gmtime_r(&t, &date);
  Template::Options options;
  options.now = date;
  // JINJA_CORPUS_SHOW=<file name> prints that template's differing cases, both sides.
  const char* show_differences = std::getenv("JINJA_CORPUS_SHOW");

  int identical_templates = 0, partial_templates = 0, failing_templates = 0, refused = 0;
  int identical_outputs = 0, outputs = 0, matched_errors = 0, errors = 0;
  std::ostringstream table;
  std::set<std::string> fully_identical;
  std::map<std::string, std::vector<std::string>> unknown_names;
  for (const auto& entry : corpus["templates"]) {
    const std::string file = entry["file"].get<std::string>();
    auto parsed = Template::Parse(entry["source"].get<std::string>(), options);
    int matched = 0, cases = 0;
    std::string first_difference;
    for (const auto& c : entry["cases"]) {
      ++cases;
      const auto& conversation = corpus["conversations"][c["conversation"].get<std::string>()];
      nlohmann::ordered_json context;
      context["messages"] = conversation["messages"];
      if (conversation.contains("tools")) context["tools"] = conversation["tools"];
      context["add_generation_prompt"] = c["add_generation_prompt"];
      context["bos_token"] = corpus["bos_token"];
      context["eos_token"] = corpus["eos_token"];
      auto value = ValueFromJson(context.dump());
      ASSERT_TRUE(value.ok()) << value.status();
      absl::StatusOr<std::string> rendered =
          parsed.ok() ? parsed->Render(*value) : absl::StatusOr<std::string>(parsed.status());
      bool same;
      if (c.contains("output")) {
        same = rendered.ok() && *rendered == c["output"].get<std::string>();
        ++outputs;
        identical_outputs += same;
      } else {
        // jinja2 raised: so must we, with jinja2's message (after our "line N: ").
        same = !rendered.ok() &&
               absl::EndsWith(rendered.status().message(), c["error"].get<std::string>());
        ++errors;
        matched_errors += same;
      }
      if (!same && show_differences && file == show_differences) {
        std::printf(
            "--- %s %s add_generation_prompt=%d\n--- jinja2:\n%s\n--- ours:\n%s\n", file.c_str(),
            c["conversation"].get<std::string>().c_str(), c["add_generation_prompt"].get<bool>(),
            c.contains("output") ? c["output"].get<std::string>().c_str()
                                 : c["error"].get<std::string>().c_str(),
            rendered.ok() ? rendered->c_str() : std::string(rendered.status().message()).c_str());
      }
      if (same) {
        ++matched;
      } else if (first_difference.empty()) {
        first_difference = c["conversation"].get<std::string>() +
                           (c["add_generation_prompt"].get<bool>() ? "+gen" : "") + ": " +
                           (rendered.ok() ? std::string("output differs")
                                          : std::string(rendered.status().message()));
      }
    }
    std::string verdict;
    if (!parsed.ok()) {
      ++refused;
      ++failing_templates;
      verdict = "refused";
      first_difference = std::string(parsed.status().message());
    } else if (matched == cases) {
      ++identical_templates;
      fully_identical.insert(file);
      verdict = "identical";
    } else if (matched > 0) {
      ++partial_templates;
      verdict = "differs";
    } else {
      ++failing_templates;
      verdict = "differs";
    }
    if (parsed.ok() && !parsed->UnknownNames().empty()) {
      for (const std::string& name : parsed->UnknownNames()) unknown_names[name].push_back(file);
    }
    char line[512];
    std::snprintf(line, sizeof(line), "%-50s %-9s %2d/%-2d %s\n", file.c_str(), verdict.c_str(),
                  matched, cases, first_difference.substr(0, 100).c_str());
    table << line;
    if (ExpectedIdentical().count(file)) {
      EXPECT_EQ(matched, cases) << file << " no longer renders as jinja2: " << first_difference;
      EXPECT_TRUE(parsed.ok()) << file << ": " << parsed.status();
    }
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "templates: %d identical in all cases, %d in some, %d in none (%d refused at parse); "
      "%d of %d rendered cases identical, %d of %d cases where jinja2 raised raise its message\n",
      identical_templates, partial_templates, failing_templates, refused, identical_outputs,
      outputs, matched_errors, errors);
  for (const auto& [name, files] : unknown_names) {
    std::printf("unsupported %s in %zu template(s), e.g. %s\n", name.c_str(), files.size(),
                files[0].c_str());
  }
  for (const std::string& file : fully_identical) {
    if (!ExpectedIdentical().count(file)) {
      std::printf("note: %s renders identically but is not in ExpectedIdentical()\n", file.c_str());
    }
  }
  for (const std::string& file : ExpectedIdentical()) {
    EXPECT_TRUE(std::any_of(corpus["templates"].begin(), corpus["templates"].end(),
                            [&](const auto& e) { return e["file"] == file; }))
        << file << " is not in the corpus";
  }
}

// The probes that render differently from jinja2, each for a reason the engine's header names.
const std::set<std::string>& KnownProbeDifferences() {
  static const std::set<std::string> kProbes = {};
  return kProbes;
}

// Small templates pinning one rule each (PROBES of chat_template_corpus.py) against jinja2.
TEST(JinjaCorpusTest, ProbesRenderAsJinja2) {
  std::ifstream in(testing::SourcePath("tests/fixtures/chat_templates/corpus.json"));
  ASSERT_TRUE(in.good()) << "tests/fixtures/chat_templates/corpus.json";
  const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(in);
  auto context = ValueFromJson(corpus["probe_context"].dump());
  ASSERT_TRUE(context.ok()) << context.status();
  ASSERT_GE(corpus["probes"].size(), 50u);
  int identical = 0;
  for (const auto& probe : corpus["probes"]) {
    const std::string source = probe["source"].get<std::string>();
    auto rendered = RenderChatTemplate(source, *context);
    bool same;
    std::string expected;
    if (probe.contains("output")) {
      expected = probe["output"].get<std::string>();
      same = rendered.ok() && *rendered == expected;
    } else {
      expected = "raises " + probe["error_type"].get<std::string>() + ": " +
                 probe["error"].get<std::string>();
      same = !rendered.ok() &&
             absl::EndsWith(rendered.status().message(), probe["error"].get<std::string>());
    }
    identical += same;
    const std::string got = rendered.ok() ? *rendered : "error: " + rendered.status().ToString();
    if (KnownProbeDifferences().count(source)) {
      EXPECT_FALSE(same) << "now renders as jinja2, drop it from KnownProbeDifferences: " << source;
      std::printf("known difference: %s\n  jinja2: %s\n  ours:   %s\n", source.c_str(),
                  expected.c_str(), got.c_str());
    } else {
      EXPECT_TRUE(same) << source << "\n  jinja2: " << expected << "\n  ours:   " << got;
    }
  }
  std::printf("probes: %d of %zu as jinja2\n", identical, corpus["probes"].size());
}

}  // namespace
}  // namespace bitsplit::text::jinja
