// The matrix report's writer, shared by its files: matrix_report.cpp (loading, judging,
// the headline, the files written), matrix_sections.cpp (the report's sections) and
// matrix_plots.cpp (the SVG plots). Private to src/verify/matrix/.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "verify/matrix/matrix_doc.h"
#include "verify/matrix/matrix_report.h"
#include "verify/matrix/matrix_files.h"
#include "verify/matrix/matrix_gate.h"
#include "verify/matrix/matrix_run.h"
#include "verify/trace/store.h"
#include "verify/localize/svg.h"

namespace arbiter::verify::report {

namespace fs = std::filesystem;
using State = MatrixComparison::State;

inline bool require_cuda() {
  const char* v = std::getenv("ARBITER_REQUIRE_CUDA");
  return v && *v && std::strcmp(v, "0") != 0;
}

inline std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper((unsigned char)c));
  return s;
}

inline std::string num(double v, const char* fmt = "%.3g") {
  return std::isfinite(v) ? strformat(fmt, v) : std::string("–");
}

// A CommonMark code span holding s verbatim (a fence longer than any backtick run in s).
inline std::string md_code(const std::string& s) {
  size_t run = 0, longest = 0;
  for (char c : s) longest = std::max(longest, run = c == '`' ? run + 1 : 0);
  std::string fence(longest + 1, '`');
  bool pad = !s.empty() && (s.front() == '`' || s.back() == '`');
  return fence + (pad ? " " : "") + s + (pad ? " " : "") + fence;
}

// The KL one row shows: the one the drift gate judged (exact, or the shared top-k part of
// the estimate), or without a gate the estimate compare reports; labelled with its method.
inline std::string kl_text(const CompareResult& x) {
  if (x.drift_status != "n/a")
    return num(x.drift_kl.mean) + " nats (" +
           (x.drift_kl_method == "exact" ? "exact" : "shared top-k") + ")";
  if (x.kl_method == "unavailable") return "–";
  return num(x.kl.mean) + " nats (" + (x.kl_method == "exact" ? "exact" : "top-k estimate") +
         ", no gate)";
}

// Anchor of a comparison's detail section.
inline std::string detail_id(const std::string& model, const std::string& shape,
                      const MatrixComparison& c) {
  return "detail-" + model + "-" + shape + "-" + c.cand_arm + (c.aa ? "-aa" : "-vs-" + c.ref_arm);
}

// A trace of the spec as found on disk.
struct Side {
  State state = State::Missing;
  Verdict verdict = Verdict::Inconclusive;  // when not usable
  std::string why;
  Trace trace;
  std::string path;
  std::string logits;  // its full-logits file, when the spec keeps one and it exists
};

inline std::string extra(const TraceHeader& h, const std::string& key) {
  for (const auto& [k, v] : h.extra)
    if (k == key) return v;
  return "";
}

inline std::string joined(const std::set<std::string>& s, const std::string& none = "unknown",
                   const std::string& sep = "; ") {
  std::string o;
  for (const auto& v : s)
    if (!v.empty()) o += (o.empty() ? "" : sep) + v;
  return o.empty() ? none : o;
}

class Reporter {
 public:
  Reporter(const MatrixSpec& spec, const std::string& dir) : spec_(spec), dir_(dir) {}
  MatrixResults run();

 private:
  void load_sides();
  void update_store();
  void compare_all();
  MatrixComparison judge(size_t m, size_t s, const std::string& ref, const std::string& cand,
                         bool aa, bool quantization = false);
  void headline();
  void group_skips();
  void write_files();
  void section_summary(Doc& d);
  void section_details(Doc& d);
  void section_environment(Doc& d);
  void section_method(Doc& d);
  void section_results(Doc& d);
  void section_sweep_ranks(Doc& d);
  void section_controls(Doc& d);
  void section_quantization(Doc& d);
  void section_like_for_like(Doc& d);
  void section_plots(Doc& d);
  std::string floor_cell(const MatrixComparison& c) const;
  std::string verdict_cell(const MatrixComparison& c) const;
  std::string label(const MatrixComparison& c) const;
  const Side& side(size_t m, size_t s, const std::string& arm, bool aa, bool parent = false) const;

  const MatrixSpec& spec_;
  std::string dir_, tdir_;
  std::vector<MatrixTrace> traces_;
  std::map<std::string, Side> sides_;  // by trace file name
  MatrixResults res_;
  std::vector<MatrixGateResult> gates_;
  bool any_capped_ = false;
  // Each distinct skip reason once, with the comparisons it covers (report order).
  std::vector<std::pair<std::string, std::vector<const MatrixComparison*>>> skips_;
  size_t skip_number(const MatrixComparison& c) const;
};

}  // namespace arbiter::verify::report
