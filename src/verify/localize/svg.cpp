#include "verify/localize/svg.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/error.h"

namespace arbiter::verify {

namespace {

// Okabe & Ito's colour-blind safe palette ("Color Universal Design", 2008), black last.
const char* kPalette[] = {"#0072b2", "#d55e00", "#009e73", "#e69f00",
                          "#cc79a7", "#56b4e9", "#f0e442", "#000000"};

bool drawable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

std::string fmt(double v) {  // pixel coordinates: one decimal is plenty
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// One data point: a dot, or a cross (a second encoding besides colour).
std::string marker(const SvgSeries& s, double x, double y, const std::string& col,
                   const std::string& cls = "mark") {
  if (!s.cross)
    return "<circle class=\"" + cls + "\" cx=\"" + fmt(x) + "\" cy=\"" + fmt(y) +
           "\" r=\"2.2\" fill=\"" + col + "\"/>\n";
  const double r = 3.5;
  return "<path class=\"" + cls + "\" d=\"M" + fmt(x - r) + " " + fmt(y - r) + " L" + fmt(x + r) +
         " " + fmt(y + r) + " M" + fmt(x - r) + " " + fmt(y + r) + " L" + fmt(x + r) + " " +
         fmt(y - r) + "\" stroke=\"" + col + "\" stroke-width=\"1.8\"/>\n";
}

}  // namespace

double SvgAxis::to_px(double v) const {
  double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi;
  double x = log ? std::log10(v) : v;
  double t = b > a ? (x - a) / (b - a) : 0.5;
  return p0 + t * (p1 - p0);
}

std::vector<double> SvgAxis::ticks(int n) const {
  std::vector<double> out;
  if (log) {
    int k0 = int(std::floor(std::log10(lo) + 1e-9)), k1 = int(std::ceil(std::log10(hi) - 1e-9));
    int every = std::max(1, (k1 - k0 + 11) / 12);  // at most ~12 labelled decades
    for (int k = k0; k <= k1; k += every) {
      double v = std::pow(10.0, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
    return out;
  }
  double span = hi - lo;
  if (!(span > 0)) return {lo};
  double raw = span / std::max(n, 1), mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag * (1 + 1e-9)) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

std::pair<double, double> svg_range(const std::vector<double>& values, bool log, bool bars) {
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values)
    if (drawable(v, log)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (log) {
    if (!(lo <= hi)) return {0.1, 1.0};
    lo = std::pow(10.0, std::floor(std::log10(lo)));
    hi = std::pow(10.0, std::ceil(std::log10(hi)));
    if (hi <= lo) hi = lo * 10;
    return {lo, hi};
  }
  if (!(lo <= hi)) return {0.0, 1.0};
  if (bars) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (hi == lo) {
    double d = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    return {lo - d, hi + d};
  }
  double pad = (hi - lo) * 0.05;
  return {bars && lo == 0 ? 0.0 : lo - pad, bars && hi == 0 ? 0.0 : hi + pad};
}

bool svg_spans_decades(const std::vector<double>& values, double decades) {
  double lo = INFINITY, hi = 0;
  for (double v : values)
    if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  return hi > 0 && hi / lo >= std::pow(10.0, decades) * (1 - 1e-12);
}

std::string svg_number(double v) {
  if (v == 0) return "0";
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

namespace {

// One chart as an <svg> element; nested (at x, y inside an outer <svg>) when nested.
std::string render_chart(const SvgChart& c, bool nested, double at_x, double at_y) {
  const bool bars = c.kind == SvgChart::Kind::Bar;
  bool legend = false;
  for (const SvgSeries& s : c.series) legend = legend || !s.name.empty();
  const double ml = 80, mr = legend ? 190 : 24, mt = 40, mb = 64;
  const double W = c.width, H = c.height;
  // --- ranges -----------------------------------------------------------------------------
  std::vector<double> ys, xs;
  size_t groups = 0;
  for (const SvgSeries& s : c.series) {
    ARB_CHECK(bars || s.x.size() == s.y.size(), "[svg] series '%s': %zu x values, %zu y values",
              s.name.c_str(), s.x.size(), s.y.size());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    groups = std::max(groups, s.y.size());
  }
  bool all_zero = false;
  for (double v : ys) {
    if (!std::isfinite(v)) continue;
    if (v != 0) {
      all_zero = false;
      break;
    }
    all_zero = true;
  }
  for (const auto& h : c.hlines) ys.push_back(h.first);
  // Reference lines count for the decades: a budget far below the data needs a log axis.
  const bool log_y = !all_zero && (c.log_y || (c.auto_log_y && svg_spans_decades(ys)));
  SvgAxis yax, xax;
  std::tie(yax.lo, yax.hi) = svg_range(ys, log_y, bars);
  yax.log = log_y;
  // All zero: the values sit on the x axis of a [0, 1] range and the chart says so, instead
  // of a symmetric range that suggests there is something either side of zero.
  if (all_zero) yax.lo = 0, yax.hi = std::max(1.0, yax.hi);
  yax.p0 = H - mb;
  yax.p1 = mt;
  if (bars) {
    xax.lo = -0.5;
    xax.hi = std::max<double>(groups, 1) - 0.5;
  } else {
    for (const auto& t : c.x_ticks) xs.push_back(t.first);
    for (const auto& v : c.vlines) xs.push_back(v.first);
    std::tie(xax.lo, xax.hi) = svg_range(xs, false, false);
    double mn = INFINITY, mx = -INFINITY;
    for (double x : xs)
      if (std::isfinite(x)) mn = std::min(mn, x), mx = std::max(mx, x);
    bool lines = false;
    for (const SvgSeries& s : c.series) lines = lines || s.line;
    // Lines span the plot edge to edge; a scatter keeps the padding, so no point sits on an axis.
    if (mn < mx && lines) xax.lo = mn, xax.hi = mx;
  }
  xax.p0 = ml;
  xax.p1 = W - mr;

  std::string o;
  o += std::string("<svg") + (nested ? "" : " xmlns=\"http://www.w3.org/2000/svg\"") +
       (nested ? " x=\"" + fmt(at_x) + "\" y=\"" + fmt(at_y) + "\"" : std::string()) + " width=\"" +
       std::to_string(c.width) + "\" height=\"" + std::to_string(c.height) + "\" viewBox=\"0 0 " +
       std::to_string(c.width) + " " + std::to_string(c.height) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(c.width) + "\" height=\"" +
       std::to_string(c.height) + "\" fill=\"white\"/>\n";
  if (!c.title.empty())
    o += "<text x=\"" + fmt(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
         svg_escape(c.title) + "</text>\n";
  // --- grid, ticks, axes ------------------------------------------------------------------
  for (double v : all_zero ? std::vector<double>{0.0} : yax.ticks()) {
    double y = yax.to_px(v);
    o += "<line class=\"grid\" x1=\"" + fmt(ml) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(W - mr) +
         "\" y2=\"" + fmt(y) + "\" stroke=\"#e0e0e0\"/>\n";
    o += "<text class=\"ytick\" x=\"" + fmt(ml - 6) + "\" y=\"" + fmt(y + 4) +
         "\" text-anchor=\"end\">" + svg_escape(svg_number(v)) + "</text>\n";
  }
  std::vector<std::pair<double, std::string>> xt = c.x_ticks;
  if (xt.empty())
    for (double v : xax.ticks()) xt.emplace_back(v, svg_number(v));
  for (const auto& [v, label] : xt) {
    double x = xax.to_px(v);
    o += "<line x1=\"" + fmt(x) + "\" y1=\"" + fmt(H - mb) + "\" x2=\"" + fmt(x) + "\" y2=\"" +
         fmt(H - mb + 5) + "\" stroke=\"black\"/>\n";
    o += "<text class=\"xtick\" x=\"" + fmt(x) + "\" y=\"" + fmt(H - mb + 18) +
         "\" text-anchor=\"middle\">" + svg_escape(label) + "</text>\n";
  }
  o += "<path d=\"M" + fmt(ml) + " " + fmt(mt) + " V" + fmt(H - mb) + " H" + fmt(W - mr) +
       "\" fill=\"none\" stroke=\"black\"/>\n";
  if (!c.x_label.empty())
    o += "<text x=\"" + fmt((ml + W - mr) / 2) + "\" y=\"" + fmt(H - 18) +
         "\" text-anchor=\"middle\">" + svg_escape(c.x_label) + "</text>\n";
  if (!c.y_label.empty())
    o += "<text x=\"18\" y=\"" + fmt((mt + H - mb) / 2) + "\" text-anchor=\"middle\" " +
         "transform=\"rotate(-90 18 " + fmt((mt + H - mb) / 2) + ")\">" + svg_escape(c.y_label) +
         "</text>\n";
  if (all_zero)
    o += "<text class=\"all-zero\" x=\"" + fmt((ml + W - mr) / 2) + "\" y=\"" +
         fmt((mt + H - mb) / 2) + "\" text-anchor=\"middle\" font-size=\"16\" fill=\"#555\">" +
         "all zero</text>\n";
  // --- data -------------------------------------------------------------------------------
  const double base = log_y ? yax.lo : std::max(yax.lo, std::min(0.0, yax.hi));
  const size_t ns = c.series.size();
  for (size_t si = 0; si < ns; ++si) {
    const SvgSeries& s = c.series[si];
    const std::string col = s.color.empty() ? kPalette[si % 8] : s.color;
    if (bars) {
      const double slot = 0.8 / double(std::max<size_t>(ns, 1));
      for (size_t i = 0; i < s.y.size(); ++i) {
        if (!drawable(s.y[i], log_y)) continue;
        double x0 = xax.to_px(double(i) - 0.4 + slot * double(si));
        double x1 = xax.to_px(double(i) - 0.4 + slot * double(si + 1));
        double y0 = yax.to_px(base), y1 = yax.to_px(s.y[i]);
        o += "<rect class=\"bar mark\" x=\"" + fmt(x0) + "\" y=\"" + fmt(std::min(y0, y1)) +
             "\" width=\"" + fmt(x1 - x0) + "\" height=\"" + fmt(std::fabs(y1 - y0)) +
             "\" fill=\"" + col + "\"><title>" + svg_escape(s.name) + ": " +
             svg_escape(svg_number(s.y[i])) + "</title></rect>\n";
      }
      continue;
    }
    std::string d;
    bool pen = false;
    for (size_t i = 0; s.line && i < s.y.size(); ++i) {
      if (!drawable(s.y[i], log_y) || !std::isfinite(s.x[i])) {
        pen = false;
        continue;
      }
      d += (pen ? " L" : (d.empty() ? "M" : " M")) + fmt(xax.to_px(s.x[i])) + " " +
           fmt(yax.to_px(s.y[i]));
      pen = true;
    }
    if (!d.empty())
      o += "<path class=\"series\" d=\"" + d + "\" fill=\"none\" stroke=\"" + col +
           "\" stroke-width=\"1.6\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    if (s.markers || !s.line)
      for (size_t i = 0; i < s.y.size(); ++i)
        if (drawable(s.y[i], log_y) && std::isfinite(s.x[i]))
          o += marker(s, xax.to_px(s.x[i]), yax.to_px(s.y[i]), col);
  }
  for (const auto& [v, label] : c.vlines) {
    if (!std::isfinite(v)) continue;
    double x = xax.to_px(v);
    o += "<line class=\"vline\" x1=\"" + fmt(x) + "\" y1=\"" + fmt(mt) + "\" x2=\"" + fmt(x) +
         "\" y2=\"" + fmt(H - mb) + "\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n";
    if (!label.empty())
      o += "<text x=\"" + fmt(x + 4) + "\" y=\"" + fmt(mt + 12) + "\" fill=\"#333\">" +
           svg_escape(label) + "</text>\n";
  }
  for (const auto& [v, label] : c.hlines) {
    if (!drawable(v, log_y)) continue;
    double y = yax.to_px(v);
    o += "<line class=\"hline\" x1=\"" + fmt(ml) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(W - mr) +
         "\" y2=\"" + fmt(y) + "\" stroke=\"#555\" stroke-dasharray=\"3 3\"/>\n";
    o += "<text x=\"" + fmt(W - mr - 4) + "\" y=\"" + fmt(y - 4) +
         "\" text-anchor=\"end\" fill=\"#555\">" + svg_escape(label) + "</text>\n";
  }
  // --- legend -----------------------------------------------------------------------------
  double ly = mt + 6;
  for (size_t si = 0; si < ns; ++si) {
    const SvgSeries& s = c.series[si];
    if (s.name.empty()) continue;
    const std::string col = s.color.empty() ? kPalette[si % 8] : s.color;
    if (s.line)
      o += "<rect x=\"" + fmt(W - mr + 14) + "\" y=\"" + fmt(ly - 9) +
           "\" width=\"14\" height=\"10\" fill=\"" + col + "\"/>\n";
    else  // a scatter's legend shows its marker (not of class mark: not a data point)
      o += marker(s, W - mr + 21, ly - 4, col, "legend-mark");
    o += "<text class=\"legend\" x=\"" + fmt(W - mr + 34) + "\" y=\"" + fmt(ly) + "\">" +
         svg_escape(s.name) + "</text>\n";
    ly += 18;
  }
  o += "</svg>\n";
  return o;
}

}  // namespace

std::string render_svg(const SvgChart& c) { return render_chart(c, false, 0, 0); }

std::string render_svg_panels(const std::vector<SvgChart>& panels, int columns) {
  columns = std::max(columns, 1);
  // Rows are as tall as their tallest panel; the document as wide as the widest row.
  double W = 0, H = 0, row_h = 0, x = 0;
  std::string body;
  for (size_t i = 0; i < panels.size(); ++i) {
    if (i % size_t(columns) == 0) H += row_h, row_h = 0, x = 0;
    body += render_chart(panels[i], true, x, H);
    x += panels[i].width;
    W = std::max(W, x);
    row_h = std::max(row_h, double(panels[i].height));
  }
  H += row_h;
  const std::string w = std::to_string(int(W)), h = std::to_string(int(H));
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
         "\" viewBox=\"0 0 " + w + " " + h + "\">\n" + body + "</svg>\n";
}

}  // namespace arbiter::verify
