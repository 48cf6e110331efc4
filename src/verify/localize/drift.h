// Localization inside the forward pass (docs/localize.md).
//
// A capture (engine/probe.h) records every stage output of a forward on one tier; a replay
// runs the forward again on a tier with each stage overwritten by another tier's capture
// right after it is recorded, so each stage's error does not compound: the "local" error.
// Both run the forward that trace and generate run, fused kernels included. drift compares
// two tiers' chains stage by stage (accumulated) and b's replay on a's capture (local), and
// flags the first stage whose local error exceeds the bound expected for the precision;
// opcheck is the local column against the f64 ref tier.
//
// Bound (one formula for drift and opcheck), relative L2 of a stage's output:
//   bound = C * ( u_s * (sqrt(m) + amp) + u_a * sqrt(n) ),   C = kBoundSafety = 4
// u_s/u_a: storage/accumulation unit roundoff of the coarser side (core/dtype.h);
// m: storage roundings feeding one output element (inputs, weights, output);
// n: reduction length (terms summed per output element);
// m and n come with each stage from the architecture's forward (model/stage.h);
// amp: extra error amplification (attention: rounding q and k moves each score, and softmax
//      turns score shifts into relative changes of the output; amp = 2 S with S computed
//      from the data by attention_score_scale).
// A stage whose op rounded its inputs beyond the storage type on either side (the cpu tier's
// decode matmuls on 8-bit activation codes) adds the relative L2 that rounding can cause,
//   q = sqrt( sum over its values of sum_k (|w_k| r_k)^2 / sum a^2 ),
// r_k the largest rounding of input k (d/2 for a block of scale d), measured by the tier
// that rounded (StageRecord::input_rounding): bound = C * (... + q).
// The sqrt terms model independent roundings (random walk), as NMSE-style checks do.
// C = 4 leaves room for cancellation (||W||x|| / ||Wx|| up to about 4); a correct tier sits
// about an order of magnitude below the bound (docs/localize.md has measured ratios).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/probe.h"
#include "verify/judge/route_flips.h"

namespace arbiter::verify {

/// "embed", "q@L0", "logits".
std::string stage_id_name(const std::string& stage, int layer);

/// Error of a candidate against a reference, accumulated over many elements.
struct ErrAccum {
  int64_t n = 0;          // finite pairs
  int64_t nonfinite = 0;  // pairs where either value is NaN or Inf
  double sum_d2 = 0, sum_r2 = 0, sum_c2 = 0, sum_rc = 0, sum_abs = 0, max_abs = 0;
  void add(const double* ref, const double* cand, int64_t count);
  /// sqrt(sum d^2 / sum ref^2); +inf when anything was non-finite; 0 when both are all zero.
  double rel_l2() const;
  double nmse() const;  // rel_l2 squared
  double mean_abs() const;
  /// ref.cand / (|ref| |cand|); 1 when both are all zero, NaN when only one is.
  double cosine() const;
};

/// The expected local error of one stage (see the file comment).
struct StageBound {
  int64_t reduction = 1;  // n
  int roundings = 3;      // m
  double amp = 0;         // extra multiples of u_s
  double act = 0;         // q: relative L2 of the tiers' own input rounding (activation codes)
  double value = 0;       // the bound on relative L2
};
constexpr double kBoundSafety = 4.0;
StageBound stage_bound(int64_t reduction, int roundings, double score_scale, const Roundoff& u,
                       double act = 0);

/// S = sqrt( sum over (query, head) of sum_j p_j^2 r_j^2 |v_j - out|^2 / sum |out|^2 ),
/// r_j^2 = sum_i (q_i k_ji s)^2 (s the scores' scale), p the softmax weights over the keys
/// the query sees (causal, sliding window; GQA: head h reads kv head h / (H / Hkv)), from
/// the captured q, k and v stages the attention stage names (its geometry): the first-order
/// relative L2 change of the attention output per unit roundoff of the scores (see drift.cpp
/// for the derivation). 0 for a stage that is not an attention.
double attention_score_scale(const Capture& cap, const std::string& stage, int layer);

/// One row of a localization table: a stage over every forward of the capture, and the
/// bound for it (the largest reduction any forward had).
struct LocalRow {
  std::string stage, op;
  int layer = -1;
  int64_t rows = 0, cols = 0;
  StageBound bound;
};
/// The stages of a capture in forward order, each with its bound (u: the coarser roundoff of
/// the two sides compared; q from the input rounding recorded in a and in `other`, the other
/// side's replay, when given). A stage whose tier could not attribute its input rounding is
/// refused with one line naming it.
std::vector<LocalRow> local_rows(const Capture& a, const Roundoff& u,
                                 const Capture* other = nullptr);

/// One stage's row of the drift table.
struct DriftRow {
  LocalRow id;
  ErrAccum acc;    // b's chain vs a's chain
  ErrAccum local;  // b's replay on a's inputs vs a's output
  bool flagged = false;  // local rel_l2 > bound, or non-finite
};

struct DriftReport {
  std::string model_path, corpus_path;  // corpus_path empty when the tokens came otherwise
  std::string input = "BOS + corpus";   // what the positions are, for the report
  std::string a_label, b_label, a_device, b_device, a_compute, b_compute;
  std::string a_inject = "none", b_inject = "none";
  std::string b_providers;     // b's op providers over its capture and replay runs
  int positions = 0, width = 0, forwards = 0;
  Roundoff u;
  std::vector<DriftRow> rows;  // forward order
  int first_flagged = -1;      // index into rows, -1 when none
  int n_flagged = 0;
  /// MoE models: b's routing against a's over the captured forwards (each side its own
  /// chain; a replay routes as a did, so only the chains can flip), classed by a's margins.
  RouteFlips routes;
};

/// Compares captures a and b (same tokens, same forwards) and b_local, b's replay of a
/// (replay_forwards on b's session). u: the coarser roundoff of the two sides; route_decided:
/// the margin at which a routing flip is decided (route_flips.h).
DriftReport drift_compare(const Capture& a, const Capture& b, const Capture& b_local,
                          const Roundoff& u, double route_decided = kRouteDecided);

/// Runs `tokens` on sessions a and b as forwards of at most `width` tokens (capture), replays
/// b on a's capture (local), and compares them with the coarser roundoff of the two tiers.
/// Fills the devices, computes, injects (the sessions') and b's providers; labels and paths
/// are the caller's. a_last / b_last, when given, receive each side's logits row [V] at the
/// last token (the next-token logits after the whole sequence). progress_tag non-empty: each
/// capture and the replay report progress on stderr ("[TAG a]", "[TAG b]", "[TAG replay]").
DriftReport drift_run(Session& a, Session& b, const std::vector<int32_t>& tokens, int width,
                      std::vector<double>* a_last = nullptr, std::vector<double>* b_last = nullptr,
                      const std::string& progress_tag = "", double route_decided = kRouteDecided);

/// How the accumulated error grows through the layers (docs/localize.md, "jump rule"). The
/// error entering layer l is the accumulated rel_l2 of the last stage before it (embed for
/// layer 0); leaving it, that of its last stage (the residual). growth(l) = leaving/entering.
/// A jump is a layer whose growth exceeds `jump_factor` while one of its stages has local
/// error above its bound (local/bound > 1): the error was made there, not carried there.
constexpr double kJumpFactor = 10.0;
struct DriftSummary {
  int worst = -1;            // row with the largest local/bound (-1: no rows)
  double worst_ratio = 0;    // its local rel_l2 / bound (inf when non-finite)
  bool jump = false;
  int growth_layer = -1;     // the jump's layer, else the layer of the largest growth (-1: none)
  double growth = 0;         // growth(growth_layer); inf when the error entering it was 0
  double growth_ratio = 0;   // worst local/bound within growth_layer
};
DriftSummary drift_summary(const DriftReport& r, double jump_factor = kJumpFactor);

/// Human table (one row per stage, a per-layer summary, the first flagged stage).
std::string drift_text(const DriftReport& r);
/// TSV with a header line; one row per stage.
std::string drift_tsv(const DriftReport& r);
/// SVG: accumulated and local relative L2 (log y) along the forward, ticks per layer, bound.
std::string drift_svg(const DriftReport& r);
nlohmann::json drift_json(const DriftReport& r);

/// "%.3g" with inf/nan spelled out (tables).
std::string fmt_g(double v);
/// The bound's formula with u_s and u_u filled in, for the reports' heads; with `act` (some
/// row has q > 0) the q term and what it is.
std::string bound_formula_text(const Roundoff& u, bool act);

}  // namespace arbiter::verify
