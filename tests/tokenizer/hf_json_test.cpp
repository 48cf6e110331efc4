// tokenizer.json reading, on small hand-written files whose encodings are derived by hand
// (merge by merge in the comments): byte-level BPE with a ByteLevel or Sequence
// pre-tokenizer, added tokens, TemplateProcessing BOS; SentencePiece-style BPE with a
// Metaspace pre-tokenizer and byte fallback; refusal of what is not implemented.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

// Vocabulary in GPT-2 byte characters ("Ġ" = space). Merges in rank order.
json byte_level_json() {
  json vocab = {{"h", 0},
                {"e", 1},
                {"l", 2},
                {"o", 3},
                {"\xC4\xA0", 4},
                {"w", 5},
                {"r", 6},
                {"d", 7},
                {"he", 8},
                {"ll", 9},
                {"hell", 10},
                {"hello", 11},
                {"\xC4\xA0w", 12},
                {"or", 13},
                {"\xC4\xA0wor", 14},
                {"ld", 15},
                {"\xC4\xA0world", 16},
                {"<|endoftext|>", 17},
                {"<user>", 18},
                {"!", 19},
                {"<s>", 20}};
  json merges = {"h e", "l l",          "he ll", "hell o",        "\xC4\xA0 w",
                 "o r", "\xC4\xA0w or", "l d",   "\xC4\xA0wor ld"};
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 17},
         {"content", "<|endoftext|>"},
         {"special", true},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"single_word", false}},
        {{"id", 18},
         {"content", "<user>"},
         {"special", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"single_word", false}},
        {{"id", 20},
         {"content", "<s>"},
         {"special", true},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"single_word", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {20}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merges},
        {"unk_token", nullptr},
        {"byte_fallback", false}}},
  };
}

std::string write_dir(const json& tokenizer, const json& config = json::object()) {
  std::string dir = test::temp_dir("hf");
  test::write_file(dir + "/tokenizer.json", tokenizer.dump());
  if (!config.empty()) test::write_file(dir + "/tokenizer_config.json", config.dump());
  return dir;
}

TEST(HfJson, ByteLevelMergesByRank) {
  auto tok = tokenizer_from_hf_dir(write_dir(byte_level_json()));
  // "hello" -> h e l l o -[he]-> he l l o -[ll]-> he ll o -[hell]-> hell o -[hello]-> 11
  // " world" -> Ġ w o r l d -[Ġw]-> -[or]-> Ġw or l d -[Ġwor]-> Ġwor l d -[ld]-> -[Ġworld]-> 16
  EXPECT_EQ(tok->encode("hello world!", true, false), (std::vector<int32_t>{20, 11, 16, 19}));
  EXPECT_EQ(tok->encode("hel", false, false), (std::vector<int32_t>{8, 2}));  // he, l
  EXPECT_EQ(tok->bos_id(), 20);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->decode({20, 11, 16, 19}, true), "hello world!");
  EXPECT_EQ(tok->decode({20, 11, 16, 19}, false), "<s>hello world!");
}

TEST(HfJson, AddedTokens) {
  auto tok = tokenizer_from_hf_dir(write_dir(byte_level_json()));
  // Non-special added tokens are always split out; special ones only with parse_special.
  EXPECT_EQ(tok->encode("he<user>hello", false, false), (std::vector<int32_t>{8, 18, 11}));
  EXPECT_EQ(tok->encode("hello<|endoftext|>", false, true), (std::vector<int32_t>{11, 17}));
  EXPECT_TRUE(tok->is_special(17));
  EXPECT_FALSE(tok->is_special(18));
}

TEST(HfJson, SequencePreTokenizerSplitsBeforeMerging) {
  json j = byte_level_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "l"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  auto tok = tokenizer_from_hf_dir(write_dir(j));
  // "hello" -> pieces he | l | l | o: the "ll" and "hell" merges can no longer apply.
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{8, 2, 2, 3}));
  // A step after ByteLevel would see mapped characters: refused.
  j["pre_tokenizer"]["pretokenizers"] = {{{"type", "ByteLevel"}, {"use_regex", true}}, {{"type", "Digits"}}};
  EXPECT_THROW(tokenizer_from_hf_dir(write_dir(j)), Error);
}

TEST(HfJson, NfcOnlyForProvablyStableText) {
  json j = byte_level_json();
  j["normalizer"] = {{"type", "NFC"}};
  auto tok = tokenizer_from_hf_dir(write_dir(j));
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{11}));
  // e + U+0301 COMBINING ACUTE would compose to U+00E9 under NFC: refused, not mis-tokenized.
  try {
    tok->encode("he\xCC\x81", false, false);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("U+0301"), std::string::npos) << e.what();
  }
}

TEST(HfJson, ConfigDecidesBosWithoutTemplate) {
  json j = byte_level_json();
  j["post_processor"] = nullptr;
  auto tok = tokenizer_from_hf_dir(write_dir(j, {{"bos_token", "<s>"}, {"add_bos_token", true}}));
  EXPECT_EQ(tok->encode("hello", true, false), (std::vector<int32_t>{20, 11}));
  auto tok2 = tokenizer_from_hf_dir(write_dir(j, {{"bos_token", {{"content", "<s>"}}}}));
  EXPECT_EQ(tok2->bos_id(), 20);
  EXPECT_FALSE(tok2->add_bos());
  EXPECT_EQ(tok2->encode("hello", true, false), (std::vector<int32_t>{11}));
}

// SentencePiece-style with a Metaspace pre-tokenizer (prepend_scheme "first", split).
json metaspace_json() {
  json vocab = {{"<unk>", 0},
                {"\xE2\x96\x81", 1},
                {"a", 2},
                {"b", 3},
                {"\xE2\x96\x81"
                 "a",
                 4},
                {"<0x63>", 5},
                {"<s>", 6}};
  return {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 6}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "\xE2\x96\x81"},
        {"prepend_scheme", "first"},
        {"split", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Metaspace"},
        {"replacement", "\xE2\x96\x81"},
        {"prepend_scheme", "first"},
        {"split", true}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"\xE2\x96\x81 a"}},
        {"unk_token", "<unk>"},
        {"byte_fallback", true}}},
  };
}

TEST(HfJson, MetaspaceAndByteFallback) {
  auto tok =
      tokenizer_from_hf_dir(write_dir(metaspace_json(), {{"bos_token", "<s>"}, {"add_bos_token", true}}));
  EXPECT_EQ(tok->kind(), "spm-bpe");
  // "a b" -> "▁a▁b" -> words "▁a" "▁b" -> [▁a] [▁ b]
  EXPECT_EQ(tok->encode("a b", true, false), (std::vector<int32_t>{6, 4, 1, 3}));
  // 'c' is no token: byte fallback <0x63>. A text starting with a space gets no second "▁".
  EXPECT_EQ(tok->encode(" c", false, false), (std::vector<int32_t>{1, 5}));
  // prepend_scheme "first": no "▁" in front of text that follows an added token.
  EXPECT_EQ(tok->encode("<s>a", false, true), (std::vector<int32_t>{6, 2}));
  EXPECT_EQ(tok->decode({6, 4, 1, 3}, true), "a b");
  EXPECT_EQ(tok->decode({1, 5}, true), "c");
}

TEST(HfJson, RefusesWhatIsNotImplemented) {
  json j = byte_level_json();
  j["model"]["type"] = "WordPiece";
  try {
    tokenizer_from_hf_dir(write_dir(j));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer model 'WordPiece' is not supported"), std::string::npos)
        << e.what();
  }
  json k = byte_level_json();
  k["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THROW(tokenizer_from_hf_dir(write_dir(k)), Error);
  EXPECT_THROW(tokenizer_from_hf_dir(test::temp_dir("empty")), Error);
  std::string bad = test::temp_dir("bad");
  test::write_file(bad + "/tokenizer.json", "{not json");
  EXPECT_THROW(tokenizer_from_hf_dir(bad), Error);
}

}  // namespace
}  // namespace arbiter
