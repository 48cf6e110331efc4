#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <utility>

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
/// softmax at the temperature, top-p cut (the smallest prefix whose mass reaches p), min-p
/// cut (candidates below min_p x the best one's probability, as llama.cpp and vLLM define
/// it), renormalise, one uniform number from rng. NaN logits get no mass; when the best logit is
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
  while (keep > 1 && prob[size_t(keep - 1)] < p.min_p * prob[0]) --keep;  // prob[0] is the best
  while (keep > 1 && prob[size_t(keep - 1)] == 0) --keep;  // the fallback below has mass
  double kept = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (int i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r < 0) return ids[i];
  }
  return ids[keep - 1];
}

/// The bits of an IEEE value as an unsigned key that orders the values from the largest down;
/// every NaN (either sign) the largest key.
template <class U>
U descending_key(U bits) {
  constexpr U sign = U(1) << (8 * sizeof(U) - 1);
  constexpr U exp_mask = std::is_same_v<U, uint32_t> ? U(0x7f800000u) : U(0x7ff0000000000000u);
  if ((bits & ~sign) > exp_mask) return ~U(0);  // NaN: last
  return ~((bits & sign) ? ~bits : (bits | sign));
}

}  // namespace

// A stable LSD radix sort of order keys (the logit's bits made to compare as unsigned
// integers, inverted for descending order; -0 as +0; NaN the largest key), a byte per pass:
// 4 passes when every logit is an f32 value (as the tiers deliver them), else 8; a pass whose
// digit is the same for every key is skipped. Its buffers stay with the thread: fresh ones
// cost as much again in page faults. It replaced std::stable_sort, ~7x slower on a 152k row
// (bench/sampler_bench.cpp).
std::vector<int32_t> rank_row(const std::vector<double>& logits) {
  const size_t V = logits.size();
  bool f32 = true;
  for (const double x : logits) f32 = f32 && (std::isnan(x) || double(float(x)) == x);
  thread_local std::vector<uint64_t> key, key_tmp;
  thread_local std::vector<int32_t> idx, idx_tmp;
  key.resize(V);
  key_tmp.resize(V);
  idx.resize(V);
  idx_tmp.resize(V);
  for (size_t i = 0; i < V; ++i) {
    const double x = logits[i] == 0 ? 0.0 : logits[i];  // -0 as +0
    key[i] = f32 ? descending_key(std::bit_cast<uint32_t>(float(x)))
                 : descending_key(std::bit_cast<uint64_t>(x));
    idx[i] = int32_t(i);
  }
  for (int shift = 0; shift < (f32 ? 32 : 64); shift += 8) {
    size_t start[256] = {};
    for (size_t i = 0; i < V; ++i) ++start[(key[i] >> shift) & 255];
    if (*std::max_element(start, start + 256) == V) continue;
    size_t pos = 0;
    for (size_t& c : start) pos += std::exchange(c, pos);
    for (size_t i = 0; i < V; ++i) {
      const size_t at = start[(key[i] >> shift) & 255]++;
      key_tmp[at] = key[i];
      idx_tmp[at] = idx[i];
    }
    key.swap(key_tmp);
    idx.swap(idx_tmp);
  }
  return idx;
}

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
  ARB_CHECK(p.temperature >= 0 && std::isfinite(p.temperature),
            "[sampler] temperature %g must be >= 0", p.temperature);
  ARB_CHECK(p.top_k >= 0, "[sampler] top-k %d must be >= 0", p.top_k);
  ARB_CHECK(p.top_p > 0 && p.top_p <= 1, "[sampler] top-p %g must be in (0, 1]", p.top_p);
  ARB_CHECK(p.min_p >= 0 && p.min_p <= 1, "[sampler] min-p %g must be in [0, 1]", p.min_p);
}

void check_penalties(const PenaltyParams& p) {
  ARB_CHECK(p.repeat > 0 && std::isfinite(p.repeat), "[sampler] repeat penalty %g must be > 0", p.repeat);
  ARB_CHECK(p.presence >= -2 && p.presence <= 2, "[sampler] presence penalty %g must be in [-2, 2]", p.presence);
  ARB_CHECK(p.frequency >= -2 && p.frequency <= 2, "[sampler] frequency penalty %g must be in [-2, 2]",
            p.frequency);
}

void apply_penalties(const PenaltyParams& p, const std::vector<int32_t>& prompt,
                     const std::vector<int32_t>& generated, std::vector<double>& logits) {
  const int32_t V = int32_t(logits.size());
  std::vector<int32_t> count(size_t(V), 0);
  std::vector<bool> seen(size_t(V), false);
  for (int32_t id : prompt)
    if (id >= 0 && id < V) seen[size_t(id)] = true;
  for (int32_t id : generated)
    if (id >= 0 && id < V) {
      seen[size_t(id)] = true;
      ++count[size_t(id)];
    }
  for (int32_t v = 0; v < V; ++v) {
    double& l = logits[size_t(v)];
    if (seen[size_t(v)] && p.repeat != 1.0) l = l > 0 ? l / p.repeat : l * p.repeat;
    if (count[size_t(v)] > 0) l -= p.presence + p.frequency * count[size_t(v)];
  }
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
  // only the first k are ordered (the partial sort of the first 40 of a 152k vocabulary
  // takes under 1 ms); else the whole row, by rank_row.
  const int n = p_.top_k > 0 ? std::min(p_.top_k, V) : V;
  std::vector<int32_t> idx;
  if (n < V) {  // not stable: ties are ordered by id explicitly
    idx.resize(size_t(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return ranks_before(logits[a], a, logits[b], b);
    });
  } else {
    idx = rank_row(logits);
  }
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
