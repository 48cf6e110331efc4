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

/// Generates up to n_max tokens after prompt (which must be non-empty); n_max < 0: until a
/// stop id or the context is full. on_token is called for each generated id as it comes
/// (for streaming). Stops at any of stop_ids. Penalties, when active, are applied to each
/// row (the row then comes to the host).
GenerateResult generate(Session& s, const std::vector<int32_t>& prompt, int n_max,
                        Sampler& sampler, const std::vector<int32_t>& stop_ids,
                        const std::function<void(int32_t)>& on_token,
                        const PenaltyParams& penalties = {});

}  // namespace arbiter
