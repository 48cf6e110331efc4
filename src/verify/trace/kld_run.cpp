#include "verify/trace/kld_run.h"

#include <algorithm>

#include "core/error.h"
#include "core/progress.h"
#include "io/file.h"
#include "verify/trace/kld_file.h"
#include "verify/trace/trace_run.h"

namespace arbiter::verify {

std::vector<int32_t> kld_tokens(const Model& m, const std::string& corpus_text) {
  std::vector<int32_t> t;
  if (m.tokenizer->bos_id() >= 0) t.push_back(m.tokenizer->bos_id());
  const std::vector<int32_t> text = m.tokenizer->encode(corpus_text, false, false);
  t.insert(t.end(), text.begin(), text.end());
  return t;
}

int64_t run_kld_base(Session& s, const std::vector<int32_t>& tokens, const KldRunOptions& opt) {
  const Model& m = s.model();
  ARB_CHECK(opt.n_ctx >= 4 && opt.n_ctx <= s.max_ctx(), "[kld] context %d outside [4, %d]", opt.n_ctx, s.max_ctx());
  ARB_CHECK(int64_t(tokens.size()) >= 2 * int64_t(opt.n_ctx),
            "[kld] %zu tokens; a context of %d needs at least %d (llama-perplexity's rule)", tokens.size(), opt.n_ctx,
            2 * opt.n_ctx);
  KldLayout l;
  l.n_ctx = opt.n_ctx;
  l.n_vocab = m.config.vocab;
  l.n_chunk = int32_t(tokens.size() / size_t(opt.n_ctx));
  if (opt.max_chunks > 0) l.n_chunk = std::min(l.n_chunk, opt.max_chunks);
  l.tokens.assign(tokens.begin(), tokens.begin() + int64_t(l.n_chunk) * l.n_ctx);
  for (int32_t t : l.tokens)
    ARB_CHECK(t >= 0 && t < l.n_vocab, "[kld] token %d outside the model's vocabulary (%d)", t, l.n_vocab);
  check_output_target(opt.out_path, "[kld]");
  KldWriter w;
  w.open(opt.out_path, l);
  const int first = l.first(), W = l.rows_per_chunk();
  const int32_t bos = m.tokenizer->bos_id();
  std::vector<float> row(size_t(l.n_vocab));
  Progress meter("kld", int64_t(l.n_chunk) * W, "positions", Progress::Unit::Count, opt.progress);
  for (int c = 0; c < l.n_chunk; ++c) {
    const auto chunk = l.tokens.begin() + int64_t(c) * l.n_ctx;
    std::vector<int32_t> ctx(chunk, chunk + first), in(chunk + first, chunk + first + W);
    if (bos >= 0) ctx[0] = bos;
    s.reset();
    s.context(ctx);
    s.forward(in);
    for (int r = 0; r < W; ++r) {
      const std::vector<double> logits = s.logits(r);
      for (size_t v = 0; v < row.size(); ++v) row[v] = float(logits[v]);
      w.write_row(row.data());
    }
    meter.update(int64_t(c + 1) * W);
  }
  w.finish();
  meter.finish();
  return int64_t(l.n_chunk) * W;
}

}  // namespace arbiter::verify
