// Helpers for the backend op tests: seeded inputs, weight tensors in every storage dtype over
// test-owned buffers, buffer upload/download, NaN poisoning and the NMSE metric.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace arbiter::test {

/// Seeded uniform values in [lo, hi), rounded to f32 so that both tiers see the same inputs.
inline std::vector<double> random_f32(std::mt19937_64& rng, int64_t n, double lo = -1,
                                      double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = double(float(d(rng)));
  return v;
}

/// A weight tensor [rows, cols] stored as `dtype` in a test-owned byte buffer, made from
/// seeded uniform values in [-1, 1) (q8_0: ggml's scheme, d = amax / 127, q = round(v / d)).
struct OwnedTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
};

inline OwnedTensor make_weight(std::mt19937_64& rng, DType dtype, int64_t rows, int64_t cols,
                               const std::string& name = "w") {
  OwnedTensor o;
  const int64_t n = rows * cols;
  std::vector<double> v = random_f32(rng, n);
  o.bytes.resize(dtype_bytes(dtype, n));
  switch (dtype) {
    case DType::F64: {
      auto* p = reinterpret_cast<double*>(o.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = v[size_t(i)];
      break;
    }
    case DType::F32: {
      auto* p = reinterpret_cast<float*>(o.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = float(v[size_t(i)]);
      break;
    }
    case DType::F16: {
      auto* p = reinterpret_cast<uint16_t*>(o.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(float(v[size_t(i)]));
      break;
    }
    case DType::BF16: {
      auto* p = reinterpret_cast<uint16_t*>(o.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(float(v[size_t(i)]));
      break;
    }
    case DType::Q8_0: {
      auto* b = reinterpret_cast<BlockQ8_0*>(o.bytes.data());
      for (int64_t i = 0; i < n / kQ8BlockSize; ++i) {
        double amax = 0;
        for (int j = 0; j < kQ8BlockSize; ++j)
          amax = std::max(amax, std::fabs(v[size_t(i * kQ8BlockSize + j)]));
        const float d = float(amax / 127);
        b[i].d = f32_to_f16(d);
        const float dd = f16_to_f32(b[i].d);
        for (int j = 0; j < kQ8BlockSize; ++j) {
          const double q = dd > 0 ? std::nearbyint(v[size_t(i * kQ8BlockSize + j)] / dd) : 0;
          b[i].qs[j] = int8_t(std::max(-127.0, std::min(127.0, q)));
        }
      }
      break;
    }
  }
  o.t.name = name;
  o.t.dtype = dtype;
  o.t.shape = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
  o.t.data = o.bytes.data();
  return o;
}

/// Allocates a buffer of host.size() elements and writes host into it.
inline Buffer upload(Backend& be, const std::vector<double>& host, bool logits = false) {
  Buffer b = be.alloc(int64_t(host.size()), logits);
  be.write(b, 0, int64_t(host.size()), host.data());
  return b;
}

inline std::vector<double> download(Backend& be, const Buffer& b, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  be.read(b, 0, n, v.data());
  return v;
}

/// Fills the first n elements with NaN, so an element the op does not write fails the check.
inline void poison(Backend& be, Buffer& b, int64_t n) {
  std::vector<double> nan(size_t(n), std::numeric_limits<double>::quiet_NaN());
  be.write(b, 0, n, nan.data());
}

/// sum((cand - ref)^2) / sum(ref^2) and the worst element; non-finite candidates counted.
struct Nmse {
  double nmse = 0;
  int64_t nonfinite = 0;
  int64_t worst = -1;
  double worst_cand = 0, worst_ref = 0;
  std::string describe() const {
    char s[256];
    std::snprintf(s, sizeof s, "nmse %.3e, non-finite %lld, worst [%lld] cand %.9g ref %.9g",
                  nmse, (long long)nonfinite, (long long)worst, worst_cand, worst_ref);
    return s;
  }
};

inline Nmse nmse(const std::vector<double>& cand, const std::vector<double>& ref) {
  Nmse r;
  double num = 0, den = 0, worst_err = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(cand[i])) {
      if (r.nonfinite++ == 0) {
        r.worst = int64_t(i);
        r.worst_cand = cand[i];
        r.worst_ref = ref[i];
      }
      continue;
    }
    const double e = (cand[i] - ref[i]) * (cand[i] - ref[i]);
    num += e;
    den += ref[i] * ref[i];
    if (e > worst_err && !r.nonfinite) {
      worst_err = e;
      r.worst = int64_t(i);
      r.worst_cand = cand[i];
      r.worst_ref = ref[i];
    }
  }
  r.nmse = den > 0 ? num / den : (num > 0 ? std::numeric_limits<double>::infinity() : 0);
  return r;
}

}  // namespace arbiter::test
