// Each CPU-tier op against the f64 ref tier, on seeded random inputs, for EVERY compiled kernel
// variant (scalar twin, AVX2, AVX-512; own GEMM and OpenBLAS) and every weight dtype.
//
// Outputs are poisoned with NaN before each op (an unwritten element fails); the metric is
// NMSE = sum((cpu - ref)^2) / sum(ref^2) against one tolerance table (kBudget below), derived
// from f32 unit roundoff and the reduction length. Every failure prints variant, case and seed.
// Ops with no rounding (embed, kv_store, summarize, widening) must match exactly.
//
// Adding a case: append a row to the op's case list; shapes should include aligned sizes,
// odd ones (31/32/33, 5x7x11x13) and, once per op, a real model shape (llama-3.2-1B).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <functional>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "backend/rope.h"
#include "op_test_util.h"

namespace arbiter::test {
namespace {

using cpu::GemmImpl;
using cpu::Isa;

// ---------------------------------------------------------------------------------------------
// Tolerance table.
//
// Model (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-4, with the usual
// probabilistic reading): every f32 operation rounds with an independent relative error of
// mean 0 and variance at most u^2 / 3, u = 2^-24. The f64 reference's own error (2^-53) and
// the inputs (f32 values given to both tiers, weights widened exactly) contribute nothing.
//
// A dot product y = sum_k a_k summed in one f32 chain s_j = (s_{j-1} + a_j)(1 + e_j) has the
// first-order error sum_k a_k d_k + sum_j s_j e_j, so E[err^2] <= u^2/3 (sum a_k^2 + sum s_j^2).
// With zero-mean terms s_j^2 ~ j sigma^2 and y^2 ~ K sigma^2: NMSE ~ u^2 (1 + K/2) / 3; with a
// dominant mean (s_j ~ j mu, y ~ K mu) it is ~ u^2 (1/K + K/3) / 3. Splitting the chain
// (SIMD lanes, several accumulators, q8 blocks) only shortens it. So an op whose outputs are
// sums of K terms has an NMSE budget of (K/2 + c) u^2, c counting the fixed roundings around
// the sum; that is already >= 3x the expectation for a single sequential chain.
//
// Budgets in units of u^2 (before the safety factor):
//   add        1                          one rounding
//   matmul     K/2 + 2                    dot of length K, + bias
//   rmsnorm    N/2 + 3                    sum of squares (relative error of rsqrt is half of
//                                         it), rsqrt rounded to f32, two products
//   rope       5                          cos and sin rounded to f32, two products, one sum
//   swiglu     kExpU2 + 3                 exp, then 1 + e, a division and a product
//   attention  (Dh + L)/2 + kExpU2 + 4    scores (dot of Dh, O(1) in these tests), exp,
//                                         sum of L weighted values, normalisation
// kExpU2 = 9: simd.h's vexp is within 3u of exp (Taylor to r^7 leaves 6e-9 < 0.1u; Horner on
// |r| <= ln2/2 adds <= 1.7u; the Cody-Waite reduction <= 0.35u), checked by VexpAccuracy.
// The NMSE of M outputs is a ratio of sums of M squared errors; for the small odd shapes
// (M = 5..35) it fluctuates a few-fold around its mean, hence kSafety = 16.
// Scale of the bounds: matmul at K = 8192 allows NMSE 2.3e-10, while dropping one of the K
// terms gives ~1/K = 1.2e-4 (DropOneTermIsCaught checks that such a defect fails).
constexpr double kU = 1.0 / (1 << 24);
constexpr double kSafety = 16;
constexpr double kExpU2 = 9;
struct Budget {
  static double add() { return 1; }
  static double matmul(int64_t K) { return K / 2.0 + 2; }
  static double rmsnorm(int64_t N) { return N / 2.0 + 3; }
  static double rope() { return 5; }
  static double swiglu() { return kExpU2 + 3; }
  static double attention(int Dh, int L) { return (Dh + L) / 2.0 + kExpU2 + 4; }
};
double bound(double budget_u2) { return kSafety * budget_u2 * kU * kU; }

void expect_close(const std::vector<double>& cand, const std::vector<double>& ref,
                  double budget_u2) {
  const Nmse m = nmse(cand, ref);
  EXPECT_EQ(m.nonfinite, 0) << m.describe();
  EXPECT_LE(m.nmse, bound(budget_u2)) << m.describe() << " > bound " << bound(budget_u2);
}

// Reference results are f64 and identical for every variant: compute once per key.
const std::vector<double>& cached_ref(const std::string& key,
                                      const std::function<std::vector<double>()>& make) {
  static std::map<std::string, std::vector<double>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Variants.

struct Variant {
  Isa isa;
  GemmImpl gemm;
  std::string name() const {
    return std::string(cpu::isa_name(isa)) + "_" + cpu::gemm_impl_name(gemm);
  }
  std::unique_ptr<Backend> make(int threads = 2) const {
    cpu::CpuOptions o;
    o.threads = threads;
    o.isa = isa;
    o.gemm = gemm;
    return cpu::make_cpu_backend(o);
  }
};

std::vector<Variant> gemm_variants() {
  std::vector<Variant> v;
  for (Isa isa : cpu::available_isas())
    for (GemmImpl g : {GemmImpl::Own, GemmImpl::Blas}) v.push_back({isa, g});
  return v;
}
std::vector<Variant> isa_variants() {
  std::vector<Variant> v;
  for (Isa isa : cpu::available_isas()) v.push_back({isa, GemmImpl::Own});
  return v;
}
std::string variant_name(const testing::TestParamInfo<Variant>& i) { return i.param.name(); }

class MatmulTest : public testing::TestWithParam<Variant> {};
class IsaTest : public testing::TestWithParam<Variant> {};

constexpr DType kWeightTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0};

// ---------------------------------------------------------------------------------------------
// matmul

struct MatmulCase {
  int T;
  int64_t N, K;
  bool bias;
};

std::string matmul_case_name(const MatmulCase& c, DType dt) {
  return strformat("matmul T=%d N=%lld K=%lld bias=%d %s", c.T, (long long)c.N, (long long)c.K,
                   int(c.bias), dtype_name(dt));
}

// Inputs of one case, regenerated from the seed for each tier.
struct MatmulInputs {
  OwnedTensor w, bias;
  std::vector<double> x;
};
MatmulInputs matmul_inputs(const MatmulCase& c, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MatmulInputs in;
  in.w = make_weight(rng, dt, c.N, c.K);
  in.x = random_f32(rng, c.T * c.K);
  if (c.bias) in.bias = make_weight(rng, DType::F32, 1, c.N, "bias");
  return in;
}

std::vector<double> run_matmul(Backend& be, const MatmulCase& c, const MatmulInputs& in) {
  Buffer x = upload(be, in.x);
  Buffer out = be.alloc(c.T * c.N);
  poison(be, out, c.T * c.N);
  be.matmul(x, in.w.t, c.bias ? &in.bias.t : nullptr, c.T, out);
  std::vector<double> r = download(be, out, c.T * c.N);
  be.free(x);
  be.free(out);
  return r;
}

void check_matmul(const Variant& v, const MatmulCase& c0, uint64_t seed) {
  for (DType dt : kWeightTypes) {
    MatmulCase c = c0;
    if (dt == DType::Q8_0) c.K = (c.K + kQ8BlockSize - 1) / kQ8BlockSize * kQ8BlockSize;
    const std::string name = matmul_case_name(c, dt);
    SCOPED_TRACE(strformat("%s variant=%s seed=%llu", name.c_str(), v.name().c_str(),
                           (unsigned long long)seed));
    const MatmulInputs in = matmul_inputs(c, dt, seed);
    const auto& ref = cached_ref(name + strformat(" seed=%llu", (unsigned long long)seed), [&] {
      auto rb = make_ref_backend();
      return run_matmul(*rb, c, in);
    });
    auto be = v.make();
    expect_close(run_matmul(*be, c, in), ref, Budget::matmul(c.K));
  }
}

// T = 1 takes the GEMV kernels (the GEMM choice does not matter), T > 1 the GEMM.
const MatmulCase kGemvCases[] = {
    {1, 64, 256, false}, {1, 31, 33, true},   {1, 33, 31, false},  {1, 7, 5, false},
    {1, 13, 143, true},  {1, 5, 1, false},    {1, 1, 32, false},   {1, 2048, 8192, false},
    {1, 8192, 2048, true}};
const MatmulCase kGemmCases[] = {
    {2, 64, 256, false},  {5, 7, 11, true},    {13, 31, 33, false}, {31, 33, 32, true},
    {33, 65, 143, false}, {12, 32, 256, false}, {7, 5, 300, true},   {64, 2048, 2048, false},
    {13, 512, 2048, true}};

TEST_P(IsaTest, GemvMatchesRef) {  // per ISA only: T = 1 does not use the GEMM
  uint64_t seed = 1000;
  for (const auto& c : kGemvCases) check_matmul(GetParam(), c, seed++);
}

TEST_P(MatmulTest, GemmMatchesRef) {
  uint64_t seed = 2000;
  for (const auto& c : kGemmCases) check_matmul(GetParam(), c, seed++);
}

INSTANTIATE_TEST_SUITE_P(Cpu, MatmulTest, testing::ValuesIn(gemm_variants()), variant_name);

// The bound is tight enough to see a real defect: a matmul that drops the last of K = 8192
// terms is refused.
TEST(Tolerance, DropOneTermIsCaught) {
  const MatmulCase c{1, 512, 8192, false};
  const MatmulInputs in = matmul_inputs(c, DType::F32, 7);
  auto rb = make_ref_backend();
  const std::vector<double> ref = run_matmul(*rb, c, in);
  MatmulInputs dropped = matmul_inputs(c, DType::F32, 7);
  dropped.x[size_t(c.K - 1)] = 0;
  const std::vector<double> bad = run_matmul(*rb, c, dropped);
  EXPECT_GT(nmse(bad, ref).nmse, 100 * bound(Budget::matmul(c.K)));
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

TEST_P(IsaTest, RmsnormMatchesRef) {
  struct Case {
    int R, N;
    bool in_place;
  };
  const Case cases[] = {{1, 64, false}, {5, 31, false}, {7, 33, true},  {13, 32, false},
                        {11, 13, true}, {3, 1, false},  {16, 64, true}, {512, 2048, false}};
  uint64_t seed = 3000;
  for (const Case& c : cases) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      ++seed;
      SCOPED_TRACE(strformat("rmsnorm R=%d N=%d in_place=%d %s variant=%s seed=%llu", c.R, c.N,
                             int(c.in_place), dtype_name(dt), GetParam().name().c_str(),
                             (unsigned long long)seed));
      std::mt19937_64 rng(seed);
      OwnedTensor w = make_weight(rng, dt, 1, c.N);
      const std::vector<double> x = random_f32(rng, int64_t(c.R) * c.N, -3, 3);
      const double eps = 1e-5;
      auto run = [&](Backend& be) {
        Buffer xb = upload(be, x);
        Buffer out = c.in_place ? xb : be.alloc(int64_t(c.R) * c.N);
        if (!c.in_place) poison(be, out, int64_t(c.R) * c.N);
        be.rmsnorm(xb, w.t, c.R, c.N, eps, out);
        std::vector<double> r = download(be, out, int64_t(c.R) * c.N);
        if (!c.in_place) be.free(out);
        be.free(xb);
        return r;
      };
      auto rb = make_ref_backend();
      auto be = GetParam().make();
      expect_close(run(*be), run(*rb), Budget::rmsnorm(c.N));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rope (one kernel for every ISA; run per ISA anyway since the backend is per ISA)

TEST_P(IsaTest, RopeMatchesRef) {
  struct Case {
    int T, nh, Dh, pos0;
    RopeLayout layout;
    RopeScaling::Kind scaling;
  };
  const Case cases[] = {
      {1, 32, 64, 0, RopeLayout::Half, RopeScaling::Kind::None},
      {5, 7, 22, 13, RopeLayout::Half, RopeScaling::Kind::None},
      {5, 7, 22, 13, RopeLayout::Adjacent, RopeScaling::Kind::None},
      {33, 3, 128, 1000, RopeLayout::Half, RopeScaling::Kind::Linear},
      {11, 13, 2, 5, RopeLayout::Adjacent, RopeScaling::Kind::None},
      {512, 8, 64, 1536, RopeLayout::Half, RopeScaling::Kind::Llama3},  // llama-3.2-1B k
  };
  uint64_t seed = 4000;
  for (const Case& c : cases) {
    ++seed;
    SCOPED_TRACE(strformat("rope T=%d nh=%d Dh=%d pos0=%d layout=%d scaling=%d variant=%s "
                           "seed=%llu",
                           c.T, c.nh, c.Dh, c.pos0, int(c.layout), int(c.scaling),
                           GetParam().name().c_str(), (unsigned long long)seed));
    RopeSpec cfg;
    cfg.dims = c.Dh;
    cfg.theta = 500000;
    cfg.layout = c.layout;
    cfg.scaling.kind = c.scaling;
    cfg.scaling.factor = 32;
    std::mt19937_64 rng(seed);
    const int64_t n = int64_t(c.T) * c.nh * c.Dh;
    const std::vector<double> x = random_f32(rng, n);
    auto run = [&](Backend& be) {
      Buffer xb = upload(be, x);
      be.rope(xb, c.T, c.nh, c.Dh, c.pos0, cfg);
      std::vector<double> r = download(be, xb, n);
      be.free(xb);
      return r;
    };
    auto rb = make_ref_backend();
    auto be = GetParam().make();
    expect_close(run(*be), run(*rb), Budget::rope());
    // Same positions again: the cached cos/sin table is reused.
    expect_close(run(*be), run(*rb), Budget::rope());
  }
}

// ---------------------------------------------------------------------------------------------
// attention

TEST_P(IsaTest, AttentionMatchesRef) {
  struct Case {
    int T, pos0, H, Hkv, Dh, window;
  };
  const Case cases[] = {
      {1, 0, 4, 4, 16, 0},     {1, 37, 8, 2, 64, 0},   {5, 11, 6, 3, 24, 0},
      {7, 1, 7, 7, 13, 0},     {13, 20, 4, 1, 33, 0},  {9, 30, 4, 2, 32, 8},
      {31, 2, 2, 1, 31, 5},    {1, 1536, 32, 8, 64, 1024},  // mistral-like window, decode
      {8, 1536, 32, 8, 64, 1024}, {64, 448, 32, 8, 64, 0}};  // llama-3.2-1B heads
  uint64_t seed = 5000;
  for (const Case& c : cases) {
    ++seed;
    SCOPED_TRACE(strformat("attention T=%d pos0=%d H=%d Hkv=%d Dh=%d window=%d variant=%s "
                           "seed=%llu",
                           c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, GetParam().name().c_str(),
                           (unsigned long long)seed));
    std::mt19937_64 rng(seed);
    const int kv_dim = c.Hkv * c.Dh, ctx = c.pos0 + c.T, rows = ctx + 3;
    const std::vector<double> q = random_f32(rng, int64_t(c.T) * c.H * c.Dh);
    std::vector<double> kc = random_f32(rng, int64_t(rows) * kv_dim);
    std::vector<double> vc = random_f32(rng, int64_t(rows) * kv_dim);
    // Cache rows no query may see are NaN: the rows after the last position, and with a
    // window the rows before the first query's window. Reading one of them fails the test.
    const int first_lo = c.window > 0 ? std::max(0, c.pos0 - c.window + 1) : 0;
    for (int r = 0; r < rows; ++r)
      if (r >= ctx || r < first_lo)
        for (int d = 0; d < kv_dim; ++d) {
          kc[size_t(r) * kv_dim + d] = std::nan("");
          vc[size_t(r) * kv_dim + d] = std::nan("");
        }
    const int64_t n_out = int64_t(c.T) * c.H * c.Dh;
    auto run = [&](Backend& be, bool is_ref) {
      // The ref tier never reads masked rows either, but give it finite values to be safe.
      std::vector<double> k2 = kc, v2 = vc;
      if (is_ref)
        for (auto* vec : {&k2, &v2})
          for (auto& e : *vec)
            if (std::isnan(e)) e = 0;
      Buffer qb = upload(be, q), kb = upload(be, k2), vb = upload(be, v2);
      Buffer out = be.alloc(n_out);
      poison(be, out, n_out);
      be.attention(qb, kb, vb, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, out);
      std::vector<double> r = download(be, out, n_out);
      for (Buffer* b : {&qb, &kb, &vb, &out}) be.free(*b);
      return r;
    };
    auto rb = make_ref_backend();
    auto be = GetParam().make();
    const int L = c.window > 0 ? std::min(ctx, c.window) : ctx;
    expect_close(run(*be, false), run(*rb, true), Budget::attention(c.Dh, L));
  }
}

// ---------------------------------------------------------------------------------------------
// swiglu, add

TEST_P(IsaTest, SwigluMatchesRef) {
  const int64_t sizes[] = {1, 15, 16, 17, 31, 33, 1001, 8192 * 13 + 5};
  uint64_t seed = 6000;
  for (int64_t n : sizes) {
    ++seed;
    SCOPED_TRACE(strformat("swiglu n=%lld variant=%s seed=%llu", (long long)n,
                           GetParam().name().c_str(), (unsigned long long)seed));
    std::mt19937_64 rng(seed);
    std::vector<double> g = random_f32(rng, n, -20, 20);
    const std::vector<double> u = random_f32(rng, n, -3, 3);
    // The clamp region of exp: SiLU of large |g| (its result is ~0 or ~g there).
    if (n > 4) {
      g[0] = -100;
      g[1] = 100;
      g[2] = -88.5;
      g[3] = 0;
    }
    auto run = [&](Backend& be) {
      Buffer gb = upload(be, g), ub = upload(be, u), out = be.alloc(n);
      poison(be, out, n);
      be.swiglu(gb, ub, n, out);
      std::vector<double> r = download(be, out, n);
      for (Buffer* b : {&gb, &ub, &out}) be.free(*b);
      return r;
    };
    auto rb = make_ref_backend();
    auto be = GetParam().make();
    expect_close(run(*be), run(*rb), Budget::swiglu());
  }
}

TEST_P(IsaTest, AddMatchesRef) {
  const int64_t sizes[] = {1, 7, 16, 17, 33, 65536 + 3};
  uint64_t seed = 7000;
  for (int64_t n : sizes) {
    ++seed;
    SCOPED_TRACE(strformat("add n=%lld variant=%s seed=%llu", (long long)n,
                           GetParam().name().c_str(), (unsigned long long)seed));
    std::mt19937_64 rng(seed);
    const std::vector<double> x = random_f32(rng, n), y = random_f32(rng, n);
    auto run = [&](Backend& be) {
      Buffer xb = upload(be, x), yb = upload(be, y);
      be.add(xb, yb, n);
      std::vector<double> r = download(be, xb, n);
      be.free(xb);
      be.free(yb);
      return r;
    };
    auto rb = make_ref_backend();
    auto be = GetParam().make();
    expect_close(run(*be), run(*rb), Budget::add());
  }
}

// ---------------------------------------------------------------------------------------------
// Exact ops: embed, widening, kv_store, summarize.

TEST_P(IsaTest, EmbedIsExact) {
  uint64_t seed = 8000;
  for (DType dt : kWeightTypes) {
    for (int64_t D : {int64_t(32), int64_t(64), int64_t(2048), int64_t(33)}) {
      if (dt == DType::Q8_0 && D % kQ8BlockSize) continue;
      ++seed;
      SCOPED_TRACE(strformat("embed D=%lld %s variant=%s seed=%llu", (long long)D,
                             dtype_name(dt), GetParam().name().c_str(),
                             (unsigned long long)seed));
      std::mt19937_64 rng(seed);
      const int V = 50;
      OwnedTensor table = make_weight(rng, dt, V, D);
      const int32_t ids[] = {0, 49, 7, 7, 23};
      auto run = [&](Backend& be) {
        Buffer out = be.alloc(5 * D);
        poison(be, out, 5 * D);
        be.embed(table.t, ids, 5, out);
        std::vector<double> r = download(be, out, 5 * D);
        be.free(out);
        return r;
      };
      auto rb = make_ref_backend();
      auto be = GetParam().make();
      EXPECT_EQ(run(*be), run(*rb));
      const int32_t bad[] = {V};
      Buffer out = be->alloc(D);
      EXPECT_THROW(be->embed(table.t, bad, 1, out), Error);
      be->free(out);
    }
  }
}

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
                      int64_t(33), int64_t(96), int64_t(1000)}) {
      if (dt == DType::Q8_0 && n % kQ8BlockSize) continue;
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

TEST_P(IsaTest, KvStoreIsExact) {
  std::mt19937_64 rng(9100);
  const int T = 5, pos0 = 3, kv_dim = 33, rows = 10;
  const std::vector<double> k = random_f32(rng, T * kv_dim), v = random_f32(rng, T * kv_dim);
  auto run = [&](Backend& be) {
    Buffer kb = upload(be, k), vb = upload(be, v);
    Buffer kc = be.alloc(rows * kv_dim), vc = be.alloc(rows * kv_dim);
    poison(be, kc, rows * kv_dim);
    poison(be, vc, rows * kv_dim);
    be.kv_store(kb, vb, kc, vc, T, pos0, kv_dim);
    std::vector<double> r = download(be, kc, rows * kv_dim), rv = download(be, vc, rows * kv_dim);
    r.insert(r.end(), rv.begin(), rv.end());
    for (Buffer* b : {&kb, &vb, &kc, &vc}) be.free(*b);
    return r;
  };
  auto be = GetParam().make();
  const std::vector<double> got = run(*be);
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < kv_dim; ++d) {
      const bool written = r >= pos0 && r < pos0 + T;
      const double gk = got[size_t(r * kv_dim + d)], gv = got[size_t((rows + r) * kv_dim + d)];
      if (written) {
        EXPECT_EQ(gk, k[size_t((r - pos0) * kv_dim + d)]);
        EXPECT_EQ(gv, v[size_t((r - pos0) * kv_dim + d)]);
      } else {
        EXPECT_TRUE(std::isnan(gk) && std::isnan(gv)) << "row " << r << " was overwritten";
      }
    }
}

TEST_P(IsaTest, SummarizeMatchesRefExactly) {
  std::mt19937_64 rng(9200);
  const int T = 3, V = 1001, K = 8;
  std::vector<double> logits = random_f32(rng, T * V, -10, 10);
  logits[5] = logits[17] = 12.5;  // a tie at the top of row 0: lower id first
  logits[V + 3] = std::nan("");   // row 1 has a NaN
  const int32_t targets[] = {17, -1, 1000};
  auto run = [&](Backend& be) {
    Buffer b = upload(be, logits, true);
    std::vector<LogitsSummary> s;
    be.summarize(b, T, V, K, targets, s);
    be.free(b);
    return s;
  };
  auto rb = make_ref_backend();
  auto be = GetParam().make();
  const auto got = run(*be), want = run(*rb);
  ASSERT_EQ(got.size(), size_t(T));
  for (int t = 0; t < T; ++t) {
    SCOPED_TRACE(strformat("row %d", t));
    EXPECT_EQ(got[t].top_ids, want[t].top_ids);
    EXPECT_EQ(got[t].n_nonfinite, want[t].n_nonfinite);
    if (want[t].n_nonfinite == 0) {
      EXPECT_EQ(got[t].lse, want[t].lse);
      EXPECT_EQ(got[t].top_logits, want[t].top_logits);
    }
    if (std::isnan(want[t].target_logit)) EXPECT_TRUE(std::isnan(got[t].target_logit));
    else EXPECT_EQ(got[t].target_logit, want[t].target_logit);
  }
  EXPECT_EQ(got[0].top_ids[0], 5);
  EXPECT_EQ(got[0].top_ids[1], 17);
}

// ---------------------------------------------------------------------------------------------
// Providers: each op names its kernel; fallbacks only where no SIMD kernel exists.

TEST_P(IsaTest, ProvidersAreRecorded) {
  auto be = GetParam().make();
  const std::string sfx = std::string("_") + cpu::isa_name(GetParam().isa);
  std::mt19937_64 rng(9300);
  OwnedTensor w = make_weight(rng, DType::BF16, 8, 32);
  Buffer x = upload(*be, random_f32(rng, 2 * 32)), out = be->alloc(2 * 8);
  be->matmul(x, w.t, nullptr, 1, out);
  be->matmul(x, w.t, nullptr, 2, out);
  be->swiglu(x, x, 16, out);
  const auto& calls = be->stats().calls();
  EXPECT_EQ(calls.at("matmul").count("cpu.gemv_bf16" + sfx), 1u);
  EXPECT_EQ(calls.at("matmul").count("cpu.gemm_bf16" + sfx), 1u);
  EXPECT_EQ(calls.at("swiglu").count("cpu.swiglu" + sfx), 1u);
  EXPECT_EQ(be->stats().fallbacks(), 0);
  // f64 weights have no SIMD kernel: served, but counted as a fallback.
  OwnedTensor w64 = make_weight(rng, DType::F64, 8, 32);
  be->matmul(x, w64.t, nullptr, 1, out);
  EXPECT_EQ(be->stats().fallbacks(), 1);
  EXPECT_EQ(calls.at("matmul").count("cpu.matmul_generic"), 1u);
  be->free(x);
  be->free(out);
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
