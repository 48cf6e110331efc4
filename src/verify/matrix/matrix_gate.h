// The token gate of a correctness matrix (docs/matrix.md "Token gate"): the spec's [gate]
// table run per model across arms (verify/localize/gate.h), kept as DIR/gate-<model>.json,
// and its section of the report. The traces judge teacher-forced logits; the gate judges what
// users see, greedy tokens, and names the side whose divergence is a defect rather than a
// near-tie.
//
// DIR/gate-<model>.json: {"format": "arbiter-matrix-gate", "version": 1, "asked": what the
// spec asked (model, arms, sides, against, prompts, n, runs, band, threads), "prompts_sha256",
// "gate": gate_json(), "recorded": [per side], "pieces": {id: text}}, and with [gate] localize
// = true "localize": {"divergences": gate_localize_json(), "recorded_skipped": n}. Written
// atomically after a complete gate (and localization); a gate that was skipped (no GPU) or
// failed is a line of run-status.tsv.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/localize/gate.h"
#include "verify/localize/gate_localize.h"
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

/// One localized divergence as the gate file keeps it (gate_localize_json), for the report,
/// which has no model to rebuild a DriftReport.
struct MatrixLocalized {
  std::string side, cls;  // cls: localize_class_name()
  int prompt = 0, step = 0;  // prompt 1-based, as in the file
  std::vector<TopToken> ref_top, side_top;
  double ref_gap = 0, deficit = 0;
  int ref_rank_in_side = 0;
  std::string first_stage, first_op;  // first stage over its bound ("" = none)
  int first_layer = -1;
  double max_ratio = 0;  // max local/bound, at max_stage (layer max_layer)
  std::string max_stage;
  int max_layer = -1;
  std::string growth_kind;  // "jump", "uniform" or "none"
  int growth_layer = -1;
  double growth = 0, growth_ratio = 0, jump_factor = 0;
};

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
  bool localized = false;  // the file holds a localization ([gate] localize = true)
  std::vector<MatrixLocalized> localize;
  int localize_recorded_skipped = 0;
  nlohmann::json localize_json;  // the file's "localize", for results.json
};

/// Reads each model's gate from DIR (files and run-status.tsv); empty without [gate].
/// require_cuda: ARBITER_REQUIRE_CUDA is set (a skipped gate then counts as FAIL).
std::vector<MatrixGateResult> matrix_gate_results(const MatrixSpec& spec, const std::string& dir,
                                                  bool require_cuda);

/// The report's headline phrase for a counted gate that did not pass ("" when it passed).
std::string matrix_gate_finding(const MatrixSpec& spec, const MatrixGateResult& g);

/// The answer's sentences about the gates besides their findings: " The token gate passed on
/// every model." when it did, the models whose gate was skipped (never counted as passed),
/// and the divergences localize classed unexplained (no stage over its bound, yet past the
/// band), or "".
std::string matrix_gate_note(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates);

/// The "Token gate" section: per model the verdict, per-side counts, divergences,
/// self-inconsistencies, the resolution of contested steps and, with localize, each
/// divergence's localization. Nothing without [gate].
void matrix_gate_section(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates,
                         Doc& d);

/// results.json's "gates": per model the state, verdict, counted flag, gate_json() and the
/// gate file's "localize".
nlohmann::json matrix_gate_json(const MatrixSpec& spec, const std::vector<MatrixGateResult>& gates);

}  // namespace arbiter::verify
