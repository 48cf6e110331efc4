// libFuzzer harness: the correctness matrix's TOML spec (src/verify/matrix/matrix_spec.h
// parse_matrix_spec_text) on arbitrary text, then the traces and trace commands it implies.
#include "fuzz_util.h"
#include "verify/matrix/matrix_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  fuzz::expect_clean([&] {
    verify::MatrixSpec s = verify::parse_matrix_spec_text(fuzz::bytes(data, size), "fuzz.toml");
    size_t n = 0;
    for (const verify::MatrixTrace& t : verify::matrix_traces(s)) n += verify::matrix_trace_args(s, t, "traces").size();
    fuzz::sink(n);
  });
  return 0;
}
