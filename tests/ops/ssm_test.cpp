// The Mamba2 ops (backend.h): ssm_conv (causal depthwise conv1d with its rolling state, then
// SiLU), ssm_scan (the selective scan from a given state), rmsnorm_gated (y * silu(z), RMS per
// group) and relu2. ref against the definitions worked out here one element at a time; T
// tokens in one call equal to T one-token calls bit for bit on ref (the decode step is the scan
// with T = 1); every tier against ref on the hybrids' shapes and odd ones, outputs and final
// states. ssm_scan's cases cover the chunked form cpu and cuda run for T > 1: T below, at and
// across the chunk, a chunk of 1, a prefill continued by steps.
#include <cmath>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// --- ssm_conv ----------------------------------------------------------------------------

struct ConvCase {
  int T, C, K;
};
// tiny-granite-h's conv (C = 128 + 2*2*16 = 192, K = 4), one token, odd widths, K = 1 and 2;
// a prefill over several of cuda's 16-token tiles and channel blocks, and a window longer than
// a tile (K - 1 = 69 tokens read the state).
const ConvCase kConv[] = {{1, 192, 4}, {7, 192, 4}, {3, 33, 2},   {20, 5, 4},
                          {2, 7, 1},   {1, 1, 3},   {150, 300, 4}, {75, 9, 70}};

struct ConvIn {
  std::vector<double> x, state, w, b;
  std::unique_ptr<HostTensor> wt, bt;
};
ConvIn conv_inputs(const ConvCase& c, uint64_t seed, DType compute) {
  ConvIn in;
  in.x = values(int64_t(c.T) * c.C, seed, 1.0, compute);
  in.state = values(int64_t(c.K - 1) * c.C, seed + 1, 1.0, compute);
  in.w = values(int64_t(c.C) * c.K, seed + 2, 0.5, DType::BF16);
  in.b = values(c.C, seed + 3, 0.2, DType::BF16);
  in.wt = make_tensor("conv1d.weight", {c.C, 1, c.K}, in.w, DType::BF16);
  in.bt = make_tensor("conv1d.bias", {c.C}, in.b, DType::BF16);
  return in;
}

TEST(SsmConvRef, MatchesTheDefinitionAndStepsEqualOneCall) {
  auto ref = make_ref_backend();
  uint64_t seed = 4100;
  for (const ConvCase& c : kConv) {
    ConvIn in = conv_inputs(c, ++seed, DType::F64);
    const int T = c.T, C = c.C, K = c.K;
    // seq = [state; x]; out[t, ch] = silu(sum_k w[ch, k] seq[t + k, ch] + b[ch]).
    std::vector<double> seq = in.state;
    seq.insert(seq.end(), in.x.begin(), in.x.end());
    std::vector<double> want(size_t(T) * C), want_state(size_t(K - 1) * C);
    for (int t = 0; t < T; ++t)
      for (int ch = 0; ch < C; ++ch) {
        double a = 0;
        for (int k = 0; k < K; ++k) a += in.w[size_t(ch) * K + k] * seq[size_t(t + k) * C + ch];
        want[size_t(t) * C + ch] = silu(a + in.b[size_t(ch)]);
      }
    for (int r = 0; r < K - 1; ++r)
      for (int ch = 0; ch < C; ++ch) want_state[size_t(r) * C + ch] = seq[size_t(T + r) * C + ch];
    Buf xb(*ref, in.x), st(*ref, in.state), ob(*ref, int64_t(T) * C);
    ref->ssm_conv(xb.b, in.wt->t, &in.bt->t, T, C, K, st.b, ob.b);
    const std::string what = strformat("T=%d C=%d K=%d", T, C, K);
    const std::vector<double> got = ob.read();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-14 * (1 + std::fabs(want[i]))) << what << " i=" << i;
    EXPECT_EQ(st.read(), want_state) << what;
    // The same tokens one call each: the rolling state carries the window, bit for bit.
    Buf st1(*ref, in.state), one(*ref, C), xt(*ref, C);
    for (int t = 0; t < T; ++t) {
      xt.be->write(xt.b, 0, C, in.x.data() + size_t(t) * C);
      ref->ssm_conv(xt.b, in.wt->t, &in.bt->t, 1, C, K, st1.b, one.b);
      const std::vector<double> row = one.read();
      EXPECT_TRUE(std::equal(row.begin(), row.end(), got.begin() + int64_t(t) * C))
          << what << " t=" << t;
    }
    EXPECT_EQ(st1.read(), st.read()) << what;
  }
}

class SsmConv : public OpTest {};

TEST_P(SsmConv, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 4200;
  for (const ConvCase& c : kConv) {
    ConvIn in = conv_inputs(c, ++seed, tier.compute);
    const std::string what = strformat("T=%d C=%d K=%d", c.T, c.C, c.K);
    Buf xb(*be, in.x), st(*be, in.state), ob(*be, int64_t(c.T) * c.C);
    Buf xr(*ref, in.x), sr(*ref, in.state), want(*ref, int64_t(c.T) * c.C);
    ob.poison();
    be->ssm_conv(xb.b, in.wt->t, &in.bt->t, c.T, c.C, c.K, st.b, ob.b);
    ref->ssm_conv(xr.b, in.wt->t, &in.bt->t, c.T, c.C, c.K, sr.b, want.b);
    // K products summed, a bias, an exp and a division.
    check_close("ssm_conv", tier, what, seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, c.K + 1, 6));
    if (c.K > 1) check_exact("ssm_conv", tier, what + " state", seed, st.read(), sr.read());
  }
}

// The decode step is the op with T = 1: T such calls leave the outputs and the state of one
// call of T tokens, bit for bit, on every tier (the state carries the window exactly).
void expect_one_token_calls_equal_one_call(Backend& be, const OpTier& tier, const ConvCase& c) {
  ConvIn in = conv_inputs(c, 4250, tier.compute);
  const std::string what = strformat("T=%d C=%d K=%d", c.T, c.C, c.K);
  Buf xb(be, in.x), st(be, in.state), ob(be, int64_t(c.T) * c.C);
  be.ssm_conv(xb.b, in.wt->t, &in.bt->t, c.T, c.C, c.K, st.b, ob.b);
  const std::vector<double> all = ob.read();
  Buf st1(be, in.state), xt(be, c.C), one(be, c.C);
  for (int t = 0; t < c.T; ++t) {
    xt.be->write(xt.b, 0, c.C, in.x.data() + size_t(t) * c.C);
    be.ssm_conv(xt.b, in.wt->t, &in.bt->t, 1, c.C, c.K, st1.b, one.b);
    check_exact("ssm_conv", tier, strformat("%s token %d", what.c_str(), t), 4250, one.read(),
                std::vector<double>(all.begin() + int64_t(t) * c.C,
                                    all.begin() + int64_t(t + 1) * c.C));
  }
  check_exact("ssm_conv", tier, what + " state", 4250, st1.read(), st.read());
}

TEST_P(SsmConv, OneTokenCallsGiveOneCallsBits) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  for (const ConvCase& c : {kConv[1], kConv[6]})
    expect_one_token_calls_equal_one_call(*be, tier, c);
}

INSTANTIATE_TEST_SUITE_P(Tiers, SsmConv, testing::ValuesIn(op_tiers()), op_tier_name);

// --- ssm_scan ----------------------------------------------------------------------------

struct ScanCase {
  int T, nh, hd, G, N;
  double dt_min, dt_max;
  int chunk;  // HF chunk_size: the chunked form's (T > 1 on cpu and cuda)
};
const double kInf = INFINITY;
// tiny-granite-h's mixer (8 heads x 16, 2 groups, d_state 16, chunk 16): the decode step, T
// below the chunk, at it, 3 chunks + 5, and across chunks of 4; granite-4.0-h's head and state
// sizes (64, 128; one group); one group, a group per head, a clamped dt, odd sizes, a chunk of
// 1 (every token its own chunk) and N = 256 (the cuda tier's largest); granite-4.0-h's chunk
// (256) and Nemotron-H's (128) with T past it, rows of 80 (two of cuda's 64-row passes).
const ScanCase kScan[] = {
    {1, 8, 16, 2, 16, 0, kInf, 16},      {7, 8, 16, 2, 16, 0, kInf, 16},
    {16, 8, 16, 2, 16, 0, kInf, 16},     {53, 8, 16, 2, 16, 0, kInf, 16},
    {13, 8, 16, 2, 16, 0, kInf, 4},      {40, 2, 64, 1, 128, 0, kInf, 16},
    {5, 4, 3, 1, 5, 0, kInf, 5},         {9, 6, 8, 6, 7, 0.05, 0.4, 4},
    {2, 3, 1, 3, 1, 0, kInf, 1},         {33, 2, 4, 2, 16, 0.001, 2, 8},
    {12, 2, 3, 1, 256, 0, kInf, 5},      {300, 2, 64, 1, 128, 0, kInf, 256},
    {150, 4, 80, 2, 40, 0, kInf, 128}};

struct ScanIn {
  std::vector<double> xbc, dt, state, a_log, d, dt_bias;
  std::unique_ptr<HostTensor> A, D, B;
};
ScanIn scan_inputs(const ScanCase& c, uint64_t seed, DType compute) {
  ScanIn in;
  const int64_t width = int64_t(c.nh) * c.hd + 2 * int64_t(c.G) * c.N;
  in.xbc = values(c.T * width, seed, 1.0, compute);
  in.dt = values(int64_t(c.T) * c.nh, seed + 1, 2.0, compute);
  in.dt[0] = 25;  // softplus's linear branch
  in.state = values(int64_t(c.nh) * c.hd * c.N, seed + 2, 1.0, compute);
  in.a_log = values(c.nh, seed + 3, 1.0, DType::BF16);
  in.d = values(c.nh, seed + 4, 1.0, DType::BF16);
  in.dt_bias = values(c.nh, seed + 5, 1.0, DType::BF16);
  in.A = make_tensor("A_log", {c.nh}, in.a_log, DType::BF16);
  in.D = make_tensor("D", {c.nh}, in.d, DType::BF16);
  in.B = make_tensor("dt_bias", {c.nh}, in.dt_bias, DType::BF16);
  return in;
}

std::string scan_what(const ScanCase& c) {
  return strformat("T=%d nh=%d hd=%d G=%d N=%d chunk=%d dt in [%g, %g]", c.T, c.nh, c.hd, c.G,
                   c.N, c.chunk, c.dt_min, c.dt_max);
}

// The recurrence: each output sums N state terms and each state carries T steps of a
// multiply-add (decays below 1: earlier roundings fade). The chunked form (T > 1) adds, per
// output and per state, a chunk's Q terms, each with a sum of up to Q log-decays inside its
// exp. dt and the decays take an exp, a log1p, an exp.
double scan_bound(const OpTier& tier, const ScanCase& c, int T) {
  const int Q = std::min(c.chunk, T);
  return nmse_bound(tier.compute, tier.compute, c.N + T + (T > 1 ? 2 * Q : 0), 12);
}

TEST(SsmScanRef, MatchesTheDefinitionAndStepsEqualOneCall) {
  auto ref = make_ref_backend();
  uint64_t seed = 4300;
  for (const ScanCase& c : kScan) {
    ScanIn in = scan_inputs(c, ++seed, DType::F64);
    const int I = c.nh * c.hd, width = I + 2 * c.G * c.N;
    std::vector<double> h = in.state, want(size_t(c.T) * I);
    for (int t = 0; t < c.T; ++t)
      for (int hh = 0; hh < c.nh; ++hh) {
        const int g = hh / (c.nh / c.G);
        const double v = in.dt[size_t(t) * c.nh + hh] + in.dt_bias[size_t(hh)];
        const double dt = std::clamp(v > 20 ? v : std::log(1 + std::exp(v)), c.dt_min, c.dt_max);
        const double A = -std::exp(in.a_log[size_t(hh)]);
        for (int p = 0; p < c.hd; ++p) {
          const double x = in.xbc[size_t(t) * width + size_t(hh) * c.hd + p];
          double y = in.d[size_t(hh)] * x;
          for (int n = 0; n < c.N; ++n) {
            const double B = in.xbc[size_t(t) * width + I + size_t(g) * c.N + n];
            const double C = in.xbc[size_t(t) * width + I + size_t(c.G + g) * c.N + n];
            double& s = h[(size_t(hh) * c.hd + p) * c.N + n];
            s = std::exp(dt * A) * s + dt * B * x;
            y += s * C;
          }
          want[size_t(t) * I + size_t(hh) * c.hd + p] = y;
        }
      }
    Buf xb(*ref, in.xbc), db(*ref, in.dt), st(*ref, in.state), yb(*ref, int64_t(c.T) * I);
    ref->ssm_scan(xb.b, db.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, c.T, c.nh, c.hd, c.G,
                  c.N, c.chunk, st.b, yb.b);
    const std::string what = scan_what(c);
    const std::vector<double> got = yb.read(), got_state = st.read();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << what << " i=" << i;
    for (size_t i = 0; i < h.size(); ++i)
      ASSERT_NEAR(got_state[i], h[i], 1e-12 * (1 + std::fabs(h[i]))) << what << " state " << i;
    // Token by token (the decode step): the same bits.
    Buf st1(*ref, in.state), x1(*ref, width), d1(*ref, c.nh), y1(*ref, I);
    for (int t = 0; t < c.T; ++t) {
      x1.be->write(x1.b, 0, width, in.xbc.data() + size_t(t) * width);
      d1.be->write(d1.b, 0, c.nh, in.dt.data() + size_t(t) * c.nh);
      ref->ssm_scan(x1.b, d1.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, 1, c.nh, c.hd,
                    c.G, c.N, c.chunk, st1.b, y1.b);
      const std::vector<double> row = y1.read();
      EXPECT_TRUE(std::equal(row.begin(), row.end(), got.begin() + int64_t(t) * I))
          << what << " t=" << t;
    }
    EXPECT_EQ(st1.read(), got_state) << what;
  }
}

class SsmScan : public OpTest {};

TEST_P(SsmScan, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 4400;
  for (const ScanCase& c : kScan) {
    ScanIn in = scan_inputs(c, ++seed, tier.compute);
    const int64_t I = int64_t(c.nh) * c.hd;
    // The state in the logits type, as the hybrid model keeps it (f32 on cuda).
    Buf xb(*be, in.xbc), db(*be, in.dt), st(*be, in.state, true), yb(*be, c.T * I);
    Buf xr(*ref, in.xbc), dr(*ref, in.dt), sr(*ref, in.state), want(*ref, c.T * I);
    yb.poison();
    be->stats().reset();
    be->ssm_scan(xb.b, db.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, c.T, c.nh, c.hd, c.G,
                 c.N, c.chunk, st.b, yb.b);
    ref->ssm_scan(xr.b, dr.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, c.T, c.nh, c.hd, c.G,
                  c.N, c.chunk, sr.b, want.b);
    const double bound = scan_bound(tier, c, c.T);
    const std::string what = scan_what(c);
    check_close("ssm_scan", tier, what, seed, yb.read(), want.read(), bound);
    // The final state too: decode continues from it.
    check_close("ssm_scan", tier, what + " state", seed, st.read(), sr.read(), bound);
    // A prefill takes the chunked form, the decode step the recurrence.
    const auto& provs = be->stats().calls().at("ssm_scan");
    ASSERT_EQ(provs.size(), 1u) << what;
    EXPECT_EQ(provs.begin()->first.find("ssm_scan_chunked") != std::string::npos, c.T > 1)
        << what << ": " << provs.begin()->first;
  }
}

// Decode continues from the state a prefill leaves: a chunked prefill of N tokens, then m
// one-token steps, gives the outputs and state of one prefill of N + m tokens, within the
// bound of the longer scan, on every tier. N = 2 chunks + 5, so the prefill ends inside a
// chunk.
TEST_P(SsmScan, PrefillThenStepsMatchOneLongerPrefill) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  const ScanCase c = kScan[3];  // tiny-granite-h's mixer, 53 tokens, chunks of 16
  const int n = 2 * c.chunk + 5, m = c.T - n;
  ScanIn in = scan_inputs(c, 4450, tier.compute);
  const int64_t I = int64_t(c.nh) * c.hd, width = I + 2 * int64_t(c.G) * c.N;
  Buf xb(*be, in.xbc), db(*be, in.dt), st(*be, in.state, true), yb(*be, c.T * I);
  be->ssm_scan(xb.b, db.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, c.T, c.nh, c.hd, c.G,
               c.N, c.chunk, st.b, yb.b);
  const std::vector<double> all = yb.read();
  const std::vector<double> x(in.xbc.begin(), in.xbc.begin() + n * width);
  const std::vector<double> dt(in.dt.begin(), in.dt.begin() + int64_t(n) * c.nh);
  Buf xn(*be, x), dn(*be, dt), st1(*be, in.state, true), yn(*be, n * I);
  be->ssm_scan(xn.b, dn.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, n, c.nh, c.hd, c.G,
               c.N, c.chunk, st1.b, yn.b);
  std::vector<double> got = yn.read();
  Buf x1(*be, width), d1(*be, c.nh), y1(*be, I);
  for (int t = n; t < n + m; ++t) {
    x1.be->write(x1.b, 0, width, in.xbc.data() + size_t(t) * width);
    d1.be->write(d1.b, 0, c.nh, in.dt.data() + size_t(t) * c.nh);
    be->ssm_scan(x1.b, d1.b, in.A->t, in.D->t, in.B->t, c.dt_min, c.dt_max, 1, c.nh, c.hd, c.G,
                 c.N, c.chunk, st1.b, y1.b);
    const std::vector<double> row = y1.read();
    got.insert(got.end(), row.begin(), row.end());
  }
  const double bound = scan_bound(tier, c, c.T);
  const std::string what = strformat("prefill %d then %d steps", n, m);
  check_close("ssm_scan", tier, what, 4450, got, all, bound);
  check_close("ssm_scan", tier, what + " state", 4450, st1.read(), st.read(), bound);
}

INSTANTIATE_TEST_SUITE_P(Tiers, SsmScan, testing::ValuesIn(op_tiers()), op_tier_name);

// --- rmsnorm_gated, relu2 ----------------------------------------------------------------

struct NormCase {
  int R, W, group;
};
// Granite normalises the full width (128), Nemotron-H per group (64 of 128).
const NormCase kNorm[] = {{3, 128, 128}, {3, 128, 64}, {1, 12, 4}, {5, 33, 11}, {2, 1, 1}};

TEST(RmsnormGatedRef, MatchesTheDefinitionPerGroup) {
  auto ref = make_ref_backend();
  uint64_t seed = 4500;
  for (const NormCase& c : kNorm) {
    ++seed;
    const int64_t n = int64_t(c.R) * c.W;
    const std::vector<double> y = values(n, seed, 1.0, DType::F64);
    const std::vector<double> z = values(n, seed + 1, 2.0, DType::F64);
    const std::vector<double> wv = values(c.W, seed + 2, 1.0, DType::BF16);
    auto w = make_tensor("norm", {c.W}, wv, DType::BF16);
    std::vector<double> want(static_cast<size_t>(n));
    for (int r = 0; r < c.R; ++r)
      for (int g = 0; g < c.W / c.group; ++g) {
        double ss = 0;
        for (int i = 0; i < c.group; ++i) {
          const size_t k = size_t(r) * c.W + size_t(g) * c.group + i;
          ss += std::pow(y[k] * silu(z[k]), 2);
        }
        const double rms = std::sqrt(ss / c.group + 1e-5);
        for (int i = 0; i < c.group; ++i) {
          const size_t k = size_t(r) * c.W + size_t(g) * c.group + i;
          want[k] = wv[size_t(g) * c.group + i] * y[k] * silu(z[k]) / rms;
        }
      }
    Buf yb(*ref, y), zb(*ref, z), ob(*ref, n);
    ref->rmsnorm_gated(yb.b, zb.b, w->t, c.R, c.W, c.group, 1e-5, ob.b);
    const std::vector<double> got = ob.read();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-13 * (1 + std::fabs(want[i])))
          << strformat("R=%d W=%d group=%d i=%zu", c.R, c.W, c.group, i);
  }
}

class RmsnormGated : public OpTest {};

TEST_P(RmsnormGated, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 4600;
  for (const NormCase& c : kNorm) {
    ++seed;
    const int64_t n = int64_t(c.R) * c.W;
    const std::vector<double> y = values(n, seed, 1.0, tier.compute);
    const std::vector<double> z = values(n, seed + 1, 2.0, tier.compute);
    auto w = make_tensor("norm", {c.W}, values(c.W, seed + 2, 1.0, DType::BF16), DType::BF16);
    Buf yb(*be, y), zb(*be, z), ob(*be, n), yr(*ref, y), zr(*ref, z), want(*ref, n);
    ob.poison();
    const std::string what = strformat("R=%d W=%d group=%d", c.R, c.W, c.group);
    be->rmsnorm_gated(yb.b, zb.b, w->t, c.R, c.W, c.group, 1e-5, ob.b);
    ref->rmsnorm_gated(yr.b, zr.b, w->t, c.R, c.W, c.group, 1e-5, want.b);
    check_close("rmsnorm_gated", tier, what, seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, c.group, 8));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, RmsnormGated, testing::ValuesIn(op_tiers()), op_tier_name);

class Relu2 : public OpTest {};

TEST_P(Relu2, MatchesTheDefinition) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(40000)}) {
    const std::vector<double> x = values(n, 4700 + uint64_t(n), 2.0, tier.compute);
    Buf xb(*be, x), ob(*be, n);
    ob.poison();
    be->relu2(xb.b, n, ob.b);
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[size_t(i)];
      want[size_t(i)] = v > 0 ? v * v : 0.0;
    }
    // One product rounded to the tier's type.
    check_close("relu2", tier, strformat("n=%lld", (long long)n), 4700, ob.read(), want,
                nmse_bound(tier.compute, tier.compute, 0, 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Relu2, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
