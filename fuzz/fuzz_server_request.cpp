// libFuzzer harness: an OpenAI request body as the server receives it (src/server/requests.h),
// parsed as /v1/completions and as /v1/chat/completions against the shipped TinyStories-656K
// tokenizer and qwen3's chat template (its tool and thinking branches). A refusal is an
// ApiError or one arbiter::Error (the server answers both with 400/404); anything else would be
// a 500 and is a finding.
#include "fuzz_util.h"
#include "server/requests.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace arbiter;

struct Served {
  std::unique_ptr<Tokenizer> tok = tokenizer_from_hf_dir(ARBITER_SOURCE_DIR "/models/TinyStories-656K");
  std::unique_ptr<ChatTemplate> tpl =
      chat_template_from_file(ARBITER_SOURCE_DIR "/tests/fixtures/chat_templates/qwen3.jinja", *tok);
  server::RequestLimits limits{*tok, tok->vocab_size(), 512, 20, "tiny", tpl.get()};
};

template <class F>
void parse(F&& fn) {
  try {
    fuzz::expect_clean(fn);
  } catch (const server::ApiError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Served served;
  parse([&] {
    const server::json body = server::parse_request_body(fuzz::bytes(data, size));
    parse([&] { fuzz::sink(server::parse_completion_request(body, served.limits).prompts.size()); });
    parse([&] { fuzz::sink(server::parse_chat_request(body, served.limits).ids.size()); });
  });
  return 0;
}
