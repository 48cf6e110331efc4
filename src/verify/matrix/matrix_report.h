// The correctness matrix's judgement and report (docs/matrix.md §Report): every candidate
// compared with the reference (compare_traces), the controls (A/A reruns byte-identical,
// noise-floor pairs), the store regenerated and verified, and report.md, report.html,
// results.json and plots/*.svg written from what is on disk, so `matrix report DIR`
// reproduces what `matrix run` wrote.
#pragma once
#include <string>
#include <vector>

#include "verify/judge/compare.h"
#include "verify/matrix/matrix_spec.h"

namespace arbiter::verify {

/// One comparison of the matrix (a candidate vs the reference, a noise-floor pair, or an
/// A/A rerun), at one model x shape.
struct MatrixComparison {
  size_t model = 0, shape = 0;
  std::string ref_arm, cand_arm;  // A/A: both the same arm (cand is its .aa rerun)
  bool candidate = false, noise = false, aa = false;
  /// compared: a verdict from the traces; skipped: a GPU arm with no device (not counted
  /// unless ARBITER_REQUIRE_CUDA=1); missing: a trace not on disk (inconclusive);
  /// error: a trace that failed to run or to read (unreadable).
  enum class State { Compared, Skipped, Missing, Error } state = State::Missing;
  std::string why;  // skipped/missing/error
  Verdict verdict = Verdict::Inconclusive;
  bool counted = true;        // part of the exit code
  CompareResult result;       // state == Compared
  bool aa_identical = false;  // A/A: the data rows are byte-identical
  std::string aa_detail;
  std::vector<double> nll_shift;  // cand nll - ref nll per matched position, ref row order
};

struct MatrixResults {
  std::vector<MatrixComparison> comparisons;
  /// Per model with a [parents] entry and shape: the reference arm on the parent (ref side)
  /// against the reference arm on the quantized weights (cand side): the quantization error,
  /// measured with llama-perplexity's KLD statistics and never counted in the verdict.
  std::vector<MatrixComparison> quantization;
  Verdict worst = Verdict::Pass;
  std::string answer;                 // the headline, one paragraph (Markdown inline)
  std::vector<std::string> problems;  // store problems; traces in DIR/traces not in the spec
  std::string report_md, report_html, results_json;  // paths written
};

/// Judges what is in DIR (DIR/traces, DIR/run-status.tsv) against spec, regenerates the
/// store files, writes the report files. Throws arbiter::Error when DIR cannot be read or
/// written (a trace still being written, a missing directory); every problem with a single
/// trace becomes that comparison's verdict instead.
MatrixResults matrix_report(const MatrixSpec& spec, const std::string& dir);

/// One line per comparison for the terminal.
std::string format_matrix_summary(const MatrixSpec& spec, const MatrixResults& r);

}  // namespace arbiter::verify
