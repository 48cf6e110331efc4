// Routing flips between two sides of a mixture-of-experts model (docs/traces.md §"Routing
// flips"): the (position, layer) pairs where the two sides sent a token to different sets of
// experts, each classed by the reference side's router margin (k-th minus (k+1)-th selection
// score) as a near-tie (margin < threshold: rounding may legitimately decide it) or decided
// (a correct candidate keeps the reference's experts there). compare reads them from two
// traces' routes columns, drift from two captures; both print format_route_flips.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace arbiter::verify {

/// Default threshold on the reference's margin, in selection-score units: a flip with a
/// margin at or above it is "decided". Why 0.01: a softmax score moves by about p_k times the
/// change of its router logit, and p_k <= 1/k; a bf16 tier's router logits carry errors of
/// a few 2^-8 relative, i.e. about 0.01 on logits of a few units, so with k >= 2 rounding
/// alone moves a probability margin by well under 0.01; f32 tiers by about 1e-6. See
/// docs/traces.md for the units of each router kind.
constexpr double kRouteDecided = 0.01;

/// One side's routing of one token at one layer. chunk/pos: a trace's row (drift: chunk 0
/// and the absolute position).
struct RouteSample {
  int chunk = 0, pos = 0, layer = 0;
  std::vector<int32_t> ids;  // the k experts, any order
  double margin = 0;         // k-th minus (k+1)-th selection score
};

/// One flip, for the reports' list (largest reference margin first).
struct RouteFlip {
  int chunk = 0, pos = 0, layer = 0;
  std::vector<int32_t> ref_ids, cand_ids;  // as recorded (descending score)
  double ref_margin = 0, cand_margin = 0;
};

/// Flips at one layer.
struct LayerFlips {
  int layer = 0;
  int64_t pairs = 0, flips = 0, decided = 0;
};

struct RouteFlips {
  bool recorded = false;  // at least one side recorded routes (false: a dense model)
  bool compared = false;  // both sides recorded routes of the same layers
  std::string note;       // when not compared: why (one line)
  std::string score;      // the margins' units (the reference's router kind)
  double threshold = kRouteDecided;
  int64_t pairs = 0;      // (position, layer) pairs present on both sides
  int64_t unmatched = 0;  // pairs present on one side only
  int64_t flips = 0, decided = 0, near_tie = 0;
  /// The largest reference margin at any flip (threshold-free: the class of every flip
  /// changes at a threshold above it); NaN when there is no flip.
  double max_margin_at_flip = std::numeric_limits<double>::quiet_NaN();
  std::vector<LayerFlips> layers;  // ascending layer
  std::vector<RouteFlip> worst;    // up to 10, largest reference margin first
};

/// Counts the flips of cand against ref, matched by (chunk, pos, layer); ids are compared as
/// sets. A flip is near-tie when ref's margin < threshold, else decided (a NaN margin too:
/// a router that produced NaN decided nothing legitimately).
RouteFlips count_route_flips(const std::vector<RouteSample>& ref,
                             const std::vector<RouteSample>& cand, double threshold);

/// "routing flips ..." report lines, each starting with indent.
std::string format_route_flips(const RouteFlips& f, const std::string& indent);
nlohmann::json to_json(const RouteFlips& f);

}  // namespace arbiter::verify
