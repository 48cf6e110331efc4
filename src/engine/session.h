// A model running on one tier: per-sequence state (KV caches), positions, forward passes,
// fault injection and stage observers. Prefill (many tokens) and decode (one token) run the
// same forward, the architecture's own (model/arch.h).
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/inject.h"
#include "engine/kv_pool.h"
#include "model/model.h"

namespace arbiter {

/// Sees every stage of every forward of a session and may ask for its output (tap.record)
/// or replace it (tap.overwrite): capture and replay (engine/probe.h).
class StageObserver {
 public:
  virtual ~StageObserver() = default;
  virtual void on_stage(const StagePoint& p, int pos0, StageTap& tap) = 0;
};

class Session {
 public:
  /// max_ctx: cache rows; max_T: widest single forward (prefills are split into pieces of
  /// at most max_T tokens).
  Session(const Model& m, Backend& be, int max_ctx, int max_T = 512);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Empties the cache (positions restart at 0) and drops picks not taken.
  void reset();
  int pos() const { return pos_; }
  int max_ctx() const { return state_->max_ctx; }
  /// Bytes the per-sequence state holds on the tier (KV caches and scratch).
  int64_t state_bytes() const { return state_->bytes; }

  /// Runs ids at the current position as ONE forward of width ids.size() (must be <= max_T)
  /// and advances. Logits of those tokens stay on the device: see summarize()/logits().
  void forward(const std::vector<int32_t>& ids);
  /// Like forward() but splits into pieces of at most max_T tokens and computes logits only
  /// for the last token (what generation needs to pick the next one): last_T() is then 1,
  /// unless a fault or an observer is set (their stages are every row's: then the last
  /// piece's rows).
  void prefill(const std::vector<int32_t>& ids);
  /// Fills the cache with ids (pieces of at most max_T tokens) and computes no logits: the
  /// untraced context of a teacher-forced chunk. summarize()/logits() are unavailable after.
  void context(const std::vector<int32_t>& ids);

  /// Greedy decode with the token kept on the tier: pick() chooses the next token from the
  /// last forward's last logits row (summarize's top-1), forward_picked() runs the latest
  /// pick as the next one-token forward without waiting for it on the host, and take_pick()
  /// returns the picks in order, waiting for each.
  void pick();
  void forward_picked();
  int32_t take_pick();

  /// Summaries of the last forward's logits rows (targets[t] < 0: no target).
  std::vector<LogitsSummary> summarize(int K, const std::vector<int32_t>& targets);
  /// Full logits row t of the last forward, as f64 on the host.
  std::vector<double> logits(int t);
  int last_T() const { return last_T_; }

  /// The fault of this session's tier. A stage that no forward with logits has emitted (a
  /// q_norm on a llama, a layer past the last) fails that forward with the model's stages.
  void set_inject(const InjectSpec& spec);
  const InjectSpec& inject() const { return inject_; }
  /// Sees every stage after injection (nullptr: none); not owned.
  void set_observer(StageObserver* o) { observer_ = o; }
  /// Receives the routing decisions of every forward's MoE layers (nullptr: none); not owned.
  void set_route_log(RouteLog* log) { routes_ = log; }

  /// Runs every later forward inside a batch with n other sequences, as continuous batching
  /// runs it (the batched forward, a paged KV pool, row-invariant matmuls: docs/serve.md), so
  /// that a trace shows what the batching scheduler computes (`trace --batch-with N`). The
  /// others are streams of pseudo-random tokens, each at its own positions, feeding 1 to 3
  /// rows per forward, before and after this sequence's rows; each restarts when it has
  /// filled its own pages. n = 0: off. A route log gets this sequence's routing alone.
  /// Refused (one line) for families without a batched forward, on tiers without its ops,
  /// and with a fault or an observer (the batched forward runs no hooks). Resets the session.
  void set_batch_with(int n);

  const Model& model() const { return m_; }
  Backend& backend() { return be_; }

 private:
  /// The forward's hook: the taps of injection and the observer, kept for one forward.
  class Hook final : public StageHook {
   public:
    explicit Hook(Session& s) : s_(s) {}
    const StageTap* at(const StagePoint& p, int pos0) override;
    void clear() { taps_.clear(); }

   private:
    Session& s_;
    std::deque<StageTap> taps_;  // stable addresses while the forward runs
  };

  const Model& m_;
  Backend& be_;
  std::unique_ptr<ForwardState> state_;
  Hook hook_{*this};
  int pos_ = 0;
  int last_T_ = 0;  // rows of logits the last forward left; 0 after context()
  bool picked_ = false;  // a pick since the last reset (forward_picked may run)
  int picks_pending_ = 0;  // picks not taken yet
  InjectSpec inject_;
  bool inject_matched_ = false;  // the fault's stage was seen since set_inject
  std::vector<std::string> stages_seen_;  // names seen, for the message when it never is
  StageObserver* observer_ = nullptr;
  RouteLog* routes_ = nullptr;

  // --batch-with: the batch's state and pool, this sequence's pages, the other sequences.
  struct Companion {
    std::vector<int32_t> table;
    int pos = 0, rows = 0, cap = 0;  // next position, rows per forward, positions before restart
    uint64_t rng = 0;
  };
  std::unique_ptr<ForwardState> batch_state_;
  std::unique_ptr<KvPool> pool_;
  std::vector<int32_t> table_;
  std::vector<Companion> companions_;
  ForwardState& state() { return batch_state_ ? *batch_state_ : *state_; }
  void run_batched(const int32_t* ids, int T, bool logits);

  // ids == nullptr: the latest pick; last_row: the last row's logits alone where no hook runs
  void run(const int32_t* ids, int T, bool logits, bool last_row = false);
  void drop_picks();  // takes (and discards) every pick not taken
  // Pieces of at most max_T tokens; logits only for the last piece, and only if last_logits.
  void run_pieces(const std::vector<int32_t>& ids, bool last_logits);
};

/// What a tier must be told about a model before its first op (Backend::prepare).
Backend::Prepare prepare_spec(const Model& m);

}  // namespace arbiter
