// The request parser of serve (src/server/requests.h) on bodies the npm-client tests cannot
// send well: numbers beyond int64, ids beyond the vocabulary, a missing template, another
// model. Each is refused with the status and field a client reads, never a 500.
#include <gtest/gtest.h>

#include "server/requests.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace arbiter::server {
namespace {

struct Served {
  std::unique_ptr<Tokenizer> tok = tokenizer_from_hf_dir(test::source_path("models/TinyStories-656K"));
  std::unique_ptr<ChatTemplate> tpl = chat_template_from_file(test::source_path("tests/fixtures/chat_templates/qwen3.jinja"), *tok);
  RequestLimits limits(const ChatTemplate* t) const { return {*tok, tok->vocab_size(), 512, 20, "tiny", t}; }
};

const Served& served() {
  static const Served s;
  return s;
}

// The ApiError a completions (or chat) body is refused with.
ApiError refusal(const std::string& body, bool chat = false, bool with_template = true) {
  const RequestLimits lim = served().limits(with_template ? served().tpl.get() : nullptr);
  try {
    const json b = parse_request_body(body);
    if (chat) parse_chat_request(b, lim);
    else parse_completion_request(b, lim);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(Requests, ACompletionIsTokenizedAsTheTokenizerDoes) {
  const RequestLimits lim = served().limits(nullptr);
  const CompletionRequest r = parse_completion_request(
      parse_request_body(R"({"prompt": ["Once upon a time", [5, 6]], "max_tokens": 3, "logprobs": 2, "echo": true,
                             "stop": ["\n"], "seed": -9223372036854775808})"),
      lim);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], served().tok->encode("Once upon a time", true, true));
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.p.max_tokens, 3);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.p.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.p.sampling.seed, uint64_t(INT64_MIN));
}

TEST(Requests, NumbersBeyondInt64AreOutOfRangeNotConverted) {
  for (const char* body : {R"({"prompt": "a", "max_tokens": 1e300})", R"({"prompt": "a", "max_tokens": -1e19})",
                           R"({"prompt": "a", "seed": 18446744073709551615})", R"({"prompt": "a", "seed": 9.3e18})",
                           R"({"prompt": "a", "n": 4294967297})"}) {
    const ApiError e = refusal(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(e.message.find("must be in ["), std::string::npos) << body << ": " << e.message;
  }
  EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": 1e300})").param, "max_tokens");
  EXPECT_EQ(refusal(R"({"prompt": "a", "seed": 18446744073709551615})").param, "seed");
}

TEST(Requests, PromptIdsOutsideTheVocabularyAreRefused) {
  for (const char* ids : {"[-1]", "[100000000000]", "[18446744073709551615]", "[1, 2.5]", "[1, \"a\"]", "[1, null]"}) {
    const ApiError e = refusal(std::string(R"({"prompt": )") + ids + "}");
    EXPECT_EQ(e.status, 400) << ids;
    EXPECT_EQ(e.param, "prompt") << ids;
  }
}

TEST(Requests, ChatNeedsATemplateAndWellFormedMessages) {
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "hi"}]})", true, false).param, "messages");
  EXPECT_EQ(refusal(R"({"messages": [{"role": 5}]})", true).param, "messages");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"})", true).param,
            "tool_choice");
  const ChatRequest r = parse_chat_request(
      parse_request_body(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
                             "chat_template_kwargs": {"enable_thinking": false}})"),
      served().limits(served().tpl.get()));
  EXPECT_EQ(r.p.max_tokens, 4);
  EXPECT_NE(r.text.find("<|im_start|>user\nhi<|im_end|>"), std::string::npos) << r.text;
  EXPECT_EQ(r.ids, served().tok->encode(r.text, false, true));
}

TEST(Requests, AnotherModelIs404AndABadBodyIs400) {
  const ApiError e = refusal(R"({"model": "gpt-4", "prompt": "a"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  for (const char* body : {"[1]", "{\"prompt\": ", "\"x\""}) EXPECT_EQ(refusal(body).status, 400) << body;
}

}  // namespace
}  // namespace arbiter::server
