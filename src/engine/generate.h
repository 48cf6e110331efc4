// The generation loop: prefill the prompt in one forward, then decode one token per step.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

namespace arbiter {

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (not the prompt)
  bool stopped_on_eos = false;
  double prefill_s = 0, decode_s = 0;
};

/// One logits row on its tier, what the next token is chosen from: the last row of a
/// session's forward, or a sequence's row of a batched forward (engine/scheduler.cpp).
class LogitsRow {
 public:
  virtual ~LogitsRow() = default;
  virtual int vocab() const = 0;
  /// The whole row on the host, as f64.
  virtual std::vector<double> values() = 0;
  /// The tier's summary of the row (top K, no target).
  virtual LogitsSummary summary(int K) = 0;
  /// summarize's top-1, picked on the tier (Backend::pick_greedy).
  virtual int32_t greedy() = 0;
};

/// The last row of a session's last forward.
class SessionRow final : public LogitsRow {
 public:
  explicit SessionRow(Session& s) : s_(s) {}
  int vocab() const override { return s_.model().config.vocab; }
  std::vector<double> values() override;
  LogitsSummary summary(int K) override;
  int32_t greedy() override;

 private:
  Session& s_;
};

/// The next token from a logits row, as generation picks it: greedy on the tier (the row
/// stays there), a top-k sample from the tier's summary (the same candidates in the same
/// order as the whole row gives, so the same token), else from the whole row on the host,
/// penalised by the prompt and the tokens generated so far.
int32_t next_token(LogitsRow& row, Sampler& sampler, const PenaltyParams& penalties,
                   const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated);
/// next_token of the session's last forward's last row.
int32_t next_token(Session& s, Sampler& sampler, const PenaltyParams& penalties,
                   const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated);

/// Generates up to n_max tokens after prompt (which must be non-empty); n_max < 0: until a
/// stop id or the context is full. on_token is called for each generated id as it comes
/// (for streaming). Stops at any of stop_ids. Penalties, when active, are applied to each
/// row (the row then comes to the host).
GenerateResult generate(Session& s, const std::vector<int32_t>& prompt, int n_max,
                        Sampler& sampler, const std::vector<int32_t>& stop_ids,
                        const std::function<void(int32_t)>& on_token,
                        const PenaltyParams& penalties = {});

}  // namespace arbiter
