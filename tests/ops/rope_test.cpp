// rope: in place on x[T, nh, Dh] at positions pos0 + t, both pair layouts, every scaling;
// run twice (a tier may keep its cos/sin table between calls).
#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "backend/rope.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, nh, Dh, pos0;
  RopeLayout layout;
  RopeScaling::Kind scaling;
  double theta;
};
const Case kCases[] = {
    {1, 32, 64, 0, RopeLayout::Half, RopeScaling::Kind::None, 5e5},
    {5, 7, 22, 13, RopeLayout::Half, RopeScaling::Kind::None, 5e5},
    {5, 7, 22, 13, RopeLayout::Adjacent, RopeScaling::Kind::None, 5e5},
    {33, 3, 128, 1000, RopeLayout::Half, RopeScaling::Kind::Linear, 5e5},
    {11, 13, 2, 5, RopeLayout::Adjacent, RopeScaling::Kind::None, 5e5},
    {512, 8, 64, 1536, RopeLayout::Half, RopeScaling::Kind::Llama3, 5e5},  // llama-3.2-1B k
    {5, 16, 128, 0, RopeLayout::Half, RopeScaling::Kind::None, 1e6},       // qwen3 q
    {1, 8, 64, 3000, RopeLayout::Half, RopeScaling::Kind::Llama3, 5e5},    // table growth
    {7, 4, 8, 20, RopeLayout::Adjacent, RopeScaling::Kind::None, 1e4},     // stories260K
    {2, 3, 96, 7000, RopeLayout::Adjacent, RopeScaling::Kind::None, 1e4}}; // far position

class Rope : public OpTest {};

TEST_P(Rope, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 500;
  for (const Case& c : kCases) {
    ++seed;
    RopeSpec spec;
    spec.dims = c.Dh;
    spec.theta = c.theta;
    spec.layout = c.layout;
    spec.scaling.kind = c.scaling;
    spec.scaling.factor = c.scaling == RopeScaling::Kind::None ? 1 : 32;
    const std::vector<double> x = values(int64_t(c.T) * c.nh * c.Dh, seed, 1.0, tier.compute);
    Buf want(*ref, x);
    ref->rope(want.b, c.T, c.nh, c.Dh, c.pos0, spec);
    for (int pass = 0; pass < 2; ++pass) {
      Buf got(*be, x);
      be->rope(got.b, c.T, c.nh, c.Dh, c.pos0, spec);
      check_close("rope", tier,
                  strformat("T=%d nh=%d Dh=%d pos0=%d %s scaling %d pass %d", c.T, c.nh, c.Dh,
                            c.pos0, c.layout == RopeLayout::Half ? "half" : "adjacent",
                            int(c.scaling), pass),
                  seed, got.read(), want.read(), nmse_bound(tier.compute, tier.compute, 0, 5));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Rope, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
