// The CPU tier is deterministic: every op gives bit-identical outputs on repeated runs and for
// 1, 2 and 3 threads, for every kernel variant (each output element is computed by one thread
// with a fixed reduction order; see src/core/thread_pool.h).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "op_test_util.h"

namespace arbiter::test {
namespace {

using cpu::GemmImpl;
using cpu::Isa;

// Runs a fixed mix of ops on a fresh backend and returns all their outputs, concatenated.
std::vector<double> run_mix(Backend& be, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> all;
  auto keep = [&](const Buffer& b, int64_t n) {
    std::vector<double> v = download(be, b, n);
    all.insert(all.end(), v.begin(), v.end());
  };
  struct M {
    int T;
    int64_t N, K;
    DType dt;
  };
  const M mats[] = {{1, 1001, 2048, DType::BF16}, {1, 333, 2048, DType::Q8_0},
                    {37, 333, 300, DType::F16},   {64, 200, 512, DType::BF16},
                    {13, 65, 96, DType::Q8_0},    {5, 77, 64, DType::F32}};
  for (const M& m : mats) {
    OwnedTensor w = make_weight(rng, m.dt, m.N, m.K);
    Buffer x = upload(be, random_f32(rng, m.T * m.K)), out = be.alloc(m.T * m.N);
    be.matmul(x, w.t, nullptr, m.T, out);
    keep(out, m.T * m.N);
    be.free(x);
    be.free(out);
  }
  {  // attention: prefill-shaped and decode-shaped
    const int H = 8, Hkv = 2, Dh = 64, ctx = 70;
    Buffer kc = upload(be, random_f32(rng, ctx * Hkv * Dh));
    Buffer vc = upload(be, random_f32(rng, ctx * Hkv * Dh));
    for (int T : {19, 1}) {
      Buffer q = upload(be, random_f32(rng, T * H * Dh)), out = be.alloc(T * H * Dh);
      be.attention(q, kc, vc, T, ctx - T, H, Hkv, Dh, 0, out);
      keep(out, T * H * Dh);
      be.free(q);
      be.free(out);
    }
    be.free(kc);
    be.free(vc);
  }
  {  // rmsnorm over many rows, swiglu and add over more than one parallel chunk
    const int R = 300, N = 2048;
    OwnedTensor w = make_weight(rng, DType::BF16, 1, N);
    Buffer x = upload(be, random_f32(rng, R * N, -3, 3)), out = be.alloc(R * N);
    be.rmsnorm(x, w.t, R, N, 1e-5, out);
    keep(out, R * N);
    be.swiglu(x, out, R * N, out);
    keep(out, R * N);
    be.add(out, x, R * N);
    keep(out, R * N);
    be.free(x);
    be.free(out);
  }
  return all;
}

bool bit_identical(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(Determinism, BitIdenticalAcrossRunsAndThreadCounts) {
  for (Isa isa : cpu::available_isas()) {
    for (GemmImpl g : {GemmImpl::Own, GemmImpl::Blas}) {
      SCOPED_TRACE(strformat("variant %s_%s", cpu::isa_name(isa), cpu::gemm_impl_name(g)));
      std::vector<double> first;
      for (int threads : {1, 2, 3}) {
        cpu::CpuOptions o;
        o.threads = threads;
        o.isa = isa;
        o.gemm = g;
        auto be = cpu::make_cpu_backend(o);
        for (int rep = 0; rep < 2; ++rep) {
          SCOPED_TRACE(strformat("threads %d rep %d seed 42", threads, rep));
          std::vector<double> out = run_mix(*be, 42);
          for (double v : out) ASSERT_TRUE(std::isfinite(v));
          if (first.empty()) first = out;
          else EXPECT_TRUE(bit_identical(first, out));
        }
      }
    }
  }
}

}  // namespace
}  // namespace arbiter::test
