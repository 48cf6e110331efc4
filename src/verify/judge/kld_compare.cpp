#include "verify/judge/kld_compare.h"

#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "core/error.h"
#include "verify/trace/kld_file.h"

namespace arbiter::verify {

bool is_kld_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[8] = {};
  const bool yes = ::read(fd, magic, 8) == 8 && std::memcmp(magic, "_logits_", 8) == 0;
  ::close(fd);
  return yes;
}

LlamaKldStats compare_kld_files(const std::string& base_path, const std::string& cand_path) {
  const KldReader base(base_path), cand(cand_path);
  const KldLayout &a = base.layout(), &b = cand.layout();
  ARB_CHECK(a.n_ctx == b.n_ctx && a.n_vocab == b.n_vocab && a.n_chunk == b.n_chunk,
            "[kld] %s (n_ctx %d, n_vocab %d, %d chunks) and %s (n_ctx %d, n_vocab %d, %d chunks) differ", base_path.c_str(),
            a.n_ctx, a.n_vocab, a.n_chunk, cand_path.c_str(), b.n_ctx, b.n_vocab, b.n_chunk);
  for (size_t k = 0; k < a.tokens.size(); ++k)
    ARB_CHECK(a.tokens[k] == b.tokens[k],
              "[kld] %s and %s evaluated different tokens (token %zu: %d and %d); make one from the other's tokens "
              "(arbiter trace --kld-tokens)", base_path.c_str(), cand_path.c_str(), k, a.tokens[k], b.tokens[k]);
  LlamaKld acc;
  std::vector<float> pa, pb;
  for (int c = 0; c < a.n_chunk; ++c)
    for (int r = 0; r < a.rows_per_chunk(); ++r) {
      base.read_row(c, r, pa);
      cand.read_row(c, r, pb);
      acc.add(pa.data(), pb.data(), a.n_vocab, a.target(c, r));
    }
  return acc.finish();
}

}  // namespace arbiter::verify
