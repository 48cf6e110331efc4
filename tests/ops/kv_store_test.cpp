// kv_store: k, v [T, kv_dim] copied to the rows of positions pos0.. of the caches (position
// p at row p % rows: its own row in a cache of max_ctx rows, a ring's row in a smaller one),
// exactly; no other row touched (they stay NaN).
#include "tier_util.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, pos0, kv_dim, rows;
};
// The last three are rings: wrapping inside the chunk, past the end, a whole ring's worth.
const Case kCases[] = {{5, 3, 33, 10}, {5, 17, 128, 50}, {1, 0, 64, 4}, {8, 100, 1024, 120},
                       {5, 8, 33, 10},  {3, 100, 16, 7},  {7, 40, 64, 7}};

class KvStore : public OpTest {};

TEST_P(KvStore, CopiesExactly) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  uint64_t seed = 600;
  for (const Case& c : kCases) {
    ++seed;
    const std::vector<double> k = values(int64_t(c.T) * c.kv_dim, seed, 1.0, tier.compute);
    const std::vector<double> v = values(int64_t(c.T) * c.kv_dim, seed + 1, 1.0, tier.compute);
    Buf kb(*be, k), vb(*be, v), kc(*be, int64_t(c.rows) * c.kv_dim), vc(*be, int64_t(c.rows) * c.kv_dim);
    kc.poison();
    vc.poison();
    be->kv_store(kb.b, vb.b, kc.b, vc.b, c.T, c.pos0, c.kv_dim);
    std::vector<double> want_k(size_t(c.rows) * c.kv_dim, std::nan("")), want_v = want_k;
    for (int t = 0; t < c.T; ++t) {
      const int64_t at = int64_t((c.pos0 + t) % c.rows) * c.kv_dim, from = int64_t(t) * c.kv_dim;
      std::copy_n(k.begin() + from, c.kv_dim, want_k.begin() + at);
      std::copy_n(v.begin() + from, c.kv_dim, want_v.begin() + at);
    }
    const std::string what = strformat("T=%d pos0=%d kv_dim=%d rows=%d", c.T, c.pos0, c.kv_dim, c.rows);
    check_exact("kv_store.k", tier, what, seed, kc.read(), want_k);
    check_exact("kv_store.v", tier, what, seed, vc.read(), want_v);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KvStore, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
