// Shared pieces of the CUDA tier's tests: making the tier or skipping, its tuning switches,
// a synthetic Qwen3-0.6B-shaped model. Inputs, tensors and the tolerance rule are
// tests/tier_util.h's.
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
#include "tier_util.h"

namespace arbiter::test {

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
      if (::arbiter::test::cuda_required())                                               \
        FAIL() << "ARBITER_REQUIRE_CUDA=1 but the CUDA tier is unavailable: " << why_;  \
      std::fprintf(stderr, "SKIP: no CUDA device (%s)\n", why_.c_str());                 \
      GTEST_SKIP() << "SKIP: no CUDA device (" << why_ << ")";                           \
    }                                                                                    \
  }

namespace arbiter::test {

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
