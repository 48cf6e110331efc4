// rmsnorm_add (gemma's post-attention and post-feedforward norms: residual += norm(y)): against
// ref; against the tier's own composition (rmsnorm or rmsnorm_1p, then add) bit for bit; with a
// stage tap on the sum, whose record is the composition's. A tapped norm runs the composition
// (the fused kernel never writes the normalised y). Rows of gemma3-1b's 1,152, a tiny model's,
// one no 16-byte chunk divides, and T > 1. Then the same update as the NormAdd that
// rmsnorm_matmul and rmsnorm_glu run first.
#include <cmath>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, D;
  NormWeight nw;
};
const Case kCases[] = {{1, 1152, NormWeight::OnePlus},
                       {1, 64, NormWeight::Plain},
                       {3, 64, NormWeight::OnePlus},
                       {2, 1156, NormWeight::OnePlus}};

struct Outcome {
  std::vector<double> sum;
  std::vector<double> record;
};

Outcome run(Backend& be, bool composed, const Case& c, const HostTensor& w,
            const std::vector<double>& y, const std::vector<double>& res, bool tapped) {
  Buf yb(be, y), rb(be, res);
  std::vector<double> record;
  StageTap sum;
  sum.record = &record;
  const StageTap* st = tapped ? &sum : nullptr;
  if (composed) be.Backend::rmsnorm_add(yb.b, w.t, c.nw, c.T, c.D, 1e-6, rb.b, nullptr, st);
  else be.rmsnorm_add(yb.b, w.t, c.nw, c.T, c.D, 1e-6, rb.b, nullptr, st);
  return {rb.read(), record};
}

class RmsnormAdd : public OpTest {};

TEST_P(RmsnormAdd, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 1700;
  for (const Case& c : kCases) {
    ++seed;
    std::vector<double> wv = values(c.D, seed, 0.1, DType::F32);
    if (c.nw == NormWeight::Plain)  // near 1 either way: rmsnorm_1p adds the 1
      for (double& v : wv) v += 1.0;
    auto w = make_tensor("norm", {c.D}, wv, DType::F32);
    const std::vector<double> y = values(int64_t(c.T) * c.D, seed + 1, 1.0, tier.compute);
    const std::vector<double> res = values(int64_t(c.T) * c.D, seed + 2, 1.0, tier.compute);
    const std::string what = strformat("T=%d D=%d%s", c.T, c.D,
                                       c.nw == NormWeight::OnePlus ? " 1+w" : "");
    const Outcome fused = run(*be, false, c, *w, y, res, false);
    // The norm's sum of squares over D, the normalised y rounded, then the add.
    check_close("rmsnorm_add", tier, what, seed, fused.sum,
                run(*ref, false, c, *w, y, res, false).sum,
                nmse_bound(tier.compute, tier.compute, c.D, 4, 1));
    check_exact("rmsnorm_add.composed", tier, what, seed, fused.sum,
                run(*be, true, c, *w, y, res, false).sum);
    const Outcome tf = run(*be, false, c, *w, y, res, true);
    check_exact("rmsnorm_add.record", tier, what, seed, tf.record,
                run(*be, true, c, *w, y, res, true).record);
    check_exact("rmsnorm_add.tapped", tier, what, seed, tf.sum, fused.sum);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, RmsnormAdd, testing::ValuesIn(op_tiers()), op_tier_name);

// rmsnorm_matmul and rmsnorm_glu with a NormAdd first (Gemma's post norm, run by the next
// norm that reads the residual): the residual they leave against ref, and it and every output
// bit for bit against the tier's composition (rmsnorm_add, then the op), untapped and with the
// NormAdd's sum recorded (which runs it as its own op). The cases in sequence on one backend,
// so cuda's last-block counter is reused. gemma3-1b's q/k/v (rows of 1,152) and gate/up (6,912
// rows: many blocks, several rows a warp), rows of 1,024 (cuda's four-chunk forms, whose
// NormAdd variant takes one row a warp where the plain one takes two), logits rows in f32, a
// tiny model's, and T > 1.
struct PreCase {
  int T, D;
  std::vector<int> rows;  // rmsnorm_matmul's outputs; rmsnorm_glu: rows[0] of gate and of up
  bool glu;
  NormWeight nw;
  bool logits = false;
};
const PreCase kPreCases[] = {{1, 1152, {1024, 256, 256}, false, NormWeight::OnePlus},
                             {1, 1152, {6912}, true, NormWeight::OnePlus},
                             {1, 1024, {1024, 512, 512}, false, NormWeight::Plain},
                             {1, 1024, {3072}, true, NormWeight::Plain},
                             {1, 256, {20000}, false, NormWeight::OnePlus, true},
                             {1, 64, {64}, false, NormWeight::OnePlus},
                             {2, 64, {128}, true, NormWeight::OnePlus}};

struct PreOutcome {
  std::vector<std::vector<double>> outs;
  std::vector<double> residual, record;
};

PreOutcome run_pre(Backend& be, bool composed, const PreCase& c, const HostTensor& norm,
                   const std::vector<std::unique_ptr<HostTensor>>& W, const HostTensor& post,
                   const std::vector<double>& x, const std::vector<double>& y, bool tap_sum) {
  Buf xb(be, x), yb(be, y), xn(be, x.size());
  PreOutcome r;
  StageTap sum;
  sum.record = &r.record;
  const Backend::NormAdd pre{&yb.b, &post.t, &xb.b, nullptr, tap_sum ? &sum : nullptr};
  std::vector<std::unique_ptr<Buf>> out;
  for (size_t i = 0; i < (c.glu ? 3 : W.size()); ++i) {  // glu: gate, up, act
    out.push_back(std::make_unique<Buf>(be, int64_t(c.T) * c.rows[c.glu ? 0 : i], c.logits));
    out.back()->poison();
  }
  if (c.glu) {
    if (composed)
      be.Backend::rmsnorm_glu(xb.b, norm.t, c.nw, c.T, c.D, 1e-6, xn.b, W[0]->t, W[1]->t,
                              GluAct::GeluTanh, out[0]->b, out[1]->b, out[2]->b, {}, &pre);
    else
      be.rmsnorm_glu(xb.b, norm.t, c.nw, c.T, c.D, 1e-6, xn.b, W[0]->t, W[1]->t, GluAct::GeluTanh,
                     out[0]->b, out[1]->b, out[2]->b, {}, &pre);
    r.outs.push_back(out[2]->read());
  } else {
    std::vector<Backend::MatmulTarget> tg;
    for (size_t i = 0; i < W.size(); ++i) tg.push_back({&W[i]->t, nullptr, &out[i]->b, nullptr});
    if (composed)
      be.Backend::rmsnorm_matmul(xb.b, norm.t, c.nw, c.T, c.D, 1e-6, xn.b, false, nullptr,
                                 tg.data(), int(tg.size()), &pre);
    else
      be.rmsnorm_matmul(xb.b, norm.t, c.nw, c.T, c.D, 1e-6, xn.b, false, nullptr, tg.data(),
                        int(tg.size()), &pre);
    for (auto& o : out) r.outs.push_back(o->read());
  }
  r.residual = xb.read();
  return r;
}

class NormAddFirst : public OpTest {};

TEST_P(NormAddFirst, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  const DType st = weight_types(tier).front();
  uint64_t seed = 1900;
  for (const PreCase& c : kPreCases) {
    ++seed;
    auto weights = [&](uint64_t s) {
      std::vector<double> v = values(c.D, s, 0.1, DType::F32);
      if (c.nw == NormWeight::Plain)  // near 1 either way: rmsnorm_1p adds the 1
        for (double& e : v) e += 1.0;
      return v;
    };
    auto norm = make_tensor("norm", {c.D}, weights(seed), DType::F32);
    auto post = make_tensor("post_norm", {c.D}, weights(seed + 1), DType::F32);
    std::vector<std::unique_ptr<HostTensor>> W;
    for (size_t i = 0; i < (c.glu ? 2 : c.rows.size()); ++i) {
      const int n = c.rows[c.glu ? 0 : i];
      W.push_back(make_tensor("W" + std::to_string(i), {n, c.D},
                              values(int64_t(n) * c.D, seed + 10 + i, 0.05, DType::F32), st));
    }
    const std::vector<double> x = values(int64_t(c.T) * c.D, seed + 2, 1.0, tier.compute);
    const std::vector<double> y = values(int64_t(c.T) * c.D, seed + 3, 1.0, tier.compute);
    const std::string what = strformat("T=%d D=%d %s %zu%s", c.T, c.D,
                                       c.glu ? "glu" : "matmul", c.rows.size(),
                                       c.nw == NormWeight::OnePlus ? " 1+w" : "");
    const PreOutcome fused = run_pre(*be, false, c, *norm, W, *post, x, y, false);
    check_close("norm_add_first.residual", tier, what, seed, fused.residual,
                run_pre(*ref, false, c, *norm, W, *post, x, y, false).residual,
                nmse_bound(tier.compute, tier.compute, c.D, 4, 1));
    const PreOutcome composed = run_pre(*be, true, c, *norm, W, *post, x, y, false);
    check_exact("norm_add_first.residual composed", tier, what, seed, fused.residual,
                composed.residual);
    for (size_t i = 0; i < fused.outs.size(); ++i)
      check_exact("norm_add_first.composed", tier, what + " output " + std::to_string(i), seed,
                  fused.outs[i], composed.outs[i]);
    const PreOutcome tapped = run_pre(*be, false, c, *norm, W, *post, x, y, true);
    check_exact("norm_add_first.record", tier, what, seed, tapped.record, composed.residual);
    for (size_t i = 0; i < fused.outs.size(); ++i)
      check_exact("norm_add_first.tapped", tier, what + " output " + std::to_string(i), seed,
                  tapped.outs[i], fused.outs[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, NormAddFirst, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
