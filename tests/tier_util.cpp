#include "tier_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

#include "backend/cpu/kernels.h"
#include "backend/cuda_factory.h"
#include "core/quant.h"

namespace arbiter::test {

std::vector<OpTier> op_tiers(bool with_blas) {
  std::vector<OpTier> out;
  for (cpu::Isa isa : cpu::available_isas())
    for (cpu::GemmImpl g : {cpu::GemmImpl::Own, cpu::GemmImpl::Blas}) {
      if (g == cpu::GemmImpl::Blas && !with_blas) continue;
      OpTier t;
      t.name = std::string("cpu_") + cpu::isa_name(isa) +
               (g == cpu::GemmImpl::Blas ? "_blas" : "");
      t.compute = DType::F32;
      t.isa = isa;
      t.make = [isa, g] {
        cpu::CpuOptions o;
        o.threads = 2;
        o.isa = isa;
        o.gemm = g;
        return cpu::make_cpu_backend(o);
      };
      out.push_back(t);
    }
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    OpTier t;
    t.name = std::string("cuda_") + dtype_name(dt);
    t.compute = dt;
    t.cuda = true;
    t.make = [dt] { return make_cuda_backend(0, dtype_name(dt)); };
    out.push_back(t);
  }
  return out;
}

std::string op_tier_name(const testing::TestParamInfo<OpTier>& info) { return info.param.name; }

bool cuda_required() {
  const char* v = std::getenv("ARBITER_REQUIRE_CUDA");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::unique_ptr<Backend> make_or_skip(const OpTier& t, std::string& why) {
  if (!t.cuda) return t.make();
  try {
    return t.make();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("no CUDA device") == std::string::npos &&
        msg.find("cuda tier not built") == std::string::npos)
      throw;  // a bug in the tier's start-up
    why = msg;
    return nullptr;
  }
}

double round_to(DType type, double x) {
  const float f = float(x);
  if (type == DType::BF16) return bf16_to_f32(f32_to_bf16(f));
  if (type == DType::F16) return f16_to_f32(f32_to_f16(f));
  if (type == DType::F64) return x;
  return f;
}

std::vector<double> values(int64_t n, uint64_t seed, double scale, DType type) {
  // Standard normal draws are the expensive part of a large case: kept per (n, seed).
  static std::map<std::pair<int64_t, uint64_t>, std::vector<double>> draws;
  auto it = draws.find({n, seed});
  if (it == draws.end()) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> z(static_cast<size_t>(n));
    for (double& x : z) x = normal(rng);
    it = draws.emplace(std::make_pair(n, seed), std::move(z)).first;
  }
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = round_to(type, scale * it->second[i]);
  return v;
}

std::unique_ptr<HostTensor> make_tensor(const std::string& name, std::vector<int64_t> shape,
                                        const std::vector<double>& vals, DType storage) {
  auto h = std::make_unique<HostTensor>();
  h->t.name = name;
  h->t.dtype = storage;
  h->t.shape = std::move(shape);
  const int64_t n = h->t.numel();
  h->bytes.resize(dtype_bytes(storage, n));
  uint8_t* p = h->bytes.data();
  switch (storage) {
    case DType::F64:
      std::memcpy(p, vals.data(), size_t(n) * 8);
      break;
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        const float f = float(vals[size_t(i)]);
        std::memcpy(p + i * 4, &f, 4);
      }
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t u = storage == DType::F16 ? f32_to_f16(float(vals[size_t(i)]))
                                                 : f32_to_bf16(float(vals[size_t(i)]));
        std::memcpy(p + i * 2, &u, 2);
      }
      break;
    default: {
      // ggml's block formats: core/quant_encode.cpp's encoders (blocks never span rows).
      std::vector<float> f(vals.begin(), vals.end());
      quantize_blocks(storage, f.data(), n / block_elems(storage), p);
      break;
    }
  }
  h->t.data = h->bytes.data();
  return h;
}

bool reads_exactly(DType storage, DType compute) {
  // Formats with a min (x = d q + m) round once when widened to f32 (core/quant.h).
  const bool with_min = storage == DType::Q4_1 || storage == DType::Q5_1 || storage == DType::Q2_K ||
                        storage == DType::Q4_K || storage == DType::Q5_K || mlx_affine_bits(storage) > 0;
  return storage == compute || (compute == DType::F32 && storage != DType::F64 && !with_min);
}

std::vector<DType> weight_types(const OpTier& t) {
  // ggml's block formats: every tier reads them (cuda packed on the device, gemv_quant.cu).
  const DType ggml[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,
                        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,   DType::Q6_K,
                        DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};
  std::vector<DType> out;
  if (!t.cuda) {
    out = {DType::F32, DType::F16, DType::BF16};
    out.insert(out.end(), std::begin(ggml), std::end(ggml));
    // MLX's blocks: one affine width whose values straddle words (3), the common one (4) and
    // both fp blocks. The other widths run the same code with another `bits`; each is checked
    // by hand (tests/core/mlx_quant_test.cpp) and on every ISA (IsaTest.BlockGemvWithinDotBound),
    // which keeps this list's cost down.
    out.insert(out.end(), {DType::MLX_Q3, DType::MLX_Q4, DType::MLX_MXFP8, DType::MLX_NVFP4});
    return out;
  }
  out = {t.compute};
  if (t.compute != DType::F32) out.push_back(DType::F32);
  out.insert(out.end(), std::begin(ggml), std::end(ggml));
  return out;
}

int act_quant_block(const OpTier& tier, DType storage, int T, int64_t K) {
  if (tier.cuda) return 0;
  if (T == 1 || cpu::qgemm_kernel(tier.isa, storage, K)) return cpu::act_q8_block(storage);
  return 0;
}

double act_quant_nmse(const std::vector<double>& x, const Tensor& W, int64_t T, int64_t N,
                      int64_t K, int block) {
  std::vector<double> step(size_t(T * K)), w(static_cast<size_t>(K));
  for (int64_t i = 0; i < T * K; i += block) {
    double amax = 0;
    for (int64_t k = i; k < i + block; ++k) amax = std::max(amax, std::fabs(x[size_t(k)]));
    for (int64_t k = i; k < i + block; ++k) step[size_t(k)] = amax / 127 / 2;
  }
  double err = 0, sig = 0;
  for (int64_t n = 0; n < N; ++n) {
    row_to_f64(W.dtype, W.row(n), w.data(), K);
    for (int64_t t = 0; t < T; ++t) {
      double y = 0;
      for (int64_t k = 0; k < K; ++k) {
        y += x[size_t(t * K + k)] * w[size_t(k)];
        err += (w[size_t(k)] * step[size_t(t * K + k)]) * (w[size_t(k)] * step[size_t(t * K + k)]);
      }
      sig += y * y;
    }
  }
  return sig > 0 ? 4 * err / sig : 0;
}

Buf::Buf(Backend& backend, int64_t n, bool logits) : be(&backend), b(backend.alloc(n, logits)) {}
Buf::Buf(Backend& backend, const std::vector<double>& v, bool logits)
    : Buf(backend, int64_t(v.size()), logits) {
  be->write(b, 0, b.n, v.data());
}
std::vector<double> Buf::read() const {
  std::vector<double> v(static_cast<size_t>(b.n));
  be->read(b, 0, b.n, v.data());
  return v;
}
void Buf::poison() {
  const std::vector<double> nan(static_cast<size_t>(b.n), std::nan(""));
  be->write(b, 0, b.n, nan.data());
}

double nmse_bound(DType out, DType compute, int64_t n, double c, int m) {
  const double uo = unit_roundoff(out), ua = roundoff_of(compute).accum;
  return 4 * (1 + m) * uo * uo + 8 * (double(n) + c) * ua * ua;
}

double operand_rounding_nmse(DType to, const std::vector<double>& x, const std::vector<double>& w,
                             int64_t T, int64_t N, int64_t K) {
  double terms = 0, dots = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = x[size_t(t * K + k)] * w[size_t(n * K + k)];
        terms += p * p;
        dot += p;
      }
      dots += dot * dot;
    }
  const double u = unit_roundoff(to);
  return dots > 0 ? 4 * u * u * terms / dots : 0;
}

void check_close(const char* op, const OpTier& tier, const std::string& what, uint64_t seed,
                 const std::vector<double>& got, const std::vector<double>& want, double bound) {
  ASSERT_EQ(got.size(), want.size()) << op << " " << what;
  double num = 0, den = 0, worst = -1;
  int64_t bad = 0, at = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (bad++ == 0) at = int64_t(i);
      continue;
    }
    const double d = (got[i] - want[i]) * (got[i] - want[i]);
    num += d;
    den += want[i] * want[i];
    if (d > worst && bad == 0) worst = d, at = int64_t(i);
  }
  const double nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0);
  std::printf("NMSE %-12s %-16s %-48s seed=%-6llu nmse=%.3e bound=%.3e\n", op, tier.name.c_str(),
              what.c_str(), (unsigned long long)seed, nmse, bound);
  const std::string where = std::string(op) + " " + tier.name + " " + what + " seed " +
                            std::to_string(seed) + ": element " + std::to_string(at) +
                            (at >= 0 ? " got " + std::to_string(got[size_t(at)]) + " want " +
                                           std::to_string(want[size_t(at)])
                                     : "");
  EXPECT_EQ(bad, 0) << where << ": non-finite or unwritten (poisoned) outputs";
  EXPECT_LE(nmse, bound) << where;
}

void check_exact(const char* op, const OpTier& tier, const std::string& what, uint64_t seed,
                 const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << op << " " << what;
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))))
      if (differ++ == 0) first = int64_t(i);
  std::printf("NMSE %-12s %-16s %-48s seed=%-6llu mismatches=%lld (exact)\n", op,
              tier.name.c_str(), what.c_str(), (unsigned long long)seed, (long long)differ);
  EXPECT_EQ(differ, 0) << op << " " << tier.name << " " << what << " seed " << seed
                       << ": first differing element " << first;
}

}  // namespace arbiter::test

namespace arbiter::test {

TapSet::TapSet(size_t n, const std::vector<const std::vector<double>*>& over)
    : taps(n), records(n) {
  for (size_t i = 0; i < n; ++i) {
    taps[i].record = &records[i];
    if (i < over.size()) taps[i].overwrite = over[i];
  }
}

}  // namespace arbiter::test
