// Hostile model files (src/model/validate.h, docs/reliability.md): counts no file can back,
// non-finite or out-of-range hyper-parameters, special-token ids outside the vocabulary, a
// tokenizer larger than the embedding, NaN weights, deep JSON. Each must be refused with one
// arbiter::Error that names the file and the key (never a crash, a std::bad_alloc, or a load
// that silently drops the value). Add a case: patch one value of a valid model (a GGUF via
// patch_value, an HF directory via edit_json) and state the words the refusal must contain.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/io_test_util.h"
#include "model/model.h"
#include "model/model_test_util.h"
#include "model/validate.h"

using namespace arbiter;
using test::Dims;
using test::GgufBuilder;
using test::make_gguf;
using test::patch_value;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string error_of(const std::string& path) {
  return test::error_of([&] { load_model(path); });
}

// A valid tiny llama GGUF with one edit of its bytes.
std::string gguf_with(const std::function<void(std::string&)>& edit) {
  std::string bytes = make_gguf("llama", Dims{}, false, false, false, true).build();
  edit(bytes);
  std::string p = test::temp_dir("hostile-gguf") + "/m.gguf";
  test::write_file(p, bytes);
  return p;
}

// A copy of TinyStories-656K with one JSON file edited.
std::string hf_with(const std::string& file, const std::function<void(json&)>& edit) {
  std::string dir = test::temp_dir("hostile-hf") + "/m";
  fs::copy(test::tinystories656k_dir(), dir, fs::copy_options::recursive);
  json j = json::parse(test::read_file(dir + "/" + file));
  edit(j);
  test::write_file(dir + "/" + file, j.dump());
  return dir;
}

void expect_refused(const std::string& path, std::initializer_list<const char*> words) {
  std::string e = error_of(path);
  for (const char* w : words) EXPECT_NE(e.find(w), std::string::npos) << "missing '" << w << "' in: " << e;
}

bool have_models() { return !test::stories260k_gguf().empty() && !test::tinystories656k_dir().empty(); }

}  // namespace

TEST(ValidateGguf, CountsTheFileCannotBack) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  // 5e7 and 2^31-1 layers: std::bad_alloc (a 50 GB layer table) before the check existed.
  for (uint32_t layers : {50'000'000u, 2'147'483'647u})
    expect_refused(gguf_with([&](std::string& b) { patch_value(b, "llama.block_count", layers); }),
                   {"m.gguf", "llama.block_count", std::to_string(layers).c_str(), "tensors"});
  // Dimensions the tensors spell out: refused by the first tensor that does not match, before
  // any buffer is sized from them.
  expect_refused(gguf_with([](std::string& b) { patch_value(b, "llama.feed_forward_length", 2'000'000'000u); }),
                 {"m.gguf", "ffn_", "has shape", "2000000000"});
  expect_refused(gguf_with([](std::string& b) { patch_value(b, "llama.embedding_length", 1'000'000'000u); }),
                 {"m.gguf", "has shape", "1000000000"});
}

TEST(ValidateGguf, NonFiniteAndOutOfRangeFloats) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // An epsilon of 2 and a theta of 0.5 pass the family's own "positive and finite" checks
  // (which refuse NaN, inf, 0 and negative values); either way the refusal names the key.
  expect_refused(gguf_with([&](std::string& b) { patch_value(b, "llama.attention.layer_norm_rms_epsilon", 2.f); }),
                 {"llama.attention.layer_norm_rms_epsilon", "expected a finite number in (0, 1)"});
  for (float v : {inf, nan, -1.f, 0.f})
    expect_refused(gguf_with([&](std::string& b) { patch_value(b, "llama.attention.layer_norm_rms_epsilon", v); }),
                   {"m.gguf", "llama.attention.layer_norm_rms_epsilon"});
  expect_refused(gguf_with([&](std::string& b) { patch_value(b, "llama.rope.freq_base", 0.5f); }),
                 {"llama.rope.freq_base", "expected a finite number > 1"});
  for (float v : {inf, nan})
    expect_refused(gguf_with([&](std::string& b) { patch_value(b, "llama.rope.freq_base", v); }),
                   {"m.gguf", "llama.rope.freq_base"});
}

TEST(ValidateGguf, SpecialTokenIdsOutsideTheVocabulary) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  // Dropped silently before: the model then ran without its BOS, or never stopped.
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"})
    expect_refused(gguf_with([&](std::string& b) { patch_value(b, key, uint32_t(512)); }),
                   {"m.gguf", key, "512", "outside the vocabulary"});
  // -1 written as a UINT32 is "none": accepted, and BOS is then absent.
  auto m = load_model(gguf_with([](std::string& b) { patch_value(b, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu); }));
  EXPECT_EQ(m->tokenizer->bos_id(), -1);
}

TEST(ValidateGguf, NonFiniteWeightIsRefusedNamingTheTensor) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  GgufBuilder w = make_gguf("llama", Dims{}, false, false, false, true);
  for (auto& t : w.tensors)
    if (t.name == "blk.0.ffn_up.weight") {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(&t.data[4 * 7], &nan, 4);
    }
  std::string p = test::temp_dir("hostile-gguf") + "/nan.gguf";
  test::write_file(p, w.build());
  expect_refused(p, {"nan.gguf", "blk.0.ffn_up.weight", "NaN/Inf", "element 7"});
}

TEST(ValidateHf, CountsTheFileCannotBack) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  for (int64_t layers : {int64_t(50'000'000), int64_t(2'147'483'647)})
    expect_refused(hf_with("config.json", [&](json& j) { j["num_hidden_layers"] = layers; }),
                   {"config.json", "num_hidden_layers", std::to_string(layers).c_str()});
  // A dimension every tensor spells out is refused by the first tensor it does not match,
  // before any buffer is sized from it.
  expect_refused(hf_with("config.json", [](json& j) { j["intermediate_size"] = 1'000'000'000; }),
                 {"mlp.gate_proj.weight", "has shape", "1000000000"});
}

TEST(ValidateHf, RangesOfHyperParameters) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  expect_refused(hf_with("config.json", [](json& j) { j["rms_norm_eps"] = 5.0; }), {"rms_norm_eps", "(0, 1)"});
  expect_refused(hf_with("config.json", [](json& j) { j["rope_theta"] = 1.0; }), {"rope_theta", "> 1"});
  expect_refused(hf_with("config.json", [](json& j) { j["head_dim"] = 15; }), {"head_dim", "even"});
}

TEST(ValidateHf, StopIdsAndTokenizerAgainstTheEmbedding) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  expect_refused(hf_with("generation_config.json", [](json& j) { j["eos_token_id"] = 5000; }),
                 {"eos_token_id", "5000", "outside the vocabulary of 2048 rows"});
  // A tokenizer with more tokens than the embedding has rows: an id it encodes has no row.
  expect_refused(hf_with("tokenizer.json", [](json& j) { j["model"]["vocab"]["zzzz-extra"] = 2048; }),
                 {"tokenizer has 2049 tokens", "2048 rows"});
}

TEST(ValidateHf, TokenizerIdsMustBeUniqueIntegersInRange) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  auto vocab_id = [](json v) { return [v](json& j) { j["model"]["vocab"]["zzzz"] = v; }; };
  struct Case {
    std::function<void(json&)> edit;
    std::vector<const char*> words;
  };
  const Case cases[] = {
      // A 1e8-entry table, then std::bad_alloc; 2^31-1: "vector larger than max_size()".
      {vocab_id(100'000'000), {"model.vocab['zzzz']", "100000000", "outside what a file of this size"}},
      {vocab_id(2'147'483'647), {"model.vocab['zzzz']", "2147483647"}},
      // 2^32 + 5 was truncated to 5.
      {vocab_id(4'294'967'301LL), {"model.vocab['zzzz']", "4294967301", "expected 0 to 2147483647"}},
      {vocab_id(-3), {"model.vocab['zzzz']", "-3"}},
      {vocab_id(1.5), {"model.vocab['zzzz']", "expected an integer token id"}},
      {vocab_id(5), {"id 5 is given to both"}},
      {[](json& j) { j["model"]["vocab"] = json::object(); }, {"model.vocab is empty"}},
      {[](json& j) { j["added_tokens"][0]["id"] = 10'000'000; }, {"added_tokens[0].id", "10000000"}},
      {[](json& j) { j["post_processor"]["special_tokens"]["<|start_story|>"]["ids"][0] = 4096; },
       {"post_processor.special_tokens['<|start_story|>'].ids[0]", "4096", "outside the vocabulary"}},
  };
  for (const Case& c : cases) {
    std::string e = error_of(hf_with("tokenizer.json", c.edit));
    for (const char* w : c.words) EXPECT_NE(e.find(w), std::string::npos) << "missing '" << w << "' in: " << e;
    EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;
  }
}

TEST(ValidateHf, NamedSpecialTokenMissingFromTheVocabulary) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  expect_refused(hf_with("tokenizer_config.json", [](json& j) { j["eos_token"] = "<no-such-token>"; }),
                 {"tokenizer_config.json", "eos_token", "<no-such-token>", "not in the vocabulary"});
  // A number where a token is expected was taken as "no BOS".
  expect_refused(hf_with("tokenizer_config.json", [](json& j) { j["bos_token"] = 5; }),
                 {"tokenizer_config.json", "bos_token is 5"});
}

TEST(ValidateHf, ConfigFilesMustBeObjects) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  // A list where an object belongs: no eos_token_id was read, without a word.
  expect_refused(hf_with("generation_config.json", [](json& j) { j = json::array({1}); }),
                 {"generation_config.json", "not a JSON object"});
  expect_refused(hf_with("config.json", [](json& j) { j = "llama"; }), {"config.json", "not a JSON object"});
}

TEST(ValidateHf, DeeplyNestedJsonIsRefusedNotRecursedInto) {
  if (!have_models()) GTEST_SKIP() << "shipped models not found";
  // 100k levels: copying or printing such a value overflows the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const char* file : {"config.json", "tokenizer.json", "generation_config.json"}) {
    std::string dir = test::temp_dir("hostile-hf") + "/m";
    fs::copy(test::tinystories656k_dir(), dir, fs::copy_options::recursive);
    test::write_file(dir + "/" + file, "{\"a\": " + deep + "}");
    expect_refused(dir, {file, "nested deeper than 64 levels"});
  }
}

TEST(ValidateConfig, NamesTheKeyInEachFormatsSpelling) {
  ModelConfig c;
  c.arch = "qwen2";
  c.n_layer = 3;
  c.d_model = c.n_head = c.n_head_kv = c.d_ff = c.vocab = c.max_pos = 8;
  c.head_dim = 2;
  ConfigSource gguf{"m.gguf", true, 27}, hf{"d/config.json", false, 27};
  validate_config(c, gguf);  // valid as is
  c.norm_eps = std::nan("");
  auto message = [&](const ConfigSource& s) {
    try {
      validate_config(c, s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(gguf).find("[loader] m.gguf: qwen2.attention.layer_norm_rms_epsilon is nan"), std::string::npos)
      << message(gguf);
  EXPECT_NE(message(hf).find("[loader] d/config.json: rms_norm_eps is nan"), std::string::npos) << message(hf);
  c.norm_eps = 1e-6;
  c.n_layer = 28;  // every layer holds at least one tensor
  EXPECT_NE(message(hf).find("num_hidden_layers is 28 but the weights hold 27 tensors"), std::string::npos)
      << message(hf);
}
