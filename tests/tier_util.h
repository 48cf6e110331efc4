// Tiers in tests: the op tests' harness (one case list per op, tests/ops/<op>_test.cpp, run on
// every compiled tier against the f64 ref tier, as ggml's test-backend-ops runs one list on
// every backend) and the helpers every tier-level test shares.
// Tiers: cpu for each ISA compiled in and supported (scalar twin, AVX2, AVX-512; matmul also
// with OpenBLAS), cuda in bf16, f16 and f32. A tier that cannot run here says SKIP with the
// reason (ARBITER_REQUIRE_CUDA=1 turns a cuda SKIP into a failure).
//
// Inputs are seeded and drawn representable in the tier's compute type, so ref and the tier
// see the same values; outputs are poisoned with NaN first (an unwritten element fails).
// One tolerance rule for every op and tier (nmse_bound below), derived from the unit
// roundoffs of core/dtype.h and the op's reduction length; every check prints one "NMSE" line
// with the tier, case, seed, NMSE, bound and worst element.
//
// Adding a case: append a row to the op's case list. Adding an op: a file <op>_test.cpp with
// its case list, a fixture named after the op (class Rope : public OpTest {}), its TEST_Ps and
// an INSTANTIATE_TEST_SUITE_P over op_tiers().
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace arbiter::test {

/// A tier an op test runs on.
struct OpTier {
  std::string name;  // "cpu_avx512", "cpu_avx512_blas", "cuda_bf16"
  DType compute = DType::F32;
  bool cuda = false;
  std::function<std::unique_ptr<Backend>()> make;  // throws when the tier cannot start
  cpu::Isa isa = cpu::Isa::Scalar;  // a cpu tier's ISA
};
/// Every compiled tier: cpu per ISA (its own GEMM), cuda bf16/f16/f32. with_blas adds cpu
/// with OpenBLAS's GEMM per ISA (matmul's T > 1 cases).
std::vector<OpTier> op_tiers(bool with_blas = false);
std::string op_tier_name(const testing::TestParamInfo<OpTier>& info);
/// How gtest prints a tier in test lists and failures: its name, not its bytes.
inline void PrintTo(const OpTier& t, std::ostream* os) { *os << t.name; }

/// The tier under test, or a SKIP with the reason (cuda without a device or not built).
std::unique_ptr<Backend> make_or_skip(const OpTier& t, std::string& why);
#define ARB_TIER_OR_SKIP(var, tier)                                                          \
  std::unique_ptr<::arbiter::Backend> var;                                                   \
  {                                                                                          \
    std::string why_;                                                                        \
    var = ::arbiter::test::make_or_skip(tier, why_);                                         \
    if (!var) {                                                                              \
      if (::arbiter::test::cuda_required())                                                  \
        FAIL() << "ARBITER_REQUIRE_CUDA=1 but " << (tier).name << " is unavailable: " << why_; \
      std::fprintf(stderr, "SKIP: %s (%s)\n", (tier).name.c_str(), why_.c_str());            \
      GTEST_SKIP() << "SKIP: " << (tier).name << " (" << why_ << ")";                        \
    }                                                                                        \
  }
bool cuda_required();

class OpTest : public testing::TestWithParam<OpTier> {};

/// n values ~ N(0, scale^2) rounded to `type`, from seed (drawn once per (n, seed): the same
/// inputs go to every tier and storage type).
std::vector<double> values(int64_t n, uint64_t seed, double scale, DType type);
/// Rounds x to the nearest value of `type` (as a tier stores it).
double round_to(DType type, double x);

/// A weight with its own storage: `vals` stored as `storage` (block formats: encoded by
/// core/quant_encode.cpp, so the stored values approximate `vals`).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
};
std::unique_ptr<HostTensor> make_tensor(const std::string& name, std::vector<int64_t> shape,
                                        const std::vector<double>& vals, DType storage);
/// The weight storage types a tier's cases run: on cpu every type (the block formats with a
/// min are read rounded once), on cuda the compute type, F32 (which its upload rounds to the
/// compute type) and ggml's block formats (kept packed on the device; MLX's blocks, widened at
/// upload as f32 weights are, are not run here).
std::vector<DType> weight_types(const OpTier& t);
/// Whether a tier reads weights of `storage` exactly (else each weight is rounded once).
bool reads_exactly(DType storage, DType compute);

/// A buffer freed with its backend.
struct Buf {
  Backend* be = nullptr;
  Buffer b;
  Buf(Backend& backend, int64_t n, bool logits = false);
  Buf(Backend& backend, const std::vector<double>& v, bool logits = false);
  ~Buf() { be->free(b); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<double> read() const;
  void poison();  // NaN everywhere
};

/// The NMSE bound of an op on a tier: 4 (1 + m) u_out^2 + 8 (n + c) u_acc^2, where u_out is
/// the unit roundoff of the output's type, u_acc of the tier's accumulation (core/dtype.h
/// Roundoff), n the reduction length, c the op's fixed roundings in the accumulation type (an
/// exp, a division, a cos/sin), m the roundings to the storage type inside the op (a fused
/// kernel's normalised x, where the op's rows are long enough to average). Independent roundings add in the
/// squared error (Higham ch. 2-4, the probabilistic reading): a sum of n terms in one f32
/// chain has an NMSE near (n/2 + 1) u^2 / 3, and the factors 4 and 8 leave room for the few-
/// fold fluctuation of an NMSE over few outputs. A real defect (one of 8,192 terms dropped:
/// NMSE ~ 1/n) sits orders of magnitude above (DropOneTermIsCaught).
double nmse_bound(DType out, DType compute, int64_t n, double c, int m = 0);

/// The NMSE a product x[T, K] @ w[N, K]^T gets from one operand rounded, term by term, to
/// `to` (a weight rounded on upload, the normalised x before the logits GEMV): 4 u^2 kappa,
/// kappa = sum (x w)^2 / sum (x . w)^2 over every term and row. kappa is near 1 over many
/// rows of random signs, but one short row that cancels (N = 1, K = 32) magnifies the
/// terms' rounding far beyond its own rounding: nmse_bound's per-output term cannot cover it.
double operand_rounding_nmse(DType to, const std::vector<double>& x, const std::vector<double>& w,
                             int64_t T, int64_t N, int64_t K);

/// The block in which `tier` quantizes a matmul's activations to 8 bits for weights stored
/// as `storage` at T tokens of K values (cpu: T == 1 and a format with an integer kernel, or
/// T > 1 and an integer GEMM for (ISA, format, K), qgemm_kernel; backend/cpu/kernels.h
/// act_q8_block), 0 when it reads them in its compute type.
int act_quant_block(const OpTier& tier, DType storage, int T, int64_t K);
/// The NMSE a product x[T, K] @ W[N, K]^T (W's exact values) gets from x rounded to 8 bits
/// per block of `block` (kernels.h ActQ8: each value off by at most d / 2, d = max|x| / 127
/// over its block): 4 sum (w d / 2)^2 / sum (x . w)^2 over every term and row, the reading
/// of operand_rounding_nmse with the block's absolute step in place of u |x|.
double act_quant_nmse(const std::vector<double>& x, const Tensor& W, int64_t T, int64_t N,
                      int64_t K, int block);

/// Checks a tier's output against ref's: no non-finite (or unwritten) element, NMSE within
/// bound. Prints the NMSE line.
void check_close(const char* op, const OpTier& tier, const std::string& what, uint64_t seed,
                 const std::vector<double>& got, const std::vector<double>& want, double bound);
/// The same, bit for bit (gathers, copies, summaries).
void check_exact(const char* op, const OpTier& tier, const std::string& what, uint64_t seed,
                 const std::vector<double>& got, const std::vector<double>& want);

}  // namespace arbiter::test

namespace arbiter::test {

/// Stage taps of a fused-op test (backend/tap.h): n taps, each recording into its own vector
/// (and overwriting with `over[i]` when given).
struct TapSet {
  explicit TapSet(size_t n, const std::vector<const std::vector<double>*>& over = {});
  std::vector<StageTap> taps;
  std::vector<std::vector<double>> records;
  const StageTap* operator[](size_t i) const { return &taps[i]; }
};

}  // namespace arbiter::test
