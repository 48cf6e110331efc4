// Chat templates (tokenizer/chat_template.h, tokenizer/jinja.h): the real templates of
// llama-3.1/3.2, qwen2.5, qwen3, mistral-nemo, gemma3, granite-4.0 and phi-3.5 rendered on a
// message corpus and compared byte for byte with Python jinja2's renderings in
// transformers' environment (tools/chat_goldens.py wrote tests/fixtures/chat_templates/
// goldens.json). A template's raise_exception must raise with the same message, and where
// Python fails otherwise the renderer must fail too. To add a case: cases.json, rerun the
// script; to add a construct: a small test below.
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
      auto render = [&] { return ct.render(c["messages"], c["add_generation_prompt"].get<bool>(), tools, kwargs, kNow); };
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
