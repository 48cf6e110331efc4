// kv_store: k, v [T, kv_dim] copied to rows pos0.. of the caches, exactly; no other row
// touched (they stay NaN).
#include "tier_util.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, pos0, kv_dim, rows;
};
const Case kCases[] = {{5, 3, 33, 10}, {5, 17, 128, 50}, {1, 0, 64, 4}, {8, 100, 1024, 120}};

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
    std::copy(k.begin(), k.end(), want_k.begin() + int64_t(c.pos0) * c.kv_dim);
    std::copy(v.begin(), v.end(), want_v.begin() + int64_t(c.pos0) * c.kv_dim);
    const std::string what = strformat("T=%d pos0=%d kv_dim=%d rows=%d", c.T, c.pos0, c.kv_dim, c.rows);
    check_exact("kv_store.k", tier, what, seed, kc.read(), want_k);
    check_exact("kv_store.v", tier, what, seed, vc.read(), want_v);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KvStore, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
