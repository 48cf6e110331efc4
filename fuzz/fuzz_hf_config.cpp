// libFuzzer harness: an HF config.json as load_model reads it: parse_hf_config (the family
// registered for its class parses it, model/arch.h; JSON nesting bounded by io/json.h), then
// validate_config on the result, and parse_eos_ids over the same text.
#include "fuzz_util.h"
#include "io/json_config.h"
#include "model/model.h"
#include "model/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  const std::string text = fuzz::bytes(data, size);
  fuzz::expect_clean([&] {
    ModelConfig c = parse_hf_config(text, "config.json");
    validate_config(c, ConfigSource{"config.json", false, 1000});
  });
  fuzz::expect_clean([&] { fuzz::sink(parse_eos_ids(text, "config.json").size()); });
  return 0;
}
