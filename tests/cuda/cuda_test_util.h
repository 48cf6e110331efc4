// Shared pieces of the CUDA tier's tests: making the tier or skipping, the one tolerance
// table, seeded inputs representable in the compute dtype, host weight tensors, NMSE.
//
// Without a GPU (or without the tier built) every test says "SKIP: no CUDA device" with the
// reason; ARBITER_REQUIRE_CUDA=1 turns that skip into a failure (the GPU machine's check).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_factory.h"
#if ARBITER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/ref/ref_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/synth.h"
#include "model/model.h"
#include "test_util.h"

namespace arbiter::test {

inline bool require_cuda() {
  const char* v = std::getenv("ARBITER_REQUIRE_CUDA");
  return v && *v && std::strcmp(v, "0") != 0;
}

/// The CUDA tier, or nullptr with the reason when there is no device / no tier. Any other
/// failure (a bug in the tier's start-up) throws.
inline std::unique_ptr<Backend> try_make_cuda(const std::string& dtype, std::string& why) {
  try {
    return make_cuda_backend(0, dtype);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("no CUDA device") == std::string::npos &&
        msg.find("cuda tier not built") == std::string::npos)
      throw;
    why = msg;
    return nullptr;
  }
}

#if ARBITER_HAVE_CUDA
/// One decode-attention key split per n keys, up to 32 splits (tests that name their split
/// counts set it).
inline void set_attn_split_keys(Backend& be, int n) {
  CudaTuning t = cuda_tuning(be);
  t.attn_split_keys = n;
  t.attn_max_splits = 32;
  cuda_set_tuning(be, t);
}
/// The decode attention's query heads per block (1: a column per query head; 8: per KV head).
inline void set_attn_heads_per_block(Backend& be, int n) {
  CudaTuning t = cuda_tuning(be);
  t.attn_heads_per_block = n;
  cuda_set_tuning(be, t);
}
#endif

}  // namespace arbiter::test

/// Declares `var` = the CUDA tier in `dtype`, or skips the test ("SKIP: no CUDA device"),
/// or fails it when ARBITER_REQUIRE_CUDA=1.
#define ARB_CUDA_OR_SKIP(var, dtype)                                                     \
  std::unique_ptr<::arbiter::Backend> var;                                               \
  {                                                                                      \
    std::string why_;                                                                    \
    var = ::arbiter::test::try_make_cuda(dtype, why_);                                   \
    if (!var) {                                                                          \
      if (::arbiter::test::require_cuda())                                               \
        FAIL() << "ARBITER_REQUIRE_CUDA=1 but the CUDA tier is unavailable: " << why_;  \
      std::fprintf(stderr, "SKIP: no CUDA device (%s)\n", why_.c_str());                 \
      GTEST_SKIP() << "SKIP: no CUDA device (" << why_ << ")";                           \
    }                                                                                    \
  }

namespace arbiter::test {

// --- tolerance table ------------------------------------------------------------------------
// Unit roundoff of each compute dtype (half an ulp at 1): bf16 2^-8, f16 2^-11, f32 2^-24.
// Accumulation is f32 everywhere, so a reduction of length n adds a rounding-error variance
// of about n * u32^2 relative to the output's energy (random-sign error growth, sqrt(n) in
// the error, n in the squared error). One output rounding adds at most u_out^2. The bound on
// NMSE = sum (cuda - ref)^2 / sum ref^2 is therefore
//     kSafety * (u_out^2 + (n + kOpsSlack) * u32^2)
// with kOpsSlack covering a few f32 roundings inside the op (exp, divide, the RoPE cos/sin
// table) and kSafety a factor for the statistical model. Inputs are drawn representable in
// the compute dtype, so the ref tier sees exactly what the CUDA tier sees.
constexpr double kU32 = 0x1p-24;
constexpr double kSafety = 4.0;
constexpr double kOpsSlack = 16.0;

inline double unit_roundoff(const std::string& dtype) {
  if (dtype == "bf16") return 0x1p-8;
  if (dtype == "f16") return 0x1p-11;
  return kU32;
}
/// NMSE bound for an op whose output is rounded to `out_dtype` after f32 reductions of
/// length n (n = 0 for elementwise ops).
inline double nmse_bound(const std::string& out_dtype, double n) {
  const double u = unit_roundoff(out_dtype);
  return kSafety * (u * u + (n + kOpsSlack) * kU32 * kU32);
}

inline DType storage_of(const std::string& dtype) {
  return dtype == "bf16" ? DType::BF16 : dtype == "f16" ? DType::F16 : DType::F32;
}

/// Rounds x to the nearest value of `dtype` (as the CUDA tier stores it).
inline double round_to(const std::string& dtype, double x) {
  const float f = float(x);
  if (dtype == "bf16") return bf16_to_f32(f32_to_bf16(f));
  if (dtype == "f16") return f16_to_f32(f32_to_f16(f));
  return f;
}

/// n values ~ N(0, scale^2) rounded to dtype, from seed.
inline std::vector<double> random_values(int64_t n, uint64_t seed, double scale,
                                         const std::string& dtype) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = round_to(dtype, normal(rng));
  return v;
}

/// A weight tensor with its own storage (values as given, stored in `storage`).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
};

/// Stores values [shape] in `storage` (F32, F16, BF16 or Q8_0; Q8_0 quantises per block of
/// 32 with d = max|x| / 127 like ggml). Returns the tensor; `exact` gets the values the
/// storage actually holds (what both tiers see).
inline std::unique_ptr<HostTensor> make_tensor(const std::string& name,
                                               std::vector<int64_t> shape,
                                               const std::vector<double>& values, DType storage,
                                               std::vector<double>* exact = nullptr) {
  auto h = std::make_unique<HostTensor>();
  h->t.name = name;
  h->t.dtype = storage;
  h->t.shape = std::move(shape);
  const int64_t n = h->t.numel();
  h->bytes.resize(dtype_bytes(storage, n));
  uint8_t* p = h->bytes.data();
  switch (storage) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        float f = float(values[i]);
        std::memcpy(p + i * 4, &f, 4);
      }
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t u = storage == DType::F16 ? f32_to_f16(float(values[i]))
                                           : f32_to_bf16(float(values[i]));
        std::memcpy(p + i * 2, &u, 2);
      }
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / kQ8BlockSize; ++b) {
        double amax = 0;
        for (int i = 0; i < kQ8BlockSize; ++i)
          amax = std::max(amax, std::fabs(values[b * kQ8BlockSize + i]));
        const float d = float(amax / 127.0);
        BlockQ8_0 blk;
        blk.d = f32_to_f16(d);
        const float dd = f16_to_f32(blk.d);
        for (int i = 0; i < kQ8BlockSize; ++i)
          blk.qs[i] = int8_t(dd > 0 ? std::lround(values[b * kQ8BlockSize + i] / dd) : 0);
        std::memcpy(p + b * sizeof(BlockQ8_0), &blk, sizeof blk);
      }
      break;
    case DType::F64:
      std::memcpy(p, values.data(), size_t(n) * 8);
      break;
  }
  h->t.data = h->bytes.data();
  if (exact) {
    exact->resize(size_t(n));
    row_to_f64(storage, h->t.data, exact->data(), n);
  }
  return h;
}

/// Result of comparing a CUDA output with the ref output.
struct Compare {
  double nmse = 0;
  double max_abs = 0;
  int64_t worst = -1;
  int64_t nan = 0;  // non-finite values in the CUDA output
};

inline Compare compare(const std::vector<double>& cuda, const std::vector<double>& ref) {
  Compare c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(cuda[i])) {
      ++c.nan;
      continue;
    }
    const double d = cuda[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (std::fabs(d) > c.max_abs) {
      c.max_abs = std::fabs(d);
      c.worst = int64_t(i);
    }
  }
  c.nmse = den > 0 ? num / den : num;
  return c;
}

/// Reads a whole buffer.
inline std::vector<double> read_all(Backend& be, const Buffer& b, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  be.read(b, 0, n, v.data());
  return v;
}

/// Writes NaN over a whole buffer (so an element the op forgets to write shows up).
inline void poison(Backend& be, Buffer& b) {
  std::vector<double> nan(size_t(b.n), std::nan(""));
  be.write(b, 0, b.n, nan.data());
}

/// A model with random bf16 weights (uniform, small) of the given shape; norms are 1.
struct SyntheticModel {
  std::vector<uint16_t> store;
  Model m;
  int64_t matrix_params = 0;  // elements of every matrix read per token (layers + lm_head)
};

/// n_layer layers of Qwen3-0.6B's shape (arbiter synth's preset; 28 in the real model).
inline std::unique_ptr<SyntheticModel> synthetic_qwen3_06b(int n_layer = 28) {
  auto s = std::make_unique<SyntheticModel>();
  ModelConfig& c = s->m.config;
  c = synth_preset("qwen3-0.6b").config;
  c.n_layer = n_layer;
  Model& m = s->m;
  m.arch = &arch_of(c.arch);
  m.weights.specs = m.arch->tensors(c);
  m.weights.resize(m.arch->global_slots(), c.n_layer, m.arch->layer_slots());
  int64_t total = 0;
  for (const TensorSpec& sp : m.weights.specs)
    if (!sp.tie_to) total += sp.shape.size() == 2 ? sp.shape[0] * sp.shape[1] : sp.shape[0];
  s->store.resize(size_t(total));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  int64_t off = 0;
  for (const TensorSpec& sp : m.weights.specs) {
    if (sp.tie_to) continue;  // lm_head: the embedding (tied, below)
    const bool norm = sp.kind == TensorKind::Norm;
    const int64_t n = sp.shape.size() == 2 ? sp.shape[0] * sp.shape[1] : sp.shape[0];
    Tensor& t = m.weights.at(sp);
    t.name = sp.hf;
    t.dtype = DType::BF16;
    t.shape = sp.shape;
    t.data = s->store.data() + off;
    for (int64_t i = 0; i < n; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      const float u = float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);  // [-1, 1)
      s->store[size_t(off + i)] = f32_to_bf16(norm ? 1.0f : 0.04f * u);
    }
    if (!norm && sp.role != "embed") s->matrix_params += n;
    off += n;
  }
  for (const TensorSpec& sp : m.weights.specs)
    if (sp.tie_to) m.weights.at(sp) = *m.weights.find(sp.tie_to);  // tied
  s->matrix_params += int64_t(c.vocab) * c.d_model;
  return s;
}

}  // namespace arbiter::test
