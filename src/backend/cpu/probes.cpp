#include "backend/cpu/probes.h"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>

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

std::vector<double> measure_sgemm_gflops(int n, int threads, int passes) {
  threads = resolve_threads(threads);
  ARB_CHECK(n >= 1 && passes >= 1, "[cpu] sgemm probe: bad n %d or passes %d", n, passes);
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(int(i % 13) - 6) * 0.01f;
    b[i] = float(int(i % 7) - 3) * 0.01f;
  }
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  std::vector<double> out;
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  gemm();  // warm-up: thread start, page faults
  for (int p = 0; p < passes; ++p) {
    const auto t0 = Clock::now();
    gemm();
    out.push_back(2.0 * double(n) * n * n / secs(t0, Clock::now()) / 1e9);
  }
  openblas_set_num_threads(saved);
  return out;
}

}  // namespace arbiter::cpu
