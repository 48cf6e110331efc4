// libFuzzer harness: the logprobs dump reader (src/verify/trace/logprobs_jsonl.h
// parse_logprobs_jsonl) on arbitrary bytes, with every window and with a window of 2: OpenAI
// echo and vLLM prompt_logprobs seeds (replies named by token id; no tokenizer is loaded).
#include "fuzz_util.h"
#include "verify/trace/logprobs_jsonl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  const std::string text = fuzz::bytes(data, size);
  for (int64_t window : {0, 2}) {
    fuzz::expect_clean([&] {
      verify::LogprobsJsonlOptions opt;
      opt.window = window;
      verify::Trace t = verify::parse_logprobs_jsonl(text, "fuzz.jsonl", opt);
      fuzz::sink(t.rows.size());
    });
  }
  return 0;
}
