// arbiter gate: greedy-decode token gate across tiers (docs/localize.md).
//
// Each side greedily decodes N tokens from each pre-registered prompt, K times. A side must
// first agree with itself across its K runs. Then, per prompt and side, the first step where
// the side leaves the reference side's sequence (the first side listed) is judged on the
// reference's own view of that step, teacher-forced on the shared prefix: the side's token
// is a near-tie when its log-probability is within `band` nats of the reference's top-1,
// otherwise a defect. With three or more sides, contested steps are grouped ("ref and cpu
// agree, cuda:bf16 differs") so the outlier is visible.
//
// Verdict (exit code): pass 0 (no defect, every side self-consistent); fail 1 (a defect on a
// self-consistent side); inconclusive 2 (no defect, but a side disagreed with itself, or the
// reference did); incomparable 3 (the sides tokenized a prompt differently).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/judge/compare.h"
#include "verify/localize/side.h"

namespace arbiter {
class Session;
}

namespace arbiter::verify {

/// The reference's judgement of a side's token at one step.
struct StepJudgement {
  int32_t ref_token = -1, side_token = -1;
  int32_t ref_top1 = -1, ref_top2 = -1;
  double ref_gap = 0;       // logprob(top1) - logprob(top2), nats (= logit gap)
  int side_rank = 0;        // 1-based rank of side_token in ref's logits (ties: lower id first)
  double deficit = 0;       // logprob(ref top1) - logprob(side_token), nats (>= 0)
  double side_logprob = 0;  // ref's logprob of side_token
  bool near_tie = false;    // deficit <= band
};

/// Judges side_token against ref's full logits row [V] (f64). Throws arbiter::Error on an
/// empty row, an id outside it, or non-finite logits at the compared ids.
StepJudgement judge_step(const std::vector<double>& ref_logits, int32_t ref_token,
                         int32_t side_token, double band);

/// One side's decodes: tokens[prompt][run][step].
struct GateSideRuns {
  std::string label;
  std::vector<std::vector<std::vector<int32_t>>> tokens;
  /// The side's own top-1/top-2 logit gap at each step of run 0 ([prompt][step]); optional
  /// (empty: unknown). Shown at a divergence: was the side itself undecided there?
  std::vector<std::vector<double>> own_gap;
  /// The side's own top-k at each step of run 0 ([prompt][step][k], ids and log-probabilities,
  /// descending); filled when GateOptions::topk > 0 (gate --record), else empty.
  std::vector<std::vector<std::vector<int32_t>>> top_ids;
  std::vector<std::vector<std::vector<double>>> top_logprobs;
};

struct GateInconsistency {
  int side = 0, prompt = 0, run = 0, step = 0;  // run `run` first differs from run 0 at `step`
  int32_t run0_token = -1, run_token = -1;      // -1: that run ended earlier
};

struct GateDivergence {
  int side = 0, prompt = 0, step = 0;
  StepJudgement j;
  double side_own_gap = NAN;  // the side's own top-1/top-2 gap there (NaN: unknown)
  bool counts = true;         // false when the side (or the reference) is self-inconsistent
};

/// A step where sides that shared the prefix so far chose different tokens.
struct GateContested {
  int prompt = 0, step = 0;
  std::vector<std::vector<int>> groups;  // side indices grouped by token; groups[0] holds side 0
  std::vector<int32_t> tokens;           // token of each group
  std::vector<int> left_earlier;         // sides that had already left the reference
};

struct GateSideSummary {
  std::string label, device, compute, inject = "none";
  bool consistent = true;
  int diverged = 0, near_ties = 0, defects = 0;
  // The op providers that served the side's greedy decodes and their fallback count
  // (backend/backend.h OpStats; -1: unknown), as a trace header records them.
  std::string providers;
  int64_t fallbacks = -1;
  bool recorded = false;  // decoded elsewhere and read from a record (gate --against)
};

struct GateReport {
  std::string model_path, prompts_path, prompts_sha256;
  int n_prompts = 0, n_tokens = 0, runs = 0;
  double band = 0.5;
  std::vector<GateSideSummary> sides;
  std::vector<GateInconsistency> inconsistencies;
  std::vector<GateDivergence> divergences;
  std::vector<GateContested> contested;
  // Tokenizer agreement.
  bool tokenizers_agree = true;
  std::string tokenizer_note;                    // what was checked / what differed
  std::vector<int> prompt_lines;                 // 1-based line of each prompt in the file
  std::vector<std::vector<int32_t>> prompt_ids;  // the reference side's tokenization
  std::vector<std::string> prompt_text;
  std::map<int32_t, std::string> pieces;  // text of the tokens the report names (may be empty)
  std::string weights_sha256, tokenizer_sha256;  // of the reference side's model
  std::vector<GateSideRuns> side_runs;           // every side's decodes, in side order
  Verdict verdict = Verdict::Pass;
  std::string verdict_reason;
};

/// Logits row [V] of side `side` after prompt `prompt` followed by the reference's first
/// `step` tokens (the teacher-forced shared prefix).
using TeacherForcedFn = std::function<std::vector<double>(int side, int prompt, int step)>;

/// The analysis, independent of tiers (unit-testable with synthetic sequences): fills the
/// report's inconsistencies, divergences, contested steps, side counts and verdict. sides[0]
/// is the reference; every side must hold the same number of prompts and at least one run.
/// report.sides must already hold one summary per side (labels etc.); tokenizer agreement
/// must already be set (false gives incomparable).
void gate_analyze(const std::vector<GateSideRuns>& sides, const TeacherForcedFn& ref_logits,
                  double band, GateReport& report);

/// A side decoded on another machine (gate --against; read by gate_record_read). Its tokens
/// enter the analysis like a live side's, after the live sides: the reference stays live,
/// because divergences are judged teacher-forced on it.
struct GateRecordedSide {
  std::string source;  // the record directory, named in every refusal
  std::string spec;    // the side as given where it was recorded ("cpu", "cuda:bf16", ...)
  GateSideSummary summary;
  GateSideRuns runs;
  std::string weights_sha256, tokenizer_sha256, prompts_sha256;
  int n_tokens = 0;
  std::vector<std::vector<int32_t>> prompt_ids;  // [prompt] as the recording side tokenized it
};

struct GateOptions {
  std::string model_path, prompts_path;
  std::vector<Side> sides;
  int n_tokens = 32, runs = 2, threads = 0;
  double band = 0.5;
  int topk = 0;              // > 0: keep each side's top-k per step (GateSideRuns::top_ids)
  bool single_side = false;  // allow one side alone (a recording: self-consistency only)
  std::vector<GateRecordedSide> recorded;
  bool progress = true;  // status lines on stderr (core/progress.h)
};

/// Greedily decodes n_tokens after each prompt ids[p] (the prompt is prefilled; EOS does not
/// stop), `runs` times, each from an empty cache: tokens of every run; own top-1/top-2 gaps
/// and (topk > 0) top-k of run 0. progress(p, k) is called before each run.
GateSideRuns gate_decode(Session& ses, const std::vector<std::vector<int32_t>>& ids, int n_tokens,
                         int runs, int topk, const std::function<void(int p, int k)>& progress);

/// A prompt's token ids as the gate runs it: the tokenizer's special tokens (BOS when the
/// model has one), no chat template. drift --prompt uses it too, so both see the same prefix.
std::vector<int32_t> gate_prompt_ids(const Model& m, const std::string& text);

/// Reads the prompts (one per line; blank lines skipped; sha256 of the file's bytes), loads
/// the model once per side, checks every side tokenizes every prompt identically, decodes,
/// and analyses; recorded sides (opt.recorded) are checked against this run and appended.
/// Throws arbiter::Error on unreadable or empty prompt files, bad options, and a recorded
/// side whose prompts, weights, tokenizer, token count or tokenization differ.
GateReport run_gate(const GateOptions& opt);

/// Human report (verdict line last); tokens are shown as 'text'(id) when pieces holds them.
std::string gate_text(const GateReport& r);
nlohmann::json gate_json(const GateReport& r);
/// A token's bytes for a one-line report: newline, tab, quote and control bytes escaped.
std::string printable_piece(const std::string& bytes);
/// A token as the reports show it: 'text'(id) when r.pieces holds it, else the id; -1 "(end)".
std::string gate_token_text(const GateReport& r, int32_t id);

}  // namespace arbiter::verify
