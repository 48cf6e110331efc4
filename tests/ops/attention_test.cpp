// attention: causal GQA of q [T, H, Dh] (positions pos0 + t) over cache rows [0, pos0 + T),
// sliding windows included. Cache rows no query may see are NaN on the tier (reading one
// poisons the output); ref gets zeros there.
#include <algorithm>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, pos0, H, Hkv, Dh, window;
};
const Case kCases[] = {
    {1, 0, 4, 4, 16, 0},          {1, 37, 8, 2, 64, 0},        {5, 11, 6, 3, 24, 0},
    {7, 1, 7, 7, 13, 0},          {13, 20, 4, 1, 33, 0},       {9, 30, 4, 2, 32, 8},
    {31, 2, 2, 1, 31, 5},         {8, 1536, 32, 8, 64, 1024},  {64, 448, 32, 8, 64, 0},
    {64, 0, 16, 8, 128, 0},       // qwen3-0.6B prefill
    {37, 100, 8, 4, 64, 0},       // prefill behind context
    {1, 700, 16, 8, 128, 0},      // decode, key range split across blocks
    {1, 0, 8, 4, 8, 0},           // stories260K first token
    {20, 30, 12, 4, 16, 16},      // sliding window, group of 3
    {1, 1500, 32, 8, 64, 1024},   // decode past a 1024 window (llama-3.2-1B heads)
    {1, 300, 32, 4, 128, 0},      // decode, group of 8
    {1, 90, 8, 8, 256, 0},        // decode, Dh 256, MHA
    {1, 150, 16, 2, 256, 0},      // decode, group of 8 at Dh 256
    {9, 1530, 16, 16, 256, 1024}, // Dh 256, MHA, w8ctx1536-like
    {5, 3, 4, 1, 96, 0},          // Dh not a multiple of 32, one KV head
    {200, 0, 8, 2, 128, 0},       // longer prefill
    {96, 40, 8, 2, 64, 48},       // sliding window across key tiles
    {70, 5, 16, 4, 128, 0}};      // group of 4, partial last row block

class Attention : public OpTest {};

TEST_P(Attention, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 700;
  for (const Case& c : kCases) {
    ++seed;
    const int kv_dim = c.Hkv * c.Dh, end = c.pos0 + c.T, cap = end + 13;
    const int lo = c.window > 0 ? std::max(0, c.pos0 - c.window + 1) : 0;
    const std::vector<double> q = values(int64_t(c.T) * c.H * c.Dh, seed, 1.0, tier.compute);
    std::vector<double> k = values(int64_t(cap) * kv_dim, seed + 1, 1.0, tier.compute);
    std::vector<double> v = values(int64_t(cap) * kv_dim, seed + 2, 1.0, tier.compute);
    std::vector<double> kr = k, vr = v;
    for (int64_t i = 0; i < int64_t(cap) * kv_dim; ++i) {
      const int64_t row = i / kv_dim;
      if (row < lo || row >= end) {
        k[size_t(i)] = v[size_t(i)] = std::nan("");
        kr[size_t(i)] = vr[size_t(i)] = 0;
      }
    }
    Buf qb(*be, q), kb(*be, k), vb(*be, v), ob(*be, q.size());
    Buf qr(*ref, q), kb_r(*ref, kr), vb_r(*ref, vr), want(*ref, q.size());
    ob.poison();
    be->attention(qb.b, kb.b, vb.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, ob.b);
    ref->attention(qr.b, kb_r.b, vb_r.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, want.b);
    const int keys = c.window > 0 ? std::min(end, c.window) : end;
    // Scores over Dh, a softmax (an exp, a division), a weighted sum over the keys.
    check_close(c.T == 1 ? "attention.dec" : "attention.pre", tier,
                strformat("T=%d pos0=%d H=%d Hkv=%d Dh=%d window=%d", c.T, c.pos0, c.H, c.Hkv,
                          c.Dh, c.window),
                seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, c.Dh + keys, 13));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Attention, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
