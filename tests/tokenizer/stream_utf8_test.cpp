// UTF-8 helpers, regex pre-tokenization steps and StreamDecoder, on hand-derived cases.
#include <gtest/gtest.h>

#include "io/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab_fixture.h"

namespace arbiter {
namespace {

using tok::utf8_emittable_prefix;
using tok::utf8_sanitize;

TEST(Utf8, EmittablePrefixHoldsBackIncompleteTail) {
  EXPECT_EQ(utf8_emittable_prefix("abc"), 3u);
  EXPECT_EQ(utf8_emittable_prefix("a\xE4"), 1u);          // lead of a 3-byte char
  EXPECT_EQ(utf8_emittable_prefix("a\xE4\xBD"), 1u);      // 2 of 3 bytes
  EXPECT_EQ(utf8_emittable_prefix("a\xE4\xBD\xA0"), 4u);  // complete U+4F60
  EXPECT_EQ(utf8_emittable_prefix("\xF0\x9F\x99"), 0u);   // 3 of 4 bytes of U+1F642
  EXPECT_EQ(utf8_emittable_prefix("a\xE0\x80"), 3u);      // E0 80 can never be valid: emit
  EXPECT_EQ(utf8_emittable_prefix("a\x80"), 2u);          // stray continuation: emit
  EXPECT_EQ(utf8_emittable_prefix(""), 0u);
}

TEST(Utf8, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_sanitize("ok \xE4\xBD\xA0"), "ok \xE4\xBD\xA0");
  // Unicode ch. 3 example pattern: E4 BD (truncated) then 'x' -> one U+FFFD, then 'x'.
  EXPECT_EQ(utf8_sanitize("\xE4\xBDx"), "\xEF\xBF\xBDx");
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // C0 is never valid
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

// HF docs' SplitDelimiterBehavior example: "the-final--countdown" split on "-".
TEST(PreTokenize, SplitBehaviors) {
  using tok::SplitBehavior;
  auto run = [](SplitBehavior b) {
    tok::PreTokenizer p("t", {{std::make_shared<const tok::Regex>("-"), b, false}});
    std::string text = "the-final--countdown";
    std::vector<std::string> out;
    for (auto s : p.split(text)) out.push_back(text.substr(s.begin, s.end - s.begin));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run(SplitBehavior::Removed), (V{"the", "final", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::Isolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::MergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::MergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(SplitBehavior::Contiguous), (V{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenize, Gpt2PatternAndInvalidBytes) {
  tok::PreTokenizer p;
  ASSERT_TRUE(tok::pretokenizer_for_gguf_pre("gpt-2", p));
  // GPT-2 regex by hand: "'s" contraction, " ?\p{L}+", " ?\p{N}+", "\s+(?!\S)" leaves the
  // last space of a run to the next word.
  std::string text = "it's  42 ok\xFF!";
  std::vector<std::string> got;
  for (auto s : p.split(text)) got.push_back(text.substr(s.begin, s.end - s.begin));
  EXPECT_EQ(got, (std::vector<std::string>{"it", "'s", " ", " 42", " ok", "\xFF", "!"}));
  EXPECT_FALSE(tok::pretokenizer_for_gguf_pre("no-such-pre", p));
}

// Multi-token characters: stories260K has no CJK or emoji pieces, so each such character
// becomes 3-4 byte tokens and nothing may be emitted before its last byte.
TEST(StreamDecoder, HoldsPartialCharacters) {
  std::string path = test::model_file("stories260K/stories260K.gguf");
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  GgufFile g(path);
  auto t = tokenizer_from_gguf(g);
  const std::string text = "Hi \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82!";  // "Hi 你好 🙂!"
  std::vector<int32_t> ids = t->encode(text, true, false);
  StreamDecoder sd(*t);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    EXPECT_EQ(tok::utf8_sanitize(piece), piece) << "push() returned a partial character";
    all += piece;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(all, t->decode(ids, true));
  // The emoji is 4 byte tokens <0xF0> <0x9F> <0x99> <0x82> = ids 3+byte.
  StreamDecoder sd2(*t);
  EXPECT_EQ(sd2.push(3 + 0xF0), "");
  EXPECT_EQ(sd2.push(3 + 0x9F), "");
  EXPECT_EQ(sd2.push(3 + 0x99), "");
  EXPECT_EQ(sd2.push(3 + 0x82), "\xF0\x9F\x99\x82");
  // A dangling partial character is flushed as U+FFFD.
  EXPECT_EQ(sd2.push(3 + 0xE4), "");
  EXPECT_EQ(sd2.flush(), "\xEF\xBF\xBD");
}

// Byte-level: GPT-2 splits CJK/emoji into byte tokens that are not characters either.
TEST(StreamDecoder, ByteLevelMultiTokenCharacters) {
  std::string why;
  std::string path = test::vocab_gguf("ggml-vocab-gpt-2", false, &why);
  if (path.empty()) GTEST_SKIP() << why;
  GgufFile g(path);
  auto t = tokenizer_from_gguf(g);
  const std::string text = "emoji \xF0\x9F\x99\x82 and \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E.";
  std::vector<int32_t> ids = t->encode(text, false, false);
  ASSERT_GT(ids.size(), 6u);
  StreamDecoder sd(*t);
  std::string all;
  size_t empty_pushes = 0;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    EXPECT_EQ(tok::utf8_sanitize(piece), piece);
    empty_pushes += piece.empty();
    all += piece;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_GT(empty_pushes, 0u) << "some characters must span several tokens";
}

}  // namespace
}  // namespace arbiter
