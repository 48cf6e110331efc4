// Hugging Face config.json -> ModelConfig through the architecture registry (model/archs/).
// RoPE spellings (rope_theta + rope_scaling, and transformers-v5 rope_parameters), llama3 and
// linear scaling, per-arch flags and defaults, sliding windows, eos lists, and refusals.
// Expected values are written from the configs in the test (and transformers' documented
// defaults), never from the parser's output. Add a case: a JSON text and the fields it implies.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/json_config.h"
#include "model/model.h"
#include "io/io_test_util.h"

using namespace arbiter;

namespace {

ModelConfig parse(const std::string& body) { return parse_hf_config(body, "config.json"); }

// A minimal llama config with `extra` spliced in (must start with a comma when non-empty).
std::string llama(const std::string& extra = "", const std::string& cls = "LlamaForCausalLM") {
  return R"({"architectures":[")" + cls + R"("],"hidden_size":256,"num_hidden_layers":3,)"
         R"("num_attention_heads":8,"intermediate_size":512,"vocab_size":1000)" + extra + "}";
}

std::string error_of(const std::string& body) {
  return test::error_of([&] { parse(body); });
}

}  // namespace

TEST(HfConfig, TinyStories656k) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  for (std::string d : {dir, dir + "/fp32"}) {
    ModelConfig c = load_hf_config(d);
    EXPECT_EQ(c.arch, "llama");
    EXPECT_EQ(c.d_model, 128);
    EXPECT_EQ(c.d_ff, 384);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.n_head, 8);
    EXPECT_EQ(c.n_head_kv, 4);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.vocab, 2048);
    EXPECT_EQ(c.max_pos, 512);
    EXPECT_EQ(c.norm_eps, 1e-6);
    EXPECT_EQ(c.rope.theta, 10000.0);
    EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::None);
    EXPECT_EQ(c.rope.layout, RopeLayout::Half);
    EXPECT_TRUE(c.tied_embeddings);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(load_hf_eos_ids(d), (std::vector<int32_t>{2}));
  }
}

TEST(HfConfig, DefaultsFromTransformers) {
  ModelConfig c = parse(llama());
  EXPECT_EQ(c.n_head_kv, 8);    // num_key_value_heads defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 32);    // hidden_size / num_attention_heads
  EXPECT_EQ(c.max_pos, 2048);   // LlamaConfig default
  EXPECT_EQ(c.norm_eps, 1e-6);  // LlamaConfig default
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.tied_embeddings);
  // model_type alone is enough when architectures is absent.
  ModelConfig m = parse(R"({"model_type":"qwen3","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,)"
                        R"("intermediate_size":128,"vocab_size":10})");
  EXPECT_EQ(m.arch, "qwen3");
  EXPECT_EQ(m.max_pos, 32768);
}

TEST(HfConfig, LegacyRopeScalingLlama3) {
  // Llama-3.1-8B's keys (rope_type spelling), then the older "type" spelling.
  for (const char* key : {"rope_type", "type"}) {
    ModelConfig c = parse(llama(std::string(R"(,"rope_theta":500000.0,"rope_scaling":{"factor":8.0,)"
                                            R"("low_freq_factor":1.0,"high_freq_factor":4.0,)"
                                            R"("original_max_position_embeddings":8192,")") +
                                key + R"(":"llama3"},"max_position_embeddings":131072,"num_key_value_heads":2)"));
    EXPECT_EQ(c.rope.theta, 500000.0) << key;
    EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::Llama3) << key;
    EXPECT_EQ(c.rope.scaling.factor, 8.0);
    EXPECT_EQ(c.rope.scaling.low_freq_factor, 1.0);
    EXPECT_EQ(c.rope.scaling.high_freq_factor, 4.0);
    EXPECT_EQ(c.rope.scaling.original_max_pos, 8192);
    EXPECT_EQ(c.max_pos, 131072);
    EXPECT_EQ(c.n_head_kv, 2);
  }
  // Llama-3.2 values.
  ModelConfig c = parse(llama(R"(,"rope_scaling":{"factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                              R"("original_max_position_embeddings":8192,"rope_type":"llama3"})"));
  EXPECT_EQ(c.rope.scaling.factor, 32.0);
  EXPECT_EQ(c.rope.theta, 10000.0);
}

TEST(HfConfig, V5RopeParameters) {
  ModelConfig c = parse(llama(R"(,"rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":32.0,)"
                              R"("low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192})"));
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(c.rope.scaling.factor, 32.0);
  EXPECT_EQ(c.rope.scaling.original_max_pos, 8192);
  ModelConfig d = parse(llama(R"(,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0})"));
  EXPECT_EQ(d.rope.theta, 1000000.0);
  EXPECT_EQ(d.rope.scaling.kind, RopeScaling::Kind::None);
  ModelConfig l = parse(llama(R"(,"rope_parameters":{"rope_type":"linear","rope_theta":10000.0,"factor":4.0})"));
  EXPECT_EQ(l.rope.scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(l.rope.scaling.factor, 4.0);
}

TEST(HfConfig, LinearAndRefusedRope) {
  ModelConfig c = parse(llama(R"(,"rope_scaling":{"type":"linear","factor":2.0})"));
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(c.rope.scaling.factor, 2.0);
  for (const char* t : {"yarn", "dynamic", "longrope", "su"}) {
    std::string e = error_of(llama(std::string(R"(,"rope_scaling":{"type":")") + t + R"(","factor":2.0})"));
    EXPECT_NE(e.find(std::string("rope type '") + t + "' is not supported"), std::string::npos) << e;
  }
  EXPECT_NE(error_of(llama(R"(,"rope_scaling":{"rope_type":"llama3","factor":8.0})")).find("low_freq_factor missing"),
            std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"rope_scaling":{"rope_type":"linear"})")).find("factor missing"), std::string::npos);
}

TEST(HfConfig, UnsupportedArchListsSupported) {
  for (const char* cls : {"GemmaForCausalLM", "DeepseekV3ForCausalLM", "GPT2LMHeadModel"}) {
    std::string e = error_of(llama("", cls));
    EXPECT_NE(e.find(cls), std::string::npos) << e;
    EXPECT_NE(e.find("llama, mistral, qwen2, qwen3"), std::string::npos) << e;
    EXPECT_NE(e.find("[hf] config.json"), std::string::npos) << e;
  }
  EXPECT_NE(error_of(R"({"hidden_size":1})").find("llama, mistral, qwen2, qwen3"), std::string::npos);
}

TEST(HfConfig, ArchFlags) {
  // Qwen2.5-0.5B-style: q/k/v bias always; sliding window off unless use_sliding_window.
  ModelConfig q2 = parse(R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":896,"num_hidden_layers":24,)"
                         R"("num_attention_heads":14,"num_key_value_heads":2,"intermediate_size":4864,)"
                         R"("vocab_size":151936,"max_position_embeddings":32768,"rope_theta":1000000.0,)"
                         R"("sliding_window":32768,"use_sliding_window":false,"max_window_layers":21,)"
                         R"("tie_word_embeddings":true,"rms_norm_eps":1e-06})");
  EXPECT_EQ(q2.arch, "qwen2");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_EQ(q2.sliding_window, 0);
  EXPECT_EQ(q2.head_dim, 64);
  EXPECT_TRUE(q2.tied_embeddings);
  // Qwen3-0.6B-style: head_dim 128 != 1024 / 16; q/k norm; attention_bias false.
  ModelConfig q3 = parse(R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":1024,"num_hidden_layers":28,)"
                         R"("num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,)"
                         R"("intermediate_size":3072,"vocab_size":151936,"attention_bias":false,)"
                         R"("use_sliding_window":false,"sliding_window":null,"rope_theta":1000000})");
  EXPECT_EQ(q3.head_dim, 128);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_EQ(q3.sliding_window, 0);
  EXPECT_EQ(q3.rope.theta, 1e6);
  // Mistral: sliding_window int (v0.1) or null (v0.2+).
  EXPECT_EQ(parse(llama(R"(,"sliding_window":4096)", "MistralForCausalLM")).sliding_window, 4096);
  EXPECT_EQ(parse(llama(R"(,"sliding_window":null)", "MistralForCausalLM")).sliding_window, 0);
  EXPECT_EQ(parse(llama("", "MistralForCausalLM")).arch, "mistral");
  // llama ignores sliding_window; attention_bias turns on q/k/v bias.
  EXPECT_EQ(parse(llama(R"(,"sliding_window":4096)")).sliding_window, 0);
  EXPECT_TRUE(parse(llama(R"(,"attention_bias":true)")).qkv_bias);
  // Qwen2 with a window on every layer, and with a per-layer mix (refused).
  std::string q2w = R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"num_hidden_layers":4,)"
                    R"("num_attention_heads":4,"intermediate_size":128,"vocab_size":10,"use_sliding_window":true,)"
                    R"("sliding_window":256,"max_window_layers":)";
  EXPECT_EQ(parse(q2w + "0}").sliding_window, 256);
  EXPECT_EQ(parse(q2w + "4}").sliding_window, 0);
  EXPECT_NE(error_of(q2w + "2}").find("not supported"), std::string::npos);
  // transformers-v5 layer_types decides when present.
  std::string lt = R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"num_hidden_layers":2,)"
                   R"("num_attention_heads":4,"intermediate_size":128,"vocab_size":10,"sliding_window":64,)";
  EXPECT_EQ(parse(lt + R"("layer_types":["full_attention","full_attention"]})").sliding_window, 0);
  EXPECT_EQ(parse(lt + R"("layer_types":["sliding_attention","sliding_attention"]})").sliding_window, 64);
  EXPECT_NE(error_of(lt + R"("layer_types":["sliding_attention","full_attention"]})").find("mix"), std::string::npos);
  EXPECT_NE(error_of(lt + R"("layer_types":["full_attention"]})").find("layer_types"), std::string::npos);
}

TEST(HfConfig, ShippedTinyFixtures) {
  // tests/fixtures/models: values from tests/fixtures/README.md and the configs.
  std::string base = test::source_path("tests/fixtures/models/");
  if (!std::filesystem::exists(base + "tiny-llama/config.json")) GTEST_SKIP() << "tests/fixtures/models not found";
  ModelConfig l = load_hf_config(base + "tiny-llama");
  EXPECT_EQ(l.rope.scaling.kind, RopeScaling::Kind::Llama3);  // v5 rope_parameters form
  EXPECT_EQ(l.rope.scaling.factor, 8.0);
  EXPECT_EQ(l.rope.scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l.rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l.rope.scaling.original_max_pos, 64);
  EXPECT_EQ(l.rope.theta, 1e4);
  EXPECT_EQ(l.norm_eps, 1e-5);
  EXPECT_TRUE(l.tied_embeddings);
  ModelConfig m = load_hf_config(base + "tiny-mistral");
  EXPECT_EQ(m.arch, "mistral");
  EXPECT_EQ(m.sliding_window, 32);
  EXPECT_EQ(m.n_head_kv, 1);
  EXPECT_FALSE(m.tied_embeddings);
  ModelConfig q2 = load_hf_config(base + "tiny-qwen2");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_EQ(q2.rope.theta, 1e6);
  EXPECT_EQ(q2.sliding_window, 0);
  EXPECT_EQ(q2.vocab, 1024);
  ModelConfig q3 = load_hf_config(base + "tiny-qwen3");
  EXPECT_EQ(q3.head_dim, 32);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_TRUE(q3.tied_embeddings);
  EXPECT_EQ(load_hf_eos_ids(base + "tiny-qwen3"), (std::vector<int32_t>{1023}));
}

TEST(HfConfig, Refusals) {
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures":["LlamaForCausalLM"]})").find("missing required key 'hidden_size'"),
            std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"num_key_value_heads":3)")).find("not a multiple"), std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"hidden_act":"gelu")")).find("hidden_act"), std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"mlp_bias":true)")).find("mlp_bias"), std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"rms_norm_eps":"x")")).find("rms_norm_eps"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures":["LlamaForCausalLM"],"hidden_size":-5})").find("hidden_size"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"architectures":"LlamaForCausalLM"})").find("architectures"), std::string::npos);
  EXPECT_NE(error_of(llama(R"(,"partial_rotary_factor":0.5)")).find("partial_rotary_factor"), std::string::npos);
  EXPECT_NO_THROW(parse(llama(R"(,"hidden_size":256.0)")));  // integral float accepted
}

TEST(HfConfig, EosIds) {
  EXPECT_EQ(parse_eos_ids(R"({"eos_token_id":2})", "x"), (std::vector<int32_t>{2}));
  EXPECT_EQ(parse_eos_ids(R"({"eos_token_id":[128001,128008,128009]})", "x"),
            (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_TRUE(parse_eos_ids(R"({"eos_token_id":null})", "x").empty());
  EXPECT_TRUE(parse_eos_ids(R"({})", "x").empty());
  EXPECT_THROW(parse_eos_ids(R"({"eos_token_id":"2"})", "x"), Error);
  EXPECT_THROW(parse_eos_ids(R"({"eos_token_id":[-1]})", "x"), Error);
  // generation_config.json first, then config.json's extras, no duplicates.
  std::string dir = test::temp_dir("eos");
  test::write_file(dir + "/generation_config.json", R"({"eos_token_id":[128001,128009]})");
  test::write_file(dir + "/config.json", R"({"eos_token_id":[128001,128008]})");
  EXPECT_EQ(load_hf_eos_ids(dir), (std::vector<int32_t>{128001, 128009, 128008}));
}

namespace {

// A minimal gemma config (Gemma 3 by default) with `extra` spliced in (leading comma).
std::string gemma(const std::string& extra = "", const std::string& cls = "Gemma3ForCausalLM") {
  return R"({"architectures":[")" + cls + R"("],"hidden_size":64,"num_hidden_layers":7,)"
         R"("num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"intermediate_size":128,)"
         R"("vocab_size":300,"max_position_embeddings":2048,"sliding_window":16)" + extra + "}";
}

}  // namespace

// Defaults as transformers' Gemma2Config / Gemma3TextConfig apply them (their __init__
// signatures): Gemma 3 slides on all but every 6th layer, local RoPE base 1e4, global 1e6, no
// soft caps; Gemma 2 slides on even layers, caps 50 (attention) and 30 (logits), null = off.
TEST(HfConfig, GemmaDefaultsAndLayerTypes) {
  ModelConfig g3 = parse(gemma());
  EXPECT_EQ(g3.layer_sliding, std::vector<bool>({true, true, true, true, true, false, true}));
  EXPECT_EQ(g3.sliding_window, 16);
  EXPECT_EQ(g3.rope_local.theta, 10000.0);
  EXPECT_EQ(g3.rope.theta, 1000000.0);
  EXPECT_EQ(g3.attn_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_EQ(g3.attn_softcap, 0);
  EXPECT_EQ(g3.final_softcap, 0);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_TRUE(g3.tied_embeddings);

  ModelConfig g2 = parse(gemma(R"(,"query_pre_attn_scalar":144)", "Gemma2ForCausalLM"));
  EXPECT_EQ(g2.layer_sliding, std::vector<bool>({true, false, true, false, true, false, true}));
  EXPECT_EQ(g2.attn_softcap, 50.0);
  EXPECT_EQ(g2.final_softcap, 30.0);
  EXPECT_EQ(g2.attn_scale, 1.0 / 12.0);
  EXPECT_FALSE(g2.qk_norm);
  EXPECT_EQ(g2.rope_local, g2.rope);
  ModelConfig off = parse(gemma(R"(,"attn_logit_softcapping":null,"final_logit_softcapping":null)",
                                "Gemma2ForCausalLM"));
  EXPECT_EQ(off.attn_softcap, 0);
  EXPECT_EQ(off.final_softcap, 0);
  // Gemma 3's config may carry an attention cap that its attention never applies.
  ModelConfig g3cap = parse(gemma(R"(,"attn_logit_softcapping":50.0,"final_logit_softcapping":30.0)"));
  EXPECT_EQ(g3cap.attn_softcap, 0);
  EXPECT_EQ(g3cap.final_softcap, 30.0);

  // transformers v5: layer_types and per-layer-type rope_parameters.
  ModelConfig v5 = parse(gemma(
      R"(,"layer_types":["full_attention","sliding_attention","full_attention","full_attention",)"
      R"("sliding_attention","sliding_attention","full_attention"],)"
      R"("rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":500000.0},)"
      R"("sliding_attention":{"rope_type":"default","rope_theta":20000.0}})"));
  EXPECT_EQ(v5.layer_sliding, std::vector<bool>({false, true, false, false, true, true, false}));
  EXPECT_EQ(v5.rope.theta, 500000.0);
  EXPECT_EQ(v5.rope.scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(v5.rope.scaling.factor, 8.0);
  EXPECT_EQ(v5.rope_local.theta, 20000.0);
  EXPECT_EQ(v5.rope_local.scaling.kind, RopeScaling::Kind::None);
  // The older form: rope_local_base_freq for sliding layers, rope_scaling on full ones only.
  ModelConfig old = parse(gemma(R"(,"rope_local_base_freq":5000.0,"rope_scaling":{"rope_type":"linear","factor":2.0})"));
  EXPECT_EQ(old.rope_local.theta, 5000.0);
  EXPECT_EQ(old.rope_local.scaling.kind, RopeScaling::Kind::None);
  EXPECT_EQ(old.rope.scaling.factor, 2.0);
}

// Bad gemma configs: one error naming the file and the key.
TEST(HfConfig, GemmaRefusals) {
  const std::pair<std::string, std::string> cases[] = {
      {gemma(R"(,"layer_types":["sliding_attention","chunked_attention","full_attention",)"
             R"("full_attention","full_attention","full_attention","full_attention"])"),
       "layer_types[1] 'chunked_attention' is not supported"},
      {gemma(R"(,"layer_types":["full_attention"])"), "'layer_types' is not a list"},
      {gemma(R"(,"max_position_embeddings":8)"), "sliding_window 16 exceeds max_position_embeddings 8"},
      {gemma(R"(,"hidden_activation":"gelu")"), "hidden_activation \"gelu\" is not supported"},
      {gemma(R"(,"final_logit_softcapping":-1.0)"), "final_logit_softcapping must be positive"},
      {gemma(R"(,"query_pre_attn_scalar":0)"), "query_pre_attn_scalar must be positive"},
      {gemma(R"(,"use_bidirectional_attention":true)"), "use_bidirectional_attention"},
  };
  for (const auto& [body, want] : cases) {
    const std::string e = error_of(body);
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}
