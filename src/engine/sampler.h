// Token sampling: greedy at temperature 0, else temperature + top-k + top-p + min-p with a
// seeded generator (the same seed gives the same tokens on the same logits); repetition,
// presence and frequency penalties applied to a row before it is sampled.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace arbiter {

struct SamplerParams {
  double temperature = 0.0;  // 0: greedy (argmax, ties to the lower id)
  int top_k = 0;             // 0: no limit
  double top_p = 1.0;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
  double min_p = 0.0;        // drop candidates below min_p x the best one's probability
};

/// Penalties on tokens already seen (vLLM's conventions, which the OpenAI API documents):
/// presence and frequency over the generated tokens (logit -= presence if seen, -= frequency
/// x count), repetition over prompt and generated tokens (CTRL, arXiv:1909.05858: a positive
/// logit divided by it, a negative one multiplied).
struct PenaltyParams {
  double repeat = 1.0;     // 1: off
  double presence = 0.0;   // 0: off
  double frequency = 0.0;  // 0: off
  bool active() const { return repeat != 1.0 || presence != 0.0 || frequency != 0.0; }
};
/// Throws arbiter::Error on out-of-range values (repeat must be > 0, the others in [-2, 2]).
void check_penalties(const PenaltyParams& p);
/// Applies p to logits [V] in place; prompt and generated are the ids so far.
void apply_penalties(const PenaltyParams& p, const std::vector<int32_t>& prompt,
                     const std::vector<int32_t>& generated, std::vector<double>& logits);

/// Every id of the row in the sampler's candidate order: the larger logit first, -0 equal
/// to +0, NaN after every number, ties to the lower id (the order of a stable sort by logit).
std::vector<int32_t> rank_row(const std::vector<double>& logits);

class Sampler {
 public:
  /// Throws arbiter::Error on out-of-range parameters.
  explicit Sampler(const SamplerParams& p);
  /// logits [V] in f64; returns the chosen id.
  int32_t sample(const std::vector<double>& logits);
  /// The same choice from the row's best candidates alone, when top_k > 0: ids and logits in
  /// descending order, ties to the lower id (summarize's top-K), at least top_k of them. The
  /// tier then never sends the whole row to the host.
  int32_t sample_top(const std::vector<int32_t>& ids, const std::vector<double>& logits);
  const SamplerParams& params() const { return p_; }

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

}  // namespace arbiter
