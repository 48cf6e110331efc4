#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generate.h"
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
    ARB_CHECK(!r.prompt.empty(), "[scheduler] empty prompt");
    ARB_CHECK(int(r.prompt.size()) < ctx_, "[scheduler] prompt of %zu tokens does not fit the context (%d)",
              r.prompt.size(), ctx_);
    for (int32_t id : r.prompt)
      ARB_CHECK(id >= 0 && id < m_.config.vocab, "[scheduler] token id %d outside the vocabulary [0, %d)", id,
                m_.config.vocab);
    Sampler check(r.sampling);  // throws on bad parameters, before the request is queued
    check_penalties(r.penalties);
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
        SeqEvent fin;
        fin.kind = SeqEvent::Kind::Finished;
        fin.finish = *done;
        fin.error = error;
        active[k].stream->push(std::move(fin));
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
    for (Active& a : active) {  // shutting down: every waiter gets its end
      SeqEvent fin;
      fin.kind = SeqEvent::Kind::Finished;
      fin.finish = FinishReason::Cancelled;
      a.stream->push(std::move(fin));
    }
    std::lock_guard<std::mutex> lk(mu_);
    for (Pending& p : queue_) {
      SeqEvent fin;
      fin.kind = SeqEvent::Kind::Finished;
      fin.finish = FinishReason::Cancelled;
      p.stream->push(std::move(fin));
    }
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
    const bool greedy = r.sampling.temperature == 0 && !r.penalties.active() && r.top_logprobs < 0;
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
    int32_t id;
    SeqEvent ev;
    ev.kind = SeqEvent::Kind::Token;
    if (greedy) {
      // The step after this token runs when the lengths allow another token; after a stop
      // id it runs for nothing and reset() drops its pick.
      a.ahead = alone && (r.max_tokens < 0 || int(a.generated.size()) + 1 < r.max_tokens) &&
                int(r.prompt.size() + a.generated.size()) + 1 < s.max_ctx();
      if (a.ahead) {
        s.forward_picked();
        s.pick();
      }
      id = s.take_pick();
      ev.token = TokenLogprob{id, 0, {}};
    } else if (r.top_logprobs >= 0) {  // logprobs need the whole row on the host
      const std::vector<double> row = s.logits(s.last_T() - 1);
      if (r.penalties.active()) {
        std::vector<double> pen = row;
        apply_penalties(r.penalties, r.prompt, a.generated, pen);
        id = a.sampler->sample(pen);
      } else {
        id = a.sampler->sample(row);
      }
      ev.token = row_logprobs(row, id, r.top_logprobs);
    } else {
      id = next_token(s, *a.sampler, r.penalties, r.prompt, a.generated);
      ev.token = TokenLogprob{id, 0, {}};
    }
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) return FinishReason::Stop;
    a.generated.push_back(id);
    a.stream->push(std::move(ev));
    if (r.max_tokens > 0 && int(a.generated.size()) >= r.max_tokens) return FinishReason::Length;
    if (int(r.prompt.size() + a.generated.size()) >= s.max_ctx()) return FinishReason::Length;  // prompt + completion
    return std::nullopt;
  }

  // The prompt in forwards of at most 512 tokens, each scored by the tier's summarize (the
  // same top-k, lse and target logit a teacher-forced trace records), then one event.
  void prefill_scored(Session& s, Active& a) {
    const std::vector<int32_t>& p = a.req.prompt;
    const int K = std::clamp(a.req.prompt_logprobs, 1, std::min(kMaxSummaryTopK, m_.config.vocab));
    SeqEvent ev;
    ev.kind = SeqEvent::Kind::Prompt;
    for (size_t i = 0; i < p.size(); i += 512) {
      const size_t n = std::min<size_t>(512, p.size() - i);
      std::vector<int32_t> piece(p.begin() + long(i), p.begin() + long(i + n)), targets(n, -1);
      for (size_t t = 0; t < n; ++t)
        if (i + t + 1 < p.size()) targets[t] = p[i + t + 1];
      s.forward(piece);
      std::vector<LogitsSummary> sum = s.summarize(K, targets);
      for (size_t t = 0; t < n; ++t) {
        if (targets[t] < 0) continue;
        TokenLogprob tl;
        tl.id = targets[t];
        tl.logprob = sum[t].target_logit - sum[t].lse;
        for (int k = 0; k < std::min<int>(a.req.prompt_logprobs, int(sum[t].top_ids.size())); ++k)
          tl.top.emplace_back(sum[t].top_ids[size_t(k)], sum[t].top_logits[size_t(k)] - sum[t].lse);
        ev.prompt.push_back(std::move(tl));
      }
    }
    a.stream->push(std::move(ev));
  }
};

}  // namespace

std::unique_ptr<Scheduler> make_time_slice_scheduler(const Model& m, Backend& be, int slots, int ctx,
                                                     int queue_max, const InjectSpec& inject) {
  return std::make_unique<TimeSliceScheduler>(m, be, slots, ctx, queue_max, inject);
}

}  // namespace arbiter
