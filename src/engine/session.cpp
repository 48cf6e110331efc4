#include "engine/session.h"

#include "core/error.h"

namespace arbiter {

Session::Session(const Model& m, Backend& be, int max_ctx, int max_T) : m_(m), be_(be) {
  ARB_CHECK(max_ctx >= 1 && max_T >= 1, "[session] bad sizes: max_ctx %d, max_T %d", max_ctx,
            max_T);
  be_.prepare(m.config, m.weights);
  kv_cache_init(be_, m.config, max_ctx, kv_);
  scratch_init(be_, m.config, std::min(max_T, max_ctx), s_);
}

Session::~Session() {
  try {  // picks not taken would otherwise be the next session's on this backend
    drop_picks();
  } catch (...) {
  }
  scratch_free(be_, s_);
  kv_cache_free(be_, kv_);
}

void Session::reset() {
  pos_ = 0;
  drop_picks();
  picked_ = false;
}

void Session::drop_picks() {
  while (picks_pending_ > 0) take_pick();
}

void Session::forward(const std::vector<int32_t>& ids) { run(ids.data(), int(ids.size()), true); }

void Session::pick() {
  ARB_CHECK(last_T_ > 0, "[session] pick before any forward");
  be_.pick_greedy(s_.logits, last_T_ - 1, m_.config.vocab);
  picked_ = true;
  ++picks_pending_;
}

void Session::forward_picked() {
  ARB_CHECK(picked_, "[session] forward of a picked token before any pick");
  run(nullptr, 1, true);
}

int32_t Session::take_pick() {
  ARB_CHECK(picks_pending_ > 0, "[session] no pick left to take");
  --picks_pending_;
  return be_.take_pick();
}

void Session::run(const int32_t* ids, int T, bool logits) {
  ARB_CHECK(T >= 1 && T <= s_.max_T, "[session] forward of %d tokens (widest is %d)", T, s_.max_T);
  ARB_CHECK(pos_ + T <= kv_.max_ctx, "[session] context full: %d + %d tokens > %d", pos_, T,
            kv_.max_ctx);
  for (int t = 0; ids && t < T; ++t)
    ARB_CHECK(ids[t] >= 0 && ids[t] < m_.config.vocab,
              "[session] token id %d outside vocabulary [0, %d)", ids[t], m_.config.vocab);
  StageHook hook;
  if (inject_.active || capture_) {
    int pos0 = pos_;
    hook = [this, pos0](Stage st, int layer, Buffer& b, int rows, int cols) {
      if (inject_.active) inject_.apply(be_, st, layer, b, rows, cols, pos0);
      if (capture_) capture_(st, layer, b, rows, cols);
    };
  }
  arbiter::forward(m_, be_, kv_, s_, ids, T, pos_, hook, logits);
  pos_ += T;
  last_T_ = logits ? T : 0;
}

void Session::run_pieces(const std::vector<int32_t>& ids, bool last_logits) {
  for (size_t i = 0; i < ids.size(); i += size_t(s_.max_T)) {
    size_t n = std::min(ids.size() - i, size_t(s_.max_T));
    run(ids.data() + i, int(n), last_logits && i + n == ids.size());
  }
}

void Session::prefill(const std::vector<int32_t>& ids) { run_pieces(ids, true); }

void Session::context(const std::vector<int32_t>& ids) { run_pieces(ids, false); }

std::vector<LogitsSummary> Session::summarize(int K, const std::vector<int32_t>& targets) {
  ARB_CHECK(last_T_ > 0, "[session] summarize before any forward");
  ARB_CHECK(int(targets.size()) == last_T_, "[session] %zu targets for %d rows", targets.size(),
            last_T_);
  ARB_CHECK(K >= 1 && K <= m_.config.vocab, "[session] top-k %d outside [1, %d]", K,
            m_.config.vocab);
  std::vector<LogitsSummary> out;
  be_.summarize(s_.logits, last_T_, m_.config.vocab, K, targets.data(), out);
  return out;
}

std::vector<double> Session::logits(int t) {
  ARB_CHECK(t >= 0 && t < last_T_, "[session] logits row %d of %d", t, last_T_);
  std::vector<double> row(m_.config.vocab);
  be_.read(s_.logits, int64_t(t) * m_.config.vocab, m_.config.vocab, row.data());
  return row;
}

}  // namespace arbiter
