// The f64 reference tier (the oracle) and the host-side logits summary it shares with the
// CPU tiers.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace arbiter {

std::unique_ptr<Backend> make_ref_backend();

/// lse, target logit, top-K (descending, ties to lower id, NaN last) and non-finite count of
/// one logits row [V]. The lse is computed in f64 with the max subtracted.
void summarize_row(const double* row, int V, int K, int32_t target, LogitsSummary& s);

}  // namespace arbiter
