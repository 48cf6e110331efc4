// qk_rope_attention (the decode step's q/k norm + RoPE + KV store + attention; fused into one
// kernel on cuda): against ref; against the tier's own composition (rmsnorm, rope, kv_store,
// attention) bit for bit in q and k (roped in place), both caches and the output; with stage
// taps on q_norm, k_norm, q_rope, k_rope and the output, whose records are the composition's
// and whose overwrite of k_rope is what both store in the cache and attend to. The caches
// hold random rows before the position and NaN after it; long caches split the keys. Gemma's
// form too: (1 + w) q/k norms, the score scale given, a softcap (Gemma 2).
#include <algorithm>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "backend/rope.h"

namespace arbiter::test {
namespace {

struct Case {
  int T, H, Hkv, Dh, pos, cap, window;
  bool qk_norm;
  RopeLayout layout;
  NormWeight nw = NormWeight::Plain;
  Backend::AttentionScores scores = {};
};
const Case kCases[] = {
    {1, 16, 8, 128, 700, 760, 0, true, RopeLayout::Half},       // qwen3-0.6B, several splits
    {1, 4, 2, 32, 5, 600, 0, true, RopeLayout::Half},           // tiny-qwen3
    {1, 32, 8, 64, 1500, 1600, 1024, false, RopeLayout::Half},  // llama-3.2-1B past its window
    {1, 8, 8, 64, 0, 64, 0, false, RopeLayout::Adjacent},       // first token
    {1, 16, 2, 256, 200, 300, 0, true, RopeLayout::Half},       // group of 8 at Dh 256
    {1, 8, 4, 16, 30, 40, 0, false, RopeLayout::Half},          // TinyStories-656K heads
    {3, 4, 2, 32, 10, 20, 0, true, RopeLayout::Half},           // T > 1: the composition
    // gemma3-1b's heads, sliding layer
    {1, 4, 1, 256, 600, 700, 512, true, RopeLayout::Half, NormWeight::OnePlus, {0.0625, 0}},
    {1, 8, 4, 16, 30, 40, 0, false, RopeLayout::Half, NormWeight::Plain, {0.25, 50}}};  // gemma2

struct Outcome {
  std::vector<std::vector<double>> bufs;  // q, k, k cache, v cache, out
  std::vector<std::vector<double>> records;
};

Outcome run(Backend& be, bool composed, const Case& c, const std::vector<double>& q,
        const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& kc,
        const std::vector<double>& vc, const HostTensor& qn, const HostTensor& kn,
        TapSet* taps) {
  RopeSpec rope;
  rope.dims = c.Dh;
  rope.theta = 1e6;
  rope.layout = c.layout;
  Buf qb(be, q), kb(be, k), vb(be, v), kcb(be, kc), vcb(be, vc), ob(be, q.size());
  ob.poison();
  Backend::AttentionTaps t;
  if (taps) {
    if (c.qk_norm) t.q_norm = (*taps)[0], t.k_norm = (*taps)[1];
    t.q_rope = (*taps)[2], t.k_rope = (*taps)[3], t.out = (*taps)[4];
  }
  const Tensor* qnp = c.qk_norm ? &qn.t : nullptr;
  const Tensor* knp = c.qk_norm ? &kn.t : nullptr;
  if (composed)
    be.Backend::qk_rope_attention(qb.b, kb.b, vb.b, qnp, knp, c.nw, 1e-6, c.T, c.H, c.Hkv, c.Dh,
                                  c.pos, rope, kcb.b, vcb.b, c.window, c.scores, ob.b, t);
  else
    be.qk_rope_attention(qb.b, kb.b, vb.b, qnp, knp, c.nw, 1e-6, c.T, c.H, c.Hkv, c.Dh, c.pos,
                         rope, kcb.b, vcb.b, c.window, c.scores, ob.b, t);
  Outcome r;
  r.bufs = {qb.read(), kb.read(), kcb.read(), vcb.read(), ob.read()};
  if (taps) r.records = taps->records;
  return r;
}

class QkRopeAttention : public OpTest {};

TEST_P(QkRopeAttention, MatchesRefAndItsComposition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 1600;
  const char* names[] = {"q", "k", "k cache", "v cache", "out"};
  for (const Case& c : kCases) {
    ++seed;
    const int kv_dim = c.Hkv * c.Dh;
    const DType ct = tier.compute;
    const std::vector<double> q = values(int64_t(c.T) * c.H * c.Dh, seed, 1.0, ct);
    const std::vector<double> k = values(int64_t(c.T) * kv_dim, seed + 1, 1.0, ct);
    const std::vector<double> v = values(int64_t(c.T) * kv_dim, seed + 2, 1.0, ct);
    std::vector<double> kc = values(int64_t(c.cap) * kv_dim, seed + 3, 1.0, ct);
    std::vector<double> vc = values(int64_t(c.cap) * kv_dim, seed + 4, 1.0, ct);
    std::vector<double> kc_ref = kc, vc_ref = vc;
    for (int64_t i = int64_t(c.pos) * kv_dim; i < int64_t(c.cap) * kv_dim; ++i) {
      kc[size_t(i)] = vc[size_t(i)] = std::nan("");
      kc_ref[size_t(i)] = vc_ref[size_t(i)] = 0;
    }
    auto qn = make_tensor("q_norm", {c.Dh}, values(c.Dh, seed + 5, 0.3, DType::F32), DType::F32);
    auto kn = make_tensor("k_norm", {c.Dh}, values(c.Dh, seed + 6, 0.3, DType::F32), DType::F32);
    std::string what = strformat("T=%d H=%d Hkv=%d Dh=%d pos=%d cap=%d window=%d%s", c.T,
                                       c.H, c.Hkv, c.Dh, c.pos, c.cap, c.window,
                                       c.qk_norm ? " qk_norm" : "");
    if (c.nw == NormWeight::OnePlus || c.scores.scale != 0)
      what += strformat(" gemma scale %g softcap %g", c.scores.scale, c.scores.softcap);
    const Outcome fused = run(*be, false, c, q, k, v, kc, vc, *qn, *kn, nullptr);
    const Outcome composed = run(*be, true, c, q, k, v, kc, vc, *qn, *kn, nullptr);
    for (int j = 0; j < 5; ++j)
      check_exact("qk_rope_attention.composed", tier, what + " " + names[j], seed, fused.bufs[size_t(j)],
                  composed.bufs[size_t(j)]);
    const Outcome want = run(*ref, false, c, q, k, v, kc_ref, vc_ref, *qn, *kn, nullptr);
    const int keys = c.window > 0 ? std::min(c.pos + c.T, c.window) : c.pos + c.T;
    // q/k normalised and rotated (rounded twice), then the attention over the keys.
    check_close("qk_rope_attention", tier, what, seed, fused.bufs[4], want.bufs[4],
                nmse_bound(ct, ct, c.Dh + keys, 18, 2));
    TapSet tf(5), tc(5);
    const Outcome rf = run(*be, false, c, q, k, v, kc, vc, *qn, *kn, &tf);
    const Outcome rc = run(*be, true, c, q, k, v, kc, vc, *qn, *kn, &tc);
    for (size_t i = c.qk_norm ? 0 : 2; i < 5; ++i)
      check_exact("qk_rope_attention.record", tier, what + " tap " + std::to_string(i), seed,
                  rf.records[i], rc.records[i]);
    const std::vector<double> other = values(int64_t(c.T) * kv_dim, seed + 7, 1.0, ct);
    TapSet of(5, {nullptr, nullptr, nullptr, &other}), oc(5, {nullptr, nullptr, nullptr, &other});
    const Outcome wf = run(*be, false, c, q, k, v, kc, vc, *qn, *kn, &of);
    const Outcome wc = run(*be, true, c, q, k, v, kc, vc, *qn, *kn, &oc);
    for (int j = 0; j < 5; ++j)
      check_exact("qk_rope_attention.overwrite", tier, what + " " + names[j], seed,
                  wf.bufs[size_t(j)], wc.bufs[size_t(j)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, QkRopeAttention, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
