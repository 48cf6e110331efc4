// The token gate of a correctness matrix (docs/matrix.md "Token gate"): the spec's [gate]
// table run per model across arms (verify/localize/gate.h), kept as DIR/gate-<model>.json,
// and its section of the report. The traces judge teacher-forced logits; the gate judges what
// users see, greedy tokens, and names the side whose divergence is a defect rather than a
// near-tie.
//
// DIR/gate-<model>.json: {"format": "arbiter-matrix-gate", "version": 1, "asked": what the
// spec asked (model, arms, sides, against, prompts, n, runs, band, threads), "prompts_sha256",
// "gate": gate_json(), "recorded": [per side], "pieces": {id: text}}. Written atomically after
// a complete gate; a gate that was skipped (no GPU) or failed is a line of run-status.tsv.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/localize/gate.h"
#include "verify/matrix/matrix_run.h"

namespace arbiter::verify {

class Doc;

constexpr const char* kMatrixGateFormat = "arbiter-matrix-gate";
constexpr int kMatrixGateVersion = 1;

/// The gate file's name inside DIR for model m: "gate-<model>.json".
std::string matrix_gate_file(const MatrixSpec& spec, size_t m);

/// One model's gate in `matrix run`: kept (a valid file asking what the spec asks), ran,
/// skipped (a cuda arm and no GPU here) or failed (reason: the error).
struct MatrixGateRun {
  size_t model = 0;
  std::string file;  // inside DIR
  MatrixTraceStatus status = MatrixTraceStatus::Failed;
  std::string reason;
  double seconds = 0;
};

/// Why the gate file at path cannot be kept for model m ("" = it can): unreadable, or asking
/// otherwise than the spec (model, arms, sides, against, prompts and their sha256, n, runs,
/// band, threads). Throws arbiter::Error when the spec's prompts file cannot be read.
std::string matrix_gate_stale(const MatrixSpec& spec, size_t m, const std::string& path);

/// Runs the gate of every model (or only the model named only_model) of a spec with [gate]
/// whose gate file is missing or stale, writing DIR/gate-<model>.json; progress lines on
/// stderr (opt.progress). A gate that fails is returned, not thrown. Nothing to do without
/// [gate]. Throws arbiter::Error when only_model names no model of the spec.
std::vector<MatrixGateRun> matrix_run_gates(const MatrixSpec& spec, const MatrixRunOptions& opt,
                                            const std::string& only_model = "");

/// One model's gate as the report sees it.
struct MatrixGateResult {
  size_t model = 0;
  std::string file;
  /// done: a valid gate file; skipped: the run skipped it (no GPU for a cuda arm; counted as
  /// FAIL only with ARBITER_REQUIRE_CUDA=1); missing: not run (inconclusive); error: the run
  /// failed or the file is unreadable (unreadable) or asks otherwise than the spec (incomparable).
  enum class State { Done, Skipped, Missing, Error } state = State::Missing;
  std::string why;
  Verdict verdict = Verdict::Inconclusive;
  bool counted = true;
  GateReport report;  // state == Done: rebuilt from the file
};

/// Reads each model's gate from DIR (files and run-status.tsv); empty without [gate].
/// require_cuda: ARBITER_REQUIRE_CUDA is set (a skipped gate then counts as FAIL).
std::vector<MatrixGateResult> matrix_gate_results(const MatrixSpec& spec, const std::string& dir,
                                                  bool require_cuda);

/// The report's headline phrase for a counted gate that did not pass ("" when it passed).
std::string matrix_gate_finding(const MatrixSpec& spec, const MatrixGateResult& g);

/// The answer's sentence about the gates besides their findings: " The token gate passed on
/// every model." when it did, the models whose gate was skipped (never counted as passed),
/// or "".
std::string matrix_gate_note(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates);

/// The "Token gate" section: per model the verdict, per-side counts, divergences,
/// self-inconsistencies and the resolution of contested steps. Nothing without [gate].
void matrix_gate_section(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates,
                         Doc& d);

/// results.json's "gates": per model the state, verdict, counted flag and gate_json().
nlohmann::json matrix_gate_json(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates);

}  // namespace arbiter::verify
