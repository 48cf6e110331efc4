// The SVG chart writer: axis mapping, ticks, ranges, escaping and document structure.
// Expected values are hand-derived from the axis definitions.
#include "verify/localize/svg.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace arbiter::verify;

static int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Svg, LinearAndLogAxesMapEndsAndMiddle) {
  SvgAxis a{0, 10, false, 100, 200};
  EXPECT_DOUBLE_EQ(a.to_px(0), 100);
  EXPECT_DOUBLE_EQ(a.to_px(10), 200);
  EXPECT_DOUBLE_EQ(a.to_px(2.5), 125);
  SvgAxis l{1e-6, 1e-2, true, 400, 0};  // y grows upward: p0 is the bottom pixel
  EXPECT_NEAR(l.to_px(1e-6), 400, 1e-9);
  EXPECT_NEAR(l.to_px(1e-2), 0, 1e-9);
  EXPECT_NEAR(l.to_px(1e-4), 200, 1e-9);  // half way in decades
  EXPECT_NEAR(l.to_px(1e-5), 300, 1e-9);
}

TEST(Svg, TicksAreDecadesOrOneTwoFiveSteps) {
  SvgAxis l{1e-6, 1e-2, true, 0, 1};
  std::vector<double> t = l.ticks();
  ASSERT_EQ(t.size(), 5u);
  for (int k = 0; k < 5; ++k) EXPECT_NEAR(std::log10(t[size_t(k)]), -6 + k, 1e-12);
  SvgAxis a{0, 1, false, 0, 1};
  t = a.ticks(5);  // span 1 / 5 = 0.2 -> step 0.2
  ASSERT_EQ(t.size(), 6u);
  EXPECT_NEAR(t[1], 0.2, 1e-12);
  EXPECT_NEAR(t[5], 1.0, 1e-12);
  SvgAxis b{-3, 7, false, 0, 1};
  t = b.ticks(4);  // 10 / 4 = 2.5 -> step 5: -0 (snapped to 0), 5
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0], 0.0);
  EXPECT_EQ(t[1], 5.0);
}

TEST(Svg, RangesRoundToDecadesAndIncludeZeroForBars) {
  auto r = svg_range({3e-7, 2e-3, 0.0, NAN, -1}, true, false);  // 0, NaN, -1 not drawable
  EXPECT_NEAR(r.first, 1e-7, 1e-20);
  EXPECT_NEAR(r.second, 1e-2, 1e-15);
  r = svg_range({2, 4}, false, true);
  EXPECT_EQ(r.first, 0.0);
  EXPECT_NEAR(r.second, 4.2, 1e-12);  // 5% of the span [0, 4] above
  r = svg_range({}, true, false);
  EXPECT_EQ(r.first, 0.1);
  EXPECT_EQ(r.second, 1.0);
  r = svg_range({5, 5}, false, false);
  EXPECT_NEAR(r.first, 4.5, 1e-12);
  EXPECT_NEAR(r.second, 5.5, 1e-12);
}

TEST(Svg, EscapesTextAndFormatsNumbers) {
  EXPECT_EQ(svg_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
  EXPECT_EQ(svg_number(0), "0");
  EXPECT_EQ(svg_number(0.5), "0.5");
  EXPECT_EQ(svg_number(1e-6), "1e-06");
  EXPECT_EQ(svg_number(2500), "2.5e+03");
}

TEST(Svg, LineChartDocument) {
  SvgChart c;
  c.title = "err <by> layer";
  c.log_y = true;
  c.series.push_back({"local", {0, 1, 2, 3}, {1e-7, 0.0, 1e-5, 1e-3}, "", false, true});
  c.series.push_back({"bound", {0, 3}, {1e-4, 1e-4}, "#555", true, false});
  c.x_ticks = {{0, "L0"}, {2, "L1"}};
  c.hlines = {{1e-2, "limit"}};
  std::string s = render_svg(c);
  EXPECT_EQ(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(s.find("</svg>\n"), std::string::npos);
  EXPECT_NE(s.find("err &lt;by&gt; layer"), std::string::npos);
  EXPECT_EQ(count(s, "class=\"series\""), 2);
  // The zero at x = 1 cannot sit on a log axis: the line restarts after it (two subpaths).
  size_t p = s.find("class=\"series\" d=\"");
  std::string d = s.substr(p, s.find('"', p + 18) - p);
  EXPECT_EQ(count(d, "M"), 2);
  EXPECT_EQ(count(s, "<circle class=\"mark\""), 3);  // markers on "local"'s drawable points
  EXPECT_NE(s.find(">L1</text>"), std::string::npos);
  EXPECT_NE(s.find("stroke-dasharray=\"6 4\""), std::string::npos);
  EXPECT_EQ(count(s, "class=\"hline\""), 1);
  // y range: data 1e-7..1e-2 -> decades 1e-7..1e-2, six labelled ticks.
  EXPECT_EQ(count(s, "class=\"ytick\""), 6);
  EXPECT_EQ(count(s, "<text class=\"legend\""), 2);
}

TEST(Svg, BarChartDocument) {
  SvgChart c;
  c.kind = SvgChart::Kind::Bar;
  c.series.push_back({"a", {}, {1, 2, 3}, "", false, true});
  c.series.push_back({"b", {}, {2, NAN, 1}, "", false, true});
  c.x_ticks = {{0, "x"}, {1, "y"}, {2, "z"}};
  std::string s = render_svg(c);
  EXPECT_EQ(count(s, "class=\"bar mark\""), 5);  // the NaN bar is left out
  EXPECT_EQ(count(s, "class=\"xtick\""), 3);
}

TEST(Svg, AllZeroSaysSoInsteadOfASymmetricAxis) {
  SvgChart c;
  c.kind = SvgChart::Kind::Bar;
  c.series.push_back({"", {}, {0, 0, 0}, "", false, true});
  c.x_ticks = {{0, "a"}, {1, "b"}, {2, "c"}};
  std::string s = render_svg(c);
  EXPECT_EQ(count(s, "class=\"all-zero\""), 1);
  EXPECT_EQ(count(s, "class=\"ytick\""), 1);  // the zero line only
  EXPECT_EQ(count(s, ">-"), 0) << "no negative tick for an all-zero series";
  EXPECT_EQ(count(s, "class=\"bar mark\""), 3);  // the marks are still there (height 0)

  SvgChart n;
  n.series.push_back({"", {0, 1}, {0, 1e-9}, "", false, true});
  EXPECT_EQ(count(render_svg(n), "all zero"), 0);
}

TEST(Svg, LogAxisOnlyWhenTheDataSpansTwoDecades) {
  EXPECT_TRUE(svg_spans_decades({1e-3, 0.5, 1.0}));
  EXPECT_TRUE(svg_spans_decades({0.01, 1.0}));
  EXPECT_FALSE(svg_spans_decades({1.0, 50.0, 99.0}));
  EXPECT_FALSE(svg_spans_decades({0.0, -5.0, 3.0}));  // one positive value: no span
  SvgChart wide;
  wide.auto_log_y = true;
  wide.series.push_back({"", {0, 1, 2}, {1e-6, 1e-3, 1.0}, "", false, true});
  std::string s = render_svg(wide);
  EXPECT_NE(s.find(">1e-06</text>"), std::string::npos);  // decade ticks
  EXPECT_NE(s.find(">0.001</text>"), std::string::npos);
  SvgChart narrow = wide;
  narrow.series[0].y = {2, 5, 9};
  s = render_svg(narrow);
  EXPECT_EQ(s.find(">1e-06</text>"), std::string::npos);
  EXPECT_NE(s.find(">0</text>"), std::string::npos) << "linear from zero: " << s;
  // A reference line far below the data (a budget) needs the log axis to be seen.
  narrow.hlines = {{1e-9, "budget"}};
  EXPECT_NE(render_svg(narrow).find(">1e-09</text>"), std::string::npos);
}

TEST(Svg, ScatterVerticalLinesAndSmallMultiples) {
  SvgChart c;
  c.width = 400;
  c.height = 300;
  SvgSeries pts{"", {1, 2, 3, NAN}, {1, -1, 2, 5}, "", false, true};
  pts.line = false;
  c.series.push_back(pts);
  c.vlines = {{2.0, "decided"}, {2.5, ""}};
  std::string s = render_svg(c);
  EXPECT_EQ(count(s, "class=\"series\""), 0);  // a scatter draws no line
  EXPECT_EQ(count(s, "<circle class=\"mark\""), 3);
  EXPECT_EQ(count(s, "class=\"vline\""), 2);
  EXPECT_EQ(count(s, ">decided</text>"), 1);
  EXPECT_EQ(count(s, "class=\"legend\""), 0);
  SvgChart x = c;
  x.series[0].cross = true;
  x.series[0].name = "differs";
  s = render_svg(x);
  EXPECT_EQ(count(s, "<path class=\"mark\""), 3);  // crosses, not dots
  EXPECT_EQ(count(s, "<circle"), 0);
  EXPECT_EQ(count(s, "class=\"legend-mark\""), 1);  // the legend shows the cross, not a mark

  SvgChart big = c;
  big.series[0].y = {100, -100, 50, 1};
  std::string p = render_svg_panels({c, big, c}, 2);
  EXPECT_EQ(p.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"600\"", 0),
            0u)
      << p.substr(0, 120);
  EXPECT_EQ(count(p, "xmlns="), 1);
  EXPECT_EQ(count(p, "<svg x=\"0.0\" y=\"0.0\""), 1);
  EXPECT_EQ(count(p, "<svg x=\"400.0\" y=\"0.0\""), 1);
  EXPECT_EQ(count(p, "<svg x=\"0.0\" y=\"300.0\""), 1);
  EXPECT_EQ(count(p, "<circle class=\"mark\""), 9);
  // Each panel on its own axes: the small panels keep their own ±2 ticks next to the big one.
  EXPECT_EQ(count(p, ">100</text>"), 1);
  // x tick 2 in all three panels, y tick 2 only in the two small ones.
  EXPECT_EQ(count(p, ">2</text>"), 3 + 2);
}
