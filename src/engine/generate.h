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

/// The next token after the session's last forward, as generation picks it: greedy on the
/// tier (Session::pick; the row stays there), a top-k sample from the tier's summary (the
/// same candidates in the same order as the whole row gives, so the same token), else from
/// the whole row on the host, penalised by the prompt and the tokens generated so far.
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
