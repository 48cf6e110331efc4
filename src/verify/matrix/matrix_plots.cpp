// The matrix report's plots: SVG files (verify/localize/svg.h) and their section.
#include "verify/matrix/matrix_reporter.h"

namespace arbiter::verify::report {

void Reporter::section_plots(Doc& d) {
  d.heading(2, "Plots", "plots");
  d.para(
      "Per model and shape, one panel per compared pair, each on its own axes (a gross fault "
      "does not flatten a small one): (1) candidate − reference logit of the reference's top-1 "
      "token against the reference's top-1 − top-2 gap, top-1 disagreements as vermillion crosses, "
      "the "
      "decided threshold " +
      num(spec_.decided, "%g") +
      " dashed — a correct candidate disagrees only left of it; (2) the drift gate's KL at "
      "each position with its budget; (3) decided disagreements at each threshold of the sweep; "
      "(4) the distribution of the per-position NLL shift with its mean ± SE. Log axes only "
      "where the values span two decades or more. The matrix runs no per-layer drift "
      "(`arbiter drift`, `docs/localize.md`).");
  std::error_code ec;
  fs::create_directories(dir_ + "/plots", ec);
  if (ec) throw Error("[matrix] " + dir_ + "/plots: cannot create (" + ec.message() + ")");
  const char* kAgree = "#0072b2";     // Okabe-Ito blue
  const char* kDisagree = "#d55e00";  // Okabe-Ito vermillion
  for (size_t m = 0; m < spec_.models.size(); ++m)
    for (size_t s = 0; s < spec_.shapes.size(); ++s) {
      std::vector<const MatrixComparison*> cs;
      for (const auto& c : res_.comparisons)
        if (c.model == m && c.shape == s && !c.aa && c.state == State::Compared) cs.push_back(&c);
      if (cs.empty()) continue;
      const std::string mn = matrix_model_name(spec_.models[m]), sn = spec_.shapes[s].shape.name;
      d.heading(3, mn + " " + sn, "plots-" + mn + "-" + sn);
      const int columns = cs.size() > 1 ? 2 : 1, pw = 1200 / columns, ph = 300;
      auto panel = [&](const MatrixComparison* c, SvgChart::Kind kind) {
        SvgChart ch;
        ch.kind = kind;
        ch.width = pw;
        ch.height = ph;
        ch.title = c->ref_arm == spec_.reference ? c->cand_arm : c->cand_arm + " vs " + c->ref_arm;
        ch.title += " (" + upper(verdict_name(c->verdict)) + ")";
        return ch;
      };
      auto emit = [&](const std::vector<SvgChart>& panels, const std::string& kind,
                      const std::string& caption) {
        std::string file = "plots/" + mn + "." + sn + "." + kind + ".svg";
        std::string svg = render_svg_panels(panels, columns);
        write_file_atomic(dir_ + "/" + file, svg, "[matrix]");
        d.figure(caption, svg, file, "plot-" + mn + "-" + sn + "-" + kind);
      };

      std::vector<SvgChart> delta, kl, sweep, nll;
      for (const auto* c : cs) {
        const CompareResult& x = c->result;
        SvgChart ch = panel(c, SvgChart::Kind::Line);
        ch.x_label = "reference top-1 − top-2 gap (logits)";
        ch.y_label = "cand − ref logit of ref top-1";
        SvgSeries agree{"top-1 agrees", {}, {}, kAgree}, differ{"top-1 differs", {}, {}, kDisagree};
        agree.line = differ.line = false;
        differ.cross = true;
        for (const auto& p : x.points) {
          SvgSeries& se = p.disagree ? differ : agree;
          se.x.push_back(p.ref_gap);
          se.y.push_back(p.logit_delta);
        }
        ch.series = {agree, differ};
        ch.vlines.emplace_back(spec_.decided, "decided");
        delta.push_back(ch);

        ch = panel(c, SvgChart::Kind::Line);
        ch.auto_log_y = true;
        ch.x_label = "traced position (chunk-major)";
        ch.y_label = "KL(ref‖cand), nats";
        SvgSeries k{"", {}, {}, kAgree};
        for (size_t i = 0; i < x.points.size(); ++i) {
          k.x.push_back(double(i));
          k.y.push_back(x.points[i].drift_kl);
        }
        ch.series = {k};
        if (std::isfinite(x.drift_budget)) ch.hlines.emplace_back(x.drift_budget, "budget κu²");
        kl.push_back(ch);

        ch = panel(c, SvgChart::Kind::Line);
        ch.auto_log_y = true;
        ch.x_label = "decided threshold t (logits)";
        ch.y_label = "decided disagreements";
        SvgSeries w{"", {}, {}, kDisagree};
        for (const auto& p : x.sweep) {
          w.x.push_back(p.threshold);
          w.y.push_back(double(p.disagree));
        }
        ch.series = {w};
        ch.vlines.emplace_back(spec_.decided, "verdict");
        sweep.push_back(ch);

        ch = panel(c, SvgChart::Kind::Bar);
        ch.x_label = "NLL cand − ref (nats)";
        ch.y_label = "positions";
        double lo = INFINITY, hi = -INFINITY;
        for (double v : c->nll_shift)
          if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
        if (lo <= hi) {
          const int bins = 24;
          const double wd = hi > lo ? (hi - lo) / bins : 1.0;
          SvgSeries h{"", {}, std::vector<double>(hi > lo ? bins : 1, 0.0), kAgree};
          for (double v : c->nll_shift)
            if (std::isfinite(v)) h.y[std::min(h.y.size() - 1, size_t((v - lo) / wd))] += 1;
          ch.series = {h};
          for (size_t i = 0; i < h.y.size(); i += std::max<size_t>(1, h.y.size() / 6))
            ch.x_ticks.emplace_back(double(i), svg_number(lo + (double(i) + 0.5) * wd));
          // A value's position on the categorical axis: bin i is centred on x = i.
          auto at = [&](double v) { return (v - lo) / wd - 0.5; };
          double mean = x.nll_shift.mean, se = std::isfinite(x.nll_shift.se_chunk)
                                                   ? x.nll_shift.se_chunk
                                                   : x.nll_shift.se_iid;
          if (std::isfinite(mean)) {
            ch.title += ": mean " + svg_number(mean) + " ± " + svg_number(se) + " nats";
            ch.vlines.emplace_back(at(mean), "mean");
            if (std::isfinite(se) && se > 0) {
              ch.vlines.emplace_back(at(mean - se), "");
              ch.vlines.emplace_back(at(mean + se), "");
            }
          }
        }
        nll.push_back(ch);
      }
      emit(delta, "delta",
           mn + " " + sn + ": logit delta of the reference's top-1 against the reference gap");
      emit(kl, "kl", mn + " " + sn + ": per-position KL along the trace, with the drift budget");
      emit(sweep, "sweep", mn + " " + sn + ": decided disagreements by threshold");
      emit(nll, "nll", mn + " " + sn + ": NLL shift distribution, mean ± SE (dashed)");
    }
}

}  // namespace arbiter::verify::report
