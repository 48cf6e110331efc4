// A model running on one tier: KV cache, positions, forward passes, fault injection and
// capture hooks. Prefill (many tokens) and decode (one token) use the same forward().
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/inject.h"
#include "model/forward.h"
#include "model/model.h"

namespace arbiter {

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
  int max_ctx() const { return kv_.max_ctx; }

  /// Runs ids at the current position as ONE forward of width ids.size() (must be <= max_T)
  /// and advances. Logits of those tokens stay on the device: see summarize()/logits().
  void forward(const std::vector<int32_t>& ids);
  /// Like forward() but splits into pieces of at most max_T tokens and computes logits only
  /// for the last piece (what generation needs to pick the next token).
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

  void set_inject(const InjectSpec& spec) { inject_ = spec; }
  const InjectSpec& inject() const { return inject_; }
  /// Extra hook called after each stage (after injection), e.g. capture for drift.
  void set_capture(StageHook h) { capture_ = std::move(h); }

  const Model& model() const { return m_; }
  Backend& backend() { return be_; }

 private:
  const Model& m_;
  Backend& be_;
  KVCache kv_;
  Scratch s_;
  int pos_ = 0;
  int last_T_ = 0;  // rows of logits the last forward left; 0 after context()
  bool picked_ = false;  // a pick since the last reset (forward_picked may run)
  int picks_pending_ = 0;  // picks not taken yet
  InjectSpec inject_;
  StageHook capture_;

  void run(const int32_t* ids, int T, bool logits);  // ids == nullptr: the latest pick
  void drop_picks();  // takes (and discards) every pick not taken
  // Pieces of at most max_T tokens; logits only for the last piece, and only if last_logits.
  void run_pieces(const std::vector<int32_t>& ids, bool last_logits);
};

}  // namespace arbiter
