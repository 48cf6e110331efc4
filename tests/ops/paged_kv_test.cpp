// kv_store_paged and attention_paged (continuous batching's paged KV pool): on each tier, a
// sequence's rows stored through a scattered block table and attended there give exactly the
// bits of kv_store and attention over a contiguous cache holding the same rows (the same
// kernel, rows found through the table), and rows of other blocks are never touched. ref runs
// the same check. On cuda the store is exact too, but the paged attention is the flash
// kernel without key splits (paged.cpp), where attention() over a cache picks the decode,
// tensor-core or split kernels: there the two agree within twice the tolerance of either
// against ref (a single query row goes to the direct decode kernel in both, but with a KV
// group per block in the paged form, a query head per block over the cache). Cases with a
// score scale (and soft cap) are checked against scaled_attention (gemma's layers).
// Adding a case: a row of kCases.
#include "tier_util.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, pos0, H, Hkv, Dh, window, block_rows;
  Backend::AttentionScores scores;  // {}: attention()'s
};
const Case kCases[] = {
    {1, 0, 4, 2, 16, 0, 16, {}},          {5, 3, 4, 2, 16, 0, 4, {}},
    {1, 37, 8, 2, 32, 0, 16, {}},         {17, 16, 4, 4, 8, 0, 16, {}},
    {7, 40, 6, 3, 16, 9, 8, {}},          {33, 0, 2, 1, 64, 0, 16, {}},
    {6, 21, 4, 2, 16, 16, 16, {0.25, 0}}, {9, 30, 4, 2, 16, 24, 4, {0.25, 50.0}},
    {1, 40, 4, 2, 16, 0, 16, {0.125, 0}}, {1, 200, 16, 4, 128, 0, 16, {}},
    {1, 90, 8, 2, 64, 32, 8, {0.125, 0}}, {1, 300, 4, 1, 256, 0, 16, {}}};

// The pages of n positions: blocks taken from the pool's end backwards, every other one, so
// that no two neighbours are adjacent in the pool.
std::vector<int32_t> scattered_blocks(int positions, int block_rows, int& pool_blocks) {
  const int n = (positions + block_rows - 1) / block_rows;
  pool_blocks = 2 * n + 1;
  std::vector<int32_t> b;
  for (int i = 0; i < n; ++i) b.push_back(pool_blocks - 1 - 2 * i);
  return b;
}

void run_case(Backend& be, const OpTier& tier, const Case& c, uint64_t seed) {
  const DType compute = tier.compute;
  const int kv_dim = c.Hkv * c.Dh, q_dim = c.H * c.Dh, P = c.pos0 + c.T;
  int pool_blocks = 0;
  const std::vector<int32_t> blocks = scattered_blocks(P, c.block_rows, pool_blocks);
  const Backend::KvPages pages{blocks.data(), int(blocks.size()), c.block_rows};
  const int64_t pool_rows = int64_t(pool_blocks) * c.block_rows;
  Buf kc(be, int64_t(P) * kv_dim), vc(be, int64_t(P) * kv_dim);
  Buf kp(be, pool_rows * kv_dim), vp(be, pool_rows * kv_dim);
  kp.poison();
  vp.poison();
  // Every position's K/V, stored in two calls (the context, then the T new rows) as a
  // sequence's prefill and step would.
  for (const auto& [p0, n] : {std::pair<int, int>{0, c.pos0}, {c.pos0, c.T}}) {
    if (n == 0) continue;
    const std::vector<double> k = values(int64_t(n) * kv_dim, seed + p0, 1.0, compute);
    const std::vector<double> v = values(int64_t(n) * kv_dim, seed + p0 + 1, 1.0, compute);
    Buf kb(be, k), vb(be, v);
    be.kv_store(kb.b, vb.b, kc.b, vc.b, n, p0, kv_dim);
    be.kv_store_paged(kb.b, vb.b, kp.b, vp.b, pages, n, p0, kv_dim);
  }
  const std::string what = strformat("T=%d pos0=%d H=%d Hkv=%d Dh=%d window=%d block_rows=%d scale=%g softcap=%g",
                                     c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.block_rows, c.scores.scale,
                                     c.scores.softcap);
  // The pool holds each position at its block's row, NaN elsewhere.
  std::vector<double> want_k(size_t(pool_rows) * kv_dim, std::nan("")), want_v = want_k;
  const std::vector<double> k_all = kc.read(), v_all = vc.read();
  for (int p = 0; p < P; ++p) {
    std::copy_n(k_all.begin() + int64_t(p) * kv_dim, kv_dim, want_k.begin() + pages.row(p) * kv_dim);
    std::copy_n(v_all.begin() + int64_t(p) * kv_dim, kv_dim, want_v.begin() + pages.row(p) * kv_dim);
  }
  check_exact("kv_store_paged.k", tier, what, seed, kp.read(), want_k);
  check_exact("kv_store_paged.v", tier, what, seed, vp.read(), want_v);
  Buf q(be, values(int64_t(c.T) * q_dim, seed + 7, 1.0, compute));
  Buf want(be, int64_t(c.T) * q_dim), got(be, int64_t(c.T) * q_dim);
  got.poison();
  if (c.scores.scale == 0)
    be.attention(q.b, kc.b, vc.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, want.b);
  else
    be.scaled_attention(q.b, kc.b, vc.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.scores.scale,
                        c.scores.softcap, want.b);
  be.attention_paged(q.b, kp.b, vp.b, pages, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, c.scores, got.b);
  if (!tier.cuda) return check_exact("attention_paged", tier, what, seed, got.read(), want.read());
  const int keys = c.window > 0 ? std::min(P, c.window) : P;
  // Two results each within attention's bound of the truth: their difference within 4x it.
  check_close("attention_paged", tier, what, seed, got.read(), want.read(),
              4 * nmse_bound(compute, compute, c.Dh + keys, 13));
}

class PagedKv : public OpTest {};

TEST_P(PagedKv, EqualsTheContiguousCacheBitForBit) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  uint64_t seed = 900;
  for (const Case& c : kCases) run_case(*be, tier, c, seed += 10);
}

INSTANTIATE_TEST_SUITE_P(Tiers, PagedKv, testing::ValuesIn(op_tiers()), op_tier_name);

TEST(PagedKvRef, EqualsTheContiguousCacheBitForBit) {
  const OpTier ref{"ref", DType::F64, false,
                   [] { return make_backend(DeviceSpec{"ref", "", 0, ""}); }};
  auto be = ref.make();
  uint64_t seed = 950;
  for (const Case& c : kCases) run_case(*be, ref, c, seed += 10);
}

TEST(PagedKvRef, RefusesPagesThatDoNotCoverThePositions) {
  auto be = make_backend(DeviceSpec{"ref", "", 0, ""});
  const std::vector<int32_t> blocks = {0};
  Buf k(*be, 4 * 8), pool(*be, 2 * 4 * 8);
  EXPECT_THROW(be->kv_store_paged(k.b, k.b, pool.b, pool.b, {blocks.data(), 1, 4}, 4, 2, 8), Error);
  const std::vector<int32_t> outside = {2};
  EXPECT_THROW(be->kv_store_paged(k.b, k.b, pool.b, pool.b, {outside.data(), 1, 4}, 1, 0, 8), Error);
}

}  // namespace
}  // namespace arbiter::test
