// matmul: out[T, N] = x[T, K] @ W[N, K]^T (+ bias), for every weight storage a tier reads.
// T = 1 takes a tier's GEMV kernels, T > 1 its GEMM (on cpu both its own and OpenBLAS's); the
// logits cases write f32 (f64 on ref) rows as the lm_head does. Shapes: real ones (Qwen3-
// 0.6B, Llama-3.2-1B, Gemma-3-1B's rows of 1,152 and its down projection, stories260K, a
// 20,000-word vocabulary) and
// odd ones (few long rows with a K % 8 tail: cuda's loop GEMV splits each over 4 warps).
#include <map>

#include "core/quant.h"
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int T;
  int N, K;
  bool bias, logits;
};
const Case kGemv[] = {
    {1, 64, 256, false, false},   {1, 31, 33, true, false},     {1, 33, 31, false, false},
    {1, 7, 5, false, false},      {1, 13, 143, true, false},    {1, 5, 1, false, false},
    {1, 1, 32, false, false},     {1, 172, 64, false, false},   {1, 3072, 1024, false, false},
    {1, 1024, 3072, false, false}, {1, 2048, 8192, false, false}, {1, 8192, 2048, true, false},
    {1, 1024, 1024, true, false}, {1, 20000, 512, false, true},  {1, 1152, 6912, false, false},
    {1, 40, 4100, true, false},   {1, 256, 1152, false, false}};
const Case kGemm[] = {
    {2, 64, 256, false, false},   {5, 7, 11, true, false},    {13, 31, 33, false, false},
    {31, 33, 32, true, false},    {33, 65, 143, false, false}, {12, 32, 256, false, false},
    {7, 5, 300, true, false},     {3, 64, 172, false, false},  {8, 3072, 1024, false, false},
    {6, 512, 1024, true, false},  {64, 2048, 2048, false, false}, {13, 512, 2048, true, false},
    {4, 20000, 256, false, true}};

struct Inputs {
  std::unique_ptr<HostTensor> W, bias;
  std::vector<double> w, x;  // w: W's values before its storage type
};
Inputs inputs(const Case& c, DType storage, DType compute, uint64_t seed) {
  Inputs in;
  in.w = values(int64_t(c.N) * c.K, seed, 0.05, DType::F32);
  in.W = make_tensor("W", {c.N, c.K}, in.w, storage);
  if (c.bias) in.bias = make_tensor("b", {c.N}, values(c.N, seed + 7, 0.5, compute), DType::F32);
  in.x = values(int64_t(c.T) * c.K, seed + 3, 1.0, compute);
  return in;
}

std::vector<double> run(Backend& be, const Case& c, const Inputs& in, bool poison) {
  Buf x(be, in.x), out(be, int64_t(c.T) * c.N, c.logits);
  if (poison) out.poison();
  be.matmul(x.b, in.W->t, in.bias ? &in.bias->t : nullptr, c.T, out.b);
  return out.read();
}

void check(const OpTier& tier, Backend& be, const Case& c0, uint64_t seed) {
  // ref's results depend only on the inputs: computed once per input set.
  static std::map<std::string, std::vector<double>> ref_cache;
  for (DType st : weight_types(tier)) {
    // Every storage type on the small shapes; the large ones (real models' rows, each a kernel
    // shape of its own) in the first type only, to keep the suite fast.
    if (int64_t(c0.N) * c0.K > (int64_t(1) << 20) && st != weight_types(tier).front()) continue;
    // One output (N = 1) makes the NMSE the relative error of a single dot, which cancellation
    // can push past any bound that ignores it (seed 1006 cancels ~50x with Q4_0's values). The
    // block formats' single dots are held instead to a bound that counts it: sum |w x|
    // (IsaTest.BlockGemvWithinDotBound, tests/backend/cpu_tier_test.cpp).
    if (c0.N == 1 && block_elems(st) > 1 && st != DType::Q8_0) continue;
    Case c = c0;
    const int blk = block_elems(st);
    c.K = (c.K + blk - 1) / blk * blk;
    const std::string what = strformat("T=%d N=%d K=%d%s%s W %s", c.T, c.N, c.K,
                                       c.bias ? " +bias" : "", c.logits ? " logits" : "",
                                       dtype_name(st));
    const Inputs in = inputs(c, st, tier.compute, seed);
    const std::string key = what + " x " + dtype_name(tier.compute) + " " + std::to_string(seed);
    auto it = ref_cache.find(key);
    if (it == ref_cache.end()) {
      auto ref = make_ref_backend();
      it = ref_cache.emplace(key, run(*ref, c, in, false)).first;
    }
    const DType out = c.logits ? DType::F32 : tier.compute;
    double bound = nmse_bound(out, tier.compute, c.K, 2);
    if (!reads_exactly(st, tier.compute))
      bound += operand_rounding_nmse(tier.compute, in.x, in.w, c.T, c.N, c.K);
    // The cpu tier's integer kernels round x to 8 bits per block first (kernels.h ActQ8).
    if (const int ab = act_quant_block(tier, st, c.T, c.K))
      bound += act_quant_nmse(in.x, in.W->t, c.T, c.N, c.K, ab);
    check_close(c.T == 1 ? "matmul.gemv" : "matmul.gemm", tier, what, seed, run(be, c, in, true),
                it->second, bound);
  }
}

class Matmul : public OpTest {};

TEST_P(Matmul, GemvMatchesRef) {
  const OpTier& tier = GetParam();
  if (tier.name.find("_blas") != std::string::npos)
    GTEST_SKIP() << "T = 1 does not use the GEMM (the tier without _blas runs these)";
  ARB_TIER_OR_SKIP(be, tier);
  uint64_t seed = 1000;
  for (const Case& c : kGemv) check(tier, *be, c, seed++);
}

TEST_P(Matmul, GemmMatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  uint64_t seed = 2000;
  for (const Case& c : kGemm) check(tier, *be, c, seed++);
}

INSTANTIATE_TEST_SUITE_P(Tiers, Matmul, testing::ValuesIn(op_tiers(/*with_blas=*/true)),
                         op_tier_name);

// The f32 bound is tight enough to see a real defect: a matmul that drops the last of
// K = 8192 terms is refused. (In bf16 that defect is smaller than the output's rounding.)
TEST(MatmulBound, DropOneTermIsCaught) {
  const Case c{1, 512, 8192, false, false};
  Inputs in = inputs(c, DType::F32, DType::F32, 7);
  auto ref = make_ref_backend();
  const std::vector<double> want = run(*ref, c, in, false);
  in.x[size_t(c.K - 1)] = 0;
  const std::vector<double> bad = run(*ref, c, in, false);
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (bad[i] - want[i]) * (bad[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_GT(num / den, 100 * nmse_bound(DType::F32, DType::F32, c.K, 2));
}

}  // namespace
}  // namespace arbiter::test
