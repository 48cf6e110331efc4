// What every family's batched forward (ForwardArgs::batch: continuous batching, docs/serve.md)
// does the same way: the checks of its arguments, each sequence's attention on its own rows
// and pages, and the logits rows the sequences ask for. A family's forward keeps its own
// per-layer arithmetic and calls these where the batch differs from one sequence.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/arch.h"

namespace arbiter {

/// Refuses (ARB_CHECK) what no batched forward runs: stage hooks, picked tokens, a route log
/// without the one sequence it logs (routes_seq), sequences whose rows do not add up to a.T,
/// and a recurrent-state slot outside [0, seqs) (seqs 0: the family keeps no per-sequence
/// state, slots are not read).
void check_batch(const ForwardArgs& a, int seqs = 0);

/// The Stages of a batched forward: no hook; the route log, if any, gets sequence
/// a.routes_seq's rows at its positions.
Stages batch_stages(const ForwardArgs& a);

/// Rows [r, r + n) of a [rows, width] buffer, as a buffer of its own (same storage).
Buffer batch_rows(const Buffer& b, int r, int n, int width);

/// The rows of x [T, D] whose logits a single-sequence forward computes: all T, or with
/// ForwardArgs::last_row the last one alone; rows gets their count.
Buffer logit_rows(const ForwardArgs& a, const Buffer& x, int T, int D, int& rows);

/// Each sequence's attention on its own rows of q [T, H*Dh], k, v [T, Hkv*Dh] (the batch's
/// rows in sequence order), against its own pages of the layer's pool, into out [T, H*Dh]
/// (Backend::attention_batch, which says what it does).
void batch_attention(Backend& be, const std::vector<BatchSeq>& batch, Buffer& q, Buffer& k,
                     const Buffer& v, const Tensor* q_norm, const Tensor* k_norm, NormWeight nw,
                     double eps, int H, int Hkv, int Dh, const RopeSpec* rope, Buffer& k_pool,
                     Buffer& v_pool, int window, const Backend::AttentionScores& scores,
                     Buffer& out);

/// The logits rows each sequence asks for (BatchSeq::logits), in sequence order: the final
/// norm (as nw says) of those rows of x [T, D] alone, packed into xn, then one lm_head matmul
/// over them into logits (the rmsnorm_matmul path without its taps). Returns the rows made.
int batch_logits(Backend& be, const std::vector<BatchSeq>& batch, const Buffer& x,
                 const Tensor& norm, NormWeight nw, int D, double eps, Buffer& xn,
                 const Tensor& lm_head, Buffer& logits);

}  // namespace arbiter
