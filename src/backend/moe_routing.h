// Mixture-of-experts routing: which k of E experts a token goes to, and with which weights,
// defined once for every family and every tier. It sits below backend/ (like RoPE, rope.h)
// because a tier that routes on its own device (CUDA decode without a host round trip) needs
// the spec, not the model; the model layer only fills a RouterSpec from its config.
//
// The variants, as HF transformers 5.17 computes them (logits = x @ W_router^T, [E]):
//   Qwen2-MoE, Qwen3-MoE, Mixtral: p = softmax(logits); top-k of p; renormalised over the k
//     when norm_topk_prob (Mixtral always; Qwen3-MoE per config; Qwen2-MoE default false).
//   Granite MoE (GraniteMoeTopKGating): top-k of the logits, then softmax over those k.
//   Nemotron-H / DeepSeek-V3 (noaux_tc): s = sigmoid(logits); selection on s + bias
//     (e_score_correction_bias), limited to the topk_group best of n_group groups (a group's
//     score: the sum of its two best), the others' selection scores set to 0.0 as HF's
//     masked_fill does; weights from the uncorrected s, over (sum + 1e-20) when
//     norm_topk_prob, times routed_scaling_factor.
// Ties: torch.topk leaves their order unspecified; here the lower expert index wins, at every
// top-k (groups and experts), so every tier picks the same experts from the same scores.
#pragma once
#include <vector>

namespace arbiter {

enum class RouterScoring { Softmax, Sigmoid };
/// ScoreThenTopK: score every expert, select on the scores (plus bias), weight by them.
/// TopKThenScore: select on the raw logits, then softmax over the k selected (Granite).
enum class RouterOrder { ScoreThenTopK, TopKThenScore };

/// Everything a router does after its matmul. E and k are the config's num_experts and
/// num_experts_per_tok.
struct RouterSpec {
  int n_experts = 0;  // E
  int top_k = 0;      // k
  RouterScoring scoring = RouterScoring::Softmax;
  RouterOrder order = RouterOrder::ScoreThenTopK;
  bool norm_topk_prob = false;         // weights /= (sum of the k weights + norm_eps)
  double norm_eps = 0;                 // 1e-20 for Nemotron-H / DeepSeek-V3, else 0
  double routed_scaling_factor = 1.0;  // weights *= it, after the renormalisation
  int n_group = 1;                     // groups of E / n_group experts (1: no group limit)
  int topk_group = 1;                  // groups kept when n_group > 1
};

/// Why spec cannot be routed (k > E, a group limit that does not divide E, ...), or nullptr.
/// Callers turn it into a one-line error naming their file and key.
const char* router_spec_problem(const RouterSpec& spec);

/// What Route::margin is a difference of, for traces: "softmax" (probabilities; Qwen,
/// Mixtral), "logit" (the raw router logits: top-k before scoring, Granite) or "sigmoid"
/// (sigmoid scores plus any selection bias, group-limited: Nemotron-H).
const char* router_score_name(const RouterSpec& spec);

/// One token's routing: ids[k] by descending selection score (ties: lower index first),
/// weights[k] in the same order, and margin = the k-th selection score minus the (k+1)-th
/// (how far the choice is from a flip; +inf when k == E).
struct Route {
  std::vector<int> ids;
  std::vector<double> weights;
  double margin = 0;
};

/// Routes one token from its router logits [E] (in f64: the ref tier's oracle; other tiers
/// pass their logits widened). bias [E] (the selection-only correction) may be null.
/// The spec must have passed router_spec_problem().
Route route(const RouterSpec& spec, const double* logits, const double* bias = nullptr);

}  // namespace arbiter
