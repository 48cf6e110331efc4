// Stop strings in streamed text (server/text_stream.h): cut out wherever they fall across
// tokens, text that might still begin one held back until it cannot, the earliest of several
// stops wins, and without a stop everything comes out by flush().
#include <gtest/gtest.h>

#include "server/text_stream.h"
#include "test_util.h"

namespace arbiter {
namespace {

// Streams the greedy story's ids through StopTextStream; returns what was emitted.
std::string run(const Tokenizer& tok, const std::vector<int32_t>& ids, std::vector<std::string> stops, bool& stopped) {
  server::StopTextStream s(tok, std::move(stops));
  std::string out;
  for (int32_t id : ids) out += s.push(id);
  out += s.flush();
  stopped = s.stopped();
  return out;
}

TEST(StopTextStream, CutsStopsAcrossTokens) {
  auto tok = tokenizer_from_hf_dir(test::source_path("models/TinyStories-656K"));
  const std::vector<int32_t> ids = tok->encode("Once upon a time, a little girl named Lily lived in a house.", false, false);
  StreamDecoder whole(*tok);
  std::string text;
  for (int32_t id : ids) text += whole.push(id);
  text += whole.flush();
  bool stopped = false;
  EXPECT_EQ(run(*tok, ids, {}, stopped), text);
  EXPECT_FALSE(stopped);
  // "girl named" spans token boundaries in this vocabulary; the text before it is kept whole.
  EXPECT_EQ(run(*tok, ids, {"girl named"}, stopped), text.substr(0, text.find("girl named")));
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run(*tok, ids, {"house", "little"}, stopped), text.substr(0, text.find("little")));
  EXPECT_EQ(run(*tok, ids, {"not in the text"}, stopped), text);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run(*tok, ids, {"."}, stopped), text.substr(0, text.find('.')));
}

}  // namespace
}  // namespace arbiter
