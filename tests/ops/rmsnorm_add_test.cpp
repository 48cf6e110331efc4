// rmsnorm_add (gemma's post-attention and post-feedforward norms: residual += norm(y)): against
// ref; against the tier's own composition (rmsnorm or rmsnorm_1p, then add) bit for bit; with a
// stage tap on the sum, whose record is the composition's. A tapped norm runs the composition
// (the fused kernel never writes the normalised y). Rows of gemma3-1b's 1,152, a tiny model's,
// one no 16-byte chunk divides, and T > 1.
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

}  // namespace
}  // namespace arbiter::test
