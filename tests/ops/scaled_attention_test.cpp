// scaled_attention: attention() with a given score scale and optional soft cap of the scores
// (gemma: query_pre_attn_scalar^-0.5; Gemma 2's attn_logit_softcapping), sliding windows
// included. ref against a two-key case worked from the definition and against attention()
// (same bits at scale 1/sqrt(Dh) without cap); every tier against ref.
#include <algorithm>
#include <cmath>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, pos0, H, Hkv, Dh, window;
  double scale, softcap;
};
const Case kCases[] = {
    {1, 0, 4, 2, 32, 0, 0.2, 0},     {1, 40, 4, 2, 32, 16, 0.2, 0},   {8, 64, 4, 2, 32, 16, 0.2, 0},
    {8, 64, 4, 2, 16, 24, 0.177, 20}, {1, 50, 4, 2, 16, 0, 0.177, 20}, {13, 5, 6, 3, 33, 0, 0.5, 5},
    {31, 2, 2, 1, 31, 5, 1.0, 2}};

// q = [2], keys [1, 3], values [10, 20], scale 0.5, cap 1: scores tanh(1), tanh(3).
TEST(ScaledAttentionRef, MatchesTheDefinition) {
  auto ref = make_ref_backend();
  using V = std::vector<double>;
  Buf q(*ref, V{2.0}), k(*ref, V{1.0, 3.0}), v(*ref, V{10.0, 20.0}), out(*ref, 1);
  ref->scaled_attention(q.b, k.b, v.b, 1, 1, 1, 1, 1, 0, 0.5, 1.0, out.b);
  const double p1 = 1.0 / (1.0 + std::exp(std::tanh(1.0) - std::tanh(3.0)));
  EXPECT_NEAR(out.read()[0], 10.0 * (1 - p1) + 20.0 * p1, 1e-13);
  ref->scaled_attention(q.b, k.b, v.b, 1, 1, 1, 1, 1, 0, 0.5, 0, out.b);  // no cap: 1 and 3
  const double p1u = 1.0 / (1.0 + std::exp(1.0 - 3.0));
  EXPECT_NEAR(out.read()[0], 10.0 * (1 - p1u) + 20.0 * p1u, 1e-13);
  ref->scaled_attention(q.b, k.b, v.b, 1, 1, 1, 1, 1, 1, 0.5, 1.0, out.b);  // window 1: key 1
  EXPECT_EQ(out.read()[0], 20.0);
}

class ScaledAttention : public OpTest {};

TEST_P(ScaledAttention, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 2600;
  for (const Case& c : kCases) {
    ++seed;
    const int kv_dim = c.Hkv * c.Dh, end = c.pos0 + c.T;
    const std::vector<double> q = values(int64_t(c.T) * c.H * c.Dh, seed, 1.0, tier.compute);
    const std::vector<double> k = values(int64_t(end) * kv_dim, seed + 1, 1.0, tier.compute);
    const std::vector<double> v = values(int64_t(end) * kv_dim, seed + 2, 1.0, tier.compute);
    const int64_t n = int64_t(c.T) * c.H * c.Dh;
    Buf qb(*be, q), kb(*be, k), vb(*be, v), ob(*be, n);
    Buf qr(*ref, q), kr(*ref, k), vr(*ref, v), want(*ref, n), plain(*ref, n);
    const std::string what = strformat("T=%d pos0=%d H=%d Hkv=%d Dh=%d window=%d scale=%g cap=%g",
                                       c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.scale, c.softcap);
    ref->scaled_attention(qr.b, kr.b, vr.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window,
                          1.0 / std::sqrt(double(c.Dh)), 0, want.b);
    ref->attention(qr.b, kr.b, vr.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, plain.b);
    check_exact("scaled_attention", tier, "ref vs attention(): " + what, seed, want.read(),
                plain.read());
    ob.poison();
    be->scaled_attention(qb.b, kb.b, vb.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.scale,
                         c.softcap, ob.b);
    ref->scaled_attention(qr.b, kr.b, vr.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.scale,
                          c.softcap, want.b);
    // As attention_test: scores over Dh, the weighted sum over the keys, an exp, a tanh and
    // a division per score.
    check_close("scaled_attention", tier, what, seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, std::max(c.Dh, end), 16));
  }
}

// A sliding layer's ring cache (window + T - 1 rows, position p at row p % rows) gives the bits
// of the full cache, wrapped or not; a ring one row short of that is refused.
TEST_P(ScaledAttention, RingCacheGivesTheFullCachesBits) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  struct Ring {
    int T, pos0, H, Hkv, Dh, window;
  };
  const Ring rings[] = {{8, 64, 4, 2, 32, 16}, {1, 90, 4, 2, 16, 24}, {5, 3, 2, 1, 16, 4}};
  uint64_t seed = 2700;
  for (const Ring& c : rings) {
    ++seed;
    const int kv_dim = c.Hkv * c.Dh, end = c.pos0 + c.T, rows = c.window + c.T - 1;
    const std::vector<double> q = values(int64_t(c.T) * c.H * c.Dh, seed, 1.0, tier.compute);
    const std::vector<double> k = values(int64_t(end) * kv_dim, seed + 1, 1.0, tier.compute);
    const std::vector<double> v = values(int64_t(end) * kv_dim, seed + 2, 1.0, tier.compute);
    std::vector<double> kr(size_t(rows) * kv_dim), vr = kr;  // the latest `rows` positions
    for (int p = std::max(0, end - rows); p < end; ++p) {
      std::copy_n(k.begin() + int64_t(p) * kv_dim, kv_dim, kr.begin() + int64_t(p % rows) * kv_dim);
      std::copy_n(v.begin() + int64_t(p) * kv_dim, kv_dim, vr.begin() + int64_t(p % rows) * kv_dim);
    }
    const int64_t n = int64_t(c.T) * c.H * c.Dh;
    Buf qb(*be, q), kb(*be, k), vb(*be, v), krb(*be, kr), vrb(*be, vr), full(*be, n), ring(*be, n);
    const std::string what = strformat("T=%d pos0=%d window=%d rows=%d", c.T, c.pos0, c.window, rows);
    full.poison();
    ring.poison();
    be->scaled_attention(qb.b, kb.b, vb.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, 0.2, 5,
                         full.b);
    be->scaled_attention(qb.b, krb.b, vrb.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, 0.2, 5,
                         ring.b);
    check_exact("scaled_attention", tier, "ring vs full cache: " + what, seed, ring.read(),
                full.read());
    if (end <= rows - 1) continue;  // a cache of rows - 1 would still hold every position
    Buf ks(*be, int64_t(rows - 1) * kv_dim), vs(*be, int64_t(rows - 1) * kv_dim);
    EXPECT_THROW(be->scaled_attention(qb.b, ks.b, vs.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window,
                                      0.2, 5, ring.b),
                 Error)
        << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, ScaledAttention, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
