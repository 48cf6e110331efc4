// rmsnorm_matmul (the fused norm + q/k/v GEMV, and the final norm + logits GEMV): against
// ref; against the tier's own op-by-op composition (Backend::rmsnorm_matmul: rmsnorm, then
// each matmul) bit for bit, as the fused kernels promise; and with stage taps, whose records
// must be the composition's intermediates and whose overwrite of the normalised x must feed
// the products exactly as in the composition. Shapes: the q/k/v form (rows of 1,024, 1,000
// and 504 elements, segments of odd lengths), logits rows, a tiny model's, and T > 1; the
// Plain norm and gemma's (1 + w) (gemma3-1b's q/k/v rows of 1,152). With keep_xn the
// normalised x is the composition's too. rmsnorm_matmul_conv (Mamba2's in_proj with the
// conv of its xBC rows) the same way, on the hybrids' shapes.
#include <cmath>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, K;
  std::vector<int> rows;  // one to three outputs
  bool logits;
  NormWeight nw = NormWeight::Plain;
};
const std::vector<Case> kCases = {{1, 1024, {1001, 37, 3000}, false}, {1, 1000, {1001, 37, 3000}, false},
                                  {1, 504, {512, 64, 64}, false},    {1, 64, {64, 32, 32}, false},
                                  {1, 256, {20000}, true},           {1, 512, {9000}, true},
                                  {3, 64, {128, 64, 64}, false},
                                  {1, 1152, {1024, 256, 256}, false, NormWeight::OnePlus},
                                  {2, 64, {128, 64, 64}, false, NormWeight::OnePlus}};

struct Outcome {
  std::vector<std::vector<double>> outs;
  std::vector<std::vector<double>> records;  // norm, then each output
  std::vector<double> xn;
};

Outcome run(Backend& be, bool composed, const Case& c, const HostTensor& norm,
        const std::vector<std::unique_ptr<HostTensor>>& W, const std::vector<double>& x,
        TapSet* taps, bool keep_xn = false) {
  Buf xb(be, x), xn(be, x.size());
  std::vector<std::unique_ptr<Buf>> out;
  std::vector<Backend::MatmulTarget> tg;
  for (size_t i = 0; i < W.size(); ++i) {
    out.push_back(std::make_unique<Buf>(be, int64_t(c.T) * c.rows[i], c.logits));
    out.back()->poison();
  }
  for (size_t i = 0; i < W.size(); ++i)
    tg.push_back({&W[i]->t, nullptr, &out[i]->b, taps ? (*taps)[i + 1] : nullptr});
  const StageTap* nt = taps ? (*taps)[0] : nullptr;
  if (composed)
    be.Backend::rmsnorm_matmul(xb.b, norm.t, c.nw, c.T, c.K, 1e-6, xn.b, keep_xn, nt,
                               tg.data(), int(tg.size()));
  else
    be.rmsnorm_matmul(xb.b, norm.t, c.nw, c.T, c.K, 1e-6, xn.b, keep_xn, nt, tg.data(),
                      int(tg.size()));
  Outcome r;
  r.xn = xn.read();
  for (auto& o : out) r.outs.push_back(o->read());
  if (taps) r.records = taps->records;
  return r;
}

class RmsnormMatmul : public OpTest {};

TEST_P(RmsnormMatmul, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  const DType st = weight_types(tier).front();  // read exactly
  uint64_t seed = 1300;
  for (const Case& c : kCases) {
    ++seed;
    std::vector<double> nv = values(c.K, seed, 0.1, DType::F32);  // the weights applied
    for (double& w : nv) w += 1.0;
    std::vector<double> stored = nv;  // rmsnorm_1p adds the 1 itself
    if (c.nw == NormWeight::OnePlus)
      for (double& w : stored) w -= 1.0;
    auto norm = make_tensor("norm", {c.K}, stored, DType::F32);
    std::vector<std::unique_ptr<HostTensor>> W;
    std::vector<std::vector<double>> w;
    for (size_t i = 0; i < c.rows.size(); ++i) {
      w.push_back(values(int64_t(c.rows[i]) * c.K, seed + 10 + i, 0.05, DType::F32));
      W.push_back(make_tensor("W" + std::to_string(i), {c.rows[i], c.K}, w.back(), st));
    }
    const std::vector<double> x = values(int64_t(c.T) * c.K, seed + 1, 1.0, tier.compute);
    std::vector<double> xn = x;  // normalised in f64, for the bound's cancellation
    for (int t = 0; t < c.T; ++t) {
      double ss = 0;
      for (int k = 0; k < c.K; ++k) ss += x[size_t(t * c.K + k)] * x[size_t(t * c.K + k)];
      const double r = 1 / std::sqrt(ss / c.K + 1e-6);
      for (int k = 0; k < c.K; ++k) xn[size_t(t * c.K + k)] *= r * nv[size_t(k)];
    }
    const std::string what = strformat("T=%d K=%d outputs %zu%s%s", c.T, c.K, c.rows.size(),
                                       c.logits ? " logits" : "",
                                       c.nw == NormWeight::OnePlus ? " 1+w" : "");
    const Outcome want = run(*ref, false, c, *norm, W, x, nullptr);
    const Outcome fused = run(*be, false, c, *norm, W, x, nullptr);
    const Outcome composed = run(*be, true, c, *norm, W, x, nullptr);
    const DType out = c.logits ? DType::F32 : tier.compute;
    for (size_t i = 0; i < W.size(); ++i) {
      // The norm's sum of squares and each dot over K; x normalised, rounded to the compute
      // type (also before the f32 logits), then multiplied.
      check_close("rmsnorm_matmul", tier, what, seed, fused.outs[i], want.outs[i],
                  nmse_bound(out, tier.compute, c.K, 5) +
                      operand_rounding_nmse(tier.compute, xn, w[i], c.T, c.rows[i], c.K));
      check_exact("rmsnorm_matmul.composed", tier, what, seed, fused.outs[i], composed.outs[i]);
    }
    // keep_xn (a MoE block's router): the products unchanged, and xn the composition's.
    const Outcome kept = run(*be, false, c, *norm, W, x, nullptr, /*keep_xn=*/true);
    for (size_t i = 0; i < W.size(); ++i)
      check_exact("rmsnorm_matmul.keep_xn", tier, what, seed, kept.outs[i], composed.outs[i]);
    check_exact("rmsnorm_matmul.keep_xn xn", tier, what, seed, kept.xn, composed.xn);
    // Taps: the records are the composition's; an overwritten norm feeds every product.
    TapSet tf(1 + W.size()), tc(1 + W.size());
    const Outcome rf = run(*be, false, c, *norm, W, x, &tf), rc = run(*be, true, c, *norm, W, x, &tc);
    for (size_t i = 0; i < rf.records.size(); ++i)
      check_exact("rmsnorm_matmul.record", tier, what + " tap " + std::to_string(i), seed,
                  rf.records[i], rc.records[i]);
    std::vector<double> other = values(int64_t(c.T) * c.K, seed + 2, 1.0, tier.compute);
    TapSet of(1 + W.size(), {&other}), oc(1 + W.size(), {&other});
    const Outcome wf = run(*be, false, c, *norm, W, x, &of), wc = run(*be, true, c, *norm, W, x, &oc);
    for (size_t i = 0; i < W.size(); ++i)
      check_exact("rmsnorm_matmul.overwrite", tier, what, seed, wf.outs[i], wc.outs[i]);
    TapSet ok(1 + W.size(), {&other});  // kept: the overwritten xn
    const Outcome wk = run(*be, false, c, *norm, W, x, &ok, /*keep_xn=*/true);
    check_exact("rmsnorm_matmul.overwrite keep_xn", tier, what, seed, wk.xn, wc.xn);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, RmsnormMatmul, testing::ValuesIn(op_tiers()), op_tier_name);

// --- matmuls: the projections of one input -------------------------------------------------

class Matmuls : public OpTest {};

// The tier's matmuls (cpu, T == 1: every target's rows in one parallel region, x quantized
// once for the block formats) gives each output the bits of Backend::matmuls' one matmul at a
// time: per weight type of the tier, q/k/v-like rows (one with a bias, as Qwen2's), and the
// block-format mixtures of Q4_K_M (Q4_K and Q6_K share the activation block: one region) and
// one that does not group (Q8_0 beside Q4_K: their activation blocks differ).
TEST_P(Matmuls, EqualsOneAtATime) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  const int K = 1024;
  const std::vector<int> rows = {520, 37, 700};
  std::vector<std::vector<DType>> mixes;
  for (DType t : weight_types(tier)) mixes.push_back({t, t, t});
  if (!tier.cuda) {
    mixes.push_back({DType::Q4_K, DType::Q4_K, DType::Q6_K});
    mixes.push_back({DType::Q8_0, DType::Q4_K, DType::Q8_0});
  }
  uint64_t seed = 1350;
  for (const std::vector<DType>& mix : mixes) {
    ++seed;
    std::vector<std::unique_ptr<HostTensor>> W;
    for (size_t i = 0; i < rows.size(); ++i)
      W.push_back(make_tensor("W" + std::to_string(i), {rows[i], K},
                              values(int64_t(rows[i]) * K, seed + 10 + i, 0.05, DType::F32), mix[i]));
    auto bias = make_tensor("bias", {rows[1]}, values(rows[1], seed + 20, 0.5, DType::F32), DType::F32);
    const std::vector<double> x = values(K, seed + 1, 1.0, tier.compute);
    std::vector<std::vector<double>> got[2];
    for (int one_by_one = 0; one_by_one < 2; ++one_by_one) {
      Buf xb(*be, x);
      std::vector<std::unique_ptr<Buf>> out;
      std::vector<Backend::MatmulTarget> tg;
      for (size_t i = 0; i < W.size(); ++i) {
        out.push_back(std::make_unique<Buf>(*be, rows[i]));
        out.back()->poison();
        tg.push_back({&W[i]->t, i == 1 ? &bias->t : nullptr, &out.back()->b, nullptr});
      }
      if (one_by_one) be->Backend::matmuls(xb.b, 1, tg.data(), int(tg.size()));
      else be->matmuls(xb.b, 1, tg.data(), int(tg.size()));
      for (auto& o : out) got[one_by_one].push_back(o->read());
    }
    std::string what = "T=1 K=1024 weights";
    for (DType t : mix) what += std::string(" ") + dtype_name(t);
    for (size_t i = 0; i < W.size(); ++i)
      check_exact("matmuls", tier, what + " output " + std::to_string(i), seed, got[0][i], got[1][i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Matmuls, testing::ValuesIn(op_tiers()), op_tier_name);

// --- rmsnorm_matmul_conv: Mamba2's in_proj (z, xBC, dt) with the conv of xBC ------------------

struct ConvProj {
  int T, D, I, C, nh, K;  // x [T, D]; outputs z [T, I], xBC [T, C], dt [T, nh]; conv width K
};
// tiny-granite-h's mixer; granite-4.0-h-1b's (rows of 1,536: six chunks); rows of 1,024 (two
// rows a warp on cuda) with K = 3; T > 1 (the composition on every tier).
const ConvProj kConvProj[] = {{1, 64, 128, 192, 8, 4},
                              {1, 1536, 3072, 3328, 48, 4},
                              {1, 1024, 256, 320, 8, 3},
                              {3, 64, 128, 192, 8, 4}};

struct ConvOutcome {
  std::vector<std::vector<double>> outs;  // z, xBC, dt
  std::vector<double> act, state;
  std::vector<std::vector<double>> records;  // norm, z, xBC, dt, conv, state
};

ConvOutcome run_conv(Backend& be, bool composed, const ConvProj& c, const HostTensor& norm,
                     const std::vector<std::unique_ptr<HostTensor>>& W, const HostTensor& cw,
                     const HostTensor& cb, const std::vector<double>& x,
                     const std::vector<double>& state, TapSet* taps) {
  Buf xb(be, x), xn(be, x.size()), st(be, state), act(be, int64_t(c.T) * c.C);
  act.poison();
  auto tap = [&](size_t i) { return taps ? (*taps)[i] : nullptr; };
  std::vector<std::unique_ptr<Buf>> out;
  std::vector<Backend::MatmulTarget> tg;
  for (size_t i = 0; i < W.size(); ++i) {
    out.push_back(std::make_unique<Buf>(be, int64_t(c.T) * W[i]->t.rows()));
    out.back()->poison();
    tg.push_back({&W[i]->t, nullptr, &out.back()->b, tap(i + 1)});
  }
  const Backend::ConvTarget conv{1, &cw.t, &cb.t, c.K, &st.b, &act.b, tap(4), tap(5)};
  if (composed)
    be.Backend::rmsnorm_matmul_conv(xb.b, norm.t, NormWeight::Plain, c.T, c.D, 1e-6, xn.b, tap(0),
                                    tg.data(), 3, conv);
  else
    be.rmsnorm_matmul_conv(xb.b, norm.t, NormWeight::Plain, c.T, c.D, 1e-6, xn.b, tap(0),
                           tg.data(), 3, conv);
  ConvOutcome r;
  for (auto& o : out) r.outs.push_back(o->read());
  r.act = act.read();
  r.state = st.read();
  if (taps) r.records = taps->records;
  return r;
}

class RmsnormMatmulConv : public OpTest {};

// The fused form gives the bits of the tier's own composition (rmsnorm_matmul, then ssm_conv
// of xBC): every output, the conv's and the state; its taps record the composition's values,
// and an overwritten xBC feeds the conv and the state as in the composition (whose ops are
// checked against ref by RmsnormMatmul and SsmConv). On cuda a one-token case runs the fused
// kernel.
TEST_P(RmsnormMatmulConv, EqualsItsCompositionBitForBit) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  const DType st = weight_types(tier).front();
  uint64_t seed = 1400;
  for (const ConvProj& c : kConvProj) {
    ++seed;
    std::vector<double> nv = values(c.D, seed, 0.1, DType::F32);
    for (double& w : nv) w += 1.0;
    auto norm = make_tensor("norm", {c.D}, nv, DType::F32);
    std::vector<std::unique_ptr<HostTensor>> W;
    const int rows[3] = {c.I, c.C, c.nh};
    for (int i = 0; i < 3; ++i)
      W.push_back(make_tensor("W" + std::to_string(i), {rows[i], c.D},
                              values(int64_t(rows[i]) * c.D, seed + 10 + i, 0.05, DType::F32), st));
    auto cw = make_tensor("conv1d.weight", {c.C, 1, c.K},
                          values(int64_t(c.C) * c.K, seed + 3, 0.5, DType::BF16), DType::BF16);
    auto cb = make_tensor("conv1d.bias", {c.C}, values(c.C, seed + 4, 0.2, DType::BF16),
                          DType::BF16);
    const std::vector<double> x = values(int64_t(c.T) * c.D, seed + 1, 1.0, tier.compute);
    const std::vector<double> state = values(int64_t(c.K - 1) * c.C, seed + 2, 1.0, tier.compute);
    const std::string what = strformat("T=%d D=%d C=%d K=%d", c.T, c.D, c.C, c.K);
    const ConvOutcome fused = run_conv(*be, false, c, *norm, W, *cw, *cb, x, state, nullptr);
    if (tier.cuda && c.T == 1) {
      const auto& calls = be->stats().calls();
      EXPECT_TRUE(calls.count("rmsnorm_matmul_conv") &&
                  calls.at("rmsnorm_matmul_conv").count("cuda.norm_gemv_conv"))
          << tier.name << " " << what << ": the fused kernel did not run";
    }
    const ConvOutcome composed = run_conv(*be, true, c, *norm, W, *cw, *cb, x, state, nullptr);
    for (int i = 0; i < 3; ++i)
      check_exact("rmsnorm_matmul_conv.out", tier, what, seed, fused.outs[size_t(i)],
                  composed.outs[size_t(i)]);
    check_exact("rmsnorm_matmul_conv.act", tier, what, seed, fused.act, composed.act);
    check_exact("rmsnorm_matmul_conv.state", tier, what, seed, fused.state, composed.state);
    TapSet tf(6), tc(6);
    const ConvOutcome rf = run_conv(*be, false, c, *norm, W, *cw, *cb, x, state, &tf);
    const ConvOutcome rc = run_conv(*be, true, c, *norm, W, *cw, *cb, x, state, &tc);
    for (size_t i = 0; i < rf.records.size(); ++i) {
      EXPECT_FALSE(rf.records[i].empty()) << tier.name << " " << what << " tap " << i;
      check_exact("rmsnorm_matmul_conv.record", tier, what + " tap " + std::to_string(i), seed,
                  rf.records[i], rc.records[i]);
    }
    const std::vector<double> other = values(int64_t(c.T) * c.C, seed + 5, 1.0, tier.compute);
    TapSet of(6, {nullptr, nullptr, &other}), oc(6, {nullptr, nullptr, &other});
    const ConvOutcome wf = run_conv(*be, false, c, *norm, W, *cw, *cb, x, state, &of);
    const ConvOutcome wc = run_conv(*be, true, c, *norm, W, *cw, *cb, x, state, &oc);
    check_exact("rmsnorm_matmul_conv.overwrite act", tier, what, seed, wf.act, wc.act);
    check_exact("rmsnorm_matmul_conv.overwrite state", tier, what, seed, wf.state, wc.state);
    EXPECT_NE(wf.act, fused.act) << tier.name << " " << what << ": the overwrite did not reach the conv";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, RmsnormMatmulConv, testing::ValuesIn(op_tiers()),
                         op_tier_name);

}  // namespace
}  // namespace arbiter::test
