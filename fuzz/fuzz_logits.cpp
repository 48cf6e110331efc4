// libFuzzer harness: the full-logits side file (src/verify/trace/trace.h LogitsReader) on
// arbitrary bytes, then every row read back. The reader opens files by path (regular files
// only), so each input is placed in a memfd, a regular file in memory, opened through
// /proc/self/fd.
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "verify/trace/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arbiter;
  const int fd = ::memfd_create("fuzz.logits", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, data, size) != ssize_t(size)) std::abort();
  fuzz::expect_clean([&] {
    verify::LogitsReader r("/proc/self/fd/" + std::to_string(fd));
    std::vector<float> row;
    int64_t nonfinite = 0;
    for (uint64_t i = 0; i < r.rows(); ++i) nonfinite += r.read_row(i, row);
    fuzz::sink(nonfinite);
  });
  ::close(fd);
  return 0;
}
