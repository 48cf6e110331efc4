// Judging a candidate trace against a reference trace (DESIGN.md §4, docs/traces.md):
// top-1 agreement on decided positions, threshold-free numbers (largest reference gap at
// any disagreement, gap buckets, rank histogram, sweep), logit deltas, perplexity and the
// paired NLL shift with chunk-respecting standard errors, the spread statistic, KL(ref||cand)
// and NaN/Inf counts; then one verdict with its exit code. Two gates decide it: top-1
// disagreement on decided positions, and the drift gate (mean KL against a budget derived
// from the arms' unit roundoff, docs/traces.md §"Drift gate").
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/judge/llama_stats.h"
#include "verify/judge/route_flips.h"
#include "verify/trace/trace.h"

namespace arbiter::verify {

/// Verdicts; the value is the exit code of `arbiter compare`.
enum class Verdict { Pass = 0, Fail = 1, Inconclusive = 2, Incomparable = 3, Unreadable = 4 };

/// "pass", "fail", "inconclusive", "incomparable", "unreadable".
const char* verdict_name(Verdict v);
/// The worse of two verdicts, by severity pass < inconclusive < fail < incomparable <
/// unreadable (a fail outranks "no evidence"; anything that stopped a comparison outranks
/// a fail, because it may hide one).
Verdict worse_verdict(Verdict a, Verdict b);

/// Default κ of the drift gate: fail when mean KL(ref||cand) > κ·u² nats, u the coarser
/// unit roundoff of the two arms (floored at f32's). Calibrated on trusted pairs; the table
/// and the commands that produced it are in docs/traces.md §"Drift gate".
constexpr double kDefaultKlKappa = 3e5;

/// The unit roundoff the drift gate uses for a trace's compute dtype: f64 2^-53, f32 2^-24,
/// f16 2^-11, bf16 2^-8 (storage roundoff; core/dtype.h). NaN for an unknown or empty name.
/// A trace whose header records activations quantized on the fly (`act_quant`, 8-bit codes
/// per block: a value rounds by up to half a step, 1/254 of its block's max) gets at least
/// 2^-8, bf16's: its matmul inputs are no finer than bf16's.
double drift_unit_roundoff(const std::string& compute, const std::string& act_quant = "");

struct CompareOptions {
  double decided = 2.0;                          // decided: ref top1 - top2 logit >= this
  std::vector<double> sweep = {0.5, 1.0, 2.0, 5.0};  // `decided` is added if missing
  bool force = false;                            // judge even when identity fields differ
  std::string ref_logits, cand_logits;           // full-logits files; both or KL is estimated
  std::string ref_label, cand_label;             // names in the report (default: trace paths)
  double kl_kappa = kDefaultKlKappa;             // drift gate: budget = kl_kappa * u^2
  double route_decided = kRouteDecided;          // a routing flip is decided: ref margin >= this
  // ref and cand are different checkpoints of one model (a quantization and its parent): their
  // model and tokenizer files may differ (noted, not a mismatch); the tokens may not.
  bool other_weights = false;
};

/// Mean of per-position values with two standard errors: iid (sd/sqrt(n)) and chunk
/// batch means (clusters = chunks; see docs/traces.md), and the t values mean/SE.
struct MeanSe {
  int64_t n = 0, chunks = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();
  double sd = std::numeric_limits<double>::quiet_NaN();
  double se_iid = std::numeric_limits<double>::quiet_NaN();
  double se_chunk = std::numeric_limits<double>::quiet_NaN();
  double t_iid = std::numeric_limits<double>::quiet_NaN();
  double t_chunk = std::numeric_limits<double>::quiet_NaN();
};

/// values[i] belongs to cluster[i] (a chunk index). se_chunk needs >= 2 clusters.
MeanSe mean_se(const std::vector<double>& values, const std::vector<int64_t>& cluster);

/// Nearest-rank percentiles (p-th value = sorted[ceil(p*n) - 1]).
struct Quantiles {
  int64_t n = 0;
  double p50 = std::numeric_limits<double>::quiet_NaN();
  double p90 = std::numeric_limits<double>::quiet_NaN();
  double p99 = std::numeric_limits<double>::quiet_NaN();
  double max = std::numeric_limits<double>::quiet_NaN();
};
Quantiles quantiles(std::vector<double> values);

/// An identity field that differs between the two traces ("model", "corpus", "tokenizer",
/// "shape", "targets", "rows").
struct Mismatch {
  std::string field, detail;
};

struct SweepPoint {
  double threshold = 0;
  int64_t decided = 0, disagree = 0;
};

struct GapBucket {
  double lo = 0, hi = 0;  // [lo, hi) of the reference top1 - top2 logit gap
  int64_t positions = 0, disagree = 0;
};

/// One top-1 disagreement, for the report's list (largest reference gap first).
struct Disagreement {
  int chunk = 0, pos = 0;
  int64_t abs_pos = -1;
  int32_t target = 0, ref_top1 = 0, cand_top1 = 0;
  double ref_gap = 0;
  int cand_rank = 0;  // rank of ref top-1 in the candidate's top-k; 0 = beyond top-k
};

/// One matched position, for plots (the matrix report): what the statistics above are
/// made of, in reference row order. Not part of to_json.
struct PositionPoint {
  double ref_gap = 0;      // reference top-1 - top-2 logit (NaN: K < 2)
  double logit_delta = 0;  // candidate - reference logit of the reference's top-1 (NaN: n/a)
  double drift_kl = 0;     // the drift gate's per-position KL (NaN: unavailable)
  bool disagree = false;   // top-1 ids differ
};

struct CompareResult {
  std::string ref_label, cand_label;
  Verdict verdict = Verdict::Inconclusive;
  std::vector<std::string> reasons;     // why this verdict, one line each
  bool forced = false;                  // --force overrode mismatches
  std::vector<Mismatch> mismatches;     // identity differences (incomparable unless forced)
  std::vector<std::string> unchecked;   // identity fields unknown on one side
  std::vector<std::string> notes;       // anything else a reader must know

  std::string ref_device, cand_device;  // "device compute weights", "" unknown
  TracePreamble ref_preamble, cand_preamble;  // loader lines skipped before a foreign header
  int64_t ref_rows = 0, cand_rows = 0, positions = 0, chunks = 0;
  int64_t topk_ref = 0, topk_cand = 0;

  // Top-1 agreement.
  int64_t disagree = 0;
  double decided_threshold = 2.0;
  int64_t decided = 0, decided_disagree = 0;
  int64_t gap_unknown = 0;                  // positions without a ref top-2 (K < 2 or NaN)
  std::vector<SweepPoint> sweep;
  double max_gap_at_disagreement = std::numeric_limits<double>::quiet_NaN();  // NaN: none
  std::vector<GapBucket> gap_buckets;
  std::vector<int64_t> rank_hist;           // [r-1]: ref top-1 at candidate rank r
  int64_t rank_beyond = 0;                  // ref top-1 not in the candidate's top-k
  int worst_rank = 0;                       // largest rank seen; 0 when some were beyond
  std::vector<Disagreement> worst_disagreements;  // up to 10, largest ref gap first

  // What the compared logit columns hold (docs/traces.md §"Log-probabilities"): "logit"
  // (raw logits), "logprob" (a side holds log-probabilities; the other was made so with its
  // lse), or "shifted" (log-probabilities against raw logits without lse: each row differs by
  // an unknown shift, so only shift-invariant statistics are computed).
  std::string logit_units = "logit";

  // Candidate minus reference logit (log-probability with logit_units "logprob"; not
  // computed when "shifted") of the reference's top-1 token.
  Quantiles top1_logit_abs_delta;
  MeanSe top1_logit_delta;
  int64_t top1_logit_unavailable = 0;  // token neither in cand top-k nor the target

  // NLL and perplexity over positions where both NLLs are finite.
  double mean_nll_ref = std::numeric_limits<double>::quiet_NaN();
  double mean_nll_cand = std::numeric_limits<double>::quiet_NaN();
  double ppl_ref = std::numeric_limits<double>::quiet_NaN();
  double ppl_cand = std::numeric_limits<double>::quiet_NaN();
  double ppl_diff_pct = std::numeric_limits<double>::quiet_NaN();
  double ppl_diff_pct_se = std::numeric_limits<double>::quiet_NaN();  // delta method, chunk SE
  MeanSe nll_shift;                         // cand - ref, nats
  int64_t nll_higher = 0, nll_lower = 0, nll_equal = 0;

  // Spread: top-1 logit minus top-K logit, K = min(topk_ref, topk_cand).
  int64_t spread_k = 0;
  MeanSe spread_ref, spread_cand, spread_shift;

  // KL(ref || cand) in nats per position.
  std::string kl_method;  // "exact", "topk_tail_estimate" or "unavailable"
  std::string kl_note;
  // llama-perplexity's statistics of cand against ref (llama_stats.h), from full logits on
  // both sides; otherwise llama_note says why they are absent.
  std::optional<LlamaKldStats> llama;
  std::string llama_note;
  MeanSe kl;
  Quantiles kl_q;

  // Drift gate: mean KL against budget = kappa * u^2. u = max(u_ref, u_cand, 2^-24), each
  // from the trace's compute dtype; the floor is the precision at which traces record
  // logits (%.9g, float32 logits files). The KL judged (drift_kl) is the exact KL, or
  // without full logits the lse-free part of the estimate, P_S * KL(p|S || q|S) over the
  // shared top-k ids S (docs/traces.md §Drift gate: the tail term carries the rounding of
  // the recorded lse). Not applied ("n/a") when the KL is unavailable or a compute dtype is
  // unknown; drift_note says why.
  MeanSe drift_kl;
  std::string drift_kl_method;       // "exact" or "shared_topk"; "" when not applied
  std::string drift_status = "n/a";  // "pass", "fail" or "n/a"
  std::string drift_note;
  double drift_kappa = std::numeric_limits<double>::quiet_NaN();
  double drift_u = std::numeric_limits<double>::quiet_NaN();
  double drift_budget = std::numeric_limits<double>::quiet_NaN();  // kappa * u^2, nats
  double kl_over_u2 = std::numeric_limits<double>::quiet_NaN();    // drift_kl.mean / u^2

  // NaN/Inf values over all rows of each trace, and over the full-logits rows read (exact
  // KL only); any of them fails the verdict.
  int64_t nonfinite_ref = 0, nonfinite_cand = 0;
  int64_t nonfinite_logits_ref = 0, nonfinite_logits_cand = 0;

  // Routing flips of a mixture-of-experts model over the matched positions, when both
  // traces record routes (route_flips.h). Evidence, not a gate: a deep layer's router reads
  // a hidden state that legitimately drifted through every layer before it, so its flips
  // say where routing diverged; whether the router itself is wrong is drift's to say.
  RouteFlips routes;

  std::vector<PositionPoint> points;  // every matched position
};

/// Compares cand against ref. Rows are matched by (chunk, pos); abs_pos and target must
/// agree. Throws arbiter::Error only for unusable full-logits files (caller: unreadable).
CompareResult compare_traces(const Trace& ref, const Trace& cand, const CompareOptions& opt);

/// The human report (always includes the threshold-free numbers), several lines.
std::string format_report(const CompareResult& r);
/// `compare --explain`: each statistic's formula with this run's values substituted.
std::string format_explain(const CompareResult& r);
/// Everything in the result as one JSON object, with "verdict" and "exit_code".
nlohmann::json to_json(const CompareResult& r);

/// The conventional full-logits side file of a trace: PATH + ".logits".
std::string logits_path_for(const std::string& trace_path);

}  // namespace arbiter::verify
