// opcheck: every op of the model, with its real shapes and weights, on one tier against the
// f64 ref tier, on identical inputs: the inputs each op saw in a ref forward of real tokens
// (captured), fed to the checked tier's own forward by overwriting every stage with ref's
// (engine/probe.h replay_forwards). Reports max abs, mean abs and NMSE per (stage, layer) and
// per op against the bound of verify/localize/drift.h; an op over its bound (or producing
// NaN/Inf) is flagged. Also checks the logits summary (lse, top-k) on the ref's logits. A new
// op is checked once the forward declares its stage (model/stage.h StagePoint).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "verify/localize/drift.h"

namespace arbiter::verify {

struct OpcheckRow {
  LocalRow id;
  ErrAccum err;
  bool flagged = false;
};

/// Per op: how many (stage, layer) checks, how many flagged, the worst error/bound ratio.
struct OpcheckOp {
  std::string op;
  int checks = 0, flagged = 0;
  double worst_ratio = 0;
  std::string worst;  // "gate@L1"
  double worst_nmse = 0;
};

/// The device's logits summary (lse, target logit, top-K) computed from ref's logits.
struct SummarizeCheck {
  int rows = 0;
  double max_lse_err = 0, max_target_err = 0;
  double lse_bound = 0;   // C * (u_l * max|logit| + u_a * sqrt(V))
  int top1_mismatch = 0;  // top-1 differs where ref's top-1/top-2 gap > 2 u_l max|logit|
  int64_t nonfinite = 0;
  bool flagged = false;
};

struct OpcheckReport {
  std::string model_path, device, compute, inject = "none";
  int positions = 0, width = 0, forwards = 0;
  Roundoff u;
  std::vector<OpcheckRow> rows;  // forward order
  std::vector<OpcheckOp> ops;    // op order of first appearance
  SummarizeCheck summarize;
  int n_flagged = 0;  // rows flagged (+1 when the summary is)
};

/// ref_cap: a capture of the ref tier (capture_forwards on a ref Session); replayed: the
/// checked tier's replay of it (replay_forwards, with its fault, if any), on backend be. V:
/// the vocabulary. u: the checked tier's roundoff (coarser of it and ref's).
OpcheckReport run_opcheck(const Capture& ref_cap, const Capture& replayed, Backend& be, int V,
                          const Roundoff& u);

std::string opcheck_text(const OpcheckReport& r);
std::string opcheck_tsv(const OpcheckReport& r);
nlohmann::json opcheck_json(const OpcheckReport& r);

}  // namespace arbiter::verify
