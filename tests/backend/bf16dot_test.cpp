// The cpu tier's bf16 dot kernels (gemv_bf16_dot in backend/cpu/gemv.cpp, gemm_bf16_dot in
// gemm.cpp): x's rounding to bf16 against its definition, both kernels against the f64 dot of
// the bf16 weights and the rounded x within the f32 chain's bound, the GEMM's bits independent
// of T and of the thread count, the rounding measure drift and opcheck use, and the tier's
// choice of the kernels (provider, the trace header's act_quant).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/backend.h"
#include "core/thread_pool.h"
#include "tier_util.h"

namespace arbiter::test {
namespace {

using cpu::Isa;

constexpr double kU = 1.0 / (1 << 24);

#define SKIP_WITHOUT_BF16_DOT()                                                               \
  if (!cpu::bf16_dot(Isa::Avx512))                                                            \
  GTEST_SKIP() << "SKIP: this build or CPU has no AVX512-BF16, so no bf16 dot kernels"

uint16_t round1(float x) {
  uint16_t h;
  cpu::round_act_bf16(&x, 1, &h);
  return h;
}

TEST(Bf16Dot, RoundsToNearestEvenAndFlushesBelowTheSmallestNormal) {
  EXPECT_EQ(round1(1.f), 0x3f80);
  EXPECT_EQ(round1(-2.5f), 0xc020);
  EXPECT_EQ(round1(1.f + std::ldexp(1.f, -8)), 0x3f80) << "a tie goes to the even 1.0";
  EXPECT_EQ(round1(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82) << "a tie goes to the even 1 + 2^-6";
  EXPECT_EQ(round1(1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20)), 0x3f81) << "past the tie";
  EXPECT_EQ(round1(std::ldexp(1.f, -126)), 0x0080) << "the smallest normal stays";
  EXPECT_EQ(round1(std::ldexp(1.f - std::ldexp(1.f, -10), -126)), 0x0080)
      << "a value that rounds up to the smallest normal is not flushed";
  EXPECT_EQ(round1(std::ldexp(1.f, -130)), 0x0000);
  EXPECT_EQ(round1(-std::ldexp(1.f, -130)), 0x8000) << "the flushed zero keeps its sign";
  EXPECT_EQ(round1(INFINITY), 0x7f80);
  EXPECT_EQ(round1(3.4028235e38f), 0x7f80) << "f32's largest rounds to infinity";
  EXPECT_TRUE(std::isnan(bf16_to_f32(round1(NAN))));
}

// x with magnitudes over 2^-3..2^3, so the rounding errors differ from term to term.
std::vector<float> activations(int64_t n, uint64_t seed) {
  const std::vector<double> v = values(n, seed, 1.0, DType::F32);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(v[size_t(i)]) * std::ldexp(1.f, int(i % 7) - 3);
  return x;
}

// Every kernel output y of a dot of K products: |y - exact| <= (K + 8) u sum |w x|, exact the
// f64 dot of the bf16 weights and the rounded x. Each product of two bf16 values is exact in
// f32; vdpbf16ps adds the two of a pair one after the other (K roundings per chain at most),
// and the lane folds add a few more.
TEST(Bf16Dot, KernelsMatchTheDotOfTheRoundedInputsWithinTheChainBound) {
  SKIP_WITHOUT_BF16_DOT();
  ThreadPool pool(2);
  uint64_t seed = 7100;
  for (int64_t K : {2, 30, 32, 64, 66, 520, 1024, 2050})
    for (int64_t N : {1, 13, 40})
      for (int64_t T : {1, 5, 33, 50, 70}) {
        ++seed;
        auto W = make_tensor("w", {N, K}, values(N * K, seed, 0.05, DType::F32), DType::BF16);
        const std::vector<float> x = activations(T * K, seed + 1);
        const std::vector<double> bias = values(N, seed + 2, 0.5, DType::F32);
        std::vector<float> biasf(bias.begin(), bias.end());
        std::vector<uint16_t> xb(static_cast<size_t>(T * K));
        cpu::round_act_bf16(x.data(), T * K, xb.data());
        std::vector<float> gemm_out(size_t(T * N)), gemv_out(static_cast<size_t>(N));
        cpu::GemmProblem p;
        p.W = W->t.data;
        p.wtype = DType::BF16;
        p.bias = biasf.data();
        p.out = gemm_out.data();
        p.T = T;
        p.N = N;
        p.K = K;
        cpu::gemm_bf16_dot(xb.data(), p, pool);
        const auto* w = static_cast<const uint16_t*>(W->t.data);
        for (int64_t t = 0; t < T; ++t) {
          cpu::gemv_bf16_dot(W->t.data, K, xb.data() + t * K, gemv_out.data(), 0, N);
          for (int64_t n = 0; n < N; ++n) {
            double exact = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double term = double(bf16_to_f32(w[n * K + k])) * double(bf16_to_f32(xb[size_t(t * K + k)]));
              exact += term;
              mag += std::fabs(term);
            }
            const double bound = double(K + 8) * kU * mag;
            const std::string at = "K " + std::to_string(K) + " N " + std::to_string(N) + " T " +
                                   std::to_string(T) + " token " + std::to_string(t) + " row " + std::to_string(n);
            EXPECT_LE(std::fabs(gemv_out[size_t(n)] - exact), bound) << "gemv " << at;
            EXPECT_LE(std::fabs(gemm_out[size_t(t * N + n)] - (exact + bias[size_t(n)])),
                      bound + kU * std::fabs(exact + bias[size_t(n)]))
                << "gemm " << at;
          }
        }
      }
}

// kernels.h: one out element's bits depend neither on T nor on the thread count (K 520: two
// whole k-blocks and a partial one; T 70: two full token tiles and a partial one).
TEST(Bf16Dot, GemmBitsIndependentOfTAndThreads) {
  SKIP_WITHOUT_BF16_DOT();
  const int64_t T = 70, N = 29, K = 520;
  auto W = make_tensor("w", {N, K}, values(N * K, 7200, 0.05, DType::F32), DType::BF16);
  const std::vector<float> x = activations(T * K, 7201);
  std::vector<uint16_t> xb(static_cast<size_t>(T * K));
  cpu::round_act_bf16(x.data(), T * K, xb.data());
  auto run = [&](int threads, int64_t t0, int64_t Tn) {
    ThreadPool pool(threads);
    std::vector<float> out(size_t(Tn * N));
    cpu::GemmProblem p;
    p.W = W->t.data;
    p.wtype = DType::BF16;
    p.out = out.data();
    p.T = Tn;
    p.N = N;
    p.K = K;
    cpu::gemm_bf16_dot(xb.data() + t0 * K, p, pool);
    return out;
  };
  const std::vector<float> all2 = run(2, 0, T), all1 = run(1, 0, T);
  EXPECT_EQ(0, std::memcmp(all1.data(), all2.data(), all1.size() * sizeof(float))) << "1 vs 2 threads";
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> one = run(2, t, 1);
    EXPECT_EQ(0, std::memcmp(one.data(), all2.data() + t * N, size_t(N) * sizeof(float))) << "token " << t;
  }
}

// act_bf16_rounding is sum_k (w_k (x_k - xb_k))^2, and it bounds what the rounding moved the
// exact dot: |dot(w, x) - dot(w, xb)| <= sqrt(K sum (w_k e_k)^2) (Cauchy-Schwarz).
TEST(Bf16Dot, RoundingMeasureIsTheSquaredErrorOfX) {
  const int64_t N = 9, K = 96;
  auto W = make_tensor("w", {N, K}, values(N * K, 7300, 0.05, DType::F32), DType::BF16);
  const std::vector<float> x = activations(K, 7301);
  std::vector<uint16_t> xb(static_cast<size_t>(K));
  cpu::round_act_bf16(x.data(), K, xb.data());
  std::vector<double> got(static_cast<size_t>(N - 2));
  cpu::act_bf16_rounding(W->t.data, K, x.data(), xb.data(), got.data(), 2, N);
  const auto* w = static_cast<const uint16_t*>(W->t.data);
  for (int64_t n = 2; n < N; ++n) {
    double want = 0, moved = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double wk = bf16_to_f32(w[n * K + k]), e = double(x[size_t(k)]) - bf16_to_f32(xb[size_t(k)]);
      want += (wk * e) * (wk * e);
      moved += wk * e;
    }
    EXPECT_GT(want, 0) << "row " << n;
    EXPECT_NEAR(got[size_t(n - 2)], want, 1e-12 * want) << "row " << n;
    EXPECT_LE(std::fabs(moved), std::sqrt(double(K) * got[size_t(n - 2)])) << "row " << n;
  }
}

// The tier: with CpuOptions::bf16_dot a matmul of bf16 weights rounds x to bf16 and runs the
// dot kernels (providers cpu.gemv_bf16_bf16_avx512 and cpu.gemm_bf16_bf16_avx512, stats'
// act_quant "bf16" for the trace header), bit for bit the kernels' own output; off (the
// default), the f32 GEMV of the widened weights, bit for bit. An odd K keeps the f32 path.
TEST(Bf16Dot, TierRoundsXOnlyWhenAsked) {
  SKIP_WITHOUT_BF16_DOT();
  const int64_t N = 24, K = 256;
  auto w = make_tensor("w", {N, K}, values(N * K, 7400, 0.05, DType::F32), DType::BF16);
  auto odd = make_tensor("odd", {N, 33}, values(N * 33, 7401, 0.05, DType::F32), DType::BF16);
  const std::vector<double> xd = values(3 * K, 7402, 1.0, DType::F32);
  std::vector<float> xf(xd.begin(), xd.end());
  EXPECT_FALSE(cpu::CpuOptions{}.bf16_dot) << "the exact f32 path is the default";
  for (bool on : {true, false}) {
    cpu::CpuOptions o;
    o.threads = 2;
    o.isa = Isa::Avx512;
    o.bf16_dot = on;
    auto be = cpu::make_cpu_backend(o);
    Buf x(*be, xd), out(*be, 3 * N);
    const std::string form = on ? "_bf16" : "";
    be->matmul(x.b, w->t, nullptr, 3, out.b);
    EXPECT_EQ(be->stats().calls().at("matmul").count("cpu.gemm_bf16" + form + "_avx512"), 1u) << on;
    EXPECT_EQ(be->stats().act_quant(), on ? "bf16" : "");
    be->stats().reset();
    be->matmul(x.b, w->t, nullptr, 1, out.b);
    EXPECT_EQ(be->stats().calls().at("matmul").count("cpu.gemv_bf16" + form + "_avx512"), 1u) << on;
    EXPECT_EQ(be->stats().act_quant(), on ? "bf16" : "");
    const std::vector<double> got = out.read();
    std::vector<float> want(static_cast<size_t>(N));
    if (on) {
      std::vector<uint16_t> xb(static_cast<size_t>(K));
      cpu::round_act_bf16(xf.data(), K, xb.data());
      cpu::gemv_bf16_dot(w->t.data, K, xb.data(), want.data(), 0, N);
    } else {
      cpu::gemv_kernel(Isa::Avx512, DType::BF16)(w->t.data, K, xf.data(), want.data(), 0, N);
    }
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(got[size_t(n)], double(want[size_t(n)])) << "row " << n;
    be->stats().reset();
    be->matmul(x.b, odd->t, nullptr, 1, out.b);
    EXPECT_EQ(be->stats().calls().at("matmul").count("cpu.gemv_bf16_avx512"), 1u) << "odd K";
    EXPECT_EQ(be->stats().act_quant(), "") << "odd K";
  }
}

// rmsnorm_matmul's projections at T == 1 (Backend::matmuls): bf16 targets share one rounding
// of x and one parallel region; a target in another x form (f32 weights) makes the tier run
// them one at a time. Either way every output has the bits of one matmul at a time.
TEST(Bf16Dot, GroupedMatmulsEqualOneAtATime) {
  SKIP_WITHOUT_BF16_DOT();
  cpu::CpuOptions o;
  o.threads = 2;
  o.isa = Isa::Avx512;
  o.bf16_dot = true;
  auto be = cpu::make_cpu_backend(o);
  const int64_t K = 1024;
  const std::vector<int64_t> rows = {520, 37, 700};
  auto bias = make_tensor("bias", {rows[1]}, values(rows[1], 7500, 0.5, DType::F32), DType::F32);
  for (const std::vector<DType>& mix : {std::vector<DType>{DType::BF16, DType::BF16, DType::BF16},
                                        std::vector<DType>{DType::BF16, DType::F32, DType::BF16}}) {
    std::vector<std::unique_ptr<HostTensor>> W;
    for (size_t i = 0; i < rows.size(); ++i)
      W.push_back(make_tensor("W" + std::to_string(i), {rows[i], K},
                              values(rows[i] * K, 7510 + i, 0.05, DType::F32), mix[i]));
    std::vector<std::vector<double>> got[2];
    for (int one_by_one = 0; one_by_one < 2; ++one_by_one) {
      Buf xb(*be, values(K, 7501, 1.0, DType::F32));
      std::vector<std::unique_ptr<Buf>> out;
      std::vector<Backend::MatmulTarget> tg;
      for (size_t i = 0; i < W.size(); ++i) {
        out.push_back(std::make_unique<Buf>(*be, rows[i]));
        tg.push_back({&W[i]->t, i == 1 ? &bias->t : nullptr, &out.back()->b, nullptr});
      }
      if (one_by_one) be->Backend::matmuls(xb.b, 1, tg.data(), int(tg.size()));
      else be->matmuls(xb.b, 1, tg.data(), int(tg.size()));
      for (auto& b : out) got[one_by_one].push_back(b->read());
    }
    for (size_t i = 0; i < W.size(); ++i)
      EXPECT_EQ(got[0][i], got[1][i]) << "output " << i << " of " << dtype_name(mix[1]) << " mix";
    EXPECT_EQ(be->stats().act_quant(), "bf16");
    be->stats().reset();
  }
}

}  // namespace
}  // namespace arbiter::test
