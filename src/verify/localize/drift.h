// Localization inside the forward pass (docs/localize.md).
//
// capture_forwards() records every stage output of a forward on one tier (host f64 copies).
// StageReplayer recomputes ONE stage on a tier from another tier's captured inputs (the
// stage's own op(s) only), so its error does not compound: the "local" error. drift compares
// two tiers' chains stage by stage (accumulated) and their replays (local) and flags the first
// stage whose local error exceeds the bound expected for the precision; opcheck reuses the
// replay op by op against the f64 ref tier.
//
// Bound (one table for drift and opcheck), relative L2 of a stage's output:
//   bound = C * ( u_s * (sqrt(m) + amp) + u_a * sqrt(n) ),   C = kBoundSafety = 4
// u_s/u_a: storage/accumulation unit roundoff of the coarser side (verify/localize/side.h);
// m: storage roundings feeding one output element (inputs, weights, output);
// n: reduction length (terms summed per output element);
// amp: extra error amplification (attention: rounding q and k moves each score, and softmax
//      turns score shifts into relative changes of the output; amp = 2 S with S computed
//      from the data by attention_score_scale).
// The sqrt terms model independent roundings (random walk), as NMSE-style checks do.
// C = 4 leaves room for cancellation (||W||x|| / ||Wx|| up to about 4); a correct tier sits
// about an order of magnitude below the bound (docs/localize.md has measured ratios).
#pragma once
#include <compare>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/session.h"
#include "model/forward.h"
#include "verify/localize/side.h"

namespace arbiter::verify {

/// One stage output inside the forward: (stage, layer); layer -1 outside the blocks.
struct StageId {
  Stage stage = Stage::Embed;
  int layer = -1;
  auto operator<=>(const StageId&) const = default;
};
/// "embed", "q@L0", "logits".
std::string stage_id_name(const StageId& id);
/// Every stage the forward emits for cfg, in forward order (q_norm/k_norm only with qk_norm).
std::vector<StageId> forward_stages(const ModelConfig& cfg);
/// The backend op producing a stage: "embed", "rmsnorm", "matmul", "rope", "attention",
/// "swiglu", "add".
const char* stage_op(Stage s);

/// Stage outputs of one forward of T tokens at positions pos0.. (host f64, [T, cols]).
struct CapturedForward {
  int pos0 = 0, T = 0;
  std::vector<int32_t> ids;
  std::map<StageId, std::vector<double>> out;
  std::map<StageId, int> cols;
  /// The captured output; throws arbiter::Error when the stage was not captured.
  const std::vector<double>& at(const StageId& id) const;
};
using Capture = std::vector<CapturedForward>;

/// Resets s and runs tokens through it as forwards of at most width tokens (width = 1 is
/// the decode path), capturing every stage after injection. Restores s's capture hook to none.
Capture capture_forwards(Session& s, const std::vector<int32_t>& tokens, int width);

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
  double value = 0;       // the bound on relative L2
};
constexpr double kBoundSafety = 4.0;
/// ctx: cache rows attention reads (the largest pos0 + T); score_scale: S for attention.
StageBound stage_bound(const StageId& id, const ModelConfig& cfg, int64_t ctx, double score_scale,
                       const Roundoff& u);
/// S = sqrt( sum over (query, head) of sum_j p_j^2 r_j^2 |v_j - out|^2 / sum |out|^2 ),
/// r_j^2 = sum_i (q_i k_ji)^2 / Dh, p the softmax weights over the keys the query sees
/// (causal, sliding window; GQA: head h reads kv head h / (H / Hkv)), from the captured
/// q_rope, k_rope and v of a layer: the first-order relative L2 change of the attention
/// output per unit roundoff of the scores (see drift.cpp for the derivation).
double attention_score_scale(const Capture& cap, int layer, const ModelConfig& cfg);

/// Recomputes single stages on a backend from another side's captured inputs.
class StageReplayer {
 public:
  /// be must hold m's weights already (a Session was made on it, or be.prepare was called).
  /// inject is the fault of the replaying side, applied to the replayed output exactly as the
  /// forward applies it (so a faulty op shows up locally).
  StageReplayer(const Model& m, Backend& be, const InjectSpec& inject);
  ~StageReplayer();
  StageReplayer(const StageReplayer&) = delete;
  StageReplayer& operator=(const StageReplayer&) = delete;

  /// Stage id of forward f of cap recomputed on the backend; returns [T, cols] in f64.
  /// Inputs (from cap): embed: token ids; attn_norm: the residual entering the layer;
  /// q/k/v: attn_norm; q_norm/k_norm: q/k; q_rope/k_rope: q_norm/k_norm (or q/k);
  /// attn: q_rope and the k_rope/v rows of forwards 0..f (stored with kv_store); o: attn;
  /// attn_res: residual in + o; ffn_norm: attn_res; gate/up: ffn_norm; act: gate, up;
  /// down: act; ffn_res: attn_res + down; final_norm: last ffn_res; logits: final_norm.
  std::vector<double> replay(const Capture& cap, size_t f, const StageId& id);
  Backend& backend() { return be_; }

 private:
  Buffer& slot(int i, int64_t n, bool logits = false);
  void put(int i, const std::vector<double>& v, int64_t n, bool logits = false);
  const Model& m_;
  Backend& be_;
  InjectSpec inject_;
  std::map<int, Buffer> bufs_;
};

/// One stage's row of the drift table.
struct DriftRow {
  StageId id;
  int64_t rows = 0, cols = 0;
  ErrAccum acc;    // b's chain vs a's chain
  ErrAccum local;  // b's replay on a's inputs vs a's output
  StageBound bound;
  bool flagged = false;  // local rel_l2 > bound, or non-finite
};

struct DriftReport {
  std::string model_path, corpus_path;
  std::string a_label, b_label, a_device, b_device, a_compute, b_compute;
  std::string a_inject = "none", b_inject = "none";
  int positions = 0, width = 0, forwards = 0;
  Roundoff u;
  std::vector<DriftRow> rows;  // forward order
  int first_flagged = -1;      // index into rows, -1 when none
  int n_flagged = 0;
};

/// Compares captures a and b (same tokens, same forwards) and replays every stage of a on
/// the replayer's backend (side b). u: the coarser roundoff of the two sides.
DriftReport drift_compare(const Model& m, const Capture& a, const Capture& b,
                          StageReplayer& replay_b, const Roundoff& u);

/// Human table (one row per stage, a per-layer summary, the first flagged stage).
std::string drift_text(const DriftReport& r);
/// TSV with a header line; one row per stage.
std::string drift_tsv(const DriftReport& r);
/// SVG: accumulated and local relative L2 (log y) along the forward, ticks per layer, bound.
std::string drift_svg(const DriftReport& r);
nlohmann::json drift_json(const DriftReport& r);

/// "%.3g" with inf/nan spelled out (tables).
std::string fmt_g(double v);

}  // namespace arbiter::verify
