// libFuzzer harness: the GGUF reader (src/io/gguf.h) on arbitrary bytes, then every typed
// getter on every key and a walk over the tensors. Any input must give a GgufFile or one
// arbiter::Error; a crash, a sanitizer report, a hang or a huge allocation is a finding.
#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    GgufFile g(MappedFile::from_bytes("fuzz.gguf", fuzz::bytes(data, size)));
    for (const auto& kv : g.metadata()) {
      const std::string& key = kv.first;
      fuzz::expect_clean([&] { g.get_int(key); });
      fuzz::expect_clean([&] { g.get_float(key); });
      fuzz::expect_clean([&] { g.get_string(key); });
      fuzz::expect_clean([&] { g.get_bool(key); });
      fuzz::expect_clean([&] { g.get_int_array(key); });
      fuzz::expect_clean([&] { g.get_float_array(key); });
      fuzz::expect_clean([&] { g.get_string_array(key); });
    }
    size_t bytes = 0;
    for (const Tensor& t : g.tensors()) bytes += t.nbytes();
    fuzz::sink(bytes);
  });
  return 0;
}
