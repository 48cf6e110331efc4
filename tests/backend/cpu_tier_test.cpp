// What only the CPU tier has: its widening kernels (bit for bit, special values included), its
// GEMM's one FMA chain per element, its provider names per ISA, vexp's accuracy for every
// compiled vector type, and that every compiled ISA is tested. Each op against ref, on every tier, is in tests/ops/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "tier_util.h"

namespace arbiter::test {
namespace {

using cpu::GemmImpl;
using cpu::Isa;

constexpr double kU = 1.0 / (1 << 24);

struct Variant {
  Isa isa;
  std::string name() const { return cpu::isa_name(isa); }
  std::unique_ptr<Backend> make(int threads = 2) const {
    cpu::CpuOptions o;
    o.threads = threads;
    o.isa = isa;
    o.gemm = GemmImpl::Own;
    return cpu::make_cpu_backend(o);
  }
};
std::vector<Variant> isa_variants() {
  std::vector<Variant> v;
  for (Isa isa : cpu::available_isas()) v.push_back({isa});
  return v;
}
std::string variant_name(const testing::TestParamInfo<Variant>& i) { return i.param.name(); }

class IsaTest : public testing::TestWithParam<Variant> {};

constexpr DType kWeightTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

bool same_f32(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

// Every widening kernel equals the scalar row_to_f32 bit for bit, on random rows and on the
// special values (signed zero, subnormals, infinities, NaN, extremes) of each 16-bit format.
TEST_P(IsaTest, WidenIsExact) {
  std::mt19937_64 rng(9000);
  for (DType dt : kWeightTypes) {
    cpu::WidenFn widen = cpu::widen_kernel(GetParam().isa, dt);
    ASSERT_NE(widen, nullptr);
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(32),
                      int64_t(33), int64_t(96), int64_t(256), int64_t(1000), int64_t(1024)}) {
      if (n % block_elems(dt)) continue;
      SCOPED_TRACE(strformat("widen %s n=%lld variant=%s", dtype_name(dt), (long long)n,
                             GetParam().name().c_str()));
      std::vector<uint8_t> src(dtype_bytes(dt, n));
      for (auto& b : src) b = uint8_t(rng());
      if (dt == DType::F16 || dt == DType::BF16) {
        const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7e00,
                                     0x7bff, 0x7f80, 0xff80, 0x7fc0, 0x0080, 0x007f};
        auto* h = reinterpret_cast<uint16_t*>(src.data());
        for (int64_t i = 0; i < n && i < 13; ++i) h[i] = specials[i];
      }
      if (dt == DType::F32) {  // random bits are often NaN; keep mostly ordinary values
        auto* f = reinterpret_cast<float*>(src.data());
        std::uniform_real_distribution<float> d(-1e3f, 1e3f);
        for (int64_t i = 0; i < n; ++i) f[i] = d(rng);
      }
      std::vector<float> got(size_t(n) + 1, -7.f), want(static_cast<size_t>(n));
      widen(src.data(), got.data(), n);
      row_to_f32(dt, src.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(same_f32(got[size_t(i)], want[size_t(i)]))
            << "element " << i << ": " << got[size_t(i)] << " vs " << want[size_t(i)];
      EXPECT_EQ(got[size_t(n)], -7.f) << "wrote past the end";
    }
  }
}

// The own GEMM's contract (kernels.h): out[t, n] is one f32 FMA chain over k = 0..K-1 from 0,
// on the exactly widened weights, plus the bias once; so neither its two schemes (broadcast
// weights up to 128 tokens, packed weights above), nor its tiles, nor the thread count change
// a bit. T covers both schemes with ragged tiles, N ragged strips, K ragged k-blocks.
TEST_P(IsaTest, GemmIsOneFmaChainPerElement) {
  std::mt19937_64 rng(9100);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Isa isa = GetParam().isa;
  for (DType dt : {DType::F32, DType::BF16, DType::Q4_K})
    for (int64_t K : {int64_t(256), int64_t(300), int64_t(768)}) {
      if (K % block_elems(dt)) continue;
      const int64_t N = 77;
      std::vector<float> wf(size_t(N * K)), bias(static_cast<size_t>(N)), wide(size_t(N * K));
      for (auto& v : wf) v = nd(rng);
      for (auto& v : bias) v = nd(rng);
      std::vector<uint8_t> w(dtype_bytes(dt, N * K));
      if (dt == DType::F32) {
        std::memcpy(w.data(), wf.data(), w.size());
      } else if (dt == DType::BF16) {
        auto* h = reinterpret_cast<uint16_t*>(w.data());
        for (int64_t i = 0; i < N * K; ++i) h[i] = f32_to_bf16(wf[size_t(i)]);
      } else {
        quantize_blocks(dt, wf.data(), N * K / block_elems(dt), w.data());
      }
      row_to_f32(dt, w.data(), wide.data(), N * K);
      for (int64_t T : {2, 17, 64, 100, 128, 129, 200}) {
        std::vector<float> x(size_t(T * K)), chain(size_t(T * N), 0.f);
        for (auto& v : x) v = nd(rng);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < K; ++k)
              chain[size_t(t * N + n)] =
                  std::fma(x[size_t(t * K + k)], wide[size_t(n * K + k)], chain[size_t(t * N + n)]);
        for (bool with_bias : {false, true})
          for (int threads : {1, 2}) {
            SCOPED_TRACE(strformat("%s K=%lld T=%lld bias=%d threads=%d variant=%s",
                                   dtype_name(dt), (long long)K, (long long)T, int(with_bias),
                                   threads, GetParam().name().c_str()));
            std::vector<float> out(size_t(T * N), -7.f);
            cpu::GemmProblem p;
            p.x = x.data();
            p.W = w.data();
            p.wtype = dt;
            p.bias = with_bias ? bias.data() : nullptr;
            p.out = out.data();
            p.T = T, p.N = N, p.K = K;
            ThreadPool pool(threads);
            cpu::gemm_own(isa, p, pool);
            for (int64_t i = 0; i < T * N; ++i) {
              const float want = with_bias ? chain[size_t(i)] + bias[size_t(i % N)] : chain[size_t(i)];
              ASSERT_TRUE(same_f32(out[size_t(i)], want))
                  << "out[" << i / N << ", " << i % N << "] = " << out[size_t(i)]
                  << ", the chain gives " << want;
            }
          }
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Providers: each op names its kernel; fallbacks only where no SIMD kernel exists.

TEST_P(IsaTest, ProvidersAreRecorded) {
  auto be = GetParam().make();
  const std::string sfx = std::string("_") + cpu::isa_name(GetParam().isa);
  auto w = make_tensor("w", {8, 32}, values(8 * 32, 9300, 0.05, DType::F32), DType::BF16);
  Buf x(*be, values(2 * 32, 9301, 1.0, DType::F32)), out(*be, 2 * 8);
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->matmul(x.b, w->t, nullptr, 2, out.b);
  be->swiglu(x.b, x.b, 16, out.b);
  const auto& calls = be->stats().calls();
  EXPECT_EQ(calls.at("matmul").count("cpu.gemv_bf16" + sfx), 1u);
  EXPECT_EQ(calls.at("matmul").count("cpu.gemm_bf16" + sfx), 1u);
  EXPECT_EQ(calls.at("swiglu").count("cpu.swiglu" + sfx), 1u);
  EXPECT_EQ(be->stats().fallbacks(), 0);
  // f64 weights have no SIMD kernel: served, but counted as a fallback.
  auto w64 = make_tensor("w64", {8, 32}, values(8 * 32, 9302, 0.05, DType::F64), DType::F64);
  be->matmul(x.b, w64->t, nullptr, 1, out.b);
  EXPECT_EQ(be->stats().fallbacks(), 1);
  EXPECT_EQ(calls.at("matmul").count("cpu.matmul_generic"), 1u);
}

// The GEMV of every block format other than Q8_0 against the f64 dot of the exactly
// dequantized row. Documented bound (docs/quantization.md): each weight widened to f32 with
// relative error <= u (u = 2^-24; 0 for the formats without a min), each product rounded
// (<= u) and K terms summed in f32 (<= (K - 1) u), so |y - exact| <= (K + 2) u sum |w_k x_k|
// to first order. A wrong scale, nibble or sub-block would be off by O(sum |w_k x_k|).
TEST_P(IsaTest, BlockGemvWithinDotBound) {
  std::mt19937_64 rng(9100);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t K = 512, N = 5;
  std::vector<float> x(K), w(size_t(N * K));
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  for (DType dt : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                   DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::MLX_Q2,
                   DType::MLX_Q3, DType::MLX_Q4, DType::MLX_Q5, DType::MLX_Q6, DType::MLX_Q8, DType::MLX_MXFP8,
                   DType::MLX_NVFP4}) {
    std::vector<uint8_t> q(dtype_bytes(dt, N * K));
    quantize_blocks(dt, w.data(), N * K / block_elems(dt), q.data());
    cpu::GemvFn gemv = cpu::gemv_kernel(GetParam().isa, dt);
    ASSERT_NE(gemv, nullptr) << dtype_name(dt);
    std::vector<float> y(N, NAN);
    gemv(q.data(), K, x.data(), y.data(), 0, N);
    std::vector<double> row(K);
    for (int64_t n = 0; n < N; ++n) {
      row_to_f64(dt, q.data() + dtype_bytes(dt, n * K), row.data(), K);
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += row[size_t(k)] * x[size_t(k)];
        mag += std::fabs(row[size_t(k)] * x[size_t(k)]);
      }
      EXPECT_LE(std::fabs(y[size_t(n)] - exact), (K + 2) * kU * mag) << dtype_name(dt) << " row " << n;
    }
  }
}

// Huge-page weight copies (CpuOptions::hugepage_weights): after prepare() the matmuls read
// the copy and give the bits of a tier reading the tensor in place; when the tensor's bytes
// change under the same address (a model freed and another mapped where it was), the next
// prepare() copies them again instead of serving the stale copy.
TEST_P(IsaTest, HugePageWeightCopiesAreExactAndNeverStale) {
  const int64_t N = 384, K = 512;  // 384 KiB of f32: above the copy threshold (256 KiB)
  auto w = make_tensor("w", {N, K}, values(N * K, 9310, 0.05, DType::F32), DType::F32);
  auto copied = GetParam().make();
  cpu::CpuOptions o;
  o.threads = 2;
  o.isa = GetParam().isa;
  o.hugepage_weights = false;
  auto in_place = cpu::make_cpu_backend(o);
  Backend::Prepare prep;
  prep.weights.push_back({&w->t, "mlp"});
  copied->prepare(prep);
  for (int T : {1, 3}) {
    Buf x(*copied, values(T * K, 9311, 1.0, DType::F32)), a(*copied, T * N);
    Buf x2(*in_place, values(T * K, 9311, 1.0, DType::F32)), b(*in_place, T * N);
    auto run = [&] {
      copied->matmul(x.b, w->t, nullptr, T, a.b);
      in_place->matmul(x2.b, w->t, nullptr, T, b.b);
      return std::make_pair(a.read(), b.read());
    };
    auto [ya, yb] = run();
    for (int64_t i = 0; i < T * N; ++i) ASSERT_EQ(ya[size_t(i)], yb[size_t(i)]) << "T " << T << " i " << i;
    // Scale the tensor in place (exact: a power of two). Until the next prepare() the tier
    // reads its copy, which shows the copy is what the matmuls read; prepare() refreshes it.
    float* f = reinterpret_cast<float*>(w->bytes.data());
    for (int64_t i = 0; i < N * K; ++i) f[i] *= 2.0f;
    auto [sa, sb] = run();
    for (int64_t i = 0; i < T * N; ++i) ASSERT_EQ(sa[size_t(i)], ya[size_t(i)]) << "T " << T << " i " << i;
    copied->prepare(prep);
    auto [za, zb] = run();
    for (int64_t i = 0; i < T * N; ++i) {
      ASSERT_EQ(za[size_t(i)], zb[size_t(i)]) << "T " << T << " i " << i << ": stale copy";
      ASSERT_EQ(zb[size_t(i)], 2.0 * yb[size_t(i)]) << "T " << T << " i " << i;
    }
    for (int64_t i = 0; i < N * K; ++i) f[i] *= 0.5f;
    copied->prepare(prep);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, IsaTest, testing::ValuesIn(isa_variants()), variant_name);

// ---------------------------------------------------------------------------------------------
// vexp: within 3u of exp over its whole clamp range, for every compiled vector type.

template <class V>
double max_exp_rel_error() {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.0037) {
    alignas(64) float in[V::W], out[V::W];
    for (int i = 0; i < V::W; ++i) in[i] = float(std::min(88.0, x + i * 1e-4));
    V::store(out, cpu::vexp<V>(V::load(in)));
    for (int i = 0; i < V::W; ++i) {
      const double want = std::exp(double(in[i]));
      worst = std::max(worst, std::fabs(out[i] - want) / want);
    }
  }
  return worst;
}

TEST(VexpAccuracy, WithinThreeUlpsOfExp) {
  EXPECT_LE(max_exp_rel_error<cpu::VScalar>(), 3 * kU);
#ifdef ARBITER_CPU_AVX2
  EXPECT_LE(max_exp_rel_error<cpu::VAvx2>(), 3 * kU);
#endif
#ifdef ARBITER_CPU_AVX512
  EXPECT_LE(max_exp_rel_error<cpu::VAvx512>(), 3 * kU);
#endif
  alignas(64) float nan_in[16], out[16];
  for (float& f : nan_in) f = std::nanf("");
  cpu::VScalar::store(out, cpu::vexp<cpu::VScalar>(cpu::VScalar::load(nan_in)));
  EXPECT_TRUE(std::isnan(out[0]));
#ifdef ARBITER_CPU_AVX512
  cpu::VAvx512::store(out, cpu::vexp<cpu::VAvx512>(cpu::VAvx512::load(nan_in)));
  for (float f : out) EXPECT_TRUE(std::isnan(f));
#endif
}

TEST(Variants, AllCompiledIsasAreTested) {
  // The dev machine builds with -march=native on AVX-512 hardware: all three must be present
  // there, so a build that silently lost a path shows up here.
  std::string have;
  for (Isa isa : cpu::available_isas()) have += std::string(cpu::isa_name(isa)) + " ";
  EXPECT_EQ(cpu::available_isas().front(), Isa::Scalar) << have;
#if defined(ARBITER_CPU_AVX512)
  if (__builtin_cpu_supports("avx512bw")) {
    EXPECT_EQ(cpu::best_isa(), Isa::Avx512) << have;
  }
#endif
}

}  // namespace
}  // namespace arbiter::test
