// attention_batch (a batched forward's attention: every sequence's q/k norm, RoPE at its own
// positions, K/V store into its pages and attention over them, in one call): against ref on
// every tier, and batch-invariant on every tier: each sequence run alone gives bit for bit
// the rows it gets inside the batch. The sequences mix prefill chunks and decode rows behind
// contexts of different lengths, with scattered pages; the forms of llama (plain), qwen3
// (q/k norms), gemma (1 + w norms, score scale, soft cap, sliding window) and the hybrids'
// NoPE layers, and decode steps of one row per sequence. Adding a case: a row of kCases.
#include <algorithm>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "backend/rope.h"

namespace arbiter::test {
namespace {

constexpr int kBlockRows = 16;

struct Seq {
  int T, pos0;
};
struct Case {
  int H, Hkv, Dh, window;
  bool qk_norm, rope;
  NormWeight nw;
  Backend::AttentionScores scores;
  std::vector<Seq> seqs;
};
const Case kCases[] = {
    {4, 2, 32, 0, false, true, NormWeight::Plain, {}, {{1, 0}, {5, 3}, {1, 40}, {17, 16}}},
    {16, 8, 128, 0, true, true, NormWeight::Plain, {}, {{1, 700}, {1, 5}, {3, 64}, {1, 129}}},
    {8, 2, 64, 24, false, true, NormWeight::Plain, {}, {{9, 30}, {1, 60}, {1, 2}}},
    {4, 1, 256, 64, true, true, NormWeight::OnePlus, {0.0625, 0}, {{1, 100}, {7, 0}, {1, 63}}},
    {8, 4, 16, 0, false, true, NormWeight::Plain, {0.25, 50.0}, {{2, 30}, {1, 7}, {6, 1}}},
    {6, 3, 16, 0, false, false, NormWeight::Plain, {}, {{1, 33}, {4, 0}, {1, 1}}},
    // Decode steps (a row per sequence: cuda's direct decode kernel, paged.cpp).
    {16, 8, 128, 0, true, true, NormWeight::Plain, {}, {{1, 700}, {1, 5}, {1, 64}, {1, 129}}},
    {8, 2, 64, 24, false, true, NormWeight::Plain, {}, {{1, 30}, {1, 60}, {1, 2}}},
    {4, 1, 256, 64, true, true, NormWeight::OnePlus, {0.0625, 0}, {{1, 100}, {1, 0}, {1, 63}}},
    {8, 4, 32, 0, false, true, NormWeight::Plain, {0.25, 50.0}, {{1, 30}, {1, 7}}},
};

// Each sequence's pages: its blocks every third block of the pool, interleaved with the other
// sequences' (sequence i takes blocks i, i + n, i + 2n, ... in reverse order).
std::vector<std::vector<int32_t>> pages_of(const Case& c, int& pool_blocks) {
  const int n = int(c.seqs.size());
  int most = 0;
  for (const Seq& s : c.seqs) most = std::max(most, (s.pos0 + s.T + kBlockRows - 1) / kBlockRows);
  pool_blocks = most * n + 1;
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Seq& s = c.seqs[size_t(i)];
    const int need = (s.pos0 + s.T + kBlockRows - 1) / kBlockRows;
    for (int b = 0; b < need; ++b) pages[size_t(i)].push_back((most - 1 - b) * n + i);
  }
  return pages;
}

/// The inputs of one case: each sequence's context K/V (already roped: a cache's content)
/// and its new rows' q, k, v, stored one sequence after the other.
struct Inputs {
  std::vector<std::vector<double>> ctx_k, ctx_v;
  std::vector<double> q, k, v;
};

Inputs make_inputs(const Case& c, uint64_t seed, DType ct) {
  const int kv_dim = c.Hkv * c.Dh;
  Inputs in;
  int rows = 0;
  for (const Seq& s : c.seqs) {
    in.ctx_k.push_back(values(int64_t(s.pos0) * kv_dim, seed + 10 * uint64_t(rows + 1), 1.0, ct));
    in.ctx_v.push_back(values(int64_t(s.pos0) * kv_dim, seed + 10 * uint64_t(rows + 1) + 1, 1.0, ct));
    rows += s.T;
  }
  in.q = values(int64_t(rows) * c.H * c.Dh, seed + 1, 1.0, ct);
  in.k = values(int64_t(rows) * kv_dim, seed + 2, 1.0, ct);
  in.v = values(int64_t(rows) * kv_dim, seed + 3, 1.0, ct);
  return in;
}

/// attention_batch over the sequences `which` of the case (their rows of the inputs), on a
/// fresh pool holding their contexts; returns the output rows of those sequences.
std::vector<double> run(Backend& be, const Case& c, const Inputs& in, const std::vector<int>& which,
                        const HostTensor& qn, const HostTensor& kn) {
  const int kv_dim = c.Hkv * c.Dh, q_dim = c.H * c.Dh;
  int pool_blocks = 0;
  const std::vector<std::vector<int32_t>> pages = pages_of(c, pool_blocks);
  Buf kp(be, int64_t(pool_blocks) * kBlockRows * kv_dim), vp(be, int64_t(pool_blocks) * kBlockRows * kv_dim);
  kp.poison();
  vp.poison();
  std::vector<int> row_of(c.seqs.size());
  for (size_t i = 0, r = 0; i < c.seqs.size(); r += size_t(c.seqs[i].T), ++i) row_of[i] = int(r);
  std::vector<double> q, k, v;
  std::vector<Backend::PagedSeq> seqs;
  int rows = 0;
  for (int i : which) {
    const Seq& s = c.seqs[size_t(i)];
    const Backend::KvPages pg{pages[size_t(i)].data(), int(pages[size_t(i)].size()), kBlockRows};
    if (s.pos0 > 0) {  // the context, stored as a cache holds it
      Buf kb(be, in.ctx_k[size_t(i)]), vb(be, in.ctx_v[size_t(i)]);
      be.kv_store_paged(kb.b, vb.b, kp.b, vp.b, pg, s.pos0, 0, kv_dim);
    }
    auto take = [&](const std::vector<double>& src, int width, std::vector<double>& dst) {
      dst.insert(dst.end(), src.begin() + int64_t(row_of[size_t(i)]) * width,
                 src.begin() + int64_t(row_of[size_t(i)] + s.T) * width);
    };
    take(in.q, q_dim, q);
    take(in.k, kv_dim, k);
    take(in.v, kv_dim, v);
    seqs.push_back({rows, s.T, s.pos0, pg});
    rows += s.T;
  }
  RopeSpec rope;
  rope.dims = c.Dh;
  rope.theta = 1e4;
  Buf qb(be, q), kb(be, k), vb(be, v), ob(be, int64_t(rows) * q_dim);
  ob.poison();
  be.attention_batch(qb.b, kb.b, vb.b, c.qk_norm ? &qn.t : nullptr, c.qk_norm ? &kn.t : nullptr, c.nw,
                     1e-6, c.H, c.Hkv, c.Dh, c.rope ? &rope : nullptr, kp.b, vp.b, seqs, c.window,
                     c.scores, ob.b);
  return ob.read();
}

class AttentionBatch : public OpTest {};

TEST_P(AttentionBatch, MatchesRefAndEachSequenceAlone) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 4100;
  for (const Case& c : kCases) {
    seed += 100;
    const DType ct = tier.compute;
    const Inputs in = make_inputs(c, seed, ct);
    auto qn = make_tensor("q_norm", {c.Dh}, values(c.Dh, seed + 5, 0.3, DType::F32), DType::F32);
    auto kn = make_tensor("k_norm", {c.Dh}, values(c.Dh, seed + 6, 0.3, DType::F32), DType::F32);
    std::vector<int> all;
    std::string what = strformat("H=%d Hkv=%d Dh=%d window=%d%s%s scale %g softcap %g seqs", c.H,
                                 c.Hkv, c.Dh, c.window, c.qk_norm ? " qk_norm" : "",
                                 c.rope ? "" : " nope", c.scores.scale, c.scores.softcap);
    int keys = 0;
    for (size_t i = 0; i < c.seqs.size(); ++i) {
      all.push_back(int(i));
      what += strformat(" %d@%d", c.seqs[i].T, c.seqs[i].pos0);
      keys = std::max(keys, c.seqs[i].pos0 + c.seqs[i].T);
    }
    if (c.window > 0) keys = std::min(keys, c.window);
    const std::vector<double> got = run(*be, c, in, all, *qn, *kn);
    const std::vector<double> want = run(*ref, c, in, all, *qn, *kn);
    // q/k normalised and rotated (rounded twice), then the attention over the keys.
    check_close("attention_batch", tier, what, seed, got, want,
                nmse_bound(ct, ct, c.Dh + keys, 18, 2));
    // Each sequence alone: its rows of the batch, bit for bit.
    const int q_dim = c.H * c.Dh;
    for (int i = 0, r = 0; i < int(c.seqs.size()); r += c.seqs[size_t(i)].T, ++i) {
      const std::vector<double> alone = run(*be, c, in, {i}, *qn, *kn);
      const std::vector<double> in_batch(got.begin() + int64_t(r) * q_dim,
                                         got.begin() + int64_t(r + c.seqs[size_t(i)].T) * q_dim);
      check_exact("attention_batch.alone", tier, what + strformat(" seq %d", i), seed, alone,
                  in_batch);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, AttentionBatch, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
