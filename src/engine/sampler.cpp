#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace arbiter {

namespace {

/// The candidates' order: the larger logit first, NaN after every number (summarize's
/// order, so a tier's NaN is never drawn while a number is left), ties to the lower id.
bool ranks_before(double a, int32_t ia, double b, int32_t ib) {
  if (std::isnan(a) || std::isnan(b)) return !std::isnan(a) || (std::isnan(b) && ia < ib);
  return a > b || (a == b && ia < ib);
}

/// The draw among the n best candidates ids[0..n), best first, logit(i) the logit of ids[i]:
/// softmax at the temperature, top-p cut (the smallest prefix whose mass reaches p),
/// renormalise, one uniform number from rng. NaN logits get no mass; when the best logit is
/// infinite, the candidates equal to it share the draw.
template <class Logit>
int32_t draw(const SamplerParams& p, std::mt19937_64& rng, const int32_t* ids, Logit logit, int n) {
  std::vector<double> prob(n);
  const double mx = logit(0);
  ARB_CHECK(!std::isnan(mx), "[sampler] every logit is NaN");
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const double l = logit(i);
    sum += prob[i] = std::isnan(l)     ? 0.0
                     : std::isinf(mx) ? (l == mx ? 1.0 : 0.0)
                                      : std::exp((l - mx) / p.temperature);
  }
  double mass = 0;
  int keep = n;
  for (int i = 0; i < n; ++i) {
    mass += prob[i] / sum;
    if (mass >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  while (keep > 1 && prob[size_t(keep - 1)] == 0) --keep;  // the fallback below has mass
  double kept = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (int i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r < 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
  ARB_CHECK(p.temperature >= 0 && std::isfinite(p.temperature),
            "[sampler] temperature %g must be >= 0", p.temperature);
  ARB_CHECK(p.top_k >= 0, "[sampler] top-k %d must be >= 0", p.top_k);
  ARB_CHECK(p.top_p > 0 && p.top_p <= 1, "[sampler] top-p %g must be in (0, 1]", p.top_p);
}

int32_t Sampler::sample(const std::vector<double>& logits) {
  const int V = int(logits.size());
  ARB_ASSERT(V > 0);
  if (p_.temperature == 0) {
    int32_t best = 0;
    for (int v = 1; v < V; ++v)
      if (ranks_before(logits[v], v, logits[best], best)) best = v;
    return best;
  }
  // Candidates sorted by logit (ties to lower id), cut by top-k, then draw(). Under top-k
  // only the first k are ordered: sorting a 152k vocabulary took ~20 ms per token, the
  // partial sort of the first 40 under 1 ms (same tokens).
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int n = p_.top_k > 0 ? std::min(p_.top_k, V) : V;
  if (n < V)  // not stable: ties are ordered by id explicitly
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return ranks_before(logits[a], a, logits[b], b);
    });
  else  // stable: ties keep the id order (a comparator with the tie clause was 15% slower)
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return !std::isnan(logits[a]) && (std::isnan(logits[b]) || logits[a] > logits[b]);
    });
  return draw(p_, rng_, idx.data(), [&](int i) { return logits[size_t(idx[size_t(i)])]; }, n);
}

int32_t Sampler::sample_top(const std::vector<int32_t>& ids, const std::vector<double>& logits) {
  ARB_CHECK(p_.top_k > 0, "[sampler] sampling from the top candidates needs a top-k");
  ARB_CHECK(ids.size() == logits.size() && ids.size() >= size_t(p_.top_k),
            "[sampler] %zu candidates (%zu logits) for top-k %d", ids.size(), logits.size(),
            p_.top_k);
  if (p_.temperature == 0) return ids[0];
  return draw(p_, rng_, ids.data(), [&](int i) { return logits[size_t(i)]; }, p_.top_k);
}

}  // namespace arbiter
