// Running a correctness matrix (docs/matrix.md): the output directory's layout, resumable
// trace production (in-process through run_trace, or a subprocess when an arm sets
// environment variables), and the shell commands of `matrix plan`.
//
// DIR/matrix.toml     the spec's bytes (so `matrix report DIR` needs nothing else)
// DIR/traces/         a trace store (store.h): traces, METADATA.txt, RUNS.txt, SHA256SUMS
// DIR/run-status.tsv  traces and gates the last run skipped (no GPU) or failed to produce, with why
// DIR/gate-<model>.json  with [gate]: each model's token gate (matrix_gate.h)
// DIR/plots/*.svg, DIR/report.md, DIR/report.html, DIR/results.json (matrix_report.h)
#pragma once
#include <string>
#include <vector>

#include "verify/matrix/matrix_spec.h"

namespace arbiter::verify {

constexpr const char* kMatrixSpecCopy = "matrix.toml";
constexpr const char* kMatrixTraceDir = "traces";
constexpr const char* kMatrixStatus = "run-status.tsv";

struct MatrixRunOptions {
  std::string out_dir;
  std::string env = "none";  // the ARBITER_* variables of this process (trace headers)
  std::string self_exe;      // this arbiter binary: subprocess arms and plan commands
  std::string cwd;           // working directory the spec's relative paths refer to (plan)
  bool progress = true;      // per-trace lines on stderr
};

enum class MatrixTraceStatus { Kept, Ran, Skipped, Failed };
const char* matrix_status_name(MatrixTraceStatus s);

struct MatrixTraceRun {
  MatrixTrace trace;
  MatrixTraceStatus status = MatrixTraceStatus::Failed;
  std::string reason;  // skipped/failed: why; ran: what was wrong with the old file, if any
  double seconds = 0;
};

/// Does a tier's start-up error say there is no GPU to run on (rather than a failure)? Then a
/// cuda arm is skipped, not failed.
bool matrix_gpu_unavailable(const std::string& msg);

/// Creates DIR and DIR/traces and writes DIR/matrix.toml (the spec's bytes; replaced when the
/// spec changed). With remove_stale (`run`), also removes temporary files of trace writers
/// that are no longer running on this host, and throws arbiter::Error when one still is;
/// `plan` leaves them alone (they may belong to writers on other hosts).
void matrix_prepare_dir(const MatrixSpec& spec, const std::string& dir, bool remove_stale);

/// Runs every trace of the spec that is missing or whose header does not match the spec
/// (matrix_trace_mismatch), keeps the others, skips GPU arms when no CUDA device is
/// available, then runs the token gate of each model when the spec has [gate]
/// (matrix_run_gates), and writes DIR/run-status.tsv. A trace or gate that fails is recorded,
/// not fatal.
std::vector<MatrixTraceRun> matrix_run_traces(const MatrixSpec& spec, const MatrixRunOptions& opt);

/// One planned trace, or one model's token gate, and the self-contained shell line that
/// produces it.
struct MatrixPlanLine {
  MatrixTrace trace;    // a trace line
  std::string gate;     // a gate line: the gate file it writes ("" = a trace line)
  size_t gate_model = 0;
  std::string command;  // cd CWD && [ENV=..] ARBITER trace ... -o DIR/traces/FILE (absolute),
                        // or cd CWD && ARBITER matrix gate SPEC -o DIR --model NAME
};

/// One line per trace, then with [gate] one per model's gate; with all = false only for
/// traces not already valid on disk (checked without loading models: paths, shape, device,
/// compute, inject, mix, env) and gates whose file is stale (matrix_gate_stale).
std::vector<MatrixPlanLine> matrix_plan(const MatrixSpec& spec, const MatrixRunOptions& opt,
                                        bool all);

/// Quotes s for a POSIX shell when it holds anything beyond [A-Za-z0-9_./:=,+-].
std::string shell_quote(const std::string& s);

}  // namespace arbiter::verify
