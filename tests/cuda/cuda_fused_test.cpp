// The CUDA tier's fused decode ops (norm + GEMV, q/k norm + RoPE + KV store, GEMV + residual
// add, programmatic dependent launch) against its own op-by-op path: a decode with the fused
// kernels must give the bits of the same decode run op by op (the compositions ref and cpu
// run, and the tier's own with fusion off), on models that exercise every fused form (llama; qwen2 with
// q/k/v biases; qwen3 with q/k norms; the MoE families; gemma), in every dtype. Also: the device read-bandwidth probe
// bench uses, and `arbiter bench --shapes` on cuda (it once crashed after the pp/tg runs:
// a stale build whose bench.cpp and cmd_bench.cpp disagreed on BenchTrace). SKIP without GPU.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "cuda/cuda_test_util.h"
#include "backend/ref/ref_backend.h"
#include "engine/session.h"
#include "model/model.h"
#if ARBITER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace arbiter::test {
namespace {

int argmax_of(const std::vector<double>& v) {
  int b = 0;
  for (int i = 1; i < int(v.size()); ++i)
    if (v[i] > v[b]) b = i;
  return b;
}

/// Logits after a prefill of the prompt and each of n greedy decode steps, as raw doubles
/// (a cache of ctx rows; 0: just enough).
std::vector<double> decode_logits(const Model& m, Backend& be, const std::vector<int32_t>& prompt,
                                  int n, int ctx = 0) {
  Session s(m, be, ctx > 0 ? ctx : int(prompt.size()) + n + 1);
  s.forward(prompt);
  std::vector<double> all;
  for (int i = 0; i <= n; ++i) {
    std::vector<double> row = s.logits(s.last_T() - 1);
    all.insert(all.end(), row.begin(), row.end());
    if (i < n) s.forward({argmax_of(row)});
  }
  return all;
}

std::string model_dir(const std::string& rel) {
  const std::string p = source_path(rel);
  return std::filesystem::exists(p) ? p : "";
}

void expect_same_bits(const std::vector<double>& ta, const std::vector<double>& tb) {
  ASSERT_EQ(ta.size(), tb.size());
  size_t first = ta.size();
  for (size_t i = 0; i < ta.size() && first == ta.size(); ++i)
    if (std::memcmp(&ta[i], &tb[i], sizeof(double)) != 0) first = i;
  EXPECT_EQ(first, ta.size()) << "fused decode differs from op-by-op at logit " << first << ": "
                              << (first < ta.size() ? ta[first] : 0.0) << " vs "
                              << (first < tb.size() ? tb[first] : 0.0);
}

TEST(CudaFused, DecodeEqualsOpByOpPath) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  const char* models[] = {"models/TinyStories-656K", "tests/fixtures/models/tiny-qwen2",
                          "tests/fixtures/models/tiny-qwen3"};
  int compared = 0;
  for (const char* rel : models) {
    const std::string path = model_dir(rel);
    if (path.empty()) continue;
    auto m = load_model(path);
    const int V = m->config.vocab;
    const std::vector<int32_t> prompt = {1 % V, 80 % V, 147 % V, 201 % V, 57 % V};
    // A 512-row cache with a split per 8 keys splits the decode attention's keys across
    // blocks (1 to 4 of the grid's splits used as the position grows).
    for (const auto& [dt, ctx] : {std::pair{"bf16", 0}, std::pair{"f16", 0}, std::pair{"f32", 0},
                                  std::pair{"bf16", 512}}) {
      SCOPED_TRACE(std::string(rel) + " " + dt + " cache " + std::to_string(ctx));
      auto a = make_cuda_backend(0, dt), b = make_cuda_backend(0, dt);
      if (ctx > 0)
        for (Backend* be : {a.get(), b.get()}) {
          CudaTuning t = cuda_tuning(*be);
          t.attn_split_keys = 8;
          cuda_set_tuning(*be, t);
        }
      const auto ta = decode_logits(*m, *a, prompt, 24, ctx);
      EXPECT_GT(a->stats().calls().count("rmsnorm_matmul"), 0u) << "fused ops did not run";
      EXPECT_GT(a->stats().calls().count("qk_rope_store") +
                    a->stats().calls().count("qk_rope_attention"),
                0u);
      EXPECT_GT(a->stats().calls().count("matmul_add"), 0u);
      EXPECT_GT(a->stats().calls().count("rmsnorm_glu"), 0u);
      CudaTuning t = cuda_tuning(*b);
      t.fused = false;
      t.pdl = false;
      cuda_set_tuning(*b, t);
      const auto tb = decode_logits(*m, *b, prompt, 24, ctx);
      t.pdl = true;
      cuda_set_tuning(*b, t);  // PDL is process-wide: restore it
      EXPECT_EQ(b->stats().calls().count("rmsnorm_matmul"), 0u);
      expect_same_bits(ta, tb);
      ++compared;
    }
  }
  EXPECT_GE(compared, 4) << "no shipped model found";
#endif
}

#if ARBITER_HAVE_CUDA
/// An op of a fused kernel and the provider it must run as.
struct FusedOp {
  const char* op;
  const char* provider;
};

/// A 16-step greedy decode of each fixture, in every dtype, with the tier's fused kernels
/// (where each op must run as its provider) and with fusion off: the same bits.
void expect_fused_ops_keep_bits(std::initializer_list<const char*> fixtures,
                                std::initializer_list<FusedOp> ops) {
  for (const char* name : fixtures) {
    auto m = load_model(source_path(std::string("tests/fixtures/models/") + name));
    const int V = m->config.vocab;
    const std::vector<int32_t> prompt = {1 % V, 80 % V, 147 % V, 201 % V, 57 % V};
    for (const char* dt : {"bf16", "f16", "f32"}) {
      SCOPED_TRACE(std::string(name) + " " + dt);
      auto a = make_cuda_backend(0, dt), b = make_cuda_backend(0, dt);
      const auto ta = decode_logits(*m, *a, prompt, 16);
      for (const FusedOp& f : ops) {
        const auto& calls = a->stats().calls();
        EXPECT_TRUE(calls.count(f.op) && calls.at(f.op).count(f.provider))
            << f.op << " did not run fused";
      }
      CudaTuning t = cuda_tuning(*b);
      t.fused = false;
      cuda_set_tuning(*b, t);
      const auto tb = decode_logits(*m, *b, prompt, 16);
      for (const FusedOp& f : ops) EXPECT_EQ(b->stats().calls().count(f.op), 0u) << f.op;
      expect_same_bits(ta, tb);
    }
  }
}
#endif

// The MoE blocks' residual update inside the decode down GEMV (moe_add: qwen3-moe's add,
// qwen2-moe's shared expert, Granite's shared expert and residual_multiplier, Nemotron-H's
// relu2 shared expert) and Granite's shared expert as one gate/up GEMV: the bits of the ops
// one by one.
TEST(CudaFused, MoeDecodeEqualsOpByOpPath) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  expect_fused_ops_keep_bits(
      {"tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-granite-h-moe", "tiny-nemotron-h"},
      {{"moe_add", "cuda.moe_decode_add"}});
#endif
}

// Gemma's post norms and residual adds inside the next norm's GEMV (rmsnorm_add as the
// NormAdd of the feed-forward's, the next layer's q/k/v and the final norm): the bits of the
// ops one by one.
TEST(CudaFused, GemmaDecodeEqualsOpByOpPath) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  expect_fused_ops_keep_bits({"tiny-gemma3", "tiny-gemma2"},
                             {{"rmsnorm_add", "cuda.in_norm_gemv"}});
#endif
}

// The hybrids' Mamba2 in_proj with the conv in its xBC rows (rmsnorm_matmul_conv): the bits of
// the GEMV and then ssm_conv.
TEST(CudaFused, HybridDecodeEqualsOpByOpPath) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  expect_fused_ops_keep_bits({"tiny-granite-h", "tiny-granite-h-moe", "tiny-nemotron-h"},
                             {{"rmsnorm_matmul_conv", "cuda.norm_gemv_conv"}});
#endif
}

// The same at a real model's shapes (two layers of Qwen3-0.6B: 1024-wide x, 2048- and
// 3072-element rows of the o and down projections, which keep x in shared memory and launch
// the next GEMV early, 4096 q/k/v and 3072 gate/up rows, a 151,936-row logits GEMV), in both
// 16-bit dtypes, with greedy picks on the device as generate runs them.
TEST(CudaFused, DecodeEqualsOpByOpPathAtQwen3Shape) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  auto syn = synthetic_qwen3_06b(2);
  const std::vector<int32_t> prompt = {1, 80, 147, 201, 57};
  for (const char* dt : {"bf16", "f16"}) {
    SCOPED_TRACE(dt);
    const int n = 8, ctx = int(prompt.size()) + n + 1;
    auto a = make_cuda_backend(0, dt);
    Session sa(syn->m, *a, ctx);
    const std::vector<int32_t> ids = greedy_by_pick(sa, prompt, n);
    const auto ta = decode_logits(syn->m, *a, prompt, n);
    EXPECT_GT(a->stats().calls().count("matmul_add"), 0u) << "fused ops did not run";
    auto b = make_cuda_backend(0, dt);
    CudaTuning t = cuda_tuning(*b);
    t.fused = false;
    t.pdl = false;
    cuda_set_tuning(*b, t);
    Session sb(syn->m, *b, ctx);
    EXPECT_EQ(greedy_by_summarize(sb, prompt, n), ids);
    const auto tb = decode_logits(syn->m, *b, prompt, n);
    t.pdl = true;
    cuda_set_tuning(*b, t);  // PDL is process-wide: restore it
    EXPECT_EQ(b->stats().calls().count("rmsnorm_matmul"), 0u);
    ASSERT_EQ(ta.size(), tb.size());
    EXPECT_EQ(0, std::memcmp(ta.data(), tb.data(), ta.size() * sizeof(double)))
        << "fused decode differs from op-by-op";
  }
#endif
}

// The direct decode attention (one launch, splits merged by the last block) against the
// flash kernel + combine it replaced for T == 1: different summation orders, both f32.
TEST(CudaFused, DirectDecodeAttentionMatchesFlashPath) {
  ARB_CUDA_OR_SKIP(probe, "f32");
#if ARBITER_HAVE_CUDA
  const std::string path = model_dir("tests/fixtures/models/tiny-qwen3");  // Dh 32: direct kernel
  if (path.empty()) GTEST_SKIP() << "fixture tiny-qwen3 missing";
  auto m = load_model(path);
  const std::vector<int32_t> prompt = {1, 80, 147, 201, 57, 300, 9};
  auto a = make_cuda_backend(0, "f32"), b = make_cuda_backend(0, "f32");
  const auto ta = decode_logits(*m, *a, prompt, 40);
  // The direct kernel runs with the q/k norm + RoPE + KV store folded in (qk_rope_attention).
  EXPECT_GT(a->stats().calls().count("qk_rope_attention"), 0u);
  CudaTuning t = cuda_tuning(*b);
  t.attn_direct = false;
  cuda_set_tuning(*b, t);
  const auto tb = decode_logits(*m, *b, prompt, 40);
  EXPECT_EQ(b->stats().calls().at("attention").count("cuda.attn_decode_direct"), 0u);
  ASSERT_EQ(ta.size(), tb.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ta.size(); ++i) {
    num += (ta[i] - tb[i]) * (ta[i] - tb[i]);
    den += tb[i] * tb[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  // And two runs of the direct kernel (atomic tickets) are byte-identical.
  auto c = make_cuda_backend(0, "f32");
  const auto tc = decode_logits(*m, *c, prompt, 40);
  EXPECT_EQ(0, std::memcmp(ta.data(), tc.data(), ta.size() * sizeof(double)));
#endif
}

// --mix on the cuda tier. Over a w8 trace of TinyStories-656K (640 positions) against the
// f64 oracle, bf16 with mlp or attn at f32 has a smaller KL (compare's drift statistic, in
// units of u^2) than uniform bf16 (measured on the H200: uniform 4.05, mlp=f32 3.44,
// attn=f32 2.18); every family at f32 is uniform f32 up to the inter-tier copies; the trace
// header records the spec. (A 9-step decode of one prompt was too small a sample to order
// mlp=f32 and uniform bf16: 6.19e-3 vs 6.04e-3 relative L2.)
TEST(CudaMix, OneFamilyAtF32MovesBf16TowardsRef) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
  const std::string path = model_dir("models/TinyStories-656K");
  if (path.empty()) GTEST_SKIP() << "model not shipped: TinyStories-656K";
  auto m = load_model(path);
  const std::vector<int32_t> prompt = {1, 80, 147, 201, 57};
  auto ref = make_ref_backend();
  const auto lr = decode_logits(*m, *ref, prompt, 8);
  auto rel = [&](const std::vector<double>& a) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - lr[i]) * (a[i] - lr[i]);
      den += lr[i] * lr[i];
    }
    return std::sqrt(num / den);
  };
  DeviceSpec ds;
  ds.device = "cuda";
  ds.dtype = "bf16";
  auto uni = make_backend(ds);
  const double e_uni = rel(decode_logits(*m, *uni, prompt, 8));
  ds.mix = "attn=f32,mlp=f32,norm=f32,residual=f32,embed=f32,logits=f32";
  auto all = make_backend(ds);
  const double e_all = rel(decode_logits(*m, *all, prompt, 8));
  std::printf("MODEL mix all families f32: rel L2 to ref %.3e (uniform bf16 %.3e)\n", e_all, e_uni);
  EXPECT_LT(e_all, 1e-5);

  const std::string dir = temp_dir("mix"), corpus = source_path("models/corpus/stories.txt");
  auto trace = [&](const std::string& dev, const std::string& out) {
    auto r = run_cli("trace -m " + path + " --corpus " + corpus + " --shape w8 --allow-long-context " + dev + " -o " + out + " --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  };
  auto kl = [&](const std::string& cand) {
    auto c = run_cli("compare --json " + dir + "/ref.tsv " + cand);
    const auto j = nlohmann::json::parse(c.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << c.out << c.err;
    return j.is_discarded() ? 0.0 : j["drift_gate"]["kl_over_u2"].get<double>();
  };
  trace("--device ref", dir + "/ref.tsv");
  trace("--device cuda --dtype bf16", dir + "/bf16.tsv");
  trace("--device cuda --dtype bf16 --mix mlp=f32", dir + "/mlp.tsv");
  trace("--device cuda --dtype bf16 --mix attn=f32", dir + "/attn.tsv");
  const double k_uni = kl(dir + "/bf16.tsv"), k_mlp = kl(dir + "/mlp.tsv"), k_attn = kl(dir + "/attn.tsv");
  std::printf("MODEL mix w8 KL/u^2 vs ref: uniform bf16 %.3f, mlp=f32 %.3f, attn=f32 %.3f\n", k_uni, k_mlp,
              k_attn);
  EXPECT_LT(k_mlp, k_uni);
  EXPECT_LT(k_attn, k_uni);
  EXPECT_NE(read_file(dir + "/mlp.tsv").find("# mix\tmlp=f32"), std::string::npos);
}

TEST(CudaProbe, ReadBandwidthIsPositive) {
  ARB_CUDA_OR_SKIP(cu, "bf16");
  const std::vector<double> bw = cu->read_bandwidth_gbs(2);
  ASSERT_EQ(bw.size(), 2u);
  for (double g : bw) {
    EXPECT_GT(g, 100.0);     // any GPU of this decade
    EXPECT_LT(g, 100000.0);  // and no timer artefact
  }
  std::printf("BENCH read probe %.1f %.1f GB/s\n", bw[0], bw[1]);
}

TEST(CudaCli, BenchWithTraceShapes) {
  ARB_CUDA_OR_SKIP(cu, "bf16");
  const std::string model = model_dir("models/TinyStories-656K");
  if (model.empty()) GTEST_SKIP() << "model not shipped: TinyStories-656K";
  auto r = run_cli("bench -m " + model + " --device cuda --dtype bf16 -p 16 -n 8 -r 1 --shapes w256,w8ctx1536 --corpus " +
                   source_path("models/corpus/stories.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| trace w256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| trace w8ctx1536"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device read probe"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace arbiter::test
