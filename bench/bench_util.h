// Helpers for the benchmarks: memory on transparent huge pages and fast pseudo-random fills.
#pragma once
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "core/dtype.h"

namespace arbiter::bench {

/// bytes of anonymous memory on 2 MiB transparent huge pages (THP is in madvise mode on the
/// dev machine; 4 KiB pages stream at about half the bandwidth), touched so that page faults
/// are not timed. huge = false keeps 4 KiB pages (what a file mmap of a checkpoint gets).
struct HugeBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  HugeBuffer() = default;
  HugeBuffer(size_t n, bool huge = true) : bytes((n + (2u << 20) - 1) / (2u << 20) * (2u << 20)) {
    ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) throw std::bad_alloc();
    madvise(ptr, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(ptr, 0, bytes);
  }
  HugeBuffer(HugeBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  HugeBuffer& operator=(HugeBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~HugeBuffer() {
    if (ptr) munmap(ptr, bytes);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

/// xorshift64*: a uniform float in [-scale, scale).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float next(float scale = 1) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const uint64_t r = s * 0x2545F4914F6CDD1Dull;
    return (float(r >> 40) / float(1 << 24) * 2 - 1) * scale;
  }
};

/// Fills n elements of dtype t (q8_0: n a multiple of 32) with values in [-scale, scale).
inline void fill_random(DType t, void* dst, int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = rng.next(scale);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(rng.next(scale));
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(rng.next(scale));
      break;
    case DType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / kQ8BlockSize; ++i) {
        b[i].d = f32_to_f16(scale / 127);
        for (int j = 0; j < kQ8BlockSize; ++j) b[i].qs[j] = int8_t(rng.next(127));
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace arbiter::bench
