#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/kv_pool.h"
#include "engine/session.h"

namespace arbiter {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

void SeqStream::push(SeqEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::optional<SeqEvent> SeqStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  SeqEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

TokenLogprob row_logprobs(const std::vector<double>& logits, int32_t target, int n) {
  // log-softmax in double, max-shifted; NaN entries take no mass and never rank.
  double mx = -INFINITY;
  for (double x : logits)
    if (!std::isnan(x)) mx = std::max(mx, x);
  double s = 0;
  for (double x : logits)
    if (!std::isnan(x)) s += std::exp(x - mx);
  const double lse = mx + std::log(s);
  TokenLogprob r;
  r.id = target;
  if (target >= 0) r.logprob = logits[size_t(target)] - lse;
  const int V = int(logits.size());
  n = std::clamp(n, 0, V);
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const double x = logits[size_t(a)], y = logits[size_t(b)];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) || (std::isnan(y) && a < b);
    return x > y || (x == y && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), before);
  for (int k = 0; k < n; ++k) r.top.emplace_back(idx[size_t(k)], logits[size_t(idx[size_t(k)])] - lse);
  return r;
}

namespace {

// What both schedulers refuse at submit, before a request is queued.
void check_request(const SeqRequest& r, const Model& m, int ctx) {
  ARB_CHECK(!r.prompt.empty(), "[scheduler] empty prompt");
  ARB_CHECK(int(r.prompt.size()) < ctx, "[scheduler] prompt of %zu tokens does not fit the context (%d)",
            r.prompt.size(), ctx);
  for (int32_t id : r.prompt)
    ARB_CHECK(id >= 0 && id < m.config.vocab, "[scheduler] token id %d outside the vocabulary [0, %d)", id,
              m.config.vocab);
  Sampler check(r.sampling);  // throws on bad parameters
  check_penalties(r.penalties);
}

void end_stream(SeqStream& s, FinishReason f, const std::string& error = {}) {
  SeqEvent fin;
  fin.kind = SeqEvent::Kind::Finished;
  fin.finish = f;
  fin.error = error;
  s.push(std::move(fin));
}

// Whether a request's tokens are summarize's top-1 alone (temperature 0, no penalties, no
// logprobs): choose_token then only takes row.greedy(), so the tier may pick it ahead.
bool greedy_top1(const SeqRequest& r) {
  return r.sampling.temperature == 0 && !r.penalties.active() && r.top_logprobs < 0;
}

// The next token from a row, with its logprobs when asked (they need the whole row on the
// host), penalised and sampled as generation does.
TokenLogprob choose_token(LogitsRow& row, const SeqRequest& r, Sampler& sampler,
                          const std::vector<int32_t>& generated) {
  if (r.top_logprobs < 0) return TokenLogprob{next_token(row, sampler, r.penalties, r.prompt, generated), 0, {}};
  const std::vector<double> v = row.values();
  int32_t id;
  if (r.penalties.active()) {
    std::vector<double> pen = v;
    apply_penalties(r.penalties, r.prompt, generated, pen);
    id = sampler.sample(pen);
  } else {
    id = sampler.sample(v);
  }
  return row_logprobs(v, id, r.top_logprobs);
}

// A chosen token: a stop id ends the sequence unemitted; else it is streamed, and the
// sequence ends when it has max_tokens or fills the context (prompt + completion).
std::optional<FinishReason> deliver(const SeqRequest& r, SeqStream& stream, std::vector<int32_t>& generated,
                                    TokenLogprob tok, int ctx) {
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok.id) != r.stop_ids.end()) return FinishReason::Stop;
  generated.push_back(tok.id);
  SeqEvent ev;
  ev.kind = SeqEvent::Kind::Token;
  ev.token = std::move(tok);
  stream.push(std::move(ev));
  if (r.max_tokens > 0 && int(generated.size()) >= r.max_tokens) return FinishReason::Length;
  if (int(r.prompt.size() + generated.size()) >= ctx) return FinishReason::Length;
  return std::nullopt;
}

// Echo: the summaries' K, and their rows as prompt logprobs (rows without a target skipped).
int prompt_top_k(const SeqRequest& r, int V) { return std::clamp(r.prompt_logprobs, 1, std::min(kMaxSummaryTopK, V)); }
void add_prompt_logprobs(const SeqRequest& r, const std::vector<LogitsSummary>& sum,
                         const std::vector<int32_t>& targets, std::vector<TokenLogprob>& out) {
  for (size_t t = 0; t < sum.size(); ++t) {
    if (targets[t] < 0) continue;
    TokenLogprob tl;
    tl.id = targets[t];
    tl.logprob = sum[t].target_logit - sum[t].lse;
    for (int k = 0; k < std::min<int>(r.prompt_logprobs, int(sum[t].top_ids.size())); ++k)
      tl.top.emplace_back(sum[t].top_ids[size_t(k)], sum[t].top_logits[size_t(k)] - sum[t].lse);
    out.push_back(std::move(tl));
  }
}

class TimeSliceScheduler : public Scheduler {
 public:
  TimeSliceScheduler(const Model& m, Backend& be, int slots, int ctx, int queue_max, const InjectSpec& inject)
      : m_(m), be_(be), ctx_(ctx), queue_max_(queue_max) {
    ARB_CHECK(slots >= 1 && ctx >= 2 && queue_max >= 0,
              "[scheduler] bad sizes: %d slots, context %d, queue %d", slots, ctx, queue_max);
    for (int k = 0; k < slots; ++k) {
      sessions_.push_back(std::make_unique<Session>(m, be, ctx));
      sessions_.back()->set_inject(inject);
    }
    free_.resize(size_t(slots));
    std::iota(free_.begin(), free_.end(), 0);
    thread_ = std::thread([this] { loop(); });
  }

  ~TimeSliceScheduler() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::shared_ptr<SeqStream> submit(SeqRequest r) override {
    check_request(r, m_, ctx_);
    auto stream = std::make_shared<SeqStream>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      // Queued sequences that free slots will take at once do not count as waiting.
      if (int(queue_.size()) - int(free_.size()) >= queue_max_) return nullptr;
      queue_.push_back({std::move(r), stream});
    }
    cv_.notify_all();
    return stream;
  }

  Stats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return {int(queue_.size()), int(sessions_.size() - free_.size()), int(sessions_.size()), last_batch_};
  }

  int max_ctx() const override { return ctx_; }

 private:
  struct Pending {
    SeqRequest req;
    std::shared_ptr<SeqStream> stream;
  };
  struct Active {
    SeqRequest req;
    std::shared_ptr<SeqStream> stream;
    int slot = 0;
    bool prefilled = false;
    bool ahead = false;  // the forward of generated.back() is queued and its pick pending
    std::vector<int32_t> generated;
    std::unique_ptr<Sampler> sampler;
  };

  const Model& m_;
  Backend& be_;
  const int ctx_, queue_max_;
  std::vector<std::unique_ptr<Session>> sessions_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  std::vector<int> free_;  // slots not held
  int last_batch_ = 0;
  bool stop_ = false;
  std::thread thread_;

  void loop() {
    std::vector<Active> active;
    while (true) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !active.empty() || !queue_.empty(); });
        if (stop_) break;
        while (!queue_.empty() && !free_.empty()) {
          Active a;
          a.req = std::move(queue_.front().req);
          a.stream = std::move(queue_.front().stream);
          queue_.pop_front();
          a.slot = free_.back();
          free_.pop_back();
          active.push_back(std::move(a));
        }
        last_batch_ = int(active.size());
      }
      for (size_t k = 0; k < active.size();) {
        std::optional<FinishReason> done;
        std::string error;
        try {
          done = step(active[k], active.size() == 1);
        } catch (const std::exception& e) {
          done = FinishReason::Error;
          error = e.what();
        }
        if (!done) {
          ++k;
          continue;
        }
        end_stream(*active[k].stream, *done, error);
        try {  // a pick queued ahead must not reach the next sequence on this backend
          sessions_[size_t(active[k].slot)]->reset();
        } catch (const std::exception&) {  // a failed tier: the next sequence reports it
        }
        {
          std::lock_guard<std::mutex> lk(mu_);
          free_.push_back(active[k].slot);
        }
        active.erase(active.begin() + long(k));
      }
    }
    for (Active& a : active) end_stream(*a.stream, FinishReason::Cancelled);  // shutting down: every waiter gets its end
    std::lock_guard<std::mutex> lk(mu_);
    for (Pending& p : queue_) end_stream(*p.stream, FinishReason::Cancelled);
  }

  // One step of a sequence: the prefill (with the prompt's logprobs when asked) and the
  // first token, or the forward of the last token and the next one. A value: it finished.
  // A greedy sequence alone on the engine runs as generate does: the forward of each token
  // is queued before the host reads it (Session::forward_picked), so the tier does not wait
  // for the host between steps. Picks are the backend's, in order, so this stops as soon as
  // another sequence is active (it takes its pending pick first: it is stepped first).
  std::optional<FinishReason> step(Active& a, bool alone) {
    if (a.stream->cancelled()) return FinishReason::Cancelled;
    Session& s = *sessions_[size_t(a.slot)];
    const SeqRequest& r = a.req;
    const bool greedy = greedy_top1(r);
    if (!a.prefilled) {
      a.prefilled = true;
      a.sampler = std::make_unique<Sampler>(r.sampling);
      s.reset();
      if (r.prompt_logprobs >= 0) prefill_scored(s, a);
      else s.prefill(r.prompt);
      if (r.max_tokens == 0) return FinishReason::Length;
      if (greedy) s.pick();
    } else if (!a.ahead) {
      s.forward({a.generated.back()});
      if (greedy) s.pick();
    }
    TokenLogprob tok;
    if (greedy) {
      // The step after this token runs when the lengths allow another token; after a stop
      // id it runs for nothing and reset() drops its pick.
      a.ahead = alone && (r.max_tokens < 0 || int(a.generated.size()) + 1 < r.max_tokens) &&
                int(r.prompt.size() + a.generated.size()) + 1 < s.max_ctx();
      if (a.ahead) {
        s.forward_picked();
        s.pick();
      }
      tok = TokenLogprob{s.take_pick(), 0, {}};
    } else {
      SessionRow row(s);
      tok = choose_token(row, r, *a.sampler, a.generated);
    }
    return deliver(r, *a.stream, a.generated, std::move(tok), s.max_ctx());
  }

  // The prompt in forwards of at most 512 tokens, each scored by the tier's summarize (the
  // same top-k, lse and target logit a teacher-forced trace records), then one event.
  void prefill_scored(Session& s, Active& a) {
    const std::vector<int32_t>& p = a.req.prompt;
    const int K = prompt_top_k(a.req, m_.config.vocab);
    SeqEvent ev;
    ev.kind = SeqEvent::Kind::Prompt;
    for (size_t i = 0; i < p.size(); i += 512) {
      const size_t n = std::min<size_t>(512, p.size() - i);
      std::vector<int32_t> piece(p.begin() + long(i), p.begin() + long(i + n)), targets(n, -1);
      for (size_t t = 0; t < n; ++t)
        if (i + t + 1 < p.size()) targets[t] = p[i + t + 1];
      s.forward(piece);
      add_prompt_logprobs(a.req, s.summarize(K, targets), targets, ev.prompt);
    }
    a.stream->push(std::move(ev));
  }
};

// A sequence's logits row of a batched forward.
class BatchRow final : public LogitsRow {
 public:
  /// picked >= 0: the row's greedy token, already taken from the step's shared summary.
  BatchRow(Backend& be, const Buffer& logits, int row, int V, int32_t picked)
      : be_(be), logits_(logits), row_(row), V_(V), picked_(picked) {}
  int vocab() const override { return V_; }
  std::vector<double> values() override {
    std::vector<double> v(static_cast<size_t>(V_));
    be_.read(logits_, int64_t(row_) * V_, V_, v.data());
    return v;
  }
  LogitsSummary summary(int K) override {
    const int32_t none = -1;
    std::vector<LogitsSummary> out;
    be_.summarize(buffer_view(logits_, int64_t(row_) * V_, V_), 1, V_, K, &none, out);
    return out[0];
  }
  int32_t greedy() override {
    if (picked_ >= 0) return picked_;
    be_.pick_greedy(logits_, row_, V_);
    return be_.take_pick();
  }

 private:
  Backend& be_;
  const Buffer& logits_;
  int row_, V_;
  int32_t picked_;
};

class BatchingScheduler : public Scheduler {
 public:
  BatchingScheduler(const Model& m, Backend& be, const BatchingOptions& o)
      : m_(m), be_(be), o_(o), pool_(pool_blocks(o), kKvBlockRows) {
    ARB_CHECK(o.slots >= 1 && o.ctx >= 2 && o.queue_max >= 0 && o.step_tokens >= o.slots,
              "[scheduler] bad sizes: %d slots, context %d, queue %d, %d rows a step", o.slots, o.ctx,
              o.queue_max, o.step_tokens);
    // A sequence alone must be able to reach the context, so that preemption (of the youngest)
    // always leaves the oldest room to finish.
    ARB_CHECK(pool_.total() >= pool_.blocks_for(o.ctx),
              "[scheduler] --kv-blocks %d holds %d positions, less than one context of %d", pool_.total(),
              pool_.total() * kKvBlockRows, o.ctx);
    const std::string why = batching_problem(m, be);
    ARB_CHECK(why.empty(), "%s", why.c_str());
    be_.prepare(prepare_spec(m));
    state_ = m.arch->make_batch_state(m, be, pool_.total() * kKvBlockRows, o.step_tokens, o.slots);
    // Handed out lowest first, as the blocks are.
    for (int k = o.slots - 1; k >= 0; --k) free_slots_.push_back(k);
    be_.set_row_invariant(true);
    kv_free_ = pool_.total();
    thread_ = std::thread([this] { loop(); });
  }

  ~BatchingScheduler() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    state_.reset();
    be_.set_row_invariant(false);
  }

  std::shared_ptr<SeqStream> submit(SeqRequest r) override {
    check_request(r, m_, o_.ctx);
    auto stream = std::make_shared<SeqStream>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (int(queue_.size()) - (o_.slots - active_) >= o_.queue_max) return nullptr;
      queue_.push_back({std::move(r), stream});
    }
    cv_.notify_all();
    return stream;
  }

  Stats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    Stats st{int(queue_.size()) + waiting_, active_, o_.slots, last_batch_};
    st.kv_blocks = pool_.total();
    st.kv_free = kv_free_;
    st.preempted = preempted_;
    st.steps = steps_;
    st.last_rows = last_rows_;
    return st;
  }

  int max_ctx() const override { return o_.ctx; }

 private:
  struct Pending {
    SeqRequest req;
    std::shared_ptr<SeqStream> stream;
  };
  struct Seq {
    SeqRequest req;
    std::shared_ptr<SeqStream> stream;
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> generated;
    std::vector<int32_t> table;  // its blocks, in position order
    int slot = -1;               // its recurrent-state slot (BatchSeq::slot) while active
    int fed = 0;                 // positions whose K/V are in the pool
    bool prompt_done = false;    // the prompt was fed once (its echo event went out)
    std::vector<TokenLogprob> echo;  // prompt logprobs gathered over the prefill's chunks
    uint64_t order = 0;          // admission order: preemption takes the youngest
    int T = 0;                   // rows in this round's forward
    int tokens() const { return int(req.prompt.size() + generated.size()); }
    int32_t token(int i) const {
      return i < int(req.prompt.size()) ? req.prompt[size_t(i)] : generated[size_t(i) - req.prompt.size()];
    }
  };

  const Model& m_;
  Backend& be_;
  const BatchingOptions o_;
  KvPool pool_;  // engine thread only
  std::vector<int> free_slots_;  // engine thread only: state slots no active sequence holds
  std::unique_ptr<ForwardState> state_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  int active_ = 0, waiting_ = 0, last_batch_ = 0, last_rows_ = 0, kv_free_ = 0;  // for stats()
  int64_t preempted_ = 0, steps_ = 0;
  bool stop_ = false;
  std::thread thread_;
  uint64_t next_order_ = 0;

  static int pool_blocks(const BatchingOptions& o) {
    return o.kv_blocks > 0 ? o.kv_blocks : o.slots * ((o.ctx + kKvBlockRows - 1) / kKvBlockRows);
  }

  // A sequence leaving the active set gives back its blocks and its state slot (a preempted
  // one is recomputed from position 0, which starts its state afresh in whatever slot).
  void release(Seq& q) {
    pool_.release(q.table);
    if (q.slot >= 0) free_slots_.push_back(q.slot);
    q.slot = -1;
  }

  // The blocks go back before the stream hears of its end, so stats() already counts them.
  void finish(Seq& q, FinishReason f, const std::string& error = {}) {
    release(q);
    {
      std::lock_guard<std::mutex> lk(mu_);
      kv_free_ = pool_.free();
    }
    end_stream(*q.stream, f, error);
  }

  void loop() {
    std::vector<std::unique_ptr<Seq>> active;  // admission order
    std::deque<std::unique_ptr<Seq>> held;     // preempted, oldest first: they go before the queue
    while (true) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !active.empty() || !queue_.empty() || !held.empty(); });
        if (stop_) break;
        admit(active, held);
      }
      // A cancelled stream (client gone) gives its blocks back before this round's forward.
      for (size_t k = 0; k < active.size();) {
        if (!active[k]->stream->cancelled()) {
          ++k;
          continue;
        }
        finish(*active[k], FinishReason::Cancelled);
        active.erase(active.begin() + long(k));
      }
      for (size_t k = 0; k < held.size();) {
        if (!held[k]->stream->cancelled()) {
          ++k;
          continue;
        }
        finish(*held[k], FinishReason::Cancelled);
        held.erase(held.begin() + long(k));
      }
      plan(active, held);
      int rows = 0;
      const int n = step(active, rows);
      std::lock_guard<std::mutex> lk(mu_);
      last_batch_ = n;
      last_rows_ = rows;
      steps_ += n > 0;
      active_ = int(active.size());
      waiting_ = int(held.size());
      kv_free_ = pool_.free();
    }
    for (auto& q : active) finish(*q, FinishReason::Cancelled);  // shutting down: every waiter gets its end
    for (auto& q : held) finish(*q, FinishReason::Cancelled);
    std::lock_guard<std::mutex> lk(mu_);
    for (Pending& p : queue_) end_stream(*p.stream, FinishReason::Cancelled);
  }

  // A slot for a sequence becoming active: one is always free, as active sequences are at most
  // o_.slots and only they hold one.
  int take_slot() {
    ARB_ASSERT(!free_slots_.empty());
    const int k = free_slots_.back();
    free_slots_.pop_back();
    return k;
  }

  // Under mu_: preempted sequences first, then the queue, while a slot is free and the pool
  // holds the sequence's tokens and one more. A queued request that does not fit waits (and
  // those behind it: admission stays in order).
  void admit(std::vector<std::unique_ptr<Seq>>& active, std::deque<std::unique_ptr<Seq>>& held) {
    while (int(active.size()) < o_.slots) {
      std::unique_ptr<Seq> q;
      if (!held.empty()) {
        if (!pool_.grow(held.front()->table, held.front()->tokens() + 1)) break;
        q = std::move(held.front());
        held.pop_front();
        q->slot = take_slot();
      } else if (!queue_.empty()) {
        Pending& p = queue_.front();
        if (p.stream->cancelled()) {
          end_stream(*p.stream, FinishReason::Cancelled);
          queue_.pop_front();
          continue;
        }
        q = std::make_unique<Seq>();
        if (!pool_.grow(q->table, int(p.req.prompt.size()) + 1)) break;
        q->req = std::move(p.req);
        q->stream = std::move(p.stream);
        q->sampler = std::make_unique<Sampler>(q->req.sampling);
        q->order = next_order_++;
        q->slot = take_slot();
        queue_.pop_front();
      } else {
        break;
      }
      active.push_back(std::move(q));
    }
  }

  // This round's rows: one for each decoding sequence, then prefill chunks in admission order
  // within step_tokens; then blocks for them, oldest first, preempting the youngest sequence
  // (perhaps the one growing) while the pool is short.
  void plan(std::vector<std::unique_ptr<Seq>>& active, std::deque<std::unique_ptr<Seq>>& held) {
    int left = o_.step_tokens;
    for (auto& q : active) q->T = 0;
    for (auto& q : active)
      if (q->tokens() - q->fed == 1) q->T = 1, --left;
    for (auto& q : active) {
      const int pending = q->tokens() - q->fed;
      if (pending > 1 && left > 0) q->T = std::min(pending, left), left -= q->T;
    }
    // In admission order, so that the youngest is last (a preempted sequence keeps its order).
    std::stable_sort(active.begin(), active.end(), [](const auto& a, const auto& b) { return a->order < b->order; });
    for (size_t k = 0; k < active.size(); ++k) {
      Seq& q = *active[k];
      if (q.T == 0) continue;
      while (!pool_.grow(q.table, q.fed + q.T)) {
        const bool self = k + 1 == active.size();
        preempt(active, held, active.size() - 1);
        if (self) break;
      }
    }
  }

  void preempt(std::vector<std::unique_ptr<Seq>>& active, std::deque<std::unique_ptr<Seq>>& held, size_t y) {
    std::unique_ptr<Seq> q = std::move(active[y]);
    active.erase(active.begin() + long(y));
    release(*q);
    q->fed = 0;
    q->T = 0;
    if (!q->prompt_done) q->echo.clear();
    auto at = std::find_if(held.begin(), held.end(), [&](const auto& h) { return h->order > q->order; });
    held.insert(at, std::move(q));
    std::lock_guard<std::mutex> lk(mu_);
    ++preempted_;
  }

  // One batched forward of the planned rows, then each sequence that caught up with its
  // tokens takes its next one. Returns the sequences it advanced; rows: the forward's rows.
  int step(std::vector<std::unique_ptr<Seq>>& active, int& rows) {
    std::vector<BatchSeq> batch;
    std::vector<Seq*> in;
    std::vector<int32_t> ids;
    for (auto& q : active) {
      if (q->T == 0) continue;
      BatchSeq b;
      b.T = q->T;
      b.pos0 = q->fed;
      b.pages = {q->table.data(), int(q->table.size()), kKvBlockRows};
      b.slot = q->slot;
      const bool echo = !q->prompt_done && q->req.prompt_logprobs >= 0;
      b.logits = echo ? BatchSeq::Logits::All
                      : q->fed + q->T == q->tokens() ? BatchSeq::Logits::Last : BatchSeq::Logits::None;
      for (int t = 0; t < q->T; ++t) ids.push_back(q->token(q->fed + t));
      batch.push_back(b);
      in.push_back(q.get());
    }
    rows = int(ids.size());
    if (batch.empty()) return 0;
    std::vector<std::pair<Seq*, FinishReason>> done;
    std::string error;
    try {
      ForwardArgs a;
      a.ids = ids.data();
      a.T = int(ids.size());
      a.batch = &batch;
      m_.arch->forward(m_, be_, *state_, a);
      const std::vector<int32_t> picked = greedy_picks(in, batch);
      int row = 0;  // logits row
      for (size_t i = 0; i < in.size(); ++i) {
        Seq& q = *in[i];
        const int n = batch[i].logit_rows();
        if (batch[i].logits == BatchSeq::Logits::All) echo_rows(q, row, n);
        q.fed += q.T;
        if (q.fed == q.tokens()) {
          if (auto f = next(q, row + n - 1, picked[i])) done.emplace_back(&q, *f);
        }
        row += n;
      }
    } catch (const std::exception& e) {  // a failed tier: every sequence of the forward reports it
      error = e.what();
      for (Seq* q : in) done.emplace_back(q, FinishReason::Error);
    }
    for (auto& [seq, f] : done) {
      Seq* q = seq;  // clang 14 (the fuzz build) cannot capture a structured binding
      finish(*q, f, f == FinishReason::Error ? error : std::string());
      auto it = std::find_if(active.begin(), active.end(), [q](const auto& p) { return p.get() == q; });
      if (it != active.end()) active.erase(it);
    }
    return int(in.size());
  }

  // The greedy tokens of the sequences that take one this step by summarize's top-1 alone
  // (temperature 0, no penalties or logprobs), from one summary of their rows (one wait on
  // the tier, not a pick and a wait per sequence); -1 for the others, which choose their own.
  // The same token as pick_greedy's (backend.h), so this only saves time.
  std::vector<int32_t> greedy_picks(const std::vector<Seq*>& in, const std::vector<BatchSeq>& batch) {
    std::vector<int32_t> picked(in.size(), -1);
    std::vector<int> rows(in.size(), -1);
    int row = 0, lo = std::numeric_limits<int>::max(), hi = -1, n = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const Seq& q = *in[i];
      row += batch[i].logit_rows();
      const bool greedy =
          q.fed + q.T == q.tokens() && (q.prompt_done || q.req.max_tokens != 0) && greedy_top1(q.req);
      if (!greedy) continue;
      rows[i] = row - 1;
      lo = std::min(lo, row - 1);
      hi = std::max(hi, row - 1);
      ++n;
    }
    if (n < 2) return picked;
    const int V = m_.config.vocab, R = hi - lo + 1;
    std::vector<LogitsSummary> sum;
    be_.summarize(buffer_view(state_->logits, int64_t(lo) * V, int64_t(R) * V), R, V, 1,
                  std::vector<int32_t>(size_t(R), -1).data(), sum);
    for (size_t i = 0; i < in.size(); ++i)
      if (rows[i] >= 0) picked[i] = sum[size_t(rows[i] - lo)].top_ids[0];
    return picked;
  }

  // Echo: the prompt logprobs of logits rows [row, row + n), positions fed.. of q.
  void echo_rows(Seq& q, int row, int n) {
    const int V = m_.config.vocab;
    std::vector<int32_t> targets(size_t(n), -1);
    for (int t = 0; t < n; ++t)
      if (q.fed + t + 1 < int(q.req.prompt.size())) targets[size_t(t)] = q.req.prompt[size_t(q.fed + t + 1)];
    std::vector<LogitsSummary> sum;
    be_.summarize(buffer_view(state_->logits, int64_t(row) * V, int64_t(n) * V), n, V,
                  prompt_top_k(q.req, V), targets.data(), sum);
    add_prompt_logprobs(q.req, sum, targets, q.echo);
  }

  // q's tokens are all in the pool and `row` holds the logits after them: the prompt's echo
  // the first time, then the next token. A value: q finished.
  std::optional<FinishReason> next(Seq& q, int row, int32_t picked) {
    if (!q.prompt_done) {
      q.prompt_done = true;
      if (q.req.prompt_logprobs >= 0) {
        SeqEvent ev;
        ev.kind = SeqEvent::Kind::Prompt;
        ev.prompt = std::move(q.echo);
        q.stream->push(std::move(ev));
      }
      if (q.req.max_tokens == 0) return FinishReason::Length;
    }
    BatchRow r(be_, state_->logits, row, m_.config.vocab, picked);
    return deliver(q.req, *q.stream, q.generated, choose_token(r, q.req, *q.sampler, q.generated), o_.ctx);
  }
};

}  // namespace

std::string batching_problem(const Model& m, Backend& be) {
  if (!m.arch->make_batch_state(m, be, kKvBlockRows, 1, 1))
    return "[scheduler] continuous batching: the " + m.arch->family() + " family (" + m.config.arch +
           ") has no batched forward yet";
  try {
    be.set_row_invariant(true);
    be.set_row_invariant(false);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<Scheduler> make_batching_scheduler(const Model& m, Backend& be, const BatchingOptions& o) {
  return std::make_unique<BatchingScheduler>(m, be, o);
}

std::unique_ptr<Scheduler> make_time_slice_scheduler(const Model& m, Backend& be, int slots, int ctx,
                                                     int queue_max, const InjectSpec& inject) {
  return std::make_unique<TimeSliceScheduler>(m, be, slots, ctx, queue_max, inject);
}

}  // namespace arbiter
