// Host-side sampling of a whole vocabulary row (`arbiter generate --temp T` without --top-k:
// every tier draws on the host from the full row), V = 151,936 (Qwen3), f32 logits widened to
// f64 as the tiers deliver them:
//   sample/row/top_k:0     Sampler::sample of the whole row (rank_row's radix sort + the draw)
//   sample/row/top_k:40    the same under top-k 40 (a partial sort of the first 40)
//   rank/radix             rank_row alone
//   rank/stable_sort       std::stable_sort of the row's ids by logit (NaN last), what
//                          Sampler::sample ran before rank_row: the peer of rank/radix
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace arbiter::bench {
namespace {

constexpr int kVocab = 151936;

const std::vector<double>& row() {
  static const std::vector<double> l = [] {
    std::mt19937_64 gen(5);
    std::normal_distribution<double> normal(0.0, 3.0);
    std::vector<double> v(kVocab);
    for (double& x : v) x = double(float(normal(gen)));
    return v;
  }();
  return l;
}

void sample_row(benchmark::State& state) {
  SamplerParams p;
  p.temperature = 0.8;
  p.top_k = int(state.range(0));
  p.seed = 1;
  Sampler s(p);
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(row()));
}
BENCHMARK(sample_row)->Name("sample/row")->ArgName("top_k")->Arg(0)->Arg(40)->Unit(benchmark::kMillisecond);

void rank_radix(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(rank_row(row()));
}
BENCHMARK(rank_radix)->Name("rank/radix")->Unit(benchmark::kMillisecond);

void rank_stable_sort(benchmark::State& state) {
  const std::vector<double>& l = row();
  std::vector<int32_t> idx(l.size());
  for (auto _ : state) {
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return !std::isnan(l[size_t(a)]) && (std::isnan(l[size_t(b)]) || l[size_t(a)] > l[size_t(b)]);
    });
    benchmark::DoNotOptimize(idx.data());
  }
}
BENCHMARK(rank_stable_sort)->Name("rank/stable_sort")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace arbiter::bench
