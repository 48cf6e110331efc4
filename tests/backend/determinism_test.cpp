// The CPU tier is deterministic: every op gives bit-identical outputs on repeated runs and for
// 1, 2 and 3 threads, for every kernel variant (each output element is computed by one thread
// with a fixed reduction order; see src/core/thread_pool.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "tier_util.h"

namespace arbiter::test {
namespace {

using cpu::GemmImpl;
using cpu::Isa;

// Runs a fixed mix of ops on a fresh backend and returns all their outputs, concatenated.
std::vector<double> run_mix(Backend& be, uint64_t seed) {
  std::vector<double> all;
  auto keep = [&](const Buf& b) {
    const std::vector<double> v = b.read();
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
    auto w = make_tensor("w", {m.N, m.K}, values(m.N * m.K, ++seed, 0.05, DType::F32), m.dt);
    Buf x(be, values(m.T * m.K, ++seed, 1.0, DType::F32)), out(be, m.T * m.N);
    be.matmul(x.b, w->t, nullptr, m.T, out.b);
    keep(out);
  }
  {  // attention: prefill-shaped and decode-shaped
    const int H = 8, Hkv = 2, Dh = 64, ctx = 70;
    Buf kc(be, values(ctx * Hkv * Dh, ++seed, 1.0, DType::F32));
    Buf vc(be, values(ctx * Hkv * Dh, ++seed, 1.0, DType::F32));
    for (int T : {19, 1}) {
      Buf q(be, values(T * H * Dh, ++seed, 1.0, DType::F32)), out(be, T * H * Dh);
      be.attention(q.b, kc.b, vc.b, T, ctx - T, H, Hkv, Dh, 0, out.b);
      keep(out);
    }
  }
  {  // rmsnorm over many rows, swiglu and add over more than one parallel chunk
    const int R = 300, N = 2048;
    auto w = make_tensor("norm", {N}, values(N, ++seed, 1.0, DType::F32), DType::BF16);
    Buf x(be, values(R * N, ++seed, 1.5, DType::F32)), out(be, R * N);
    be.rmsnorm(x.b, w->t, R, N, 1e-5, out.b);
    keep(out);
    be.swiglu(x.b, out.b, R * N, out.b);
    keep(out);
    be.add(out.b, x.b, R * N);
    keep(out);
  }
  {  // Mamba2's scan: a chunked prefill over 3 chunks (heads across the pool, a worker's C.B
     // reused for the heads of a group it holds), then the decode step
    const int nh = 8, hd = 16, G = 2, N = 32, chunk = 16, width = nh * hd + 2 * G * N;
    auto a_log = make_tensor("A_log", {nh}, values(nh, ++seed, 1.0, DType::F32), DType::F32);
    auto d = make_tensor("D", {nh}, values(nh, ++seed, 1.0, DType::F32), DType::F32);
    auto dt_bias = make_tensor("dt_bias", {nh}, values(nh, ++seed, 1.0, DType::F32), DType::F32);
    Buf state(be, values(nh * hd * N, ++seed, 1.0, DType::F32), true);
    for (int T : {37, 1}) {
      Buf xbc(be, values(T * width, ++seed, 1.0, DType::F32));
      Buf dt(be, values(T * nh, ++seed, 2.0, DType::F32)), y(be, T * nh * hd);
      be.ssm_scan(xbc.b, dt.b, a_log->t, d->t, dt_bias->t, 0, INFINITY, T, nh, hd, G, N, chunk,
                  state.b, y.b);
      keep(y);
      keep(state);
    }
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
