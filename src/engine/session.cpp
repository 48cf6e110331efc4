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
  } catch (...) {
  }
}

void Session::reset() {
  pos_ = 0;
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
  be_.pick_greedy(state_->logits, last_T_ - 1, m_.config.vocab);
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

void Session::run(const int32_t* ids, int T, bool logits) {
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
  hook_.clear();
  m_.arch->forward(m_, be_, *state_, a);
  hook_.clear();
  pos_ += T;
  last_T_ = logits ? T : 0;
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
  be_.summarize(state_->logits, last_T_, m_.config.vocab, K, targets.data(), out);
  return out;
}

std::vector<double> Session::logits(int t) {
  ARB_CHECK(t >= 0 && t < last_T_, "[session] logits row %d of %d", t, last_T_);
  std::vector<double> row(m_.config.vocab);
  be_.read(state_->logits, int64_t(t) * m_.config.vocab, m_.config.vocab, row.data());
  return row;
}

}  // namespace arbiter
