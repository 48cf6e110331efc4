// A tiny SVG chart writer (no dependencies): line, scatter and grouped-bar charts with axes,
// ticks, a legend, log-scale y (forced, or chosen when the data spans decades), horizontal
// and vertical reference lines, and small multiples (several charts in one SVG, each on its
// own axes). Used by drift (error by layer) and by the correctness-matrix report. Output is
// deterministic text, so tests and diffs can read it.
//
// Every data point drawn (a marker, a bar) carries class "mark", so a test can count what a
// plot shows. A chart whose drawable y values are all zero says "all zero" on a [0, 1] axis
// instead of inventing a symmetric range around zero.
//
// To plot: fill an SvgChart (series of (x, y) points, or bars at categorical x = 0..n-1 with
// x_ticks naming them), call render_svg (or render_svg_panels), write the string.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace arbiter::verify {

struct SvgSeries {
  std::string name;          // legend text ("" = not in the legend)
  std::vector<double> x, y;  // same length; non-finite y (or y <= 0 on a log axis) are gaps
  std::string color;         // CSS color; "" = next of the built-in palette
  bool dashed = false;
  bool markers = true;  // a dot at each point (lines only)
  bool line = true;     // false: markers only (a scatter plot)
  bool cross = false;   // markers drawn as × instead of dots (shape as well as colour)
};

struct SvgChart {
  enum class Kind { Line, Bar };
  Kind kind = Kind::Line;
  std::string title, x_label, y_label;
  bool log_y = false;
  /// Log y when the positive y values span at least two decades (svg_spans_decades);
  /// otherwise linear. Ignored when log_y is set.
  bool auto_log_y = false;
  int width = 900, height = 480;  // px
  std::vector<SvgSeries> series;
  /// Tick marks on x with their labels; empty = numeric ticks chosen from the data.
  /// Bar charts put group i at x = i and should name every group here.
  std::vector<std::pair<double, std::string>> x_ticks;
  /// Horizontal reference lines (y, label), e.g. an error bound.
  std::vector<std::pair<double, std::string>> hlines;
  /// Vertical reference lines (x, label), e.g. a threshold or a mean; bar charts use the
  /// categorical coordinate (group i at x = i).
  std::vector<std::pair<double, std::string>> vlines;
};

/// Maps data to pixels along one axis: [lo, hi] (log10 of them when log) to [p0, p1].
struct SvgAxis {
  double lo = 0, hi = 1;
  bool log = false;
  double p0 = 0, p1 = 1;
  double to_px(double v) const;
  /// Tick values: 1-2-5 steps for linear axes (about n of them), every decade for log axes.
  std::vector<double> ticks(int n = 6) const;
};

/// Range [lo, hi] of the data on an axis: padded, zero included for linear bars, rounded
/// outward to whole decades when log. Values not drawable on that axis are ignored; an
/// empty set gives [0, 1] (linear) or [1e-1, 1] (log).
std::pair<double, double> svg_range(const std::vector<double>& values, bool log, bool bars);

/// True when the finite positive values span at least `decades` decades (max/min >= 10^d).
bool svg_spans_decades(const std::vector<double>& values, double decades = 2);

/// The whole <svg> document.
std::string render_svg(const SvgChart& chart);
/// Small multiples: the panels (each with its own axes, at its own width and height) in
/// rows of `columns`, as one <svg> document.
std::string render_svg_panels(const std::vector<SvgChart>& panels, int columns);
/// Short numeric label: "0", "0.5", "1e-06", "2.5e+03".
std::string svg_number(double v);
/// Escapes & < > " for text and attributes.
std::string svg_escape(const std::string& s);

}  // namespace arbiter::verify
