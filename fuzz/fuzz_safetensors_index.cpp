// libFuzzer harness: model.safetensors.index.json (the sharded set's weight_map,
// src/io/safetensors.h parse_safetensors_index) on arbitrary text.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    fuzz::sink(parse_safetensors_index(fuzz::bytes(data, size), "fuzz.index.json").size());
  });
  return 0;
}
