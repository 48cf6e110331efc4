// The hybrid family (model/archs/hybrid.h): Mamba2/attention hybrids. HF's logits of the
// fixtures are checked in tests/engine/hf_reference_test.cpp; here: a prefill of N tokens
// equals N one-token steps (byte for byte on ref, within f32 rounding on cpu), a chunked
// prefill continues the recurrent state, the state cannot rewind, greedy ids agree across
// tiers, the config readings (both
// spellings of the layer list, Nemotron-H's pattern, the dt clamps, the gated norm's groups)
// and the refusals: a missing SSM tensor, mismatched Mamba dimensions, an unknown layer type,
// each one line naming the file and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/inject.h"
#include "engine/probe.h"
#include "engine/session.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/model.h"
#include "test_util.h"
#include "verify/localize/drift.h"

using namespace arbiter;

namespace {

const char* kGranite = "tests/fixtures/models/tiny-granite-h";

std::vector<int32_t> prompt_of(const std::string& dir, size_t n) {
  const nlohmann::json ref =
      nlohmann::json::parse(test::read_file(test::source_path(dir + "/reference_logits.json")));
  std::vector<int32_t> p = ref["prompt_ids"].get<std::vector<int32_t>>();
  p.resize(std::min(p.size(), n));
  return p;
}

// Logits of the prompt's positions run as one forward, as one-token steps, and as chunks.
struct Runs {
  std::vector<std::vector<double>> prefill, steps, chunks;  // [position][V]
};
Runs run_three_ways(const Model& m, Backend& be, const std::vector<int32_t>& p, int chunk) {
  Runs r;
  const int n = int(p.size());
  Session s(m, be, n);
  s.forward(p);
  for (int i = 0; i < n; ++i) r.prefill.push_back(s.logits(i));
  s.reset();
  for (int i = 0; i < n; ++i) {
    s.forward({p[size_t(i)]});
    r.steps.push_back(s.logits(0));
  }
  s.reset();
  for (int i0 = 0; i0 < n; i0 += chunk) {
    const int w = std::min(chunk, n - i0);
    s.forward(std::vector<int32_t>(p.begin() + i0, p.begin() + i0 + w));
    for (int i = 0; i < w; ++i) r.chunks.push_back(s.logits(i));
  }
  return r;
}

double max_diff(const std::vector<std::vector<double>>& a,
                const std::vector<std::vector<double>>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t v = 0; v < a[i].size(); ++v) worst = std::max(worst, std::fabs(a[i][v] - b[i][v]));
  return worst;
}

}  // namespace

// ref: every op runs token by token in the same order whether the tokens come in one forward
// or one at a time (the scan is the plain recurrence; attention sums keys in order), so the
// logits are the same bits.
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_one_line(const std::string& e, const std::string& file, const std::string& want) {
  EXPECT_NE(e.find(file), std::string::npos) << e;
  EXPECT_NE(e.find(want), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

}  // namespace

// Every hybrid fixture: Granite dense (no RoPE), Granite MoE (RoPE, routed experts), and
// Nemotron-H (mixer, sigmoid-routed MoE, attention, relu2 MLP).
const char* const kFixtures[] = {kGranite, "tests/fixtures/models/tiny-granite-h-moe",
                                 "tests/fixtures/models/tiny-nemotron-h"};

TEST(Hybrid, PrefillEqualsStepsBitForBitOnRef) {
  auto be = make_backend({"ref", "", 0, ""});
  for (const char* dir : kFixtures) {
    auto m = load_model(test::source_path(dir));
    const Runs r = run_three_ways(*m, *be, prompt_of(dir, 20), 7);
    ASSERT_EQ(r.prefill.size(), 20u);
    for (size_t i = 0; i < r.prefill.size(); ++i) {
      EXPECT_EQ(r.prefill[i], r.steps[i]) << dir << " position " << i;
      EXPECT_EQ(r.prefill[i], r.chunks[i]) << dir << " position " << i;
    }
  }
}

// cpu: the matmuls take other kernels for one row than for many (gemv vs gemm), and the scan
// another algorithm (the chunked form for a prefill, the recurrence for a step: backend.h), so
// steps differ from the prefill by f32 rounding only: far below the logits' scale (~10). 36
// tokens cross two boundaries of the fixtures' chunk_size 16; pieces of 7 start and end
// inside chunks, each continuing the state the last left.
TEST(Hybrid, PrefillMatchesStepsOnCpu) {
  auto be = make_backend({"cpu", "", 1, ""});  // one thread: these shapes are too small to share
  for (const char* dir : kFixtures) {
    auto m = load_model(test::source_path(dir));
    const Runs r = run_three_ways(*m, *be, prompt_of(dir, 36), 7);
    EXPECT_LE(max_diff(r.prefill, r.steps), 1e-4) << dir;
    EXPECT_LE(max_diff(r.prefill, r.chunks), 1e-4) << dir;
  }
}

// Greedy decoding (prefill, then one-token steps through the recurrent states): cpu (f32)
// picks the ids ref (f64) picks, 16 tokens behind a short prompt on every fixture.
TEST(Hybrid, GreedyIdsOnCpuEqualRef) {
  for (const char* dir : kFixtures) {
    auto m = load_model(test::source_path(dir));
    const std::vector<int32_t> prompt =
        m->tokenizer->encode("Once upon a time, a cat", true, false);
    std::vector<std::vector<int32_t>> ids;
    for (const char* tier : {"ref", "cpu"}) {
      auto be = make_backend({tier, "", 1, ""});
      Session s(*m, *be, int(prompt.size()) + 16);
      ids.push_back(test::greedy_by_summarize(s, prompt, 16));
    }
    EXPECT_EQ(ids[1], ids[0]) << dir;
  }
}

// Nemotron-3-Nano's shared expert (3,712 wide) is wider than its dense MLP (1,856): the
// forward's scratch must hold the wider (cpu asserted, cuda refused "output holds 950272
// elements, needs 1900544" at pp512). tiny-nemotron-h with its shared expert widened from 48
// to 160 columns (its MLP has 128) runs on ref and cpu, and they agree.
TEST(Hybrid, NemotronSharedExpertWiderThanItsMlp) {
  const std::string dir = test::source_path("tests/fixtures/models/tiny-nemotron-h");
  struct Held {
    SafetensorsSet st;
    std::vector<float> up, down;
  };
  auto held = std::make_shared<Held>(Held{SafetensorsSet::open_dir(dir), {}, {}});
  const int64_t D = 64, Fs = 160;
  held->up.resize(size_t(Fs * D));
  held->down.resize(size_t(D * Fs));
  for (size_t i = 0; i < held->up.size(); ++i) held->up[i] = float(std::sin(0.37 * double(i))) * 0.1f;
  for (size_t i = 0; i < held->down.size(); ++i) held->down[i] = float(std::cos(0.23 * double(i))) * 0.1f;
  HfInMemory src;
  src.path = dir + " (shared expert widened)";
  src.format = "test";
  src.weights_id = "wide-shared-expert";
  nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  ASSERT_LT(cfg["moe_shared_expert_intermediate_size"].get<int>(), cfg["intermediate_size"].get<int>());
  cfg["moe_shared_expert_intermediate_size"] = Fs;
  src.config_text = cfg.dump();
  src.tokenizer_json = test::read_file(dir + "/tokenizer.json");
  src.tokenizer_config_json = test::read_file(dir + "/tokenizer_config.json");
  src.eos_ids = {cfg["eos_token_id"].get<int32_t>()};
  int widened = 0;
  for (const auto& [name, t] : held->st.tensors()) {
    Tensor w = t;
    if (name.find("shared_experts.up_proj") != std::string::npos) {
      w.dtype = DType::F32, w.shape = {Fs, D}, w.data = held->up.data();
      ++widened;
    } else if (name.find("shared_experts.down_proj") != std::string::npos) {
      w.dtype = DType::F32, w.shape = {D, Fs}, w.data = held->down.data();
      ++widened;
    }
    src.tensors[name] = w;
  }
  ASSERT_EQ(widened, 2);
  src.storage = held;
  auto m = load_hf_in_memory(std::move(src));
  ASSERT_EQ(m->config.moe_shared_ff, Fs);
  const std::vector<int32_t> p = prompt_of("tests/fixtures/models/tiny-nemotron-h", 12);
  std::vector<std::vector<double>> logits;
  for (const char* tier : {"ref", "cpu"}) {
    auto be = make_backend({tier, "", 1, ""});
    Session s(*m, *be, int(p.size()));
    s.forward(p);
    logits.push_back(s.logits(int(p.size()) - 1));
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t v = 0; v < logits[0].size(); ++v) EXPECT_NEAR(logits[1][v], logits[0][v], 1e-3) << v;
}

// A reset session starts from zeroed states (same logits again); a forward that does not
// continue where the states stopped is refused (they cannot rewind).
TEST(Hybrid, TheRecurrentStateRestartsAtZeroAndCannotRewind) {
  auto m = load_model(test::source_path(kGranite));
  auto be = make_backend({"ref", "", 0, ""});
  const std::vector<int32_t> p = prompt_of(kGranite, 4);
  Session s(*m, *be, 8);
  s.forward(p);
  const std::vector<double> first = s.logits(3);
  s.reset();
  s.forward(p);
  EXPECT_EQ(s.logits(3), first);

  auto st = m->arch->make_state(*m, *be, 8, 4);
  ForwardArgs a;
  a.ids = p.data();
  a.T = 4;
  m->arch->forward(*m, *be, *st, a);
  a.T = 2;
  a.pos0 = 2;
  const std::string e = error_of([&] { m->arch->forward(*m, *be, *st, a); });
  EXPECT_NE(e.find("cannot rewind"), std::string::npos) << e;
}

TEST(Hybrid, GraniteConfig) {
  ModelConfig c = load_hf_config(test::source_path(kGranite));
  EXPECT_EQ(c.arch, "granitemoehybrid");
  EXPECT_EQ(c.layer_blocks, "M*M*");  // the Hub's "mamba"/"attention" spelling
  EXPECT_EQ(c.ssm_heads, 8);
  EXPECT_EQ(c.ssm_head_dim, 16);
  EXPECT_EQ(c.ssm_groups, 2);
  EXPECT_EQ(c.ssm_state, 16);
  EXPECT_EQ(c.ssm_conv, 4);
  EXPECT_EQ(c.ssm_chunk, 16);  // mamba_chunk_size
  EXPECT_FALSE(c.ssm_norm_per_group);
  EXPECT_FALSE(c.use_rope);  // position_embedding_type "nope"
  EXPECT_EQ(c.d_ff, 128);    // shared_intermediate_size
  EXPECT_EQ(c.embed_mult, 12.0);
  EXPECT_EQ(c.residual_mult, 0.22);
  EXPECT_EQ(c.attn_scale, 0.0625);
  EXPECT_EQ(c.logits_scaling, 4.0);
  EXPECT_EQ(c.ssm_dt_min, 0.0);
  EXPECT_EQ(c.ssm_dt_max, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(c.tied_embeddings);
  // transformers 5.17's spelling, rope, and a finite time_step_limit.
  const std::string text = test::read_file(test::source_path(kGranite) + "/config.json");
  nlohmann::json j = nlohmann::json::parse(text);
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "full_attention"};
  j["position_embedding_type"] = "rope";
  j["time_step_limit"] = {0.01, 0.5};
  j.erase("mamba_chunk_size");  // GraniteMoeHybridConfig's default
  ModelConfig v5 = parse_hf_config(j.dump(), "config.json");
  EXPECT_EQ(v5.ssm_chunk, 256);
  EXPECT_EQ(v5.layer_blocks, "*MM*");
  EXPECT_TRUE(v5.use_rope);
  EXPECT_EQ(v5.rope.theta, 10000.0);
  EXPECT_EQ(v5.ssm_dt_min, 0.01);
  EXPECT_EQ(v5.ssm_dt_max, 0.5);
  // tiny-granite-h-moe: routed experts beside the shared MLP.
  ModelConfig moe = load_hf_config(test::source_path("tests/fixtures/models/tiny-granite-h-moe"));
  EXPECT_EQ(moe.layer_blocks, "*MM*");
  EXPECT_EQ(moe.moe_experts, 4);
  EXPECT_EQ(moe.moe_top_k, 2);
  EXPECT_EQ(moe.moe_ff, 32);  // intermediate_size
  EXPECT_EQ(moe.d_ff, 64);    // shared_intermediate_size
  EXPECT_TRUE(moe.use_rope);
  EXPECT_FALSE(moe.tied_embeddings);
}

TEST(Hybrid, NemotronConfig) {
  // tiny-nemotron-h: the pattern string "ME*-", the per-group norm, the dt floor of Zamba2's
  // mixer, the sigmoid router's keys.
  const std::string text =
      test::read_file(test::source_path("tests/fixtures/models/tiny-nemotron-h/config.json"));
  nlohmann::json j = nlohmann::json::parse(text);
  ModelConfig c = parse_hf_config(j.dump(), "config.json");
  EXPECT_EQ(c.arch, "nemotron_h");
  EXPECT_EQ(c.layer_blocks, "ME*-");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_TRUE(c.ssm_norm_per_group);
  EXPECT_EQ(c.ssm_groups, 2);
  EXPECT_EQ(c.ssm_chunk, 16);  // chunk_size
  EXPECT_EQ(c.ssm_dt_min, 0.001);  // time_step_min; time_step_limit is not read by HF's mixer
  EXPECT_EQ(c.ssm_dt_max, std::numeric_limits<double>::infinity());
  EXPECT_EQ(c.d_ff, 128);
  EXPECT_FALSE(c.use_rope);
  EXPECT_EQ(c.attn_scale, 0.25);  // 16^-0.5
  EXPECT_EQ(c.moe_experts, 4);
  EXPECT_EQ(c.moe_top_k, 2);
  EXPECT_EQ(c.moe_ff, 32);
  EXPECT_EQ(c.moe_shared_ff, 48);
  EXPECT_TRUE(c.moe_norm_topk);
  EXPECT_EQ(c.moe_scaling, 2.0);
  // transformers 5.17's list, legacy names included.
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = {"linear_attention", "mlp", "full_attention", "mamba", "moe"};
  EXPECT_EQ(parse_hf_config(j.dump(), "config.json").layer_blocks, "M-*ME");
  // NemotronHConfig: chunk_size defaults to 128; the legacy mamba_chunk_size wins over it.
  j.erase("chunk_size");
  EXPECT_EQ(parse_hf_config(j.dump(), "config.json").ssm_chunk, 128);
  j["mamba_chunk_size"] = 64;
  j["chunk_size"] = 32;
  EXPECT_EQ(parse_hf_config(j.dump(), "config.json").ssm_chunk, 64);
  // num_key_value_heads: NemotronHConfig's 8 when absent, num_attention_heads when null.
  j["num_attention_heads"] = 16;
  j["head_dim"] = 4;
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse_hf_config(j.dump(), "config.json").n_head_kv, 8);
  j["num_key_value_heads"] = nullptr;
  EXPECT_EQ(parse_hf_config(j.dump(), "config.json").n_head_kv, 16);
}

TEST(Hybrid, BadConfigsAreRefusedNamingTheKey) {
  const nlohmann::json granite = nlohmann::json::parse(
      test::read_file(test::source_path(kGranite) + "/config.json"));
  const nlohmann::json nemotron = nlohmann::json::parse(
      test::read_file(test::source_path("tests/fixtures/models/tiny-nemotron-h/config.json")));
  auto with = [](nlohmann::json j, const char* key, const nlohmann::json& v) {
    j[key] = v;
    return j.dump();
  };
  nlohmann::json granite_moe = granite;
  granite_moe["num_local_experts"] = 4;

  const std::pair<std::string, std::string> cases[] = {
      {with(granite, "layer_types", {"mamba", "attention", "cross", "mamba"}),
       "layer_types[2] 'cross' is not a layer type"},
      {with(granite, "layer_types", {"mamba"}), "'layer_types' is not a list of num_hidden_layers"},
      {with(granite, "mamba_n_groups", 3), "mamba_n_groups 3 does not divide the 8 Mamba heads"},
      {with(granite, "mamba_n_heads", 7), "mamba_n_heads 7 does not divide mamba_expand"},
      {with(granite, "mamba_d_head", 8), "mamba_d_head 8 x mamba_n_heads 8"},
      {with(granite, "position_embedding_type", "alibi"), "position_embedding_type \"alibi\""},
      {with(granite, "num_local_experts", -1), "num_local_experts -1 is outside"},
      {with(granite_moe, "num_experts_per_tok", 5), "more experts per token than experts"},
      {with(granite, "mamba_proj_bias", true), "mamba_proj_bias=true"},
      {with(granite, "time_step_limit", {1.0}), "time_step_limit is not a pair"},
      {with(nemotron, "hybrid_override_pattern", "M*X-"), "hybrid_override_pattern[2] 'X'"},
      {with(nemotron, "moe_latent_size", 16), "moe_latent_size is not supported"},
      {with(nemotron, "n_group", 3), "n_group does not divide the number of experts"},
      {with(nemotron, "n_groups", 3), "n_groups 3 does not divide"},
      {with(nemotron, "mlp_hidden_act", "gelu"), "mlp_hidden_act \"gelu\""},
  };
  for (const auto& [body, want] : cases)
    expect_one_line(error_of([&] { parse_hf_config(body, "config.json"); }), "config.json", want);
}

// A checkpoint lacking one SSM tensor, or holding one of the wrong shape (d_state in the
// config differs from the weights'): the loader names the file and the tensor.
TEST(Hybrid, MissingOrMisshapenSsmTensorsAreRefused) {
  const std::string src = test::source_path(kGranite);
  SafetensorsSet st = SafetensorsSet::open_dir(src);
  auto make_dir = [&](const char* tag, const std::string& drop, const nlohmann::json& config) {
    const std::string dir = test::temp_dir(tag);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      std::filesystem::copy_file(src + "/" + f, dir + "/" + f);
    test::write_file(dir + "/config.json", config.dump());
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, t] : st.tensors()) {
      if (name == drop) continue;
      SafetensorsEntry e;
      e.name = name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.data = t.data;
      entries.push_back(e);
    }
    write_safetensors(dir + "/model.safetensors", entries);
    return dir;
  };
  const nlohmann::json config = nlohmann::json::parse(test::read_file(src + "/config.json"));
  const std::string missing = make_dir("hybrid-missing", "model.layers.2.mamba.A_log", config);
  std::string e = error_of([&] { load_model(missing); });
  expect_one_line(e, missing, "model.layers.2.mamba.A_log");
  nlohmann::json wide = config;
  wide["mamba_d_state"] = 32;
  const std::string wrong = make_dir("hybrid-dstate", "", wide);
  e = error_of([&] { load_model(wrong); });
  expect_one_line(e, wrong, "model.layers.0.mamba.in_proj.weight");
}

// bench's work model: a decode step reads every weight once (one embedding row) but only k of
// the E routed experts. Counted here from the checkpoint's own tensors.
TEST(Hybrid, DecodeReadsOnlyTheRoutedExpertsWeights) {
  for (const char* dir : {"tests/fixtures/models/tiny-granite-h-moe",
                          "tests/fixtures/models/tiny-nemotron-h"}) {
    auto m = load_model(test::source_path(dir));
    SafetensorsSet st = SafetensorsSet::open_dir(test::source_path(dir));
    double want = 0, experts = 0;
    for (const auto& [name, t] : st.tensors()) {
      const double bytes = double(t.nbytes());
      if (name.find("embed") != std::string::npos) want += bytes / double(t.shape[0]);
      else if (name.find(".experts.") != std::string::npos ||
               name.find("block_sparse_moe.input_linear") != std::string::npos ||
               name.find("block_sparse_moe.output_linear") != std::string::npos)
        experts += bytes;
      else want += bytes;
    }
    want += experts * 2 / 4;  // top-2 of 4 experts
    EXPECT_DOUBLE_EQ(m->arch->weight_bytes_per_step(*m), want) << dir;
  }
}

// Localization on the hybrids: every stage the forward emits is declared (what --inject
// accepts), the mixer's stages are there, and drift of cpu against ref, prefill and step
// path, flags no stage (each op within its rounding bound). The prefill of 16 (the fixtures'
// chunk_size) runs cpu's chunked scan, the steps its recurrence, as opcheck's replay does.
TEST(Hybrid, DriftCpuAgainstRefFlagsNothing) {
  for (const char* dir : kFixtures) {
    auto m = load_model(test::source_path(dir));
    const std::vector<int32_t> ids = prompt_of(dir, 16);
    auto a = make_backend({"ref", "", 1, ""});
    auto b = make_backend({"cpu", "", 1, ""});
    for (int w : {16, 1}) {
      Session sa(*m, *a, 16, w), sb(*m, *b, 16, w);
      b->stats().reset();
      Capture ca = capture_forwards(sa, ids, w), cb = capture_forwards(sb, ids, w);
      Capture cl = replay_forwards(sb, ca);
      for (const auto& [prov, n] : b->stats().calls().at("ssm_scan"))
        EXPECT_TRUE(w > 1 ? prov.rfind("cpu.ssm_scan_chunked_", 0) == 0 : prov == "cpu.ssm_scan")
            << dir << " width " << w << ": " << prov;
      const std::vector<std::string> declared = m->arch->stages();
      for (const StageRecord& r : ca[0].stages)
        EXPECT_NE(std::find(declared.begin(), declared.end(), r.name), declared.end()) << r.name;
      const int mixer = int(m->config.layer_blocks.find('M'));
      for (const char* stage :
           {"ssm_conv", "ssm_conv_state", "ssm_scan", "ssm_state", "ssm_norm", "ssm_out"})
        EXPECT_NE(ca[0].find(stage, mixer), nullptr) << dir << " " << stage;
      // The states are one shape whatever the forward's width: [K-1, conv_dim], [nh, hd * N].
      const ModelConfig& c = m->config;
      const StageRecord& conv = ca[0].at("ssm_conv_state", mixer);
      EXPECT_EQ(conv.rows, c.ssm_conv - 1) << dir;
      EXPECT_EQ(conv.cols, c.ssm_heads * c.ssm_head_dim + 2 * c.ssm_groups * c.ssm_state) << dir;
      const StageRecord& ssm = ca[0].at("ssm_state", mixer);
      EXPECT_EQ(ssm.rows, c.ssm_heads) << dir;
      EXPECT_EQ(ssm.cols, c.ssm_head_dim * c.ssm_state) << dir;
      const Roundoff u = coarser(roundoff_of(a->compute()), roundoff_of(b->compute()));
      const verify::DriftReport r = verify::drift_compare(ca, cb, cl, u);
      EXPECT_EQ(r.n_flagged, 0) << dir << " width " << w;
    }
  }
}

// A fault inside the mixer is named by drift at its stage and layer, on the prefill and the
// step path alike. A fault on a recurrent state is named at the state stage, not at the next
// forward's conv or scan: the replay hands that forward a's state.
TEST(Hybrid, DriftNamesAFaultInsideTheMixer) {
  struct FaultCase {
    const char* dir;
    const char* inject;
    const char* stage;
    int layer;
  };
  const FaultCase kFaults[] = {
      {"tests/fixtures/models/tiny-nemotron-h", "op=ssm_scan,layer=0,scale=1.01", "ssm_scan", 0},
      {kGranite, "op=ssm_conv,layer=2,noise=0.001", "ssm_conv", 2},
      {kGranite, "op=ssm_norm,layer=0,scale=0.99", "ssm_norm", 0},
      {kGranite, "op=ssm_state,layer=2,scale=1.001", "ssm_state", 2},
      {"tests/fixtures/models/tiny-nemotron-h", "op=ssm_conv_state,layer=0,noise=0.001",
       "ssm_conv_state", 0},
  };
  for (const FaultCase& fc : kFaults)
    for (int w : {16, 1}) {
      auto m = load_model(test::source_path(fc.dir));
      const std::vector<int32_t> ids = prompt_of(fc.dir, 16);
      auto a = make_backend({"ref", "", 1, ""});
      auto b = make_backend({"cpu", "", 1, ""});
      Session sa(*m, *a, 16, w), sb(*m, *b, 16, w);
      sb.set_inject(InjectSpec::parse(fc.inject));
      Capture ca = capture_forwards(sa, ids, w), cb = capture_forwards(sb, ids, w);
      Capture cl = replay_forwards(sb, ca);
      const Roundoff u = coarser(roundoff_of(a->compute()), roundoff_of(b->compute()));
      const verify::DriftReport r = verify::drift_compare(ca, cb, cl, u);
      ASSERT_GE(r.first_flagged, 0) << fc.inject << " width " << w;
      const verify::DriftRow& first = r.rows[size_t(r.first_flagged)];
      EXPECT_EQ(first.id.stage, fc.stage) << fc.inject << " width " << w;
      EXPECT_EQ(first.id.layer, fc.layer) << fc.inject << " width " << w;
      EXPECT_EQ(r.n_flagged, 1) << fc.inject << " width " << w;
    }
}
