#include "backend/cpu/probes.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>

#include "backend/cpu/simd.h"
#include "core/error.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace arbiter::cpu {

namespace {

using Clock = std::chrono::steady_clock;

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double thread_cpu_seconds() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int resolve_threads(int t) { return t > 0 ? t : int(std::max(1u, std::thread::hardware_concurrency())); }

// Reads [p, p + n) (n a multiple of 256 bytes) and folds it into a value the compiler must
// keep. Several independent accumulators keep enough loads in flight.
uint64_t read_sweep(const uint8_t* p, size_t n) {
#if defined(__AVX512F__)
  __m512i a0 = _mm512_set1_epi64(0), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t v[8];
  _mm512_store_si512(v, a0);
  return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
#elif defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), a0);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
#else
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < n / 8; i += 4) {
    a0 ^= q[i];
    a1 ^= q[i + 1];
    a2 ^= q[i + 2];
    a3 ^= q[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
#endif
}

std::atomic<uint64_t> g_sink{0};

// Runs fn(k) on k = 0..threads-1, all released together; returns the wall time from the
// release to the last one finishing.
double run_together(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> th;
  for (int k = 1; k < threads; ++k)
    th.emplace_back([&, k] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(k);
    });
  while (ready.load() < threads - 1) {
  }
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  fn(0);
  for (auto& t : th) t.join();
  return secs(t0, Clock::now());
}

// The FMA peak: kFmaAccumulators independent chains acc = acc * a + b per thread. 12
// chains cover the FMA latency times the FMA ports of current x86 cores (4 cycles x 2
// ports = 8 on Intel and on Zen 4's 256-bit halves); more would only add register
// pressure. a and b come from a volatile so the compiler cannot fold the chain, and
// acc converges to b / (1 - a) = 1, so no value turns subnormal or infinite. The scalar
// twin's 12 chains are vectorised by GCC (as its GEMM's scalar code may be): its figure is
// what code written with VScalar reaches, not the rate of one lane.
constexpr int kFmaAccumulators = 12;
constexpr int64_t kFmaIters = int64_t(1) << 22;  // 50 M FMAs per thread: ~15-30 ms a pass
using FmaLoop = float (*)(int64_t iters);

template <class V>
float fma_loop(int64_t iters) {
  using R = typename V::R;
  static volatile float va = 0.5f, vb = 0.5f;
  const R a = V::set1(va), b = V::set1(vb);
  R acc[kFmaAccumulators];
  for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = V::set1(float(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = V::fma(acc[i], a, b);
  }
  R s = acc[0];
  for (int i = 1; i < kFmaAccumulators; ++i) s = V::add(s, acc[i]);
  return V::reduce_add(s);
}

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
// The integer GEMM's instruction (qgemm.cpp): the same chains of vpdpbusd, 64 u8 x s8
// multiply-adds each; the int32 sums wrap harmlessly.
float dpbusd_loop(int64_t iters) {
  static volatile int32_t va = 0x01010101, vb = 0x01010101;
  const __m512i a = _mm512_set1_epi32(va), b = _mm512_set1_epi32(vb);
  __m512i acc[kFmaAccumulators];
  for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  // Lane 0 of the lanes' sum is the sink: the header's _mm512_reduce_add_epi32 adds in
  // scalar int, which overflows (undefined behaviour, UBSan) where the vector adds wrap.
  __m512i s = acc[0];
  for (int i = 1; i < kFmaAccumulators; ++i) s = _mm512_add_epi32(s, acc[i]);
  return float(_mm_cvtsi128_si32(_mm512_castsi512_si128(s)));
}
#endif

#ifdef ARBITER_CPU_AVX2
// AVX2's integer GEMM (qgemm.cpp IAvx2): vpmaddubsw, 32 u8 x s8 multiply-adds an instruction
// into 16-bit pairs (the GEMM adds several before one vpmaddwd widens them). Products of fresh
// operands (a is "changed" every iteration, so none can be hoisted) into kInt8Chains chains
// of one 16-bit add each; the sums wrap harmlessly. Chains through the multiplies (x <-
// maddubs(a, x)) were latency-bound and spilled (Zen 3, session 44).
constexpr int kInt8Chains = 4;
float maddubs_loop(int64_t iters) {
  static volatile int32_t va = 0x01010101;
  alignas(32) static const int8_t b[kInt8Chains][32] = {{1}, {2}, {3}, {4}};
  __m256i a = _mm256_set1_epi32(va);
  __m256i acc[kInt8Chains];
  for (int i = 0; i < kInt8Chains; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+x"(a));
#pragma GCC unroll 8
    for (int i = 0; i < kInt8Chains; ++i) {
      const __m256i bi = _mm256_load_si256(reinterpret_cast<const __m256i*>(b[i]));
      acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(a, bi));
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < kInt8Chains; ++i) s = _mm256_add_epi16(s, acc[i]);
  return float(_mm_cvtsi128_si32(_mm256_castsi256_si128(s)));
}
#endif

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
// gemm_bf16_dot's instruction: chains of vdpbf16ps, 32 bf16 multiply-adds each.
float dpbf16_loop(int64_t iters) {
  static volatile int32_t va = 0x3f803f80;  // the pair (1, 1)
  const __m512bh a = __m512bh(_mm512_set1_epi32(va)), b = a;
  __m512 acc[kFmaAccumulators];
  for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kFmaAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kFmaAccumulators; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}
#endif

// `passes` timed rates of `loop` (after one shorter untimed pass), `ops` operations per
// iteration, on `threads` threads released together.
std::vector<double> loop_rates(FmaLoop loop, double ops, int threads, int passes) {
  // Each thread's rate over its own CPU time, summed: on a shared host a pass of tens of
  // milliseconds spans time slices given to other processes, and a wall-clock rate then
  // reads far below what a GEMM reaches within one slice (measured at load average 12:
  // 20 GFLOP/s against a 77 GFLOP/s GEMM on one thread). CPU time counts only the cycles
  // the thread ran, so the figure stays the hardware's rate and remains a bound.
  const double total = ops * double(kFmaIters);
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<double> rate(static_cast<size_t>(threads));
  run_together(threads, [&](int k) { sink[size_t(k)] = loop(kFmaIters / 8); });  // warm-up: clocks up
  std::vector<double> out;
  for (int pass = 0; pass < passes; ++pass) {
    run_together(threads, [&](int k) {
      const double t0 = thread_cpu_seconds();
      sink[size_t(k)] = loop(kFmaIters);
      rate[size_t(k)] = total / (thread_cpu_seconds() - t0);
    });
    double sum = 0;
    for (double r : rate) sum += r;
    out.push_back(sum / 1e9);
  }
  for (float v : sink) g_sink.fetch_xor(uint64_t(v != 0.f), std::memory_order_relaxed);
  return out;
}

}  // namespace

std::vector<double> measure_host_read_bandwidth(size_t bytes, int threads, int passes) {
  threads = resolve_threads(threads);
  const size_t slice_align = 4096;
  bytes -= bytes % (slice_align * size_t(threads));
  ARB_CHECK(bytes > 0 && passes >= 1, "[cpu] bandwidth probe: bad size %zu or passes %d", bytes, passes);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ARB_CHECK(mem != MAP_FAILED, "[cpu] bandwidth probe: cannot map %zu bytes (%s)", bytes, std::strerror(errno));
  // Transparent huge pages: with 4 KiB pages the same read runs at about half the speed
  // here (MEASUREMENTS.md), and weights worth streaming are kept in such memory.
  ::madvise(mem, bytes, MADV_HUGEPAGE);
  auto* p = static_cast<uint8_t*>(mem);
  const size_t slice = bytes / size_t(threads);
  std::vector<double> out;
  // First touch by the thread that later reads the slice (NUMA locality where it matters).
  run_together(threads, [&](int k) { std::memset(p + size_t(k) * slice, k + 1, slice); });
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<uint64_t> sink(static_cast<size_t>(threads), 0);
    const double t = run_together(threads, [&](int k) { sink[size_t(k)] = read_sweep(p + size_t(k) * slice, slice); });
    for (uint64_t v : sink) g_sink.fetch_xor(v, std::memory_order_relaxed);
    out.push_back(double(bytes) / t / 1e9);
  }
  ::munmap(mem, bytes);
  return out;
}

std::vector<double> measure_fma_gflops(Isa isa, int threads, int passes) {
  threads = resolve_threads(threads);
  ARB_CHECK(passes >= 1, "[cpu] FMA probe: bad passes %d", passes);
  FmaLoop loop = nullptr;
  int lanes = 0;
  switch (isa) {
    case Isa::Scalar: loop = fma_loop<VScalar>, lanes = VScalar::W; break;
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: loop = fma_loop<VAvx2>, lanes = VAvx2::W; break;
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: loop = fma_loop<VAvx512>, lanes = VAvx512::W; break;
#endif
    default: break;
  }
  ARB_CHECK(loop != nullptr, "[cpu] FMA probe: ISA %s not compiled in", isa_name(isa));
  return loop_rates(loop, 2.0 * lanes * kFmaAccumulators, threads, passes);
}

std::vector<double> measure_int8_gops(Isa isa, int threads, int passes) {
  threads = resolve_threads(threads);
  ARB_CHECK(passes >= 1, "[cpu] int8 probe: bad passes %d", passes);
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
  if (isa == Isa::Avx512) return loop_rates(dpbusd_loop, 2.0 * 64 * kFmaAccumulators, threads, passes);
#endif
#ifdef ARBITER_CPU_AVX2
  if (isa == Isa::Avx2) return loop_rates(maddubs_loop, 2.0 * 32 * kInt8Chains, threads, passes);
#endif
  ARB_CHECK(false, "[cpu] int8 probe: no integer GEMM for %s in this build", isa_name(isa));
  return {};
}

std::vector<double> measure_bf16_dot_gflops(int threads, int passes) {
  threads = resolve_threads(threads);
  ARB_CHECK(passes >= 1, "[cpu] bf16 dot probe: bad passes %d", passes);
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
  return loop_rates(dpbf16_loop, 2.0 * 32 * kFmaAccumulators, threads, passes);
#else
  ARB_CHECK(false, "[cpu] bf16 dot probe: this build has no AVX512-BF16");
  return {};
#endif
}

std::string bf16_dot_probe_source(int threads, int passes) {
  return strformat("bf16 pair-dot peak of avx512 (vdpbf16ps, 2 FLOPs per multiply-add), %d threads released "
                   "together, %d register chains each, %d passes per rep",
                   resolve_threads(threads), kFmaAccumulators, passes);
}

std::string int8_probe_source(Isa isa, int threads, int passes) {
  return strformat("8-bit dot peak of %s (%s, 2 ops per multiply-add), %d threads released together, "
                   "%d register chains each, %d passes per rep",
                   isa_name(isa), isa == Isa::Avx512 ? "vpdpbusd" : "vpmaddubsw",
                   resolve_threads(threads), isa == Isa::Avx512 ? kFmaAccumulators : kInt8Chains, passes);
}

std::string fma_probe_source(Isa isa, int threads, int passes) {
  return strformat("f32 FMA peak of %s, %d threads released together, %d register FMA chains each, %d passes per rep",
                   isa_name(isa), resolve_threads(threads), kFmaAccumulators, passes);
}

}  // namespace arbiter::cpu
