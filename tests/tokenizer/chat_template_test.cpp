// Chat templates (tokenizer/chat_template.h, tokenizer/jinja.h): the real templates of
// llama-3.1/3.2, qwen2.5, qwen3, mistral-nemo, gemma3, granite-4.0 and phi-3.5 rendered on a
// message corpus and compared byte for byte with Python jinja2's renderings in
// transformers' environment (tools/chat_goldens.py wrote tests/fixtures/chat_templates/
// goldens.json). A template's raise_exception must raise with the same message, and where
// Python fails otherwise the renderer must fail too. To add a case: cases.json, rerun the
// script; to add a construct: a small test below. JinjaLimits: one test per limit of
// jinja.h, each hostile template refused with the limit named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/gguf_write.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

namespace arbiter {
namespace {

using ojson = nlohmann::ordered_json;
constexpr std::time_t kNow = 1721995200;  // tools/chat_goldens.py's NOW

ojson fixture(const std::string& name) {
  return ojson::parse(test::read_file(test::source_path("tests/fixtures/chat_templates/" + name)));
}

TEST(ChatTemplateGoldens, EveryFamilyMatchesPythonJinja2) {
  const ojson templates = fixture("templates.json"), cases = fixture("cases.json"),
              goldens = fixture("goldens.json");
  int compared = 0;
  for (const auto& [tname, t] : templates.items()) {
    if (tname[0] == '_') continue;
    const std::string src = test::read_file(test::source_path("tests/fixtures/chat_templates/" + t["file"].get<std::string>()));
    ChatTemplate ct(src, tname, t.value("bos_token", ""), t.value("eos_token", ""));
    ASSERT_TRUE(goldens.contains(tname)) << tname << ": no goldens; rerun tools/chat_goldens.py";
    for (const auto& [cname, c] : cases.items()) {
      if (cname[0] == '_') continue;
      SCOPED_TRACE(tname + " / " + cname);
      const ojson& want = goldens[tname][cname];
      const ojson tools = c.contains("tools") ? c["tools"] : ojson(nullptr);
      const ojson kwargs = c.contains("kwargs") ? c["kwargs"] : ojson::object();
      const ojson& messages = c["messages"];  // clang 14 cannot capture a structured binding
      const bool add_generation_prompt = c["add_generation_prompt"].get<bool>();
      auto render = [&] { return ct.render(messages, add_generation_prompt, tools, kwargs, kNow); };
      if (want.contains("text")) {
        EXPECT_EQ(render(), want["text"].get<std::string>());
      } else if (want.contains("raise")) {
        try {
          render();
          ADD_FAILURE() << "rendered; Python raised " << want["raise"];
        } catch (const jinja::RaiseError& e) {
          EXPECT_EQ(std::string(e.what()), want["raise"].get<std::string>());
        }
      } else {
        EXPECT_THROW(render(), Error) << "Python failed with " << want["fails"];
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 8 * 14);
}

std::string render(const std::string& src, const ojson& vars = ojson::object()) {
  jinja::Template t(src, "t");
  jinja::Dict g;
  for (const auto& [k, v] : vars.items()) g.set(k, jinja::Value::from_json(v));
  return t.render(g);
}

TEST(Jinja, WhitespaceControlAsTransformersHasIt) {
  // lstrip_blocks + trim_blocks: an indented block tag alone on its line leaves nothing.
  EXPECT_EQ(render("  {% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x  {% if true %}y{% endif %}"), "x  y");  // not at line start: kept
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("{# note #}\nx"), "x");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
}

TEST(Jinja, ScopesFollowJinja2) {
  // A set inside a loop body lives for that iteration only; a namespace carries state out.
  EXPECT_EQ(render("{% for i in [1,2,3] %}{% if i == 1 %}{% set x = 5 %}{% endif %}{{ x }},{% endfor %}"), "5,,,");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
}

TEST(Jinja, PythonValuesPrintAsPython) {
  EXPECT_EQ(render("{{ [1,'a',none,true,1.5,{'k':'v'}] }}"), "[1, 'a', None, True, 1.5, {'k': 'v'}]");
  EXPECT_EQ(render("{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ 2**10 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }}"),
            "0.5 2.0 3 -4 1024 1e+20 0.0001 1e-05");
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ [1,2,3][1:] }} {{ 'a b  c'.split() }} {{ 'x</t>y'.split('</t>')[-1] }}"),
            "cba [2, 3] ['a', 'b', 'c'] y");
  EXPECT_EQ(render("{{ d | tojson }}", {{"d", {{"b", 1}, {"a", "é\n"}}}}), "{\"b\": 1, \"a\": \"é\\n\"}");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}", {{"d", {{"a", {1, 2}}}}}), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
}

TEST(Jinja, FiltersTestsAndLoops) {
  EXPECT_EQ(render("{% for k, v in d.items() if k != 'b' %}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}",
                   {{"d", {{"a", 1}, {"b", 2}, {"c", 3}}}}),
            "a=1,c=3");
  EXPECT_EQ(render("{{ xs | selectattr('r', 'equalto', 'u') | map(attribute='c') | join('+') }}",
                   {{"xs", {{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}, {{"r", "u"}, {"c", "3"}}}}}),
            "1+3");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
  EXPECT_EQ(render("{{ x is defined }} {{ x is not defined }} {{ none is none }} {{ 'a' is string }} {{ 4 is divisibleby 2 }}"),
            "False True True True True");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "[1B][23]");
  EXPECT_EQ(render("{% set s %}in{{ 1 }}{% endset %}{{ s | upper }}"), "IN1");
}

TEST(Jinja, ErrorsNameTheTemplateAndLine) {
  try {
    render("line1\n{{ x + 1 }}");
    FAIL() << "an undefined operand must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[jinja] t:2: 'x' is undefined"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ 'a' + none }}"), Error);
  EXPECT_THROW(render("{{ 1 | nosuchfilter }}"), Error);
  EXPECT_THROW(render("{% include 'x' %}"), Error);
  EXPECT_THROW(render("{% if true %}open"), Error);
  try {
    render("{{ raise_exception('bad role: ' ~ r) }}", {{"r", "robot"}});
    FAIL() << "raise_exception must raise";
  } catch (const jinja::RaiseError& e) {
    EXPECT_EQ(std::string(e.what()), "bad role: robot");
  }
}

// Hostile templates (jinja.h limits): each must end in one Error line naming the template,
// the line and the limit, quickly, with no large allocation.
std::string error_of(const std::string& src) {
  try {
    render(src);
  } catch (const jinja::RaiseError&) {
    throw;
  } catch (const Error& e) {
    return e.what();
  }
  return "(rendered)";
}

void expect_refused(const std::string& src, const std::string& what) {
  const std::string msg = error_of(src);
  EXPECT_EQ(msg.rfind("[jinja] t:", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << "want '" << what << "' in: " << msg;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

TEST(JinjaLimits, ParserBoundsTheTreeHeight) {
  const std::string deep = "nesting deeper than 256";
  expect_refused("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}", deep);
  expect_refused("{{ " + repeat("[", 20000) + "1" + repeat("]", 20000) + " }}", deep);
  expect_refused("{{ " + repeat("-", 20000) + "1 }}", deep);
  expect_refused("{{ " + repeat("not ", 20000) + "1 }}", deep);
  // Left-associative chains grow the tree without recursing in the parser.
  expect_refused("{{ 1" + repeat("+1", 200000) + " }}", deep);
  expect_refused("{{ 1" + repeat(" ~ 1", 20000) + " }}", deep);
  expect_refused("{{ 1" + repeat(" or 1", 20000) + " }}", deep);
  expect_refused("{{ 1" + repeat(" == 1", 20000) + " }}", deep);
  expect_refused("{{ a" + repeat(".b", 20000) + " }}", deep);
  expect_refused("{{ a" + repeat("[0]", 20000) + " }}", deep);
  expect_refused("{{ f" + repeat("()", 20000) + " }}", deep);
  expect_refused("{{ x" + repeat("|f", 20000) + " }}", deep);
  expect_refused("{{ x" + repeat(" is f(1)", 20000) + " }}", deep);
  expect_refused("{{ a" + repeat(" if b else c", 20000) + " }}", deep);
  expect_refused("{{ a" + repeat(" if b", 20000) + " }}", deep);
  expect_refused(repeat("{% if true %}", 20000) + repeat("{% endif %}", 20000), deep);
  expect_refused(repeat("{% for x in y %}", 20000), deep);
}

TEST(JinjaLimits, NestingJustUnderTheLimitRenders) {
  // Under ASan this also shows that parsing, evaluating and destroying a tree near the
  // limit stays inside the stack.
  EXPECT_EQ(render("{{ " + repeat("(", 200) + "1" + repeat(")", 200) + " }}"), "1");
  EXPECT_EQ(render("{{ 1" + repeat("+1", 200) + " }}"), "201");
  EXPECT_EQ(render("{{ " + repeat("[", 120) + "1" + repeat("]", 120) + " | length }}"), "1");
  EXPECT_EQ(render("{{ " + repeat("-", 200) + "1 }}"), "1");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)), "x");
  EXPECT_EQ(render("{{ 'x'" + repeat("|upper", 200) + " }}"), "X");
}

TEST(JinjaLimits, MacroRecursionIsBounded) {
  expect_refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "macro recursion deeper than 100");
  // Legal recursion (a tool schema walked by a macro) still renders.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}x{% endmacro %}{{ f(60) }}"), repeat("x", 61));
  // Deep bodies multiply with recursion: the evaluator's own frame bound stops it first.
  expect_refused("{% macro f(n) %}{{ " + repeat("[", 120) + "f(n + 1)" + repeat("]", 120) + " }}{% endmacro %}{{ f(0) }}",
                 "nested deeper than 1024");
}

TEST(JinjaLimits, StepsAreBounded) {
  expect_refused("{% for i in range(10**9) %}{% endfor %}", "a list of 1000000000 items exceeds the 1048576-item limit");
  expect_refused("{{ range(10**18) | length }}", "items exceeds");
  expect_refused("{{ range(-9223372036854775807 - 1, 9223372036854775807) | length }}", "a list of 18446744073709551615 items");
  expect_refused("{% set l = range(100000) | list %}{% for i in range(30) %}{{ -1 in l }}{% endfor %}",
                 "template exceeded 250000 steps");
  expect_refused("{{ range(1000) | unique | length }}", "template exceeded 250000 steps");
  expect_refused("{% for i in range(500) %}{% for j in range(501) %}{% endfor %}{% endfor %}", "template exceeded 250000 steps");
}

TEST(JinjaLimits, StringsListsAndOutputAreBounded) {
  expect_refused("{{ 'a' * 10**12 }}", "a string of");
  expect_refused("{{ 'ab' * 9223372036854775807 }}", "exceeds the 67108864-byte limit");
  EXPECT_EQ(render("[{{ 'ab' * -3 }}][{{ 'ab' * 0 }}][{{ 2 * 'ab' }}]"), "[][][abab]");
  // Doubling: the copies of the growing string pass the render's byte budget first.
  expect_refused("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "template made more than 268435456 bytes");
  expect_refused("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "template made more than");
  expect_refused("{% set s = 'a' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", "template output exceeds 67108864 bytes");
}

TEST(JinjaLimits, AmplifyingFiltersAreBounded) {
  expect_refused("{{ ('a' * 1000000) | replace('a', 'b' * 100) }}", "exceeds the 67108864-byte limit");
  expect_refused("{{ range(1000) | map('string') | join('x' * 1000000) }}", "exceeds the 67108864-byte limit");
  expect_refused("{{ 'x' | indent(10**12, true) }}", "exceeds the 67108864-byte limit");
  EXPECT_EQ(render("{{ 'a\nb' | indent(-3) }}"), "a\nb");
  expect_refused("{{ [1, [2]] | tojson(indent=10**12) }}", "text of more than 67108864 bytes");
  expect_refused("{{ (',' * 2000000).split(',') | length }}", "items exceeds");
  // A hostile needle: linear search, not size x needle.
  EXPECT_EQ(render("{% set n = 'a' * 1500000 ~ 'b' %}{{ n in ('a' * 3000000) }}"), "False");
}

TEST(JinjaLimits, ValuesStayShallowAndAcyclic) {
  expect_refused("{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
                 "values nested deeper than 128");
  expect_refused(repeat("{% set a = [a] %}", 1000), "values nested deeper than 128");
  expect_refused("{% set ns = namespace() %}{% set ns.me = ns %}", "cannot hold a namespace");
  expect_refused("{% set ns = namespace() %}{% set d = {'n': ns} %}{% set ns.d = d.items %}", "cannot hold a namespace or a function");
}

TEST(JinjaLimits, IntegerOverflowIsRefused) {
  const std::string ovf = "integer overflow";
  expect_refused("{{ 9223372036854775807 + 1 }}", ovf);
  expect_refused("{{ -9223372036854775807 - 2 }}", ovf);
  expect_refused("{{ -(-9223372036854775807 - 1) }}", ovf);
  expect_refused("{{ 3 * 3074457345618258603 }}", ovf);
  expect_refused("{{ 2 ** 64 }}", ovf);
  expect_refused("{{ 2 ** 9223372036854775807 }}", ovf);
  expect_refused("{{ (-9223372036854775807 - 1) // -1 }}", ovf);
  expect_refused("{{ (-9223372036854775807 - 1) | abs }}", ovf);
  expect_refused("{{ 1e300 | int }}", ovf);
  expect_refused("{{ (1e308 * 10) | int }}", ovf);
  expect_refused("{{ '99999999999999999999' | int }}", ovf);
  expect_refused("{{ 99999999999999999999 }}", ovf);
  expect_refused("{{ [1].99999999999999999999 }}", ovf);
  EXPECT_EQ(render("{{ (-2) ** 63 }} {{ 1 ** 9223372036854775807 }} {{ (-1) ** 9223372036854775807 }} {{ 2 ** -1 }}"),
            "-9223372036854775808 1 -1 0.5");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }} {{ -7 % 2 }} {{ 7 % -2 }} {{ -7 // 2 }} {{ 9223372036854775807 // -2 }}"),
            "0 1 -1 -4 -4611686018427387904");
  EXPECT_EQ(render("{{ (1e308 * 10 - 1e308 * 10) | int }} {{ -2.7 | int }} {{ ' 42' | int }} {{ 'x' | int }}"), "0 -2 42 0");
  expect_refused("{{ 0 ** -1 }}", "cannot be raised to a negative power");
  expect_refused("{{ (-9223372036854775807 - 1) is divisibleby 0 }}", "non-zero");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "True");
}

TEST(JinjaLimits, SlicesAndRangesAtTheInt64Extremes) {
  EXPECT_EQ(render("{{ [1, 2, 3][::-9223372036854775807 - 1] }} {{ 'abc'[::9223372036854775807] }} "
                   "{{ [1, 2, 3][-9223372036854775807 - 1:9223372036854775807] }}"),
            "[3] a [1, 2, 3]");
  EXPECT_EQ(render("{{ 'h\xC3\xA9llo'[1:3] }} {{ 'h\xC3\xA9llo'[::-1] }} {{ 'h\xC3\xA9llo'[1] }} {{ 'h\xC3\xA9llo'[-1] }} "
                   "{{ 'h\xC3\xA9llo' | length }} {{ 'h\xC3\xA9llo' | last }}"),
            "\xC3\xA9l oll\xC3\xA9h \xC3\xA9 o 5 o");
  EXPECT_EQ(render("{{ range(9223372036854775807, -9223372036854775807 - 1, -9223372036854775807 - 1) | list }}"),
            "[9223372036854775807, -1]");
  EXPECT_EQ(render("{{ range(5, 0, -2) | list }} {{ range(3) | list }} {{ range(2, 2) | list }}"), "[5, 3, 1] [0, 1, 2] []");
  expect_refused("{{ range(1, 10, 0) }}", "must not be zero");
  expect_refused("{{ range('a') }}", "must be integers");
  EXPECT_EQ(render("{{ 'a,b,c'.rsplit(',', 1) }} {{ 'aaa'.rsplit('aa') }} {{ 'aaa'.split('aa') }}"),
            "['a,b', 'c'] ['a', ''] ['', 'a']");
}

TEST(JinjaLimits, MalformedLiteralsAreCleanErrors) {
  expect_refused("{{ '\\xZZ' }}", "truncated \\x escape");
  expect_refused("{{ '\\u12' }}", "truncated \\u escape");
  expect_refused("{{ '\\U00110000' }}", "illegal Unicode character");
  EXPECT_EQ(render("{{ '\\x41\\u00e9' }} {{ 1e999 }} {{ 1e-400 }}"), "A\xC3\xA9 inf 0.0");
}

TEST(ChatTemplateLoad, FromTokenizerConfigAndChatTemplateJinja) {
  const std::string dir = test::source_path("models/TinyStories-656K");
  auto tok = tokenizer_from_hf_dir(dir);
  EXPECT_EQ(load_chat_template(dir, *tok), nullptr) << "TinyStories ships no chat template";

  const std::string tmp = test::temp_dir("chat_load");
  test::write_file(tmp + "/tokenizer_config.json",
                   R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]})");
  auto ct = load_chat_template(tmp, *tok);
  ASSERT_NE(ct, nullptr);
  EXPECT_EQ(ct->render(ojson::parse(R"([{"role": "user", "content": "hi"}])"), true), "<|start_story|>hi");
  test::write_file(tmp + "/chat_template.jinja", "J{{ eos_token }}");
  EXPECT_EQ(load_chat_template(tmp, *tok)->render(ojson::array(), true), "J<|end_story|>");
  test::write_file(tmp + "/chat_template.jinja", "{% if %}");
  EXPECT_THROW(load_chat_template(tmp, *tok), Error);

  // A GGUF file's tokenizer.chat_template.
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.chat_template", "G{{ messages | length }}{{ bos_token }}");
  w.write(tmp + "/t.gguf");
  auto g = load_chat_template(tmp + "/t.gguf", *tok);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->render(ojson::parse(R"([{"role": "user", "content": "hi"}])"), true), "G1<|start_story|>");
  GgufWriter none;
  none.add_string("general.architecture", "llama");
  none.write(tmp + "/none.gguf");
  EXPECT_EQ(load_chat_template(tmp + "/none.gguf", *tok), nullptr);
}

}  // namespace
}  // namespace arbiter
