// matmul_add (the fused GEMV + residual add of the o and down projections): against ref;
// against the tier's own composition (matmul, then add) bit for bit; with stage taps on the
// product and the sum, whose records are the composition's and whose overwrite of the
// product feeds the add as in the composition. Rows of 1,024, 1,536 (cuda: six chunks a
// lane), 2,048 and 3,072 (x in registers or in shared memory), a tiny model's, and T > 1; with
// Granite's residual scale; 6,000 rows of 1,536, several rows a warp on cuda (the next row's
// weights loaded while the current one is multiplied).
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, N, K;
  double scale = 1;
};
const Case kCases[] = {{1, 1024, 2048}, {1, 1024, 3072}, {1, 2048, 1024},     {1, 64, 128},
                       {1, 128, 384},   {3, 64, 172},    {1, 1536, 3072, 0.22}, {3, 64, 172, 0.5},
                       {1, 640, 1536, 0.22}, {1, 6000, 1536}};

struct Outcome {
  std::vector<double> sum;
  std::vector<std::vector<double>> records;
};

Outcome run(Backend& be, bool composed, const Case& c, const HostTensor& W,
        const std::vector<double>& x, const std::vector<double>& res, TapSet* taps) {
  Buf xb(be, x), tmp(be, int64_t(c.T) * c.N), rb(be, res);
  const StageTap* product = taps ? (*taps)[0] : nullptr;
  const StageTap* sum = taps ? (*taps)[1] : nullptr;
  if (composed) be.Backend::matmul_add(xb.b, W.t, c.T, tmp.b, rb.b, c.scale, product, sum);
  else be.matmul_add(xb.b, W.t, c.T, tmp.b, rb.b, c.scale, product, sum);
  return {rb.read(), taps ? taps->records : std::vector<std::vector<double>>{}};
}

class MatmulAdd : public OpTest {};

TEST_P(MatmulAdd, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  const DType st = weight_types(tier).front();
  uint64_t seed = 1500;
  for (const Case& c : kCases) {
    ++seed;
    auto W = make_tensor("W", {c.N, c.K}, values(int64_t(c.N) * c.K, seed, 0.05, DType::F32), st);
    const std::vector<double> x = values(int64_t(c.T) * c.K, seed + 1, 1.0, tier.compute);
    const std::vector<double> res = values(int64_t(c.T) * c.N, seed + 2, 1.0, tier.compute);
    const std::string what = strformat("T=%d N=%d K=%d scale %g", c.T, c.N, c.K, c.scale);
    const Outcome fused = run(*be, false, c, *W, x, res, nullptr);
    // A dot over K, the product rounded (and scaled, rounded again), then the add.
    check_close("matmul_add", tier, what, seed, fused.sum, run(*ref, false, c, *W, x, res, nullptr).sum,
                nmse_bound(tier.compute, tier.compute, c.K, c.scale != 1 ? 4 : 3, 1));
    check_exact("matmul_add.composed", tier, what, seed, fused.sum,
                run(*be, true, c, *W, x, res, nullptr).sum);
    TapSet tf(2), tc(2);
    const Outcome rf = run(*be, false, c, *W, x, res, &tf), rc = run(*be, true, c, *W, x, res, &tc);
    for (size_t i = 0; i < 2; ++i)
      check_exact("matmul_add.record", tier, what + " tap " + std::to_string(i), seed,
                  rf.records[i], rc.records[i]);
    const std::vector<double> other = values(int64_t(c.T) * c.N, seed + 3, 1.0, tier.compute);
    TapSet of(2, {&other}), oc(2, {&other});
    check_exact("matmul_add.overwrite", tier, what, seed, run(*be, false, c, *W, x, res, &of).sum,
                run(*be, true, c, *W, x, res, &oc).sum);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, MatmulAdd, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
