// The mixture-of-experts ops (backend.h): moe (routing, the selected experts, their weighted
// sum) and sigmoid_gate (Qwen2-MoE's shared-expert gate). ref against the definition worked
// out here token by token with route() (backend/moe_routing.h); every tier against ref on the
// MoE fixtures' and real models' router kinds (softmax top-k with and without
// renormalisation, Granite's top-k on logits, Nemotron-H's sigmoid with a selection bias and
// group limits), swiglu and relu2 experts, T = 1, 5 and 64; the routing each tier reports
// equals ref's, ties included (logits on a coarse grid, so ties are common); experts no
// token picks are never read into the output (their weights are NaN).
//
// moe_add (the block's residual update around moe) equals its ops one by one on every tier.
//
// Adding a case: a row of kCases.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "tier_util.h"

#include "backend/moe_routing.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

struct MoeCase {
  const char* name;
  int T, D, F, E, k;
  bool relu2;
  RouterScoring scoring;
  RouterOrder order;
  bool norm;
  double scale;
  int n_group, topk_group;
  bool bias;
  int ties;  // 0: random logits; 1: on a grid of 1/4 (many exact ties); 2: near-ties (within
             // a few units of the compute type's roundoff of 0.5: equal and adjacent values)
};
constexpr RouterScoring kSoftmax = RouterScoring::Softmax, kSigmoid = RouterScoring::Sigmoid;
constexpr RouterOrder kScoreFirst = RouterOrder::ScoreThenTopK,
                      kTopkFirst = RouterOrder::TopKThenScore;
// qwen3-moe (softmax, renormalised), qwen2-moe (not renormalised), mixtral (k = 2), Granite
// (top-k of the logits), Nemotron-H (sigmoid, bias, groups, scaling), odd widths, k = E.
const MoeCase kCases[] = {
    {"qwen3", 1, 64, 32, 8, 2, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 0},
    {"qwen3", 5, 64, 32, 8, 2, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 1},
    {"qwen3", 64, 64, 32, 8, 2, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 0},
    {"qwen2", 5, 48, 24, 6, 4, false, kSoftmax, kScoreFirst, false, 1, 1, 1, false, 1},
    {"granite", 1, 64, 16, 4, 2, false, kSoftmax, kTopkFirst, false, 1, 1, 1, false, 1},
    {"granite", 64, 64, 16, 4, 2, false, kSoftmax, kTopkFirst, false, 1, 1, 1, false, 0},
    {"nemotron", 1, 64, 32, 8, 2, true, kSigmoid, kScoreFirst, true, 2.5, 4, 2, true, 0},
    {"nemotron", 5, 64, 32, 8, 2, true, kSigmoid, kScoreFirst, true, 2.5, 4, 2, true, 1},
    {"nemotron", 64, 64, 32, 16, 3, true, kSigmoid, kScoreFirst, true, 2.5, 4, 2, true, 0},
    {"odd", 7, 33, 13, 5, 5, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 0},
    {"odd_relu2", 3, 31, 7, 3, 1, true, kSoftmax, kScoreFirst, false, 1, 1, 1, false, 1},
    {"near_ties", 5, 64, 32, 8, 2, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 2},
    {"near_granite", 5, 64, 16, 8, 3, false, kSoftmax, kTopkFirst, false, 1, 1, 1, false, 2},
    {"near_sigmoid", 5, 64, 32, 8, 2, true, kSigmoid, kScoreFirst, true, 2.5, 4, 2, true, 2},
    // Real models' expert counts (qwen3-30b-a3b: 128 experts, k = 8), and widths that leave
    // part of a warp without an expert (CUDA routes with a thread per expert).
    {"wide", 1, 64, 16, 128, 8, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 2},
    {"wide", 5, 64, 16, 128, 8, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 1},
    {"wide_granite", 5, 64, 16, 72, 10, false, kSoftmax, kTopkFirst, false, 1, 1, 1, false, 0},
    {"wide_sigmoid", 5, 64, 16, 128, 6, true, kSigmoid, kScoreFirst, true, 2.5, 8, 4, true, 2},
    {"wide_sigmoid", 3, 64, 16, 96, 6, true, kSigmoid, kScoreFirst, true, 2.5, 6, 3, true, 1},
    // A prefill whose experts fill several row tiles (64 rows of 4 experts on average) and whose
    // projections several column blocks (D 160, F 96), K a multiple of 8 (the 16-byte loads).
    {"tiles", 128, 160, 96, 4, 2, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 0},
    // More (token, slot) pairs than the cuda sort's 16 warps take 32 at a time (960: two
    // passes a warp, the second partial), over 200 experts, many groups empty or of one pair.
    {"sort", 160, 32, 16, 200, 6, false, kSoftmax, kScoreFirst, true, 1, 1, 1, false, 0},
};

RouterSpec spec_of(const MoeCase& c) {
  RouterSpec s;
  s.n_experts = c.E, s.top_k = c.k, s.scoring = c.scoring, s.order = c.order;
  s.norm_topk_prob = c.norm, s.norm_eps = c.scoring == kSigmoid ? 1e-20 : 0;
  s.routed_scaling_factor = c.scale, s.n_group = c.n_group, s.topk_group = c.topk_group;
  return s;
}

std::string what_of(const MoeCase& c) {
  return strformat("%s T=%d D=%d F=%d E=%d k=%d", c.name, c.T, c.D, c.F, c.E, c.k);
}

/// The inputs of one case, weights stored in `storage` (the tier's compute type, which every
/// tier reads exactly).
struct MoeIn {
  std::vector<double> logits, x, bias;
  std::vector<std::vector<double>> gate, up, down;  // [E]
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::unique_ptr<HostTensor> bias_t;
  Backend::MoeExperts ex;
};
std::unique_ptr<MoeIn> moe_inputs(const MoeCase& c, uint64_t seed, DType compute) {
  auto in = std::make_unique<MoeIn>();
  in->logits = values(int64_t(c.T) * c.E, seed, 1.5, compute);
  if (c.ties == 1)
    for (double& v : in->logits) v = std::round(v * 4) / 4;  // exact in every compute type
  if (c.ties == 2)
    for (double& v : in->logits) v = round_to(compute, 0.5 + v * 2e-3);
  in->x = values(int64_t(c.T) * c.D, seed + 1, 1.0, compute);
  in->ex.spec = spec_of(c);
  in->ex.relu2 = c.relu2;
  const double ws = 1.0 / std::sqrt(double(c.D));
  for (int e = 0; e < c.E; ++e) {
    const uint64_t s = seed + 10 + 3 * uint64_t(e);
    auto add = [&](const char* n, std::vector<int64_t> shape, const std::vector<double>& v) {
      in->tensors.push_back(make_tensor(strformat("experts.%d.%s", e, n), shape, v, compute));
      return &in->tensors.back()->t;
    };
    in->up.push_back(values(int64_t(c.F) * c.D, s, ws, compute));
    in->down.push_back(values(int64_t(c.D) * c.F, s + 1, 1.0 / std::sqrt(double(c.F)), compute));
    in->ex.up.push_back(add("up", {c.F, c.D}, in->up.back()));
    in->ex.down.push_back(add("down", {c.D, c.F}, in->down.back()));
    if (!c.relu2) {
      in->gate.push_back(values(int64_t(c.F) * c.D, s + 2, ws, compute));
      in->ex.gate.push_back(add("gate", {c.F, c.D}, in->gate.back()));
    }
  }
  if (c.bias) {
    in->bias = values(c.E, seed + 2, 0.05, DType::BF16);
    in->bias_t = make_tensor("gate.e_score_correction_bias", {c.E}, in->bias, DType::F32);
    in->ex.bias = &in->bias_t->t;
  }
  return in;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// The definition in f64: route() per token, each selected expert on the token's row, the
// weighted outputs summed in ascending expert index.
std::vector<double> moe_definition(const MoeCase& c, const MoeIn& in) {
  std::vector<double> out(size_t(c.T) * c.D, 0.0);
  for (int t = 0; t < c.T; ++t) {
    const Route r = route(in.ex.spec, &in.logits[size_t(t) * c.E],
                          in.ex.bias ? in.bias.data() : nullptr);
    std::vector<int> order(r.ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return r.ids[size_t(a)] < r.ids[size_t(b)]; });
    const double* x = &in.x[size_t(t) * c.D];
    for (int i : order) {
      const int e = r.ids[size_t(i)];
      std::vector<double> act(static_cast<size_t>(c.F));
      for (int f = 0; f < c.F; ++f) {
        double u = 0, g = 0;
        for (int d = 0; d < c.D; ++d) {
          u += in.up[size_t(e)][size_t(f) * c.D + d] * x[d];
          if (!c.relu2) g += in.gate[size_t(e)][size_t(f) * c.D + d] * x[d];
        }
        act[size_t(f)] = c.relu2 ? std::max(u, 0.0) * std::max(u, 0.0) : silu(g) * u;
      }
      for (int d = 0; d < c.D; ++d) {
        double y = 0;
        for (int f = 0; f < c.F; ++f) y += in.down[size_t(e)][size_t(d) * c.F + f] * act[size_t(f)];
        out[size_t(t) * c.D + d] += r.weights[size_t(i)] * y;
      }
    }
  }
  return out;
}

TEST(MoeRef, MatchesTheDefinition) {
  auto ref = make_ref_backend();
  uint64_t seed = 9100;
  for (const MoeCase& c : kCases) {
    auto in = moe_inputs(c, ++seed, DType::F64);
    Buf lg(*ref, in->logits), x(*ref, in->x), out(*ref, int64_t(c.T) * c.D);
    std::vector<Route> routes;
    ref->moe(lg.b, x.b, in->ex, c.T, out.b, &routes);
    const std::vector<double> want = moe_definition(c, *in), got = out.read();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << what_of(c) << " i=" << i;
    ASSERT_EQ(int(routes.size()), c.T) << what_of(c);
    for (int t = 0; t < c.T; ++t) {
      const Route r = route(in->ex.spec, &in->logits[size_t(t) * c.E],
                            in->ex.bias ? in->bias.data() : nullptr);
      EXPECT_EQ(routes[size_t(t)].ids, r.ids) << what_of(c) << " t=" << t;
      EXPECT_EQ(routes[size_t(t)].margin, r.margin) << what_of(c) << " t=" << t;
    }
  }
}

TEST(MoeRef, RefusesMismatchedExperts) {
  auto ref = make_ref_backend();
  auto in = moe_inputs(kCases[0], 9000, DType::F64);
  in->ex.down.pop_back();
  Buf lg(*ref, in->logits), x(*ref, in->x), out(*ref, 64);
  try {
    ref->moe(lg.b, x.b, in->ex, 1, out.b, nullptr);
    FAIL() << "moe with 7 down matrices for 8 experts ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[ref] moe: 8 gate, 8 up and 7 down"), std::string::npos)
        << e.what();
  }
}

class Moe : public OpTest {};

TEST_P(Moe, MatchesRefAndRoutesAlike) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 9200;
  for (const MoeCase& c : kCases) {
    auto in = moe_inputs(c, ++seed, tier.compute);
    const std::string what = what_of(c);
    Buf lg(*be, in->logits), x(*be, in->x), out(*be, int64_t(c.T) * c.D);
    Buf lr(*ref, in->logits), xr(*ref, in->x), want(*ref, int64_t(c.T) * c.D);
    out.poison();
    std::vector<Route> got_r, want_r;
    be->stats().reset();
    be->moe(lg.b, x.b, in->ex, c.T, out.b, &got_r);
    ref->moe(lr.b, xr.b, in->ex, c.T, want.b, &want_r);
    if (tier.cuda && c.T > 1) {
      // A prefill groups the experts' rows: on tensor cores in bf16/f16 unless switched off.
      const char* sw = std::getenv("ARBITER_CUDA_MOE_MMA");
      const bool mma = tier.compute != DType::F32 && !(sw && std::string(sw) == "0");
      const auto& provs = be->stats().calls().at("moe");
      ASSERT_EQ(provs.size(), 1u) << what;
      EXPECT_EQ(provs.begin()->first, mma ? "cuda.moe_grouped_mma" : "cuda.moe_grouped") << what;
    }
    // Per output: the gate/up dots (D terms), the down dot (F terms) and the k-term sum;
    // roundings to the compute type of gate, up, the activation and y; an exp and a division.
    check_close("moe", tier, what, seed, out.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, c.D + c.F + c.k, 6, 4));
    ASSERT_EQ(got_r.size(), want_r.size()) << tier.name << " " << what;
    for (int t = 0; t < c.T; ++t) {
      const Route &g = got_r[size_t(t)], &w = want_r[size_t(t)];
      EXPECT_EQ(g.ids, w.ids) << tier.name << " " << what << " t=" << t;
      if (std::isinf(w.margin)) EXPECT_EQ(g.margin, w.margin) << tier.name << " " << what;
      else EXPECT_NEAR(g.margin, w.margin, 1e-12 * (1 + std::fabs(w.margin)))
          << tier.name << " " << what << " t=" << t;
    }
  }
}

// Without a route log the tier may keep the routing to itself: the output is the same.
TEST_P(Moe, RoutesOnRequestOnly) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  for (int i : {0, 2, 6, 8}) {  // T = 1 and 64, swiglu and relu2
    const MoeCase& c = kCases[i];
    auto in = moe_inputs(c, 9300 + uint64_t(i), tier.compute);
    Buf lg(*be, in->logits), x(*be, in->x), a(*be, int64_t(c.T) * c.D), b(*be, int64_t(c.T) * c.D);
    std::vector<Route> routes;
    be->moe(lg.b, x.b, in->ex, c.T, a.b, &routes);
    be->moe(lg.b, x.b, in->ex, c.T, b.b, nullptr);
    check_exact("moe", tier, what_of(c) + " without routes", 9300, b.read(), a.read());
  }
}

// moe_add: moe, then the residual update op by op (the shared expert's output added, the
// scale, the residual's add), in every form a family uses; the CUDA tier's decode folds it
// into the down GEMV and must give the same bits.
TEST_P(Moe, AddEqualsTheOpsOneByOne) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  for (int i : {0, 2, 4, 6, 8}) {  // T = 1 and 64; swiglu, Granite's and relu2 experts
    const MoeCase& c = kCases[i];
    auto in = moe_inputs(c, 9500 + uint64_t(i), tier.compute);
    const int64_t n = int64_t(c.T) * c.D;
    const std::vector<double> shared = values(n, 9550 + uint64_t(i), 0.5, tier.compute),
                              residual = values(n, 9560 + uint64_t(i), 2.0, tier.compute);
    for (bool with_shared : {false, true})
      for (double scale : {1.0, 0.22}) {
        const std::string what = what_of(c) + (with_shared ? " shared" : "") +
                                 strformat(" scale %g", scale);
        Buf lg(*be, in->logits), x(*be, in->x), sh(*be, shared), out(*be, n), tmp(*be, n);
        Buf got(*be, residual), want(*be, residual);
        Backend::MoeResidual r;
        r.shared = with_shared ? &sh.b : nullptr;
        r.scale = scale;
        be->moe_add(lg.b, x.b, in->ex, c.T, out.b, nullptr, got.b, r);
        be->moe(lg.b, x.b, in->ex, c.T, tmp.b, nullptr);
        if (with_shared) be->add(tmp.b, sh.b, n);
        if (scale != 1) be->scale(tmp.b, n, scale);
        be->add(want.b, tmp.b, n);
        check_exact("moe_add", tier, what, 9500, got.read(), want.read());
      }
  }
}

// Experts that no token picks are not read into the output: their weights are NaN.
TEST_P(Moe, ReadsOnlyTheSelectedExperts) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int i : {0, 2, 6}) {
    const MoeCase& c = kCases[i];
    auto in = moe_inputs(c, 9400 + uint64_t(i), tier.compute);
    std::vector<std::unique_ptr<HostTensor>> nans;
    auto poison = [&](std::vector<const Tensor*>& v, int e, int64_t rows, int64_t cols) {
      if (v.empty()) return;  // relu2: no gate
      nans.push_back(make_tensor("experts.unpicked", {rows, cols},
                                 std::vector<double>(size_t(rows * cols), nan), tier.compute));
      v[size_t(e)] = &nans.back()->t;
    };
    // The last two experts' logits far below the rest (and no bias to lift them back).
    for (int e = c.E - 2; e < c.E; ++e) {
      for (int t = 0; t < c.T; ++t) in->logits[size_t(t) * c.E + e] = -64;
      if (in->ex.bias) in->bias[size_t(e)] = 0;
      poison(in->ex.up, e, c.F, c.D);
      poison(in->ex.gate, e, c.F, c.D);
      poison(in->ex.down, e, c.D, c.F);
    }
    if (in->ex.bias) {
      in->bias_t = make_tensor("gate.e_score_correction_bias", {c.E}, in->bias, DType::F32);
      in->ex.bias = &in->bias_t->t;
    }
    Buf lg(*be, in->logits), x(*be, in->x), out(*be, int64_t(c.T) * c.D);
    be->moe(lg.b, x.b, in->ex, c.T, out.b, nullptr);
    for (double v : out.read()) ASSERT_TRUE(std::isfinite(v)) << tier.name << " " << what_of(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Moe, testing::ValuesIn(op_tiers()), op_tier_name);

class SigmoidGate : public OpTest {};

TEST_P(SigmoidGate, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 9500;
  for (auto [T, D] : {std::pair{1, 64}, {5, 33}, {64, 48}}) {
    const std::vector<double> y = values(int64_t(T) * D, ++seed, 1.0, tier.compute);
    const std::vector<double> g = values(T, seed + 1, 3.0, tier.compute);
    Buf yb(*be, y), gb(*be, g), yr(*ref, y), gr(*ref, g);
    be->sigmoid_gate(yb.b, gb.b, T, D);
    ref->sigmoid_gate(yr.b, gr.b, T, D);
    // An exp, an addition, a division and a product.
    check_close("sigmoid_gate", tier, strformat("T=%d D=%d", T, D), seed, yb.read(), yr.read(),
                nmse_bound(tier.compute, tier.compute, 1, 4));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, SigmoidGate, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
