// libFuzzer harness: one safetensors file (header length, JSON header, dtypes, shapes,
// data_offsets; src/io/safetensors.h) on arbitrary bytes, then a walk over its tensors.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    SafetensorsSet s = SafetensorsSet::from_bytes("fuzz.safetensors", fuzz::bytes(data, size));
    size_t bytes = 0;
    for (const auto& [name, t] : s.tensors()) bytes += t.nbytes();
    fuzz::sink(bytes + s.metadata().size());
  });
  return 0;
}
