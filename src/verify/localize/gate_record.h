// Recorded gate legs (docs/localize.md "Recorded legs"): `gate --record DIR` keeps every live
// side's greedy decodes with their chain of custody; `gate --against DIR` adds them as sides
// of a gate run on another machine; the resolution table says, per contested step, which side
// the evidence points at; `--reproduce` reruns a recorded leg here when its tier exists here.
//
// A record directory: manifest.json (identity of model, tokenizer, prompts, build, host,
// environment, one entry per side), side-<N>.json (the N-th recorded side's decodes) and
// SHA256SUMS over both (the trace store's format, `sha256sum -c`). It is written into a hidden
// sibling directory and renamed into place, so a failed run leaves no record behind.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/localize/gate.h"

namespace arbiter::verify {

constexpr const char* kGateRecordFormat = "arbiter-gate-record";
constexpr int kGateRecordVersion = 1;
constexpr int kGateRecordTopK = 5;  // top-k kept per step (GateOptions::topk when recording)

/// Where and how the recording process ran (the CLI knows these; the library does not read
/// the environment).
struct GateRecordInfo {
  std::string env = "none";  // ARBITER_* variables set, "NAME=value ..." or "none"
  std::string command;       // the gate command line
};

/// Refuses, before a run, a record target that exists and is not an empty directory.
/// Throws arbiter::Error "[gate] DIR: ...".
void gate_record_check_target(const std::string& dir);

/// Writes the live sides of r (sides not read from a record) to dir: manifest, one file per
/// side, SHA256SUMS; atomically (a hidden sibling directory renamed onto dir). r must come
/// from run_gate with GateOptions::topk > 0. Throws arbiter::Error.
void gate_record_write(const std::string& dir, const GateReport& r, const GateRecordInfo& info);

/// Reads a record: checksums first (any problem refuses it, naming the file), then the format,
/// then every side's fallback count (non-zero refuses). Each side is labelled
/// "rec:<spec>@<host>". The checks against the live run (weights, tokenizer, prompts, -n)
/// happen in run_gate. Throws arbiter::Error "[gate] DIR: ..." on the first problem.
std::vector<GateRecordedSide> gate_record_read(const std::string& dir);

// --- resolution ---------------------------------------------------------------------------

/// One contested step, resolved by the rule of docs/localize.md (first match wins):
///   self-inconsistent — the sides that agree with themselves all agree; the others changed
///                       their own token across runs at or before this step;
///   wrong             — one side alone against at least two others that agree;
///   right             — a live side agrees with the recorded oracle (a recorded `ref`
///                       leg) while another live side does not;
///   split             — anything else.
struct GateResolutionRow {
  int prompt = 0, step = 0;
  std::vector<int32_t> tokens;  // per side (r.sides order); kGateLeftEarlier: left before
  std::string kind;             // "self-inconsistent", "wrong", "right", "split"
  std::vector<int> named;       // the side(s) the verdict names
  std::string text;             // the whole resolution in words
};
constexpr int32_t kGateLeftEarlier = -2;

/// One row per contested step of r (three sides or more; with two, the divergence table
/// already names the one judged side).
std::vector<GateResolutionRow> gate_resolve(const GateReport& r);

std::string gate_resolution_text(const GateReport& r, const std::vector<GateResolutionRow>& rows);
/// The same table in GitHub markdown (for the matrix report).
std::string gate_resolution_markdown(const GateReport& r,
                                     const std::vector<GateResolutionRow>& rows);
nlohmann::json gate_resolution_json(const GateReport& r,
                                    const std::vector<GateResolutionRow>& rows);

// --- reproduction -------------------------------------------------------------------------

struct GateReproduction {
  std::string label;       // the recorded side
  bool attempted = false;  // false: its tier is not available here (why_not says why)
  std::string why_not;
  std::string device, compute;  // the tier it reran on
  int64_t steps = 0;            // tokens compared (prompts x runs x n)
  bool exact = false;
  int prompt = 0, run = 0, step = 0;  // the first difference (0-based) when !exact
  int32_t recorded_token = -1, here_token = -1;
};

/// Reruns each recorded side (r.sides with recorded set, matched to `recorded` in order) on
/// its own side spec here, with the recorded number of runs, and compares every token. A
/// spec whose tier cannot be made here, or that computes in another dtype than recorded, is
/// reported as not attempted. Adds the text of the tokens it names to r.pieces.
std::vector<GateReproduction> gate_reproduce(GateReport& r,
                                             const std::vector<GateRecordedSide>& recorded,
                                             int threads, bool progress);

std::string gate_reproduction_text(const GateReport& r, const std::vector<GateReproduction>& rep);
nlohmann::json gate_reproduction_json(const std::vector<GateReproduction>& rep);

}  // namespace arbiter::verify
