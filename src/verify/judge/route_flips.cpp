// Routing flips (route_flips.h).
#include "verify/judge/route_flips.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/text_table.h"

namespace arbiter::verify {

namespace {

std::vector<int32_t> as_set(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::string g(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strformat("%.4g", v);
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

RouteFlips count_route_flips(const std::vector<RouteSample>& ref,
                             const std::vector<RouteSample>& cand, double threshold) {
  RouteFlips f;
  f.recorded = f.compared = true;
  f.threshold = threshold;
  using Key = std::tuple<int, int, int>;  // layer first: the per-layer table comes out sorted
  std::map<Key, const RouteSample*> c;
  for (const RouteSample& s : cand) c[{s.layer, s.chunk, s.pos}] = &s;
  std::map<int, LayerFlips> layers;
  size_t matched = 0;
  for (const RouteSample& r : ref) {
    auto it = c.find({r.layer, r.chunk, r.pos});
    if (it == c.end()) {
      ++f.unmatched;
      continue;
    }
    ++matched;
    const RouteSample& x = *it->second;
    LayerFlips& L = layers[r.layer];
    L.layer = r.layer;
    ++L.pairs, ++f.pairs;
    if (as_set(r.ids) == as_set(x.ids)) continue;
    const bool near = r.margin < threshold;
    ++L.flips, ++f.flips;
    if (near) ++f.near_tie;
    else ++L.decided, ++f.decided;
    if (!(f.max_margin_at_flip >= r.margin)) f.max_margin_at_flip = r.margin;  // NaN: first/NaN
    f.worst.push_back({r.chunk, r.pos, r.layer, r.ids, x.ids, r.margin, x.margin});
  }
  f.unmatched += int64_t(cand.size() - matched);
  for (auto& [l, L] : layers) f.layers.push_back(L);
  // Largest reference margin first (NaN first: the most alarming), then position order.
  std::stable_sort(f.worst.begin(), f.worst.end(), [](const RouteFlip& a, const RouteFlip& b) {
    const double ka = std::isnan(a.ref_margin) ? INFINITY : a.ref_margin;
    const double kb = std::isnan(b.ref_margin) ? INFINITY : b.ref_margin;
    return ka > kb;
  });
  if (f.worst.size() > 10) f.worst.resize(10);
  return f;
}

std::string format_route_flips(const RouteFlips& f, const std::string& in) {
  if (!f.compared) return in + "routing flips: not compared (" + f.note + ")\n";
  std::string o = in + strformat("routing flips (expert sets that differ, classed by the reference's %s margin)\n",
                                 f.score.c_str());
  o += in + strformat("  flips  %lld / %lld (position, layer) pairs: %lld decided (ref margin >= %g), %lld near-tie\n",
                      (long long)f.flips, (long long)f.pairs, (long long)f.decided, f.threshold,
                      (long long)f.near_tie);
  if (f.flips > 0) o += in + "  largest ref margin at any flip: " + g(f.max_margin_at_flip) + "\n";
  if (f.unmatched > 0)
    o += in + strformat("  unmatched pairs (routed on one side only): %lld\n", (long long)f.unmatched);
  std::string by;
  for (const LayerFlips& L : f.layers)
    by += strformat("  L%d %lld/%lld (%lld decided)", L.layer, (long long)L.flips, (long long)L.pairs,
                    (long long)L.decided);
  if (!by.empty()) o += in + "  by layer:" + by + "   (flips/pairs)\n";
  if (f.worst.empty()) return o;
  o += in + "  flips, largest ref margin first:\n";
  TextTable t({{"chunk"}, {"pos"}, {"layer"}, {"ref_experts"}, {"cand_experts"}, {"ref_margin"},
               {"cand_margin"}, {"class", TextTable::Left}});
  for (const RouteFlip& x : f.worst)
    t.row({std::to_string(x.chunk), std::to_string(x.pos), std::to_string(x.layer), ids_text(x.ref_ids),
           ids_text(x.cand_ids), g(x.ref_margin), g(x.cand_margin),
           x.ref_margin < f.threshold ? "near-tie" : "DECIDED"});
  o += t.str(in + "    ");
  return o;
}

nlohmann::json to_json(const RouteFlips& f) {
  nlohmann::json j = {{"recorded", f.recorded}, {"compared", f.compared}};
  if (!f.compared) {
    j["note"] = f.note;
    return j;
  }
  j["score"] = f.score;
  j["threshold"] = f.threshold;
  j["pairs"] = f.pairs;
  j["unmatched"] = f.unmatched;
  j["flips"] = f.flips;
  j["decided"] = f.decided;
  j["near_tie"] = f.near_tie;
  j["max_margin_at_flip"] = num(f.max_margin_at_flip);
  j["layers"] = nlohmann::json::array();
  for (const LayerFlips& L : f.layers)
    j["layers"].push_back({{"layer", L.layer}, {"pairs", L.pairs}, {"flips", L.flips}, {"decided", L.decided}});
  j["worst"] = nlohmann::json::array();
  for (const RouteFlip& x : f.worst)
    j["worst"].push_back({{"chunk", x.chunk}, {"pos", x.pos}, {"layer", x.layer}, {"ref_ids", x.ref_ids},
                          {"cand_ids", x.cand_ids}, {"ref_margin", num(x.ref_margin)},
                          {"cand_margin", num(x.cand_margin)},
                          {"class", x.ref_margin < f.threshold ? "near-tie" : "decided"}});
  return j;
}

}  // namespace arbiter::verify
