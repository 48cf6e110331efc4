// Mixture-of-experts routing (moe_routing.h): plain f64 loops in a fixed order.
#include "backend/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace arbiter {

namespace {

// Orders by descending score, NaN last, ties to the lower index: the one rule behind every
// top-k here.
std::vector<int> ranked(const std::vector<double>& score) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int i) {
    return std::isnan(score[size_t(i)]) ? -std::numeric_limits<double>::infinity()
                                        : score[size_t(i)];
  };
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key(a) > key(b); });
  return idx;
}

// softmax over v in f64, max-subtracted (torch's softmax, in f64).
void softmax(std::vector<double>& v) {
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : v) mx = std::max(mx, x);
  double sum = 0;
  for (double& x : v) sum += (x = std::exp(x - mx));
  for (double& x : v) x /= sum;
}

}  // namespace

const char* router_spec_problem(const RouterSpec& s) {
  if (s.n_experts < 1) return "the number of experts must be positive";
  if (s.top_k < 1) return "the number of experts per token must be positive";
  if (s.top_k > s.n_experts) return "more experts per token than experts";
  if (s.order == RouterOrder::TopKThenScore && s.scoring != RouterScoring::Softmax)
    return "top-k before scoring is defined for softmax scoring only";
  if (s.order == RouterOrder::TopKThenScore && s.n_group != 1)
    return "group-limited routing needs scoring before the top-k";
  if (s.n_group < 1 || s.topk_group < 1 || s.topk_group > s.n_group)
    return "topk_group must be in [1, n_group]";
  if (s.n_experts % s.n_group != 0) return "n_group does not divide the number of experts";
  if (s.n_group > 1 && s.n_experts / s.n_group < 2)
    return "a group's score is the sum of its two best experts: groups need 2 or more";
  if (s.n_group > 1 && s.top_k > s.topk_group * (s.n_experts / s.n_group))
    return "more experts per token than the kept groups hold";
  if (!(s.norm_eps >= 0) || !std::isfinite(s.routed_scaling_factor))
    return "the renormalisation epsilon and routed_scaling_factor must be finite";
  return nullptr;
}

const char* router_score_name(const RouterSpec& s) {
  if (s.order == RouterOrder::TopKThenScore) return "logit";
  return s.scoring == RouterScoring::Softmax ? "softmax" : "sigmoid";
}

Route route(const RouterSpec& s, const double* logits, const double* bias) {
  ARB_ASSERT(router_spec_problem(s) == nullptr);
  const int E = s.n_experts, k = s.top_k;
  std::vector<double> score(logits, logits + E);  // what the weights are taken from
  if (s.order == RouterOrder::ScoreThenTopK) {
    if (s.scoring == RouterScoring::Softmax) softmax(score);
    else
      for (double& x : score) x = 1.0 / (1.0 + std::exp(-x));
  }
  std::vector<double> select = score;  // what the top-k compares
  if (bias)
    for (int e = 0; e < E; ++e) select[size_t(e)] += bias[e];
  if (s.n_group > 1) {
    // HF DeepseekV3/NemotronH get_topk_indices: a group scores the sum of its two best
    // selection scores; experts outside the topk_group best groups compete with 0.0.
    const int G = s.n_group, per = E / G;
    std::vector<double> group(size_t(G), 0.0);
    for (int g = 0; g < G; ++g) {
      std::vector<double> in(select.begin() + g * per, select.begin() + (g + 1) * per);
      const std::vector<int> r = ranked(in);
      group[size_t(g)] = in[size_t(r[0])] + in[size_t(r[1])];
    }
    const std::vector<int> rg = ranked(group);
    std::vector<bool> kept(size_t(G), false);
    for (int i = 0; i < s.topk_group; ++i) kept[size_t(rg[size_t(i)])] = true;
    for (int e = 0; e < E; ++e)
      if (!kept[size_t(e / per)]) select[size_t(e)] = 0.0;
  }
  const std::vector<int> r = ranked(select);
  Route out;
  out.ids.assign(r.begin(), r.begin() + k);
  out.margin = k < E ? select[size_t(r[size_t(k) - 1])] - select[size_t(r[size_t(k)])]
                     : std::numeric_limits<double>::infinity();
  for (int id : out.ids) out.weights.push_back(score[size_t(id)]);
  if (s.order == RouterOrder::TopKThenScore) softmax(out.weights);  // Granite: over the k
  if (s.norm_topk_prob) {
    double sum = 0;
    for (double w : out.weights) sum += w;
    for (double& w : out.weights) w /= sum + s.norm_eps;
  }
  for (double& w : out.weights) w *= s.routed_scaling_factor;
  return out;
}

}  // namespace arbiter
