// libFuzzer harness: a GGUF's vocabulary (tokenizer.ggml.*, src/tokenizer/gguf_tokenizer.cpp)
// built into a tokenizer, which then encodes and decodes a fixed text. Seeds are vocab-only
// GGUFs (no tensors), as `arbiter tokenize` accepts them.
#include "fuzz_util.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    GgufFile g(MappedFile::from_bytes("fuzz.gguf", fuzz::bytes(data, size)));
    std::unique_ptr<Tokenizer> tok = tokenizer_from_gguf(g);
    const std::vector<int32_t> ids = tok->encode("Once upon a time, <s> a caf\xC3\xA9 \xF0\x9F\x98\x80 1234!", true, true);
    fuzz::sink(tok->decode(ids, false).size() + tok->decode(ids, true).size());
  });
  return 0;
}
