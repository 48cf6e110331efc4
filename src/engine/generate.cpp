#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace arbiter {

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int32_t next_token(LogitsRow& row, Sampler& sampler, const PenaltyParams& penalties,
                   const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  if (penalties.active()) {
    std::vector<double> v = row.values();
    apply_penalties(penalties, prompt, generated, v);
    return sampler.sample(v);
  }
  if (sampler.params().temperature == 0) return row.greedy();
  const int top_k = sampler.params().top_k;
  if (top_k > 0 && top_k <= std::min(kMaxSummaryTopK, row.vocab())) {
    const LogitsSummary s = row.summary(top_k);
    return sampler.sample_top(s.top_ids, s.top_logits);
  }
  return sampler.sample(row.values());
}

std::vector<double> SessionRow::values() { return s_.logits(s_.last_T() - 1); }

LogitsSummary SessionRow::summary(int K) {
  return s_.summarize(K, std::vector<int32_t>(size_t(s_.last_T()), -1)).back();
}

int32_t SessionRow::greedy() {
  s_.pick();
  return s_.take_pick();
}

int32_t next_token(Session& s, Sampler& sampler, const PenaltyParams& penalties,
                   const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  SessionRow row(s);
  return next_token(row, sampler, penalties, prompt, generated);
}

GenerateResult generate(Session& s, const std::vector<int32_t>& prompt, int n_max,
                        Sampler& sampler, const std::vector<int32_t>& stop_ids,
                        const std::function<void(int32_t)>& on_token, const PenaltyParams& penalties) {
  ARB_CHECK(!prompt.empty(), "[generate] empty prompt (and the tokenizer adds no BOS)");
  ARB_CHECK(int(prompt.size()) < s.max_ctx() || n_max == 0,
            "[generate] prompt (%zu tokens) leaves no room in the context (%d)", prompt.size(), s.max_ctx());
  if (n_max < 0) n_max = s.max_ctx() - int(prompt.size());
  ARB_CHECK(int(prompt.size()) + n_max <= s.max_ctx(),
            "[generate] prompt (%zu tokens) + %d new tokens exceed the context (%d)",
            prompt.size(), n_max, s.max_ctx());
  GenerateResult r;
  s.reset();
  auto t0 = std::chrono::steady_clock::now();
  // The prompt is prefilled in pieces of the session's widest forward; the last piece's
  // last row gives the first new token.
  s.prefill(prompt);
  r.prefill_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  // Greedy keeps each token on the tier and queues the next step before the host looks at
  // the token, so the tier never waits for the host; the step after a stop token runs for
  // nothing. Other sampling takes each token as next_token does.
  const bool greedy = sampler.params().temperature == 0 && !penalties.active();
  if (greedy && n_max > 0) s.pick();
  for (int i = 0; i < n_max; ++i) {
    int32_t next;
    if (greedy) {
      if (i + 1 < n_max) {
        s.forward_picked();
        s.pick();
      }
      next = s.take_pick();
    } else {
      next = next_token(s, sampler, penalties, prompt, r.tokens);
    }
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) {
      r.stopped_on_eos = true;
      break;
    }
    r.tokens.push_back(next);
    if (on_token) on_token(next);
    if (!greedy && i + 1 < n_max) s.forward({next});
  }
  r.decode_s = seconds_since(t0);
  return r;
}

}  // namespace arbiter
