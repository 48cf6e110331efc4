// Stages: the named outputs inside a forward that drift compares, opcheck checks and --inject
// perturbs. The architecture's forward declares each stage as it computes it (a StagePoint,
// carrying what the stage's error bound needs) and receives the stage's tap from the hook;
// nothing else in the project lists a model's structure.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/tap.h"

namespace arbiter {

/// What the attention-score amplification of a stage's error bound reads (localize/bound.h):
/// the stages holding its q (roped), k (roped) and v inputs, and the attention's geometry.
struct AttentionGeometry {
  const char* q = "";
  const char* k = "";
  const char* v = "";
  int H = 0, Hkv = 0, Dh = 0;
  int window = 0;      // 0: full causal attention; else keys in (i - window, i]
  double scale = 0;    // the scores' scale (1 / sqrt(Dh) for the llama family)
};

/// One stage output of one forward.
struct StagePoint {
  const char* name = "";      // "attn_norm": what --inject op= names
  int layer = -1;             // -1 outside the blocks
  const char* op = "";        // the op computing it: "rmsnorm", "matmul", ...
  int rows = 0, cols = 0;     // its shape in this forward ([T, ...]; a state's own shape)
  int64_t reduction = 1;      // n: terms summed per output element
  int roundings = 3;          // m: storage roundings feeding one output element
  const AttentionGeometry* attention = nullptr;  // attention stages only
};

/// Given to the forward: the tap of each stage, or nullptr to leave it alone. pos0 is the
/// forward's first position (fault noise is seeded by absolute position).
class StageHook {
 public:
  virtual ~StageHook() = default;
  virtual const StageTap* at(const StagePoint& p, int pos0) = 0;
};

/// One token's routing at one mixture-of-experts layer: the experts it went to (by
/// descending selection score) and the router's margin, the k-th minus the (k+1)-th
/// selection score (backend/moe_routing.h Route).
struct RoutePick {
  int layer = 0;
  int pos = 0;  // absolute position of the token
  std::vector<int> ids;
  double margin = 0;
};

/// Where a forward's routing decisions go when someone asked for them (traces, drift): the
/// forward appends one pick per (token, MoE layer). A dense model appends nothing.
struct RouteLog {
  int experts = 0, top_k = 0;  // E and k of the model's routers (the last seen)
  std::string score;           // what the margin is a difference of (router_score_name)
  std::vector<RoutePick> picks;
};

/// The taps of one forward, for an architecture's forward(): declares each stage (its
/// point) to the hook, if any, and returns the stage's tap (nullptr without a hook); and
/// passes routing decisions to the forward's RouteLog, if any.
class Stages {
 public:
  /// route_rows >= 0: only rows [route_row0, route_row0 + route_rows) of the forward's T are
  /// one sequence's (a batched forward's), at positions pos0..: only their routing is logged.
  Stages(StageHook* hook, int pos0, int T, RouteLog* routes = nullptr, int route_row0 = 0,
         int route_rows = -1)
      : hook_(hook), routes_(routes), pos0_(pos0), T_(T), row0_(route_row0),
        rows_(route_rows < 0 ? T : route_rows) {}
  const StageTap* operator()(const char* name, int layer, const char* op, int cols,
                             int64_t reduction, int roundings,
                             const AttentionGeometry* attention = nullptr) const {
    return point(name, layer, op, T_, cols, reduction, roundings, attention);
  }
  /// A recurrent state the forward leaves for the next one ([rows, cols] whatever the
  /// forward's width), tapped after its last write: a replay's overwrite is then what the
  /// next forward reads, so the stage's local error is this forward's update alone.
  const StageTap* state(const char* name, int layer, const char* op, int rows, int cols,
                        int64_t reduction, int roundings) const {
    return point(name, layer, op, rows, cols, reduction, roundings, nullptr);
  }

  /// Whether someone asked for the routing decisions (a tier keeps them on its device
  /// otherwise: Backend::moe's routes).
  bool wants_routes() const { return routes_ != nullptr; }
  /// Records token t's routing at layer l (E experts, top-k, score: router_score_name).
  void route(int layer, int t, const std::vector<int>& ids, double margin, int experts,
             const char* score) const {
    if (!routes_ || t < row0_ || t >= row0_ + rows_) return;
    routes_->experts = experts;
    routes_->top_k = int(ids.size());
    routes_->score = score;
    routes_->picks.push_back({layer, pos0_ + t - row0_, ids, margin});
  }

 private:
  const StageTap* point(const char* name, int layer, const char* op, int rows, int cols,
                        int64_t reduction, int roundings,
                        const AttentionGeometry* attention) const {
    if (!hook_) return nullptr;
    StagePoint p;
    p.name = name;
    p.layer = layer;
    p.op = op;
    p.rows = rows;
    p.cols = cols;
    p.reduction = reduction;
    p.roundings = roundings;
    p.attention = attention;
    return hook_->at(p, pos0_);
  }

  StageHook* hook_;
  RouteLog* routes_;
  int pos0_, T_;
  int row0_, rows_;  // the rows whose routing is logged
};

}  // namespace arbiter
