// The matrix report's document model (src/verify/matrix/matrix_doc.h): Markdown text becomes
// HTML through libcmark, raw HTML (the SVG plots) passes through, verdict cells are coloured.
// To add a case: build a Doc, render html(), assert on the fragment that matters.
#include "verify/matrix/matrix_doc.h"

#include <gtest/gtest.h>

using namespace arbiter::verify;

namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

}  // namespace

TEST(MatrixDoc, InlineMarkdownIsCommonMark) {
  // The hand-written converter turned this into "ARBITER_<em> env" (issue 32): in CommonMark
  // a '*' followed by a space opens nothing.
  EXPECT_EQ(doc_inline_html("ARBITER_* env"), "ARBITER_* env");
  EXPECT_EQ(doc_inline_html("snake_case_name and 2 * 3 * 4"), "snake_case_name and 2 * 3 * 4");
  EXPECT_EQ(doc_inline_html("`a*b` **bold** *em*"),
            "<code>a*b</code> <strong>bold</strong> <em>em</em>");
  EXPECT_EQ(doc_inline_html("a < b & c"), "a &lt; b &amp; c");
  EXPECT_EQ(doc_inline_html("[✗ FAIL](#detail-x)"), "<a href=\"#detail-x\">✗ FAIL</a>");
}

TEST(MatrixDoc, HtmlKeepsRawBlocksAndColoursVerdicts) {
  Doc d;
  d.heading(2, "Environment of `ARBITER_*`", "env");
  d.para("ARBITER_* env and **bold**");
  d.list({"one *two*", "ARBITER_* env"});
  d.table({{"what", "value"},
           {"ARBITER_* env", "none"},
           {"[✗ FAIL](#d)<br>3 / 4 decided", "✓ PASS"},
           {"SKIP (reason 1)", "–"}},
          "t", "grid");
  const std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\">\n"
      "<circle class=\"mark\" cx=\"1\" cy=\"1\" r=\"1\"/>\n</svg>\n";
  d.figure("a *plot*", svg, "plots/p.svg", "fig");
  const std::string h = d.html("title <x>");
  EXPECT_NE(h.find("<title>title &lt;x&gt;</title>"), std::string::npos);
  EXPECT_NE(h.find("<h2 id=\"env\">Environment of <code>ARBITER_*</code></h2>"), std::string::npos)
      << h;
  EXPECT_NE(h.find("<p>ARBITER_* env and <strong>bold</strong></p>"), std::string::npos) << h;
  EXPECT_NE(h.find("<li>one <em>two</em></li>"), std::string::npos) << h;
  EXPECT_EQ(count(h, "ARBITER_* env"), 3);
  EXPECT_EQ(count(h, "<em>"), 2);  // "two" and the caption's "plot", nothing else
  EXPECT_NE(h.find("<table id=\"t\" class=\"grid\">"), std::string::npos) << h;
  EXPECT_NE(h.find("<td class=\"v-fail\"><a href=\"#d\">✗ FAIL</a><br>3 / 4 decided</td>"),
            std::string::npos)
      << h;
  EXPECT_NE(h.find("<td class=\"v-pass\">✓ PASS</td>"), std::string::npos) << h;
  EXPECT_NE(h.find("<td class=\"v-skip\">SKIP (reason 1)</td>"), std::string::npos) << h;
  // The SVG passes through whole (CMARK_OPT_UNSAFE), inside its figure.
  EXPECT_NE(h.find("<figure id=\"fig\">\n" + svg + "<figcaption>a <em>plot</em></figcaption>"),
            std::string::npos)
      << h;
  EXPECT_EQ(count(h, "<p><svg"), 0);
  EXPECT_EQ(count(h, "<!-- raw HTML omitted -->"), 0);

  const std::string md = d.markdown();
  EXPECT_NE(md.find("| ARBITER_* env | none |"), std::string::npos) << md;
  EXPECT_NE(md.find("![a *plot*](plots/p.svg)"), std::string::npos) << md;
}

TEST(MatrixDoc, VerdictGlyphs) {
  EXPECT_EQ(doc_verdict_glyph("PASS"), "✓");
  EXPECT_EQ(doc_verdict_glyph("FAIL"), "✗");
  EXPECT_EQ(doc_verdict_glyph("INCOMPARABLE"), "!");
  EXPECT_EQ(doc_verdict_glyph("UNREADABLE"), "!");
  EXPECT_EQ(doc_verdict_glyph("SKIP"), "?");
  EXPECT_EQ(doc_verdict_glyph("INCONCLUSIVE"), "?");
}
