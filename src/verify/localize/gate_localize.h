// arbiter gate --localize: from a gate divergence to the stage that made it (docs/localize.md).
//
// For every counted divergence of a gate run, drift (verify/localize/drift.h) runs between the
// reference side and the diverging side on that step's prefix: the prompt's ids followed by
// the reference's first `step` generated tokens, in ONE forward, so the logits at its last
// position are the step the gate judged. Per divergence it reports both sides' top-5 there,
// the reference's top-1/top-2 gap, the rank of the reference's token in the side's logits, the
// drift summary (first stage over its bound, largest local/bound, jump or uniform growth) and
// a class:
//   localized defect  a stage's local error is over its bound (named: stage, op, layer);
//   near-tie flip     no stage over its bound, and the gate judged the flip a near-tie
//                     (deficit <= band, so the reference's top-1/top-2 gap is within it too);
//   unexplained       no stage over its bound, yet the flip cost more than the band.
// To add a class, extend localize_class() and the class table in docs/localize.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/localize/drift.h"
#include "verify/localize/gate.h"

namespace arbiter::verify {

enum class LocalizeClass { NearTieFlip, LocalizedDefect, Unexplained };
const char* localize_class_name(LocalizeClass c);  // "near-tie flip", ...

struct TopToken {
  int32_t id = -1;
  std::string piece;  // the token's bytes
  double logit = 0;
};

/// One divergence, localized.
struct GateLocalization {
  int side = 0, prompt = 0, step = 0;  // as in GateDivergence
  int positions = 0;                   // prefix length: prompt ids + step generated tokens
  int32_t ref_token = -1, side_token = -1;  // the tokens the two sides generated at the step
  std::vector<TopToken> ref_top, side_top;  // top-5 of each side's logits there (ties: lower id)
  double ref_gap = 0;        // reference's top-1 minus top-2 logit (nats)
  double deficit = 0;        // the gate's: reference's logprob of its top-1 minus of side_token
  int ref_rank_in_side = 0;  // 1-based rank of ref_token in the side's logits (ties: lower id)
  DriftReport drift;
  DriftSummary summary;
  LocalizeClass cls = LocalizeClass::Unexplained;
};

struct GateLocalizeReport {
  double band = 0.5, jump_factor = kJumpFactor;
  std::vector<std::string> side_labels;  // as in the gate report (index = side)
  std::vector<GateLocalization> items;   // one per counted divergence, in the gate's order
  int recorded_skipped = 0;  // counted divergences of recorded sides (no tier here to run)
};

/// The class rule (file comment): a drift with any stage over its bound is a localized
/// defect; else a flip the gate judged a near-tie (deficit <= band) is a near-tie flip; else
/// unexplained.
LocalizeClass localize_class(const DriftReport& drift, double deficit, double band);

/// Fills a localization from the drift on the step's prefix and both sides' logits rows [V]
/// at its last position (drift_run's a_last / b_last). Throws arbiter::Error on rows of
/// different or zero length.
GateLocalization localize_divergence(const GateDivergence& d, DriftReport drift,
                                     const std::vector<double>& ref_row,
                                     const std::vector<double>& side_row, const Model& m,
                                     double band, double jump_factor = kJumpFactor);

/// Runs drift for every counted divergence of `gate` (which run_gate(opt) produced: the
/// sides, model and threads are opt's). Each prefix runs as one forward on fresh sessions of
/// the sides' tiers, faults included. Divergences of recorded sides (gate --against; after
/// opt.sides) are counted in recorded_skipped: their tiers do not run here.
GateLocalizeReport run_gate_localize(const GateOptions& opt, const GateReport& gate);

/// Text section printed after gate_text(): one block per divergence and a class count.
std::string gate_localize_text(const GateLocalizeReport& r);
/// The same as markdown (tables), for reports that convert markdown (the matrix report).
std::string gate_localize_markdown(const GateLocalizeReport& r);
/// The array merged into gate --json under "localize".
nlohmann::json gate_localize_json(const GateLocalizeReport& r);

}  // namespace arbiter::verify
