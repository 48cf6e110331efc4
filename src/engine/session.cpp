#include "engine/session.h"

#include <algorithm>

#include "core/error.h"

namespace arbiter {

Backend::Prepare prepare_spec(const Model& m) {
  Backend::Prepare p;
  for (const TensorSpec& s : m.weights.specs) {
    const Tensor& t = m.weights.at(s);
    if (!t.empty()) p.weights.push_back({&t, s.family});
  }
  p.ropes = {m.config.rope};
  if (!m.config.layer_sliding.empty() && !(m.config.rope_local == m.config.rope))
    p.ropes.push_back(m.config.rope_local);  // gemma's sliding layers
  p.max_pos = m.config.max_pos;
  return p;
}

Session::Session(const Model& m, Backend& be, int max_ctx, int max_T) : m_(m), be_(be) {
  ARB_CHECK(max_ctx >= 1 && max_T >= 1, "[session] bad sizes: max_ctx %d, max_T %d", max_ctx,
            max_T);
  ARB_CHECK(m.arch != nullptr, "[session] %s: model has no architecture", m.path.c_str());
  be_.prepare(prepare_spec(m));
  state_ = m.arch->make_state(m, be_, max_ctx, std::min(max_T, max_ctx));
}

Session::~Session() {
  try {  // picks not taken would otherwise be the next session's on this backend
    drop_picks();
    if (batch_state_) be_.set_row_invariant(false);
  } catch (...) {
  }
}

void Session::reset() {
  pos_ = 0;
  if (pool_) pool_->release(table_);
  drop_picks();
  picked_ = false;
}

void Session::drop_picks() {
  while (picks_pending_ > 0) take_pick();
}

void Session::set_inject(const InjectSpec& spec) {
  inject_ = spec;
  inject_matched_ = false;
  stages_seen_.clear();
}

void Session::forward(const std::vector<int32_t>& ids) { run(ids.data(), int(ids.size()), true); }

void Session::pick() {
  ARB_CHECK(last_T_ > 0, "[session] pick before any forward");
  be_.pick_greedy(state().logits, last_T_ - 1, m_.config.vocab);
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

const StageTap* Session::Hook::at(const StagePoint& p, int pos0) {
  Session& s = s_;
  const bool fault = s.inject_.matches(p);
  if (s.inject_.active && !s.inject_matched_ &&
      std::find(s.stages_seen_.begin(), s.stages_seen_.end(), p.name) == s.stages_seen_.end())
    s.stages_seen_.push_back(p.name);
  if (!fault && !s.observer_) return nullptr;
  StageTap& tap = taps_.emplace_back();
  if (fault) {
    s.inject_.fault(p, pos0, tap);
    s.inject_matched_ = true;
  }
  if (s.observer_) s.observer_->on_stage(p, pos0, tap);
  return &tap;
}

void Session::run(const int32_t* ids, int T, bool logits, bool last_row) {
  ARB_CHECK(T >= 1 && T <= state_->max_T, "[session] forward of %d tokens (widest is %d)", T,
            state_->max_T);
  ARB_CHECK(pos_ + T <= state_->max_ctx, "[session] context full: %d + %d tokens > %d", pos_, T,
            state_->max_ctx);
  for (int t = 0; ids && t < T; ++t)
    ARB_CHECK(ids[t] >= 0 && ids[t] < m_.config.vocab,
              "[session] token id %d outside vocabulary [0, %d)", ids[t], m_.config.vocab);
  ForwardArgs a;
  a.ids = ids;
  a.T = T;
  a.pos0 = pos_;
  a.logits = logits;
  a.routes = routes_;
  // Without a fault or an observer the forward runs with no hook at all: no stage point is
  // even built.
  if (inject_.active || observer_) a.hook = &hook_;
  a.last_row = last_row && !a.hook && !batch_state_;
  hook_.clear();
  if (batch_state_) run_batched(ids, T, logits);
  else m_.arch->forward(m_, be_, *state_, a);
  hook_.clear();
  pos_ += T;
  last_T_ = !logits ? 0 : a.last_row ? 1 : T;
  if (inject_.active && logits && !inject_matched_) {
    std::string seen;
    for (const std::string& n : stages_seen_) seen += (seen.empty() ? "" : ", ") + n;
    throw Error("[inject] " + inject_.text + ": this model has no stage '" + inject_.stage +
                "'" + (inject_.layer >= 0 ? " at layer " + std::to_string(inject_.layer) : "") +
                " (its stages: " + seen + "; layers 0-" + std::to_string(m_.config.n_layer - 1) +
                ")");
  }
}

void Session::run_pieces(const std::vector<int32_t>& ids, bool last_logits) {
  const int max_T = state_->max_T;
  for (size_t i = 0; i < ids.size(); i += size_t(max_T)) {
    size_t n = std::min(ids.size() - i, size_t(max_T));
    const bool last = last_logits && i + n == ids.size();
    run(ids.data() + i, int(n), last, last);
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
  be_.summarize(state().logits, last_T_, m_.config.vocab, K, targets.data(), out);
  return out;
}

std::vector<double> Session::logits(int t) {
  ARB_CHECK(t >= 0 && t < last_T_, "[session] logits row %d of %d", t, last_T_);
  std::vector<double> row(m_.config.vocab);
  be_.read(state().logits, int64_t(t) * m_.config.vocab, m_.config.vocab, row.data());
  return row;
}

void Session::set_batch_with(int n) {
  ARB_CHECK(n >= 0 && n <= 256, "[session] --batch-with %d outside [0, 256]", n);
  reset();
  batch_state_.reset();
  pool_.reset();
  companions_.clear();
  be_.set_row_invariant(false);
  if (n == 0) return;
  ARB_CHECK(!inject_.active && !observer_,
            "[session] --batch-with: the batched forward runs no stage hooks (no --inject, drift or "
            "opcheck with it)");
  // Companion j feeds 1 + j % 3 rows a forward and restarts after 24 + 11 j positions (so
  // their positions differ); this sequence's pages come first in the pool.
  int blocks = (state_->max_ctx + kKvBlockRows - 1) / kKvBlockRows, rows = 0;
  for (int j = 0; j < n; ++j) {
    Companion c;
    c.rows = 1 + j % 3;
    c.cap = 24 + 11 * j;
    c.rng = 0x9E3779B97F4A7C15ull * uint64_t(j + 1);
    blocks += (c.cap + kKvBlockRows - 1) / kKvBlockRows;
    rows += c.rows;
    companions_.push_back(c);
  }
  // Recurrent-state slots: this sequence's 0, companion j's j + 1.
  batch_state_ = m_.arch->make_batch_state(m_, be_, blocks * kKvBlockRows, state_->max_T + rows, n + 1);
  ARB_CHECK(batch_state_ != nullptr, "[session] --batch-with: the %s family (%s) has no batched forward yet",
            m_.arch->family().c_str(), m_.config.arch.c_str());
  try {
    be_.set_row_invariant(true);
  } catch (...) {
    batch_state_.reset();
    companions_.clear();
    throw;
  }
  pool_ = std::make_unique<KvPool>(blocks, kKvBlockRows);
}

void Session::run_batched(const int32_t* ids, int T, bool logits) {
  ARB_CHECK(ids, "[session] --batch-with: the forward of a picked token is not batched");
  ARB_CHECK(!inject_.active && !observer_, "[session] --batch-with: the batched forward runs no stage hooks");
  ARB_CHECK(pool_->grow(table_, pos_ + T), "[session] --batch-with: the pool is full");
  std::vector<BatchSeq> batch;
  std::vector<int32_t> all;
  auto add = [&](std::vector<int32_t>& table, int slot, int pos0, int rows, BatchSeq::Logits l,
                 const int32_t* src, uint64_t* rng) {
    BatchSeq b;
    b.T = rows;
    b.pos0 = pos0;
    b.pages = {table.data(), int(table.size()), kKvBlockRows};
    b.slot = slot;
    b.logits = l;
    for (int t = 0; t < rows; ++t) {
      if (src) {
        all.push_back(src[t]);
      } else {  // splitmix64: a fixed stream per companion
        uint64_t z = (*rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        all.push_back(int32_t((z ^ (z >> 31)) % uint64_t(m_.config.vocab)));
      }
    }
    batch.push_back(b);
  };
  // Half the companions before this sequence's rows, half after: its rows sit inside the batch.
  const size_t half = companions_.size() / 2;
  for (size_t j = 0; j <= companions_.size(); ++j) {
    if (j == half) {
      const BatchSeq::Logits l = logits ? BatchSeq::Logits::All : BatchSeq::Logits::None;
      add(table_, 0, pos_, T, l, ids, nullptr);
      // Its logits rows come first in the buffer: the only sequence that asks for any.
    }
    if (j == companions_.size()) break;
    Companion& c = companions_[j];
    if (c.pos + c.rows > c.cap) {
      pool_->release(c.table);
      c.pos = 0;
    }
    ARB_CHECK(pool_->grow(c.table, c.pos + c.rows), "[session] --batch-with: the pool is full");
    add(c.table, int(j) + 1, c.pos, c.rows, BatchSeq::Logits::None, nullptr, &c.rng);
    c.pos += c.rows;
  }
  ForwardArgs a;
  a.ids = all.data();
  a.T = int(all.size());
  a.batch = &batch;
  a.routes = routes_;  // this sequence's routing alone (a trace's, drift's)
  a.routes_seq = int(half);
  m_.arch->forward(m_, be_, *batch_state_, a);
}

}  // namespace arbiter
