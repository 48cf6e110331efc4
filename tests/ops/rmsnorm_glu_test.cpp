// rmsnorm_glu (the fused norm + gate/up GEMV + SwiGLU or GeGLU): against ref; against the
// tier's own composition (rmsnorm or rmsnorm_1p, two matmuls, swiglu or geglu) bit for bit;
// with stage taps (norm, gate, up, act) whose records are the composition's intermediates and
// whose overwrite of gate feeds the product as in the composition. Shapes: 3,001 rows of 1,024
// (pairs of rows per warp and a last warp with one), a tiny model's, gemma3-1b's rows of
// 1,152, 3,000 rows of 2,048 (several rows a warp on cuda, the next ones' weights loaded while
// the current ones are multiplied), and T > 1; llama's form and gemma's ((1 + w) norm,
// gelu_tanh).
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, F, K;
  NormWeight nw = NormWeight::Plain;
  GluAct act = GluAct::SiLU;
};
const Case kCases[] = {{1, 3001, 1024},
                       {1, 192, 64},
                       {1, 384, 128},
                       {3, 172, 64},
                       {1, 700, 1152, NormWeight::OnePlus, GluAct::GeluTanh},
                       {1, 3000, 2048},
                       {3, 172, 64, NormWeight::OnePlus, GluAct::GeluTanh}};

struct Outcome {
  std::vector<double> act;
  std::vector<std::vector<double>> records;
};

Outcome run(Backend& be, bool composed, const Case& c, const HostTensor& norm, const HostTensor& g,
        const HostTensor& u, const std::vector<double>& x, TapSet* taps) {
  Buf xb(be, x), xn(be, x.size()), gb(be, int64_t(c.T) * c.F), ub(be, int64_t(c.T) * c.F),
      act(be, int64_t(c.T) * c.F);
  act.poison();
  Backend::GluTaps t;
  if (taps) t = {(*taps)[0], (*taps)[1], (*taps)[2], (*taps)[3]};
  if (composed)
    be.Backend::rmsnorm_glu(xb.b, norm.t, c.nw, c.T, c.K, 1e-6, xn.b, g.t, u.t, c.act, gb.b, ub.b,
                            act.b, t);
  else
    be.rmsnorm_glu(xb.b, norm.t, c.nw, c.T, c.K, 1e-6, xn.b, g.t, u.t, c.act, gb.b, ub.b, act.b, t);
  return {act.read(), taps ? taps->records : std::vector<std::vector<double>>{}};
}

class RmsnormGlu : public OpTest {};

TEST_P(RmsnormGlu, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  const DType st = weight_types(tier).front();
  uint64_t seed = 1400;
  for (const Case& c : kCases) {
    ++seed;
    std::vector<double> nv = values(c.K, seed, 0.1, DType::F32);
    if (c.nw == NormWeight::Plain)  // near 1 either way: rmsnorm_1p adds the 1
      for (double& w : nv) w += 1.0;
    auto norm = make_tensor("norm", {c.K}, nv, DType::F32);
    auto g = make_tensor("gate", {c.F, c.K}, values(int64_t(c.F) * c.K, seed + 1, 0.05, DType::F32), st);
    auto u = make_tensor("up", {c.F, c.K}, values(int64_t(c.F) * c.K, seed + 2, 0.05, DType::F32), st);
    const std::vector<double> x = values(int64_t(c.T) * c.K, seed + 3, 1.0, tier.compute);
    const std::string what = strformat("T=%d F=%d K=%d%s", c.T, c.F, c.K,
                                       c.act == GluAct::GeluTanh ? " gemma" : "");
    const Outcome fused = run(*be, false, c, *norm, *g, *u, x, nullptr);
    // Dots over K; x, gate and up rounded before the product; an exp and a division.
    check_close("rmsnorm_glu", tier, what, seed, fused.act,
                run(*ref, false, c, *norm, *g, *u, x, nullptr).act,
                nmse_bound(tier.compute, tier.compute, c.K, 15, 3));
    check_exact("rmsnorm_glu.composed", tier, what, seed, fused.act,
                run(*be, true, c, *norm, *g, *u, x, nullptr).act);
    TapSet tf(4), tc(4);
    const Outcome rf = run(*be, false, c, *norm, *g, *u, x, &tf);
    const Outcome rc = run(*be, true, c, *norm, *g, *u, x, &tc);
    for (size_t i = 0; i < 4; ++i)
      check_exact("rmsnorm_glu.record", tier, what + " tap " + std::to_string(i), seed,
                  rf.records[i], rc.records[i]);
    const std::vector<double> other = values(int64_t(c.T) * c.F, seed + 4, 1.0, tier.compute);
    TapSet of(4, {nullptr, &other}), oc(4, {nullptr, &other});
    check_exact("rmsnorm_glu.overwrite", tier, what, seed,
                run(*be, false, c, *norm, *g, *u, x, &of).act,
                run(*be, true, c, *norm, *g, *u, x, &oc).act);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, RmsnormGlu, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
