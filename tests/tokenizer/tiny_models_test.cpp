// The tokenizers of the two shipped tiny models, against values from independent sources:
// TinyStories-656K (HF tokenizer.json, SentencePiece-style BPE with ranked merges) and
// stories260K (GGUF "llama" vocabulary with scores and byte tokens). Expected ids and texts
// come from each model's greedy_reference.json and README (models/ or ../shared/models/).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/sha256.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_fixture.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

std::string tinystories_dir() {
  std::string p = test::model_file("TinyStories-656K/tokenizer.json");
  return p.empty() ? "" : p.substr(0, p.size() - std::string("/tokenizer.json").size());
}

TEST(TinyStories, PromptIdsMatchReference) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found in models/ or ../shared/models/";
  json ref = json::parse(test::read_file(dir + "/greedy_reference.json"));
  auto tok = tokenizer_from_hf_dir(dir);
  std::string prompt = ref.at("prompt");
  auto expected = ref.at("prompt_ids_with_bos").get<std::vector<int32_t>>();
  ASSERT_EQ(expected, (std::vector<int32_t>{1, 80, 147, 201, 282, 57, 8}));  // README's statement
  EXPECT_EQ(tok->encode(prompt, /*add_special=*/true, /*parse_special=*/false), expected);
  EXPECT_EQ(tok->encode(prompt, false, false), std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(tok->vocab_size(), 2048);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->kind(), "spm-bpe");
}

TEST(TinyStories, DecodesReferenceText) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  json ref = json::parse(test::read_file(dir + "/greedy_reference.json"));
  auto tok = tokenizer_from_hf_dir(dir);
  std::vector<int32_t> ids = ref.at("prompt_ids_with_bos").get<std::vector<int32_t>>();
  for (int32_t id : ref.at("generated_ids").get<std::vector<int32_t>>()) ids.push_back(id);
  // The reference text is prompt + continuation without BOS, special tokens shown (the
  // model spells "<|end_story|>" from ordinary pieces, then emits EOS).
  std::vector<int32_t> no_bos(ids.begin() + 1, ids.end());
  EXPECT_EQ(tok->decode(no_bos, /*skip_special=*/false), ref.at("text").get<std::string>());
  std::string text = ref.at("text");
  const std::string eos = "<|end_story|>";
  ASSERT_EQ(text.substr(text.size() - eos.size()), eos);
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), text.substr(0, text.size() - eos.size()));
}

// Only the ids listed in added_tokens are special: ordinary tokens that contain the text
// "<|start_story|>" (e.g. "▁<|start_story|>Once▁") stay ordinary.
TEST(TinyStories, OnlyAddedTokensAreSpecial) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto tok = tokenizer_from_hf_dir(dir);
  json tj = json::parse(test::read_file(dir + "/tokenizer.json"));
  int32_t merged = tj.at("model").at("vocab").at("\xE2\x96\x81<|start_story|>").get<int32_t>();
  EXPECT_FALSE(tok->is_special(merged));
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_TRUE(tok->is_special(2));
  // Without parse_special the marker is plain text and BPE may merge it into such tokens.
  std::vector<int32_t> plain = tok->encode("<|start_story|>Once", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(tok->token_bytes(plain.front()).rfind(" <|start_story|>", 0), 0u)
      << "the merges build '▁<|start_story|>...' pieces; got " << tok->token_bytes(plain.front());
  // With parse_special it is id 1, followed by the text with its own "▁" prefix.
  std::vector<int32_t> parsed = tok->encode("<|start_story|>Once upon a time,", false, true);
  EXPECT_EQ(parsed, (std::vector<int32_t>{1, 80, 147, 201, 282, 57, 8}));
  EXPECT_EQ(tok->decode(parsed, true), "Once upon a time,");
}

TEST(TinyStories, Sha256IsTokenizerJson) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto tok = tokenizer_from_hf_dir(dir);
  // ../shared/models/SHA256SUMS lists this file's hash.
  EXPECT_EQ(tok->sha256(), "9a7917d490ac034a4e69eb081096226971887e9e66b0969355421613f62b12e7");
}

TEST(TinyStories, RoundTripAsciiText) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto tok = tokenizer_from_hf_dir(dir);
  for (std::string s : {"Lily and Ben went to the park. They saw a big dog!",
                        "  two leading spaces, \"quotes\", and 123 numbers;\nnew line", "end with space ",
                        "x", "Once upon a time,\n\nThe end."}) {
    std::vector<int32_t> ids = tok->encode(s, true, false);
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(tok->decode(ids, true), s);
  }
}

TEST(TinyStories, CliTokenize) {
  std::string dir = tinystories_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto r = test::run_cli("tokenize -m '" + dir + "' 'Once upon a time,'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 80 147 201 282 57 8\n");
  r = test::run_cli("tokenize -m '" + dir + "' --no-bos 'Once upon a time,'");
  EXPECT_EQ(r.out, "80 147 201 282 57 8\n");
  std::string f = test::temp_dir("cli") + "/prompt.txt";
  test::write_file(f, "<|start_story|>Once upon a time,");
  r = test::run_cli("tokenize -m '" + dir + "' --no-bos --special --file '" + f + "'");
  EXPECT_EQ(r.out, "1 80 147 201 282 57 8\n");
  r = test::run_cli("tokenize -m '" + dir + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
}

// stories260K.gguf: 512 tokens, 256 of them byte tokens <0x00>..<0xFF> at ids 3..258
// (README: token_type 1 normal x253, 2 unknown x1, 3 control x2, 6 byte x256; unk 0,
// bos 1, eos 2; no add_bos_token key, so SentencePiece's default: add BOS).
TEST(Stories260K, VocabularyFacts) {
  std::string path = test::model_file("stories260K/stories260K.gguf");
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  GgufFile g(path);
  auto tok = tokenizer_from_gguf(g);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tok->token_bytes(3 + b), std::string(1, static_cast<char>(b))) << b;
  int special = 0;
  for (int id = 0; id < 512; ++id) special += tok->is_special(id);
  EXPECT_EQ(special, 3) << "control x2 + unknown x1";
  // A character outside the 512 pieces falls back to its UTF-8 bytes: U+4F60 = E4 BD A0.
  std::vector<int32_t> ids = tok->encode("\xE4\xBD\xA0", false, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 3, ids.end()),
            (std::vector<int32_t>{3 + 0xE4, 3 + 0xBD, 3 + 0xA0}));
}

TEST(Stories260K, DecodesReferenceText) {
  std::string path = test::model_file("stories260K/stories260K.gguf");
  std::string ref_path = test::model_file("stories260K/greedy_reference.json");
  if (path.empty() || ref_path.empty()) GTEST_SKIP() << "stories260K not found";
  GgufFile g(path);
  auto tok = tokenizer_from_gguf(g);
  json ref = json::parse(test::read_file(ref_path));
  // The text is llama2.c's documented greedy sample ("Once upon a time, there was a little
  // girl named Lily..."), decoded with run.c's rules (leading space after BOS dropped,
  // <0x0A> -> newline).
  std::vector<int32_t> ids = ref.at("generated_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(tok->decode(ids, true), ref.at("text").get<std::string>());
  StreamDecoder sd(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  EXPECT_EQ(streamed, ref.at("text").get<std::string>());
}

TEST(Stories260K, RoundTripVariedText) {
  std::string path = test::model_file("stories260K/stories260K.gguf");
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  GgufFile g(path);
  auto tok = tokenizer_from_gguf(g);
  for (std::string s : {"Once upon a time, there was a little girl named Lily.", " leading space",
                        "tabs\tand\nnewlines\r\n", "\xE4\xBD\xA0\xE5\xA5\xBD, \xE4\xB8\x96\xE7\x95\x8C",
                        "emoji \xF0\x9F\x99\x82\xF0\x9F\x8C\x8D!", "caf\xC3\xA9 na\xC3\xAFve", "", "   "}) {
    std::vector<int32_t> ids = tok->encode(s, true, false);
    EXPECT_EQ(tok->decode(ids, true), s) << "\"" << s << "\"";
  }
}

}  // namespace
}  // namespace arbiter
