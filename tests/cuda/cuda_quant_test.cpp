// The CUDA tier on ggml's block formats kept packed on the device (gemv_quant.cu):
//  - the packed GEMV's paths, which the op tests' small shapes (one piece per row) do not all
//    reach: rows of several pieces in groups of 4 rows per warp, of 2 (long rows: x takes more
//    shared memory), of 1, and rows too long for shared memory (dequantized, then cuBLASLt);
//    the tensor-core kernel's (Q4_K, Q5_K, Q6_K in bf16/f16) partial tiles and splits of K; every
//    format, against ref within the op tests' bound (tests/ops/matmul_test.cpp);
//  - a prefill whose matrix is dequantized in two tiles, with a bias;
//  - the fused decode forms on packed rows, bit for bit their compositions;
//  - a whole Q4_K_M model (synth tiny-qwen3-256: Q4_K and Q6_K matrices, a tied Q6_K
//    embedding that is the lm_head too): cuda f32 greedy ids equal ref's, every matmul and
//    embed served by the packed kernels, and its bf16 trace passes compare against ref's.
// The per-type op cases (matmul, embed on every format) are tests/ops' (tier_util.cpp
// weight_types). Without a GPU, the decoders the kernels share (quant_decode.cuh) are run as
// host code against core/quant.cpp's dequantization, every value of every format bit for bit.
#include <map>

#include <nlohmann/json.hpp>

#if ARBITER_HAVE_CUDA
#include "backend/cuda/quant_decode.cuh"
#endif
#include "core/quant.h"
#include "cuda/cuda_test_util.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/quantize.h"

namespace arbiter::test {
namespace {

const DType kPacked[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,   DType::Q6_K,
                         DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};

#if ARBITER_HAVE_CUDA
/// Every unit of a few rows of format F decoded (Fmt<Q>::unit) equals dequant_blocks in f64.
template <DType Q>
void check_decoder(uint64_t seed) {
  using F = cuda::Fmt<Q>;
  const int64_t K = 2048, rows = 3, nb = K / F::B;
  auto t = make_tensor("W", {rows, K}, values(rows * K, seed, 0.05, DType::F32), Q);
  const auto* bytes = static_cast<const uint8_t*>(t->t.data);
  std::vector<double> want(size_t(rows * K));
  dequant_blocks(Q, bytes, rows * nb, want.data());
  float tab[16];
  for (int i = 0; i < 16; ++i) tab[i] = float(F::kTable == 2 ? kMXFP4Values[i] : kIQ4NLValues[i]);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t gu = 0; gu < K / 32; ++gu) {
      cuda::Unit u;
      F::unit(bytes + (r * nb + gu / (F::B / 32)) * F::BB, int(gu % (F::B / 32)), u);
      for (int j = 0; j < 32; ++j) {
        const double got = cuda::unit_value<F>(u, j, tab), w = want[size_t(r * K + gu * 32 + j)];
        if (got != w && bad++ < 3)
          ADD_FAILURE() << dtype_name(Q) << " row " << r << " value " << gu * 32 + j << ": decoded "
                        << got << ", dequant_blocks " << w;
      }
    }
  EXPECT_EQ(bad, 0) << dtype_name(Q);
}

TEST(CudaQuant, DecodersEqualCoreDequantization) {
  static_assert(sizeof(kPacked) / sizeof(kPacked[0]) == 13, "every packed format below");
  check_decoder<DType::Q8_0>(1);
  check_decoder<DType::Q4_0>(2);
  check_decoder<DType::Q4_1>(3);
  check_decoder<DType::Q5_0>(4);
  check_decoder<DType::Q5_1>(5);
  check_decoder<DType::Q2_K>(6);
  check_decoder<DType::Q3_K>(7);
  check_decoder<DType::Q4_K>(8);
  check_decoder<DType::Q5_K>(9);
  check_decoder<DType::Q6_K>(10);
  check_decoder<DType::IQ4_NL>(11);
  check_decoder<DType::IQ4_XS>(12);
  check_decoder<DType::MXFP4>(13);
}
#endif

/// Calls of op served by provider since the last stats reset (0 when the op never ran).
int64_t served(const Backend& be, const std::string& op, const std::string& provider) {
  const auto& calls = be.stats().calls();
  const auto it = calls.find(op);
  if (it == calls.end()) return 0;
  const auto p = it->second.find(provider);
  return p == it->second.end() ? 0 : p->second;
}

struct Shape {
  int T, N, K;
  bool bias, logits;
  const char* provider;  // the matmul provider's prefix (+ the format's name)
};

/// out = x @ W^T (+ bias) on `be`, W stored as st; checked against ref within the op tests'
/// bound; the provider that served it must be `want_provider`.
void check_matmul(Backend& be, const char* tier, DType compute, const Shape& s, DType st,
                  uint64_t seed) {
  const std::vector<double> w = values(int64_t(s.N) * s.K, seed, 0.05, DType::F32);
  auto W = make_tensor("W", {s.N, s.K}, w, st);
  auto b = s.bias ? make_tensor("b", {s.N}, values(s.N, seed + 7, 0.5, compute), DType::F32) : nullptr;
  const std::vector<double> xv = values(int64_t(s.T) * s.K, seed + 3, 1.0, DType::BF16);
  auto ref = make_ref_backend();
  auto run = [&](Backend& t, bool poison) {
    Buf x(t, xv), out(t, int64_t(s.T) * s.N, s.logits);
    if (poison) out.poison();
    t.matmul(x.b, W->t, b ? &b->t : nullptr, s.T, out.b);
    return out.read();
  };
  be.stats().reset();
  const std::vector<double> got = run(be, true), want = run(*ref, false);
  const std::string prov = std::string(s.provider) + dtype_name(st);
  EXPECT_EQ(served(be, "matmul", prov), 1) << tier << " " << dtype_name(st);
  double bound = nmse_bound(s.logits ? DType::F32 : compute, compute, s.K, 2);
  if (!reads_exactly(st, compute)) bound += operand_rounding_nmse(compute, xv, w, s.T, s.N, s.K);
  OpTier t;
  t.name = tier;
  t.compute = compute;
  t.cuda = true;
  check_close("matmul.packed", t, strformat("T=%d N=%d K=%d %s", s.T, s.N, s.K, dtype_name(st)),
              seed, got, want, bound);
}

TEST(CudaQuant, PackedGemvOverPiecesRowGroupsAndLongRows) {
  for (const char* dt : {"f32", "bf16", "f16"}) {
    ARB_CUDA_OR_SKIP(cu, dt);
    const DType compute = dtype_from_name(dt);
    const std::string gemm = std::string("cublaslt.gemm_") + dt + "_from_";
    // The CUDA-core kernel: K 4096: 4 row pieces (2 for Q6_K/Q3_K), 4 rows per warp, N not a
    // multiple of 4. K 12288: x takes 54 KB of shared memory, 2 rows per warp. K 32768: 1 row
    // per warp. K 49152: x does not fit shared memory: dequantized rows and cuBLASLt.
    // The tensor-core kernel (Q4_K, Q5_K, Q6_K in bf16/f16): tiles of 16 rows, the last one partial
    // (37, 6, 3, 2, 19, 33 rows), 1 to 8 warps a tile, and no limit on K.
    const Shape shapes[] = {{1, 37, 4096, true, false, "cuda.gemv_"},
                            {1, 6, 12288, false, true, "cuda.gemv_"},
                            {1, 3, 32768, false, false, "cuda.gemv_"},
                            {1, 2, 49152, false, false, gemm.c_str()},
                            {1, 19, 256, false, false, "cuda.gemv_"},
                            {1, 33, 1024, true, false, "cuda.gemv_"}};
    uint64_t seed = 500;
    for (DType st : kPacked) {
      const bool mma = compute != DType::F32 &&
                       (st == DType::Q4_K || st == DType::Q5_K || st == DType::Q6_K);
      for (Shape s : shapes) {
        if (mma) s.provider = "cuda.gemv_";
        check_matmul(*cu, dt, compute, s, st, seed++);
      }
    }
  }
}

TEST(CudaQuant, PrefillDequantizesTilesOfRows) {
  ARB_CUDA_OR_SKIP(cu, "f32");
  // f32 rows of 16,384 values: 1,024 rows per 64 MB tile, so 1,100 rows take two tiles (the
  // second of 76 rows), each writing its columns of the [3, 1100] output, then the bias.
  check_matmul(*cu, "f32", DType::F32, {3, 1100, 16384, true, false, "cublaslt.gemm_f32_from_"},
               DType::Q8_0, 900);
  check_matmul(*cu, "f32", DType::F32, {5, 300, 1024, false, true, "cublaslt.gemm_f32_from_"},
               DType::Q4_K, 901);
}

// The fused decode forms on packed rows (quant_ops.cpp): norm + gate/up GEMV + SwiGLU, GEMV +
// residual add, norm + q/k/v (matrices of one format stacked in one launch), each the bits of
// its composition (rmsnorm, matmul, matmul, swiglu; matmul, add; rmsnorm, matmuls) and served
// by its packed provider, the norm inside the tensor-core kernel's launches unless tapped; a
// tapped gate runs the composition.
TEST(CudaQuant, FusedFormsOnPackedRowsEqualTheirCompositions) {
  ARB_CUDA_OR_SKIP(cu, "bf16");
  const int F = 768, D = 1024;
  std::vector<double> nv = values(D, 1, 0.1, DType::F32);
  for (double& w : nv) w += 1.0;
  auto norm = make_tensor("norm", {D}, nv, DType::F32);
  const std::vector<double> x = values(D, 2, 1.0, DType::BF16),
                            resid = values(D, 3, 1.0, DType::BF16);
  for (DType st : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(st));
    auto g = make_tensor("gate", {F, D}, values(int64_t(F) * D, 4, 0.05, DType::F32), st);
    auto u = make_tensor("up", {F, D}, values(int64_t(F) * D, 5, 0.05, DType::F32), st);
    auto dn = make_tensor("down", {D, F}, values(int64_t(D) * F, 6, 0.05, DType::F32), st);
    auto swiglu = [&](bool composed, TapSet* taps) {
      Buf xb(*cu, x), xn(*cu, D), gb(*cu, F), ub(*cu, F), act(*cu, F);
      act.poison();
      Backend::GluTaps t;
      if (taps) t = {(*taps)[0], (*taps)[1], (*taps)[2], (*taps)[3]};
      if (composed)
        cu->Backend::rmsnorm_glu(xb.b, norm->t, NormWeight::Plain, 1, D, 1e-6, xn.b, g->t, u->t,
                                 GluAct::SiLU, gb.b, ub.b, act.b, t);
      else
        cu->rmsnorm_glu(xb.b, norm->t, NormWeight::Plain, 1, D, 1e-6, xn.b, g->t, u->t, GluAct::SiLU,
                        gb.b, ub.b, act.b, t);
      return act.read();
    };
    const std::string name = dtype_name(st);
    // The tensor-core kernel's formats take the norm into the launch.
    const bool norm_inside = st != DType::Q8_0;
    const std::string glu = norm_inside ? "cuda.norm_gemv_swiglu_" : "cuda.gemv_swiglu_";
    cu->stats().reset();
    const std::vector<double> act = swiglu(false, nullptr);
    EXPECT_EQ(served(*cu, "rmsnorm_glu", glu + name), 1);
    const OpTier tier{"cuda_bf16", DType::BF16, true, nullptr};
    check_exact("rmsnorm_glu.packed", tier, name, 0, act, swiglu(true, nullptr));
    TapSet taps(4);
    cu->stats().reset();
    check_exact("rmsnorm_glu.packed_tapped", tier, name, 0, swiglu(false, &taps), act);
    EXPECT_EQ(served(*cu, "rmsnorm_glu", glu + name), 0) << "a tapped gate runs the composition";
    EXPECT_EQ(taps.records[3], act) << "the act tap records the output";

    auto madd = [&](bool composed) {
      Buf a(*cu, act), tmp(*cu, D), res(*cu, resid);
      if (composed) cu->Backend::matmul_add(a.b, dn->t, 1, tmp.b, res.b, 1, nullptr, nullptr);
      else cu->matmul_add(a.b, dn->t, 1, tmp.b, res.b, 1, nullptr, nullptr);
      return res.read();
    };
    cu->stats().reset();
    const std::vector<double> sum = madd(false);
    EXPECT_EQ(served(*cu, "matmul_add", "cuda.gemv_add_" + name), 1);
    check_exact("matmul_add.packed", tier, name, 0, sum, madd(true));
  }
  // norm + q/k/v: q and k (Q4_K) in one launch, v (Q6_K) in another, taps on the norm and v.
  const int Nq = 512, Nkv = 256;
  auto q = make_tensor("q", {Nq, D}, values(int64_t(Nq) * D, 7, 0.05, DType::F32), DType::Q4_K);
  auto k = make_tensor("k", {Nkv, D}, values(int64_t(Nkv) * D, 8, 0.05, DType::F32), DType::Q4_K);
  auto v = make_tensor("v", {Nkv, D}, values(int64_t(Nkv) * D, 9, 0.05, DType::F32), DType::Q6_K);
  const OpTier tier{"cuda_bf16", DType::BF16, true, nullptr};
  auto qkv = [&](bool composed, const StageTap* norm_tap, const StageTap* v_tap) {
    Buf xb(*cu, x), xn(*cu, D), qb(*cu, Nq), kb(*cu, Nkv), vb(*cu, Nkv);
    for (Buf* b : {&qb, &kb, &vb}) b->poison();
    const Backend::MatmulTarget outs[3] = {{&q->t, nullptr, &qb.b, nullptr},
                                           {&k->t, nullptr, &kb.b, nullptr},
                                           {&v->t, nullptr, &vb.b, v_tap}};
    if (composed)
      cu->Backend::rmsnorm_matmul(xb.b, norm->t, NormWeight::Plain, 1, D, 1e-6, xn.b, false,
                                  norm_tap, outs, 3);
    else
      cu->rmsnorm_matmul(xb.b, norm->t, NormWeight::Plain, 1, D, 1e-6, xn.b, false, norm_tap,
                         outs, 3);
    std::vector<double> all = qb.read(), kv = kb.read(), vv = vb.read();
    all.insert(all.end(), kv.begin(), kv.end());
    all.insert(all.end(), vv.begin(), vv.end());
    return all;
  };
  TapSet tf(2), tc(2);
  cu->stats().reset();
  const std::vector<double> fused = qkv(false, tf[0], tf[1]);
  EXPECT_EQ(served(*cu, "rmsnorm_matmul", "cuda.gemv_q4_k"), 1) << "q and k in one launch";
  EXPECT_EQ(served(*cu, "rmsnorm_matmul", "cuda.gemv_q6_k"), 1);
  check_exact("rmsnorm_matmul.packed", tier, "q4_k q, k; q6_k v", 0, fused, qkv(true, tc[0], tc[1]));
  for (size_t i = 0; i < 2; ++i)
    check_exact("rmsnorm_matmul.packed_record", tier, "tap " + std::to_string(i), 0,
                tf.records[i], tc.records[i]);
  // Untapped, each launch normalises x itself: the composition's bits still.
  cu->stats().reset();
  const std::vector<double> inside = qkv(false, nullptr, nullptr);
  EXPECT_EQ(served(*cu, "rmsnorm_matmul", "cuda.norm_gemv_q4_k"), 1);
  EXPECT_EQ(served(*cu, "rmsnorm_matmul", "cuda.norm_gemv_q6_k"), 1);
  check_exact("rmsnorm_matmul.packed_norm_inside", tier, "q4_k q, k; q6_k v", 0, inside, fused);
}

std::vector<int32_t> greedy(const Model& m, Backend& be, const std::vector<int32_t>& prompt, int n) {
  Session s(m, be, int(prompt.size()) + n);
  Sampler sampler(SamplerParams{});
  return generate(s, prompt, n, sampler, {}, nullptr).tokens;
}

TEST(CudaQuant, Q4KmModelGreedyEqualsRefAndBf16TraceWithinDriftGate) {
  ARB_CUDA_OR_SKIP(cu, "f32");
  const std::string dir = temp_dir("cuda-quant");
  SynthOptions o;
  o.preset = "tiny-qwen3-256";
  o.format = SynthFormat::Gguf;
  o.dtype = DType::F32;
  o.quant = QuantRecipe::Q4_K_M;
  o.progress = false;
  o.out_dir = dir + "/q4_k_m.gguf";
  synth_checkpoint(o);
  auto m = load_model(o.out_dir);
  // The recipe's types on this shape: Q4_K matrices, the tied embedding (= lm_head) Q6_K.
  std::map<DType, int> types;
  m->weights.for_each_distinct([&](const TensorSpec&, const Tensor& t) { ++types[t.dtype]; });
  ASSERT_GT(types[DType::Q4_K], 0);
  ASSERT_GT(types[DType::Q6_K], 0);

  const std::vector<int32_t> prompt = {3, 100, 57, 250, 9, 31, 400};
  auto ref = make_ref_backend();
  cu->stats().reset();
  const std::vector<int32_t> got = greedy(*m, *cu, prompt, 24);
  EXPECT_EQ(got, greedy(*m, *ref, prompt, 24)) << "cuda f32 greedy ids differ from ref's";
  EXPECT_EQ(cu->stats().fallbacks(), 0);
  EXPECT_GT(served(*cu, "matmul", "cublaslt.gemm_f32_from_q4_k"), 0);  // the prompt
  for (const char* p : {"cuda.gemv_q4_k", "cuda.gemv_q6_k"})  // q/k/v; v and the lm_head
    EXPECT_GT(served(*cu, "rmsnorm_matmul", p), 0) << p;
  EXPECT_GT(served(*cu, "matmul_add", "cuda.gemv_add_q4_k"), 0);
  EXPECT_GT(served(*cu, "rmsnorm_glu", "cuda.gemv_swiglu_q4_k"), 0);
  EXPECT_GT(served(*cu, "embed", "cuda.embed_q6_k"), 0);

  const std::string corpus = source_path("models/corpus/stories.txt");
  auto trace = [&](const std::string& dev, const std::string& out) {
    auto r = run_cli("trace -m " + o.out_dir + " --corpus " + corpus +
                     " --chunk 8 --chunks 16 --prefill 64 " + dev + " -o " + out + " --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  };
  trace("--device ref", dir + "/ref.tsv");
  trace("--device cuda --dtype bf16", dir + "/bf16.tsv");
  auto c = run_cli("compare --json " + dir + "/ref.tsv " + dir + "/bf16.tsv");
  const auto j = nlohmann::json::parse(c.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << c.out << c.err;
  // Random synth weights leave few decided positions, so the token gate may find none
  // (inconclusive); the kernels' error is what the drift gate judges, and it must pass.
  EXPECT_NE(j["verdict"], "fail") << c.out;
  EXPECT_EQ(j["drift_gate"]["status"], "pass") << c.out;
}

}  // namespace
}  // namespace arbiter::test
