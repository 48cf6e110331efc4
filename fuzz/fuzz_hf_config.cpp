// libFuzzer harness: an HF config.json as load_model reads it. The entry points are today's
// parse_hf_config (src/io/hf_config.h) and parse_eos_ids, behind the JSON limits the loader
// applies first (validate_hf_dir_files: nesting, size), then validate_config on the result
// against a small file. When config parsing moves into the architecture registry, point this
// harness at the registry's parse-from-text entry point; the seeds stay valid.
#include "fuzz_util.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "model/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  const std::string text = fuzz::bytes(data, size);
  fuzz::expect_clean([&] {
    parse_json_bounded(text, "config.json", "[loader]");
    fuzz::expect_clean([&] {
      ModelConfig c = parse_hf_config(text, "config.json");
      validate_config(c, ConfigSource{"config.json", false, 1000, 1 << 20});
    });
    fuzz::sink(parse_eos_ids(text, "config.json").size());
  });
  return 0;
}
