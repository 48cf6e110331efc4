// CPU-tier kernel benchmarks and the physical limits they are judged against, in one binary:
//   stream_read   streaming read bandwidth (the decode limit), 1 GiB, huge or 4 KiB pages
//   fma_peak      f32 FMA peak at the best ISA, the tier's own probe (the compute limit)
//   sgemm_openblas  OpenBLAS sgemm 2048^3 with its own threads (the "measured GEMM peak")
//   gemv/...      our GEMV per dtype and ISA at llama-3.2-1B shapes, over a 1 GiB set of
//                 weight copies so that every call streams from DRAM (bytes/s)
//   qgemv/...     the block formats' integer GEMV, the same way (bytes/s of packed weights)
//   qgemv_hot/... the same on one matrix that stays in L2 (256 x 2048), one thread: the
//                 kernel's own rate, which the DRAM runs above only show when it is the bound
//   gemm/...      T = 512 and T = 64 GEMMs, own kernel vs OpenBLAS on widened panels (FLOP/s)
//   qgemm/...     the same shapes through the integer GEMM of the k-quants and Q8_0 (AVX2,
//                 AVX512-VNNI), x's quantization and packing included as the tier runs them
//   gemm_bf16_dot/...  the same shapes on bf16 weights with x rounded to bf16 (AVX512-BF16
//                 builds), x's rounding included as the tier runs it
// Run: build-<name>/bench/arbiter_bench --benchmark_filter=... (see bench/README.md).
// The dev machine is shared and noisy: use --benchmark_repetitions and read medians.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/probes.h"
#include "bench_util.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace arbiter::bench {
namespace {

using cpu::GemmImpl;
using cpu::Isa;

constexpr size_t kGiB = size_t(1) << 30;

ThreadPool& pool(int threads) {
  static ThreadPool p1(1), p2(2);
  return threads == 1 ? p1 : p2;
}

// ---------------------------------------------------------------------------------------------
void stream_read(benchmark::State& state, int threads, bool huge) {
  HugeBuffer buf(kGiB, huge);
  const int64_t n = int64_t(buf.bytes / sizeof(float));
  const float* p = buf.as<float>();
  std::vector<float> sink(64);
  for (auto _ : state) {
    pool(threads).parallel_for(threads, [&](int64_t b, int64_t) {
      const int64_t lo = n * b / threads, hi = n * (b + 1) / threads;
#ifdef __AVX512F__
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = lo; i + 64 <= hi; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
      }
      sink[size_t(b)] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
      float s = 0;
      for (int64_t i = lo; i < hi; ++i) s += p[i];
      sink[size_t(b)] = s;
#endif
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(buf.bytes));
}

// The tier's own probe (backend/cpu/probes.h), so bench and `arbiter bench` share one limit.
void fma_peak(benchmark::State& state, int threads) {
  const Isa isa = cpu::best_isa();
  for (auto _ : state) {
    state.counters["FLOP/s"] = cpu::measure_fma_gflops(isa, threads, 1).front() * 1e9;
  }
}

void sgemm_openblas(benchmark::State& state, int threads) {
  const int n = 2048;
  HugeBuffer a(size_t(n) * n * 4), b(size_t(n) * n * 4), c(size_t(n) * n * 4);
  fill_random(DType::F32, a.ptr, int64_t(n) * n, 1, 1);
  fill_random(DType::F32, b.ptr, int64_t(n) * n, 2, 1);
  openblas_set_num_threads(threads);
  for (auto _ : state)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a.as<float>(), n,
                b.as<float>(), n, 0.f, c.as<float>(), n);
  openblas_set_num_threads(1);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------------
void gemv(benchmark::State& state, DType dt, Isa isa, int threads, int64_t N, int64_t K) {
  const size_t mat_bytes = dtype_bytes(dt, N * K);
  const int copies = int(std::max<size_t>(1, kGiB / mat_bytes));
  HugeBuffer w(mat_bytes * size_t(copies));
  fill_random(dt, w.ptr, N * K * copies, 3, 0.05f);
  std::vector<float> x(static_cast<size_t>(K), 0.01f), y(static_cast<size_t>(N));
  const cpu::GemvFn fn = cpu::gemv_kernel(isa, dt);
  int c = 0;
  for (auto _ : state) {
    const uint8_t* wc = w.as<uint8_t>() + mat_bytes * size_t(c);
    pool(threads).parallel_for(N, [&](int64_t n0, int64_t n1) {
      fn(wc, K, x.data(), y.data(), n0, n1);
    });
    c = (c + 1) % copies;
  }
  benchmark::DoNotOptimize(y.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(mat_bytes));
}

// The integer GEMV of the block formats (x quantized to 8 bits once per call, as the tier
// does), over copies of one matrix of normal weights quantized to dt (one copy when hot).
void qgemv(benchmark::State& state, DType dt, Isa isa, int threads, int64_t N, int64_t K,
           bool hot = false) {
  const size_t mat_bytes = dtype_bytes(dt, N * K);
  const int copies = hot ? 1 : int(std::max<size_t>(1, kGiB / mat_bytes));
  HugeBuffer w(mat_bytes * size_t(copies));
  {
    std::vector<float> wf(static_cast<size_t>(N * K));
    fill_random(DType::F32, wf.data(), N * K, 3, 0.05f);
    quantize_blocks(dt, wf.data(), N * K / block_elems(dt), w.as<uint8_t>());
  }
  for (int c = 1; c < copies; ++c) std::memcpy(w.as<uint8_t>() + mat_bytes * size_t(c), w.ptr, mat_bytes);
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  fill_random(DType::F32, x.data(), K, 4, 1);
  const cpu::QGemvFn fn = cpu::qgemv_kernel(isa, dt);
  cpu::ActQ8 xa;
  int c = 0;
  for (auto _ : state) {
    const uint8_t* wc = w.as<uint8_t>() + mat_bytes * size_t(c);
    cpu::quantize_act_q8(x.data(), K, cpu::act_q8_block(dt), xa);
    pool(threads).parallel_for(N, [&](int64_t n0, int64_t n1) { fn(wc, K, xa, y.data(), n0, n1); });
    c = (c + 1) % copies;
  }
  benchmark::DoNotOptimize(y.data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(mat_bytes));
}

void gemm(benchmark::State& state, GemmImpl impl, DType dt, Isa isa, int threads, int64_t T,
          int64_t N, int64_t K) {
  HugeBuffer w(dtype_bytes(dt, N * K)), x(size_t(T * K) * 4), out(size_t(T * N) * 4);
  fill_random(dt, w.ptr, N * K, 4, 0.05f);
  fill_random(DType::F32, x.ptr, T * K, 5, 1);
  cpu::GemmProblem p;
  p.x = x.as<float>();
  p.W = w.ptr;
  p.wtype = dt;
  p.out = out.as<float>();
  p.T = T;
  p.N = N;
  p.K = K;
  for (auto _ : state) {
    if (impl == GemmImpl::Own) cpu::gemm_own(isa, p, pool(threads));
    else cpu::gemm_blas(isa, p, pool(threads));
  }
  benchmark::DoNotOptimize(out.ptr);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * T * N * K,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// The integer GEMM as the tier runs it: each token quantized and the panels packed, then the
// rows split over the threads at multiples of kQGemmRows.
void qgemm(benchmark::State& state, DType dt, Isa isa, int threads, int64_t T, int64_t N, int64_t K) {
  HugeBuffer w(dtype_bytes(dt, N * K)), out(size_t(T * N) * 4);
  {
    std::vector<float> wf(static_cast<size_t>(N * K));
    fill_random(DType::F32, wf.data(), N * K, 3, 0.05f);
    quantize_blocks(dt, wf.data(), N * K / block_elems(dt), w.as<uint8_t>());
  }
  std::vector<float> x(static_cast<size_t>(T * K));
  fill_random(DType::F32, x.data(), T * K, 5, 1);
  const cpu::QGemmFn fn = cpu::qgemm_kernel(isa, dt, K);
  std::vector<cpu::ActQ8> xa(static_cast<size_t>(T));
  cpu::ActQ8Panels panels;
  const int64_t tiles = (N + cpu::kQGemmRows - 1) / cpu::kQGemmRows;
  for (auto _ : state) {
    for (int64_t t = 0; t < T; ++t)
      cpu::quantize_act_q8(x.data() + t * K, K, cpu::act_q8_block(dt), xa[size_t(t)]);
    cpu::pack_act_q8(xa.data(), T, panels);
    pool(threads).parallel_for(tiles, [&](int64_t t0, int64_t t1) {
      fn(w.ptr, N, K, panels, out.as<float>(), t0 * cpu::kQGemmRows, std::min(N, t1 * cpu::kQGemmRows));
    });
  }
  benchmark::DoNotOptimize(out.ptr);
  state.counters["OP/s"] = benchmark::Counter(2.0 * T * N * K, benchmark::Counter::kIsIterationInvariantRate);
}

void gemm_bf16_dot(benchmark::State& state, int threads, int64_t T, int64_t N, int64_t K) {
  HugeBuffer w(dtype_bytes(DType::BF16, N * K)), x(size_t(T * K) * 4), out(size_t(T * N) * 4);
  fill_random(DType::BF16, w.ptr, N * K, 4, 0.05f);
  fill_random(DType::F32, x.ptr, T * K, 5, 1);
  std::vector<uint16_t> xb(static_cast<size_t>(T * K));
  cpu::GemmProblem p;
  p.W = w.ptr;
  p.wtype = DType::BF16;
  p.out = out.as<float>();
  p.T = T;
  p.N = N;
  p.K = K;
  for (auto _ : state) {
    cpu::round_act_bf16(x.as<float>(), T * K, xb.data());
    cpu::gemm_bf16_dot(xb.data(), p, pool(threads));
  }
  benchmark::DoNotOptimize(out.ptr);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * T * N * K,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// llama-3.2-1B: D 2048, F 8192, Hkv*Dh 512.
struct Shape {
  int64_t N, K;
};
const Shape kShapes[] = {{2048, 8192}, {8192, 2048}, {512, 2048}};

void register_all() {
  for (int th : {1, 2}) {
    for (bool huge : {true, false})
      benchmark::RegisterBenchmark(
          ("stream_read/" + std::string(huge ? "huge" : "4k") + "/threads:" + std::to_string(th)).c_str(),
          [=](benchmark::State& s) { stream_read(s, th, huge); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("fma_peak/threads:" + std::to_string(th)).c_str(),
                                 [=](benchmark::State& s) { fma_peak(s, th); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("sgemm_openblas/2048/threads:" + std::to_string(th)).c_str(),
                                 [=](benchmark::State& s) { sgemm_openblas(s, th); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (DType dt : {DType::BF16, DType::F32, DType::F16, DType::Q8_0})
    for (Isa isa : cpu::available_isas())
      for (int th : {1, 2})
        for (const Shape& sh : kShapes) {
          std::string name = std::string("gemv/") + dtype_name(dt) + "/" + cpu::isa_name(isa) +
                             "/threads:" + std::to_string(th) + "/N:" + std::to_string(sh.N) +
                             "/K:" + std::to_string(sh.K);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            gemv(s, dt, isa, th, sh.N, sh.K);
          })->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K,
                   DType::Q2_K, DType::IQ4_XS})
    for (Isa isa : cpu::available_isas())
      for (int th : {1, 2})
        for (const Shape& sh : kShapes) {
          std::string name = std::string("qgemv/") + dtype_name(dt) + "/" + cpu::isa_name(isa) +
                             "/threads:" + std::to_string(th) + "/N:" + std::to_string(sh.N) +
                             "/K:" + std::to_string(sh.K);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            qgemv(s, dt, isa, th, sh.N, sh.K);
          })->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K,
                   DType::Q2_K, DType::IQ4_XS})
    for (Isa isa : cpu::available_isas())
      benchmark::RegisterBenchmark(
          (std::string("qgemv_hot/") + dtype_name(dt) + "/" + cpu::isa_name(isa) +
           "/threads:1/N:256/K:2048").c_str(),
          [=](benchmark::State& s) { qgemv(s, dt, isa, 1, 256, 2048, /*hot=*/true); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
  // T 512 at llama-3.2-1B's shapes; T 64 (bench's pp64, the CPU peer runs) at qwen3-0.6b's.
  struct GemmCase {
    int64_t T;
    Shape sh;
  };
  const GemmCase gemm_cases[] = {{512, kShapes[0]}, {512, kShapes[1]}, {512, kShapes[2]},
                                 {64, {3072, 1024}}, {64, {1024, 3072}}, {128, {3072, 1024}}, {256, {3072, 1024}}};
  for (GemmImpl impl : {GemmImpl::Own, GemmImpl::Blas})
    for (DType dt : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_K})
      for (Isa isa : cpu::available_isas())
        for (int th : {1, 2})
          for (const GemmCase& c : gemm_cases) {
            std::string name = std::string("gemm/") + cpu::gemm_impl_name(impl) + "/" +
                               dtype_name(dt) + "/" + cpu::isa_name(isa) + "/threads:" +
                               std::to_string(th) + "/T:" + std::to_string(c.T) + "/N:" +
                               std::to_string(c.sh.N) + "/K:" + std::to_string(c.sh.K);
            benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
              gemm(s, impl, dt, isa, th, c.T, c.sh.N, c.sh.K);
            })->UseRealTime()->Unit(benchmark::kMillisecond);
          }
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (Isa isa : cpu::available_isas())
      for (int th : {1, 2})
        for (const GemmCase& c : gemm_cases) {
          if (!cpu::qgemm_kernel(isa, dt, c.sh.K)) continue;
          benchmark::RegisterBenchmark(
              (std::string("qgemm/") + dtype_name(dt) + "/" + cpu::isa_name(isa) + "/threads:" +
               std::to_string(th) + "/T:" + std::to_string(c.T) + "/N:" + std::to_string(c.sh.N) +
               "/K:" + std::to_string(c.sh.K)).c_str(),
              [=](benchmark::State& s) { qgemm(s, dt, isa, th, c.T, c.sh.N, c.sh.K); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
  if (cpu::bf16_dot(Isa::Avx512))
    for (int th : {1, 2})
      for (const GemmCase& c : gemm_cases)
        benchmark::RegisterBenchmark(
            ("gemm_bf16_dot/threads:" + std::to_string(th) + "/T:" + std::to_string(c.T) +
             "/N:" + std::to_string(c.sh.N) + "/K:" + std::to_string(c.sh.K)).c_str(),
            [=](benchmark::State& s) { gemm_bf16_dot(s, th, c.T, c.sh.N, c.sh.K); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
}

const bool registered = (register_all(), true);

}  // namespace
}  // namespace arbiter::bench

BENCHMARK_MAIN();
