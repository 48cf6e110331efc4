// libFuzzer harness: the trace reader (src/verify/trace/trace.h parse_trace) on arbitrary
// text: arbiter format v1 and other engines' 6-column TSV (seeds of both).
#include "fuzz_util.h"
#include "verify/trace/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    verify::Trace t = verify::parse_trace(fuzz::bytes(data, size), "fuzz.tsv");
    fuzz::sink(t.rows.size() + size_t(t.nonfinite_values));
  });
  return 0;
}
