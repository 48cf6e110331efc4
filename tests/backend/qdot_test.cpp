// The cpu tier's integer dot kernels (backend/cpu/qdot.cpp): the 8-bit activation quantizer
// against its stated rounding, and every format's kernel on every compiled ISA against the
// f64 dot of the exactly dequantized weights, within bounds derived below
// (docs/quantization.md). Adding a format: list it in kQdotTypes and in zero_codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <tuple>

#include "backend/cpu/kernels.h"
#include "core/quant.h"
#include "tier_util.h"

namespace arbiter::test {
namespace {

using cpu::ActQ8;
using cpu::Isa;

constexpr double kU = 1.0 / (1 << 24);
constexpr double kStepSlack = 1.0 / (1 << 15);  // kernels.h: |x - d q| <= d (1/2 + 2^-15)

constexpr DType kQdotTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};

// Activations with blocks of very different magnitudes, a block of zeros and exact ties
// (x / d = k + 1/2 is reachable only by chance; the magnitude spread is what matters).
std::vector<float> activations(int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) x[size_t(k)] = nd(rng) * std::ldexp(1.f, int((k / 32) % 7) - 3);
  for (int k = 32; k < 64 && k < K; ++k) x[size_t(k)] = 0.f;
  return x;
}

TEST(ActQ8, RoundsWithinHalfAStepPerBlock) {
  const int64_t K = 768;
  const std::vector<float> x = activations(K, 4100);
  for (int block : {32, 256}) {
    ActQ8 a;
    cpu::quantize_act_q8(x.data(), K, block, a);
    ASSERT_EQ(a.block, block);
    ASSERT_EQ(a.q.size(), size_t(K));
    for (int64_t b = 0; b < K / block; ++b) {
      float amax = 0;
      for (int64_t k = b * block; k < (b + 1) * block; ++k) amax = std::max(amax, std::fabs(x[size_t(k)]));
      const float d = a.d[size_t(b)];
      EXPECT_EQ(d, amax / 127.f) << "block " << b << " of " << block;
      for (int64_t k = b * block; k < (b + 1) * block; ++k) {
        const int q = a.q[size_t(k)];
        ASSERT_LE(std::abs(q), 127);
        ASSERT_LE(std::fabs(double(x[size_t(k)]) - double(d) * q), double(d) * (0.5 + kStepSlack))
            << "value " << k << " block " << block;
      }
    }
    for (int64_t s = 0; s < K / 16; ++s) {
      int t = 0;
      for (int i = 0; i < 16; ++i) t += a.q[size_t(s * 16 + i)];
      EXPECT_EQ(a.sums[size_t(s)], t) << "sum " << s;
    }
  }
  // A NaN or infinity poisons its block's scale only.
  std::vector<float> bad = x;
  bad[5] = NAN;
  bad[40] = INFINITY;
  ActQ8 a;
  cpu::quantize_act_q8(bad.data(), K, 32, a);
  EXPECT_TRUE(std::isnan(a.d[0]));
  EXPECT_TRUE(std::isnan(a.d[1]));
  EXPECT_FALSE(std::isnan(a.d[2]));
}

// Zeroes every quant code of a row of blocks, keeping the scales and mins: each value is then
// the format's value of code 0 (b of the kernel's a * u + b, or the table's code-0 value).
void zero_codes(DType t, uint8_t* row, int64_t nb) {
  const size_t bb = block_bytes(t);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = row + size_t(i) * bb;
    auto clear = [&](size_t off, size_t n) { std::memset(p + off, 0, n); };
    switch (t) {
      case DType::Q8_0: clear(offsetof(BlockQ8_0, qs), 32); break;
      case DType::Q4_0: clear(offsetof(BlockQ4_0, qs), 16); break;
      case DType::Q4_1: clear(offsetof(BlockQ4_1, qs), 16); break;
      case DType::Q5_0: clear(offsetof(BlockQ5_0, qh), 20); break;
      case DType::Q5_1: clear(offsetof(BlockQ5_1, qh), 20); break;
      case DType::Q2_K: clear(offsetof(BlockQ2_K, qs), 64); break;
      case DType::Q3_K: clear(offsetof(BlockQ3_K, hmask), 96); break;
      case DType::Q4_K: clear(offsetof(BlockQ4_K, qs), 128); break;
      case DType::Q5_K: clear(offsetof(BlockQ5_K, qh), 160); break;
      case DType::Q6_K: clear(offsetof(BlockQ6_K, ql), 192); break;
      case DType::IQ4_NL: clear(offsetof(BlockIQ4_NL, qs), 16); break;
      case DType::IQ4_XS: clear(offsetof(BlockIQ4_XS, qs), 128); break;
      case DType::MXFP4: clear(offsetof(BlockMXFP4, qs), 16); break;
      default: FAIL() << "no code layout for " << dtype_name(t);
    }
  }
}

// y, a kernel's dot of row n of the quantized weights q (z: the same with every code 0) with
// activations x quantized as a, against the two bounds of IntegerDotWithinDerivedBounds.
void expect_within_bounds(DType dt, const uint8_t* q, const uint8_t* z, int64_t n, int64_t K,
                          const float* x, const ActQ8& a, float y) {
  std::vector<double> wr(static_cast<size_t>(K)), zr(static_cast<size_t>(K));
  row_to_f64(dt, q + dtype_bytes(dt, n * K), wr.data(), K);
  row_to_f64(dt, z + dtype_bytes(dt, n * K), zr.data(), K);
  double exact_q = 0, exact = 0, S = 0, act = 0;
  for (int64_t k = 0; k < K; ++k) {
    const double d = a.d[size_t(k / a.block)], xq = d * a.q[size_t(k)];
    exact_q += wr[size_t(k)] * xq;
    exact += wr[size_t(k)] * x[size_t(k)];
    S += (std::fabs(wr[size_t(k)]) + 2 * std::fabs(zr[size_t(k)])) * std::fabs(xq);
    act += d * (0.5 + kStepSlack) * std::fabs(wr[size_t(k)]);
  }
  const double fp = (double(K) / 16 + 16) * kU * S;
  EXPECT_LE(std::fabs(y - exact_q), fp) << "row " << n << " (a)";
  EXPECT_LE(std::fabs(y - exact), fp + act) << "row " << n << " (b)";
}

class QdotTest : public testing::TestWithParam<Isa> {};

// Per format and ISA, for each row: y against
//  (a) exact_q = sum w_k d q_k in f64 (the exact weights, the activations as quantized): the
//      kernel's f32 steps alone. Per sub-block the kernel forms A = a * dx (one rounding), an
//      exact integer dot, one FMA into a lane; a lane sums at most K / 16 such terms, lanes
//      are reduced in at most 5 steps (16 lanes folded to 8, then 4 steps) and the b terms
//      (b * dx * sum q, two roundings) are summed apart.
//      Each term's magnitude is at most (|a u| + |b|) |d q| <= (|w| + 2 |z|) |d q|, z the value
//      of code 0 (|b| <= |z|, a u = w - b), so |y - exact_q| <= (K / 16 + 16) u S with
//      S = sum (|w_k| + 2 |z_k|) |d q_k|.
//  (b) exact = sum w_k x_k in f64: plus the activation rounding, sum over blocks of
//      d (1/2 + 2^-15) sum |w_k|.
// A wrong code, scale or sub-block order moves y by about |w_k x_k| for one term, far above
// (a)'s bound (~3e-6 of S at K = 512).
TEST_P(QdotTest, IntegerDotWithinDerivedBounds) {
  std::mt19937_64 rng(4200);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t N = 5;
  for (DType dt : kQdotTypes) {
    const int blk = cpu::act_q8_block(dt);
    ASSERT_EQ(blk, block_elems(dt)) << dtype_name(dt);
    cpu::QGemvFn gemv = cpu::qgemv_kernel(GetParam(), dt);
    ASSERT_NE(gemv, nullptr) << dtype_name(dt);
    // 96: a chunk shorter than 256 ending in half a 64-byte step; 768: three super-blocks.
    for (int64_t K : {int64_t(blk == 32 ? 96 : 256), int64_t(768)}) {
      SCOPED_TRACE(strformat("%s K=%lld isa=%s", dtype_name(dt), (long long)K, cpu::isa_name(GetParam())));
      std::vector<float> w(static_cast<size_t>(N * K));
      for (float& v : w) v = nd(rng);
      const std::vector<float> x = activations(K, 4300 + uint64_t(K));
      std::vector<uint8_t> q(dtype_bytes(dt, N * K));
      quantize_blocks(dt, w.data(), N * K / blk, q.data());
      std::vector<uint8_t> z = q;
      zero_codes(dt, z.data(), N * K / blk);
      ActQ8 a;
      cpu::quantize_act_q8(x.data(), K, blk, a);
      std::vector<float> y(N, NAN), y1(N, NAN);
      gemv(q.data(), K, a, y.data(), 0, N);
      for (int64_t n = 0; n < N; ++n) gemv(q.data(), K, a, y1.data(), n, n + 1);
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_EQ(y[size_t(n)], y1[size_t(n)]) << "row " << n << " depends on the row split";
        expect_within_bounds(dt, q.data(), z.data(), n, K, x.data(), a, y[size_t(n)]);
      }
    }
  }
}

// The integer GEMM (qgemm.cpp) on 37 tokens (two panels, then a partial one) and 9 rows (two
// tiles and a single row): every (row, token) within IntegerDotWithinDerivedBounds' bounds
// (its f32 steps are fewer: per super-block two FMAs of rounded products); the same bits for
// any row split, and for a token run alone (T = 1: another T, another panel position); a
// token with a NaN gives NaN in its own outputs only.
TEST_P(QdotTest, IntegerGemmWithinBoundsAndRowInvariant) {
  const Isa isa = GetParam();
  for (DType dt : kQdotTypes) {
    const bool gemm = dt == DType::Q4_K || dt == DType::Q5_K || dt == DType::Q6_K || dt == DType::Q8_0;
    if (isa == Isa::Scalar || !gemm) {
      EXPECT_EQ(cpu::qgemm_kernel(isa, dt, 256), nullptr) << dtype_name(dt);
    } else if (isa == Isa::Avx2) {
      EXPECT_NE(cpu::qgemm_kernel(isa, dt, 256), nullptr) << dtype_name(dt);
    }
    EXPECT_EQ(cpu::qgemm_kernel(isa, dt, 256 + 32), nullptr) << dtype_name(dt) << ": K % 256";
  }
  if (isa == Isa::Scalar) return;  // AVX2 and AVX512-VNNI have an integer GEMM (asserted above)
  if (!cpu::qgemm_kernel(isa, DType::Q4_K, 256))
    GTEST_SKIP() << "this build's AVX-512 has no VNNI";
  std::mt19937_64 rng(4600);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t N = 9, K = 768, T = 37;
  for (DType dt : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(dt));
    cpu::QGemmFn gemm = cpu::qgemm_kernel(isa, dt, K);
    const int block = cpu::act_q8_block(dt);
    ASSERT_NE(gemm, nullptr);
    std::vector<float> w(static_cast<size_t>(N * K));
    for (float& v : w) v = nd(rng);
    std::vector<uint8_t> q(dtype_bytes(dt, N * K));
    quantize_blocks(dt, w.data(), N * K / block_elems(dt), q.data());
    std::vector<uint8_t> z = q;
    zero_codes(dt, z.data(), N * K / block_elems(dt));
    std::vector<std::vector<float>> x;
    std::vector<ActQ8> a(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      x.push_back(activations(K, 4700 + uint64_t(t)));
      cpu::quantize_act_q8(x.back().data(), K, block, a[size_t(t)]);
    }
    cpu::ActQ8Panels p;
    cpu::pack_act_q8(a.data(), T, p);
    std::vector<float> out(size_t(T * N), NAN), split(size_t(T * N), NAN), one(static_cast<size_t>(N), NAN);
    gemm(q.data(), N, K, p, out.data(), 0, N);
    gemm(q.data(), N, K, p, split.data(), 0, 1);
    gemm(q.data(), N, K, p, split.data(), 1, N);
    EXPECT_EQ(out, split) << "the row split changed the bits";
    // The same integers and f32 steps on every ISA: AVX2's bits are AVX512-VNNI's.
    if (cpu::QGemmFn vnni = isa == Isa::Avx2 ? cpu::qgemm_kernel(Isa::Avx512, dt, K) : nullptr) {
      std::vector<float> wide(size_t(T * N), NAN);
      vnni(q.data(), N, K, p, wide.data(), 0, N);
      EXPECT_EQ(out, wide) << "AVX2 and AVX-512 differ";
    }
    for (int64_t t = 0; t < T; ++t) {
      cpu::ActQ8Panels p1;
      cpu::pack_act_q8(&a[size_t(t)], 1, p1);
      gemm(q.data(), N, K, p1, one.data(), 0, N);
      for (int64_t n = 0; n < N; ++n) {
        const float y = out[size_t(t * N + n)];
        EXPECT_EQ(y, one[size_t(n)]) << "token " << t << " row " << n << " differs run alone";
        expect_within_bounds(dt, q.data(), z.data(), n, K, x[size_t(t)].data(), a[size_t(t)], y);
      }
    }
    x[5][300] = NAN;
    cpu::quantize_act_q8(x[5].data(), K, block, a[5]);
    cpu::pack_act_q8(a.data(), T, p);
    std::vector<float> poisoned(size_t(T * N), 0.f);
    gemm(q.data(), N, K, p, poisoned.data(), 0, N);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        const float y = poisoned[size_t(t * N + n)];
        if (t == 5) {
          EXPECT_TRUE(std::isnan(y)) << "row " << n;
        } else {
          EXPECT_EQ(y, out[size_t(t * N + n)]) << "token " << t << " row " << n;
        }
      }
  }
}

// MXFP4's E8M0 scale at its ends: 2^-128 and 2^-127 (f32 subnormals) and 2^126, 2^127, with
// activations scaled so that a * dx stays a normal f32; against the exact f64 dot, bound (a).
TEST_P(QdotTest, Mxfp4ScaleExtremes) {
  std::mt19937_64 rng(4500);
  const int64_t K = 64;
  for (auto [e0, e1, xscale] : {std::tuple{0, 1, 0x1p40f}, std::tuple{254, 255, 0x1p-40f}}) {
    BlockMXFP4 blk[2];
    blk[0].e = uint8_t(e0);
    blk[1].e = uint8_t(e1);
    for (auto& b : blk)
      for (uint8_t& q : b.qs) q = uint8_t(rng());
    std::vector<float> x(static_cast<size_t>(K));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& v : x) v = nd(rng) * xscale;
    ActQ8 a;
    cpu::quantize_act_q8(x.data(), K, 32, a);
    float y = NAN;
    cpu::qgemv_kernel(GetParam(), DType::MXFP4)(blk, K, a, &y, 0, 1);
    std::vector<double> w(static_cast<size_t>(K));
    row_to_f64(DType::MXFP4, blk, w.data(), K);
    double exact = 0, S = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double xq = double(a.d[size_t(k / 32)]) * a.q[size_t(k)];
      exact += w[size_t(k)] * xq;
      S += std::fabs(w[size_t(k)]) * std::fabs(xq);
    }
    EXPECT_LE(std::fabs(y - exact), (double(K) / 16 + 16) * kU * S) << "e " << e0 << ", " << e1;
    EXPECT_NE(exact, 0.0);
  }
}

// The formats without an integer kernel keep the f32 GEMV (kernels.h act_q8_block).
TEST_P(QdotTest, NoIntegerKernelForOtherTypes) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::MLX_Q4, DType::MLX_MXFP8, DType::MLX_NVFP4}) {
    EXPECT_EQ(cpu::act_q8_block(dt), 0) << dtype_name(dt);
    EXPECT_EQ(cpu::qgemv_kernel(GetParam(), dt), nullptr) << dtype_name(dt);
  }
}

// The tier: a T == 1 matmul of a block format quantizes x (provider cpu.gemv_<dt>_q8_<isa>,
// stats' act_quant for the trace header) unless CpuOptions::act_quant is off, which runs the
// f32 GEMV bit for bit; T > 1 quantizes where an integer GEMM exists (cpu.gemm_<dt>_q8_<isa>),
// and never with act_quant off.
TEST_P(QdotTest, TierQuantizesOnlyDecodeAndCanBeTurnedOff) {
  const std::string sfx = std::string("_") + cpu::isa_name(GetParam());
  const int64_t N = 8, K = 256;
  auto w = make_tensor("w", {N, K}, values(N * K, 4400, 0.05, DType::F32), DType::Q4_K);
  auto w8 = make_tensor("w8", {N, K}, values(N * K, 4401, 0.05, DType::F32), DType::Q8_0);
  std::vector<double> outs[2];
  for (bool on : {true, false}) {
    cpu::CpuOptions o;
    o.threads = 2;
    o.isa = GetParam();
    o.act_quant = on;
    auto be = cpu::make_cpu_backend(o);
    Buf x(*be, values(2 * K, 4402, 1.0, DType::F32)), out(*be, 2 * N);
    be->matmul(x.b, w->t, nullptr, 2, out.b);
    const bool qgemm = on && cpu::qgemm_kernel(GetParam(), DType::Q4_K, K);
    EXPECT_EQ(be->stats().act_quant(), qgemm ? "q8_K" : "") << "T = 2";
    EXPECT_EQ(be->stats().calls().at("matmul").count("cpu.gemm_q4_k" + std::string(qgemm ? "_q8" : "") + sfx), 1u);
    be->stats().reset();
    be->matmul(x.b, w->t, nullptr, 1, out.b);
    outs[on ? 0 : 1] = out.read();
    be->matmul(x.b, w8->t, nullptr, 1, out.b);
    const auto& mm = be->stats().calls().at("matmul");
    if (on) {
      EXPECT_EQ(mm.count("cpu.gemv_q4_k_q8" + sfx), 1u);
      EXPECT_EQ(mm.count("cpu.gemv_q8_0_q8" + sfx), 1u);
      EXPECT_EQ(be->stats().act_quant(), "q8_0,q8_K");
    } else {
      EXPECT_EQ(mm.count("cpu.gemv_q4_k" + sfx), 1u);
      EXPECT_EQ(be->stats().act_quant(), "");
      std::vector<float> xf(static_cast<size_t>(K)), yf(static_cast<size_t>(N));
      const std::vector<double> xd = values(2 * K, 4402, 1.0, DType::F32);
      for (int64_t k = 0; k < K; ++k) xf[size_t(k)] = float(xd[size_t(k)]);
      cpu::gemv_kernel(GetParam(), DType::Q4_K)(w->t.data, K, xf.data(), yf.data(), 0, N);
      for (int64_t n = 0; n < N; ++n) EXPECT_EQ(outs[1][size_t(n)], yf[size_t(n)]) << "row " << n;
    }
    be->stats().reset();
    EXPECT_EQ(be->stats().act_quant(), "");
  }
  EXPECT_NE(outs[0], outs[1]) << "act_quant on and off ran the same arithmetic";
}

INSTANTIATE_TEST_SUITE_P(Cpu, QdotTest, testing::ValuesIn(cpu::available_isas()),
                         [](const testing::TestParamInfo<Isa>& i) { return std::string(cpu::isa_name(i.param)); });

}  // namespace
}  // namespace arbiter::test
