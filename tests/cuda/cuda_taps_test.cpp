// Stage taps inside the CUDA tier's fused decode kernels (backend/tap.h, kernels.h Tap): what
// drift, opcheck and --inject see on the path trace and generate run. A tapped fused kernel
// must record the bits its own op-by-op path stores (the fused forms compute exactly those),
// replay a capture exactly, and put an injected fault where it names: inside the norm + q/k/v
// GEMV, the q/k norm + RoPE + attention kernel, the GEMV + residual add, the norm + gate/up
// GEMV and the hybrids' in_proj GEMV with the conv inside. The drift run's providers are the
// trace run's. SKIP without a GPU (ARBITER_REQUIRE_CUDA=1 makes that a failure). To add a
// fault case: append to kFaults.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cuda/cuda_test_util.h"
#include "engine/probe.h"
#include "verify/localize/drift.h"

namespace arbiter::test {
namespace {

const char* kLlama = "models/TinyStories-656K";  // 2 layers, Dh 16: every fused form
const char* kQwen2 = "tests/fixtures/models/tiny-qwen2";  // q/k/v biases
const char* kQwen3 = "tests/fixtures/models/tiny-qwen3";  // q/k norms, Dh 32
const char* kGraniteH = "tests/fixtures/models/tiny-granite-h";  // Mamba2 layers 0 and 2

std::vector<int32_t> corpus_ids(const Model& m, int n) {
  std::ifstream f(source_path("models/corpus/stories.txt"), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids;
  if (m.tokenizer->bos_id() >= 0) ids.push_back(m.tokenizer->bos_id());
  const std::vector<int32_t> body = m.tokenizer->encode(ss.str(), false, false);
  ids.insert(ids.end(), body.begin(), body.begin() + (n - int(ids.size())));
  return ids;
}

/// (op, provider) pairs a backend ran.
std::set<std::string> providers(const Backend& be) {
  std::set<std::string> out;
  for (const auto& [op, by] : be.stats().calls())
    for (const auto& [prov, n] : by) out.insert(op + "=" + prov);
  return out;
}

#if ARBITER_HAVE_CUDA
void set_fused(Backend& be, bool on) {
  CudaTuning t = cuda_tuning(be);
  t.fused = on;
  cuda_set_tuning(be, t);
}
#endif

#if ARBITER_HAVE_CUDA
/// 24 positions of the model at width 1 captured with the tier's fused kernels and with fusion
/// off: every stage the same bits. Out: the fused run's providers and the stages captured.
void expect_fused_captures_equal(const char* rel, const char* dt, std::set<std::string>& provs,
                                 std::set<std::string>& stages) {
  auto m = load_model(source_path(rel));
  auto fused = make_cuda_backend(0, dt), plain = make_cuda_backend(0, dt);
  set_fused(*plain, false);
  Session sf(*m, *fused, 24, 1), sp(*m, *plain, 24, 1);
  const std::vector<int32_t> ids = corpus_ids(*m, 24);
  const Capture cf = capture_forwards(sf, ids, 1), cp = capture_forwards(sp, ids, 1);
  ASSERT_EQ(cf.size(), cp.size());
  for (size_t f = 0; f < cf.size(); ++f)
    for (const StageRecord& r : cp[f].stages) {
      ASSERT_EQ(cf[f].at(r.name, r.layer).values, r.values)
          << "forward " << f << " " << verify::stage_id_name(r.name, r.layer);
      stages.insert(r.name);
    }
  provs = providers(*fused);
}
#endif

TEST(CudaTaps, FusedKernelsRecordTheirOpByOpBits) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  for (const char* rel : {kLlama, kQwen2, kQwen3})
    for (const char* dt : {"bf16", "f16", "f32"}) {
      SCOPED_TRACE(std::string(rel) + " " + dt);
      std::set<std::string> pf, stages;
      expect_fused_captures_equal(rel, dt, pf, stages);
      // The fused kernels did run, taps and all.
      EXPECT_TRUE(pf.count(std::string("rmsnorm_matmul=cuda.norm_gemv_") + dt));
      EXPECT_TRUE(pf.count(std::string("rmsnorm_glu=cuda.norm_gemv_glu_") + dt));
      EXPECT_TRUE(pf.count(std::string("matmul_add=cuda.gemv_add_") + dt));
      // Heads of 32+ take the decode attention with q/k norm + RoPE inside; heads of 16 (the
      // llama and qwen2 here) the fused q/k norm + RoPE + KV store before the attention.
      EXPECT_TRUE(pf.count("qk_rope_attention=cuda.qk_rope_attn_decode") ||
                  pf.count("qk_rope_store=cuda.qk_rope_store"));
      EXPECT_FALSE(pf.count("rmsnorm=cuda.rmsnorm_warp"));  // no op-by-op fallback
    }
#endif
}

// The same for a hybrid: the Mamba2 in_proj with the conv inside records the GEMV's and the
// conv's op-by-op bits (stages ssm_xbc, ssm_conv and the conv state among them).
TEST(CudaTaps, HybridFusedKernelsRecordTheirOpByOpBits) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  for (const char* dt : {"bf16", "f32"}) {
    SCOPED_TRACE(dt);
    std::set<std::string> pf, stages;
    expect_fused_captures_equal(kGraniteH, dt, pf, stages);
    EXPECT_TRUE(stages.count("ssm_xbc") && stages.count("ssm_conv") &&
                stages.count("ssm_conv_state"));
    EXPECT_TRUE(pf.count("rmsnorm_matmul_conv=cuda.norm_gemv_conv"));
  }
#endif
}

TEST(CudaTaps, ReplayOfItsOwnCaptureIsExact) {
  ARB_CUDA_OR_SKIP(cu, "bf16");
  // Overwriting every stage with the value it had leaves every stage as it was: the
  // overwrite reaches the kernels' inputs at the right elements (the KV cache included).
  for (const char* rel : {kLlama, kQwen3}) {
    auto m = load_model(source_path(rel));
    Session s(*m, *cu, 24, 1);
    const Capture cap = capture_forwards(s, corpus_ids(*m, 24), 1);
    const Capture rep = replay_forwards(s, cap);
    for (size_t f = 0; f < cap.size(); ++f)
      for (const StageRecord& r : cap[f].stages)
        ASSERT_EQ(rep[f].at(r.name, r.layer).values, r.values)
            << rel << " forward " << f << " " << verify::stage_id_name(r.name, r.layer);
  }
}

struct FaultCase {
  const char* model;
  const char* inject;
  const char* stage;  // the stage drift must name first
  int layer;
};

TEST(CudaTaps, AFaultInsideAFusedKernelIsNamedByDrift) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
  // Each stage here lives inside a fused kernel of the decode step (width 1): the norm of
  // the q/k/v and gate/up GEMVs, q/k norm and RoPE inside the attention kernel, the product
  // of the GEMV + residual add, the final norm of the logits GEMV.
  const FaultCase kFaults[] = {
      {kLlama, "op=attn_norm,layer=1,scale=1.2", "attn_norm", 1},
      {kLlama, "op=q_rope,layer=0,noise=0.05", "q_rope", 0},
      {kLlama, "op=k_rope,layer=1,scale=0.8", "k_rope", 1},
      {kLlama, "op=o,layer=0,scale=1.2", "o", 0},
      {kLlama, "op=ffn_norm,layer=1,bias=0.1", "ffn_norm", 1},
      {kLlama, "op=gate,layer=0,scale=1.2", "gate", 0},
      {kLlama, "op=up,layer=1,scale=0.8", "up", 1},
      {kLlama, "op=down,layer=1,scale=1.2", "down", 1},
      {kLlama, "op=final_norm,scale=1.2", "final_norm", -1},
      {kQwen3, "op=q_norm,layer=1,scale=1.2", "q_norm", 1},
      {kQwen3, "op=k_norm,layer=0,noise=0.05", "k_norm", 0},
      {kGraniteH, "op=ssm_xbc,layer=2,scale=1.2", "ssm_xbc", 2},  // read by the conv inside
  };
  for (const FaultCase& fc : kFaults) {
    SCOPED_TRACE(fc.inject);
    auto m = load_model(source_path(fc.model));
    auto ref = make_ref_backend();
    auto cu = make_cuda_backend(0, "bf16");
    Session sa(*m, *ref, 24, 1), sb(*m, *cu, 24, 1);
    sb.set_inject(InjectSpec::parse(fc.inject));
    const std::vector<int32_t> ids = corpus_ids(*m, 24);
    const Capture ca = capture_forwards(sa, ids, 1), cb = capture_forwards(sb, ids, 1);
    const Capture cl = replay_forwards(sb, ca);
    const verify::DriftReport r = verify::drift_compare(
        ca, cb, cl, coarser(roundoff_of(DType::F64), roundoff_of(DType::BF16)));
    ASSERT_GE(r.first_flagged, 0) << verify::drift_text(r);
    const verify::LocalRow& first = r.rows[size_t(r.first_flagged)].id;
    EXPECT_EQ(first.stage, fc.stage) << verify::drift_text(r);
    EXPECT_EQ(first.layer, fc.layer);
    EXPECT_EQ(r.n_flagged, 1) << verify::drift_text(r);  // local errors do not compound
    EXPECT_TRUE(providers(*cu).count("rmsnorm_matmul=cuda.norm_gemv_bf16"));
  }
}

TEST(CudaTaps, DriftCliNamesTheFusedStageAndRunsTheTracesProviders) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
  // The acceptance check of the registry issue, through the CLI: a fault inside the fused
  // norm + q/k/v GEMV at layer 1 is named by `drift --b cuda:bf16 --width 1`, and the drift
  // run's op providers are those of a w1 trace on the same tier (its forward ops; the trace
  // also summarizes).
  const std::string model = source_path(kLlama), corpus = source_path("models/corpus/stories.txt");
  const std::string dir = temp_dir("cuda-taps-cli");
  CliResult d = run_cli("drift -m " + model + " --corpus " + corpus +
                        " --a ref --b cuda:bf16 --positions 24 --width 1 --json"
                        " --inject op=attn_norm,layer=1,scale=1.2");
  ASSERT_EQ(d.exit_code, 1) << d.err;
  const nlohmann::json j = nlohmann::json::parse(d.out);
  EXPECT_EQ(j["first_flagged"]["stage"], "attn_norm");
  EXPECT_EQ(j["first_flagged"]["layer"], 1);
  CliResult t = run_cli("trace -m " + model + " --corpus " + corpus +
                        " --shape w1 --chunks 8 --device cuda --dtype bf16 -o " + dir + "/t.tsv");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  auto pairs = [](const std::string& field) {  // "op=provider:n,..." -> {op=provider}
    std::set<std::string> out;
    std::stringstream ss(field);
    for (std::string item; std::getline(ss, item, ',');)
      if (item.rfind("summarize=", 0) != 0) out.insert(item.substr(0, item.rfind(':')));
    return out;
  };
  std::string providers_field;
  std::ifstream f(dir + "/t.tsv");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("# providers\t", 0) == 0) {
      const size_t a = line.find('\t') + 1;
      providers_field = line.substr(a, line.find('\t', a) - a);
    }
  ASSERT_FALSE(providers_field.empty());
  EXPECT_EQ(pairs(j["b_providers"].get<std::string>()), pairs(providers_field));
  EXPECT_TRUE(pairs(providers_field).count("rmsnorm_matmul=cuda.norm_gemv_bf16"));
}

}  // namespace
}  // namespace arbiter::test
