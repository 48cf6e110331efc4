// Token sampling: greedy at temperature 0, else temperature + top-k + top-p with a seeded
// generator (the same seed gives the same tokens on the same logits).
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
};

class Sampler {
 public:
  /// Throws arbiter::Error on out-of-range parameters.
  explicit Sampler(const SamplerParams& p);
  /// logits [V] in f64; returns the chosen id.
  int32_t sample(const std::vector<double>& logits);
  const SamplerParams& params() const { return p_; }

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

}  // namespace arbiter
