// libFuzzer harness: llama.cpp's KL-divergence file (src/verify/trace/kld_file.h KldReader) on
// arbitrary bytes, every row read back and summarised against itself as `compare` does
// (LlamaKld). Inputs go through a memfd, as in fuzz_logits.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "verify/judge/llama_stats.h"
#include "verify/trace/kld_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  const int fd = ::memfd_create("fuzz.kld", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, data, size) != ssize_t(size)) std::abort();
  fuzz::expect_clean([&] {
    const verify::KldReader r("/proc/self/fd/" + std::to_string(fd));
    const verify::KldLayout& l = r.layout();
    verify::LlamaKld acc;
    std::vector<float> row;
    for (int c = 0; c < l.n_chunk; ++c)
      for (int k = 0; k < l.rows_per_chunk(); ++k) {
        r.read_row(c, k, row);
        acc.add(row.data(), row.data(), l.n_vocab, l.target(c, k));
      }
    fuzz::sink(acc.finish().kld.value);
  });
  ::close(fd);
  return 0;
}
