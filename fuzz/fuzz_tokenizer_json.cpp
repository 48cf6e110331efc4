// libFuzzer harness: an HF tokenizer.json (src/tokenizer/hf_tokenizer.cpp
// tokenizer_from_hf_json) built into a tokenizer, which then encodes and decodes a fixed text.
// The input is the tokenizer.json text; tokenizer_config.json is absent.
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    std::unique_ptr<Tokenizer> tok =
        tokenizer_from_hf_json(fuzz::bytes(data, size), "tokenizer.json", std::nullopt, "tokenizer_config.json");
    const std::vector<int32_t> ids = tok->encode("Once upon a time, <s> a caf\xC3\xA9 \xF0\x9F\x98\x80 1234!", true, true);
    fuzz::sink(tok->decode(ids, false).size() + tok->decode(ids, true).size());
  });
  return 0;
}
