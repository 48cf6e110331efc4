#include "model/archs/batched.h"

#include "core/error.h"

namespace arbiter {

void check_batch(const ForwardArgs& a, int seqs) {
  ARB_CHECK(!a.hook && a.ids, "[model] a batched forward runs no stage hooks or picked tokens");
  ARB_CHECK(!a.routes || (a.routes_seq >= 0 && a.routes_seq < int(a.batch->size())),
            "[model] a batched forward's route log names sequence %d of %zu", a.routes_seq,
            a.batch->size());
  int rows = 0;
  for (const BatchSeq& q : *a.batch) {
    ARB_CHECK(q.T >= 1 && q.pos0 >= 0, "[model] batch sequence of %d rows at %d", q.T, q.pos0);
    ARB_CHECK(seqs == 0 || (q.slot >= 0 && q.slot < seqs),
              "[model] batch sequence in state slot %d of %d", q.slot, seqs);
    rows += q.T;
  }
  ARB_CHECK(rows == a.T, "[model] batch sequences hold %d rows, the forward %d", rows, a.T);
}

Stages batch_stages(const ForwardArgs& a) {
  if (!a.routes) return Stages(nullptr, 0, a.T);
  int r0 = 0;
  for (int i = 0; i < a.routes_seq; ++i) r0 += (*a.batch)[size_t(i)].T;
  const BatchSeq& q = (*a.batch)[size_t(a.routes_seq)];
  return Stages(nullptr, q.pos0, a.T, a.routes, r0, q.T);
}

Buffer batch_rows(const Buffer& b, int r, int n, int width) {
  return buffer_view(b, int64_t(r) * width, int64_t(n) * width);
}

Buffer logit_rows(const ForwardArgs& a, const Buffer& x, int T, int D, int& rows) {
  ARB_CHECK(!(a.last_row && a.hook), "[forward] the last row's logits alone, with stage hooks");
  rows = a.last_row ? 1 : T;
  return a.last_row ? batch_rows(x, T - 1, 1, D) : x;
}

void batch_attention(Backend& be, const std::vector<BatchSeq>& batch, Buffer& q, Buffer& k,
                     const Buffer& v, const Tensor* q_norm, const Tensor* k_norm, NormWeight nw,
                     double eps, int H, int Hkv, int Dh, const RopeSpec* rope, Buffer& k_pool,
                     Buffer& v_pool, int window, const Backend::AttentionScores& scores,
                     Buffer& out) {
  std::vector<Backend::PagedSeq> seqs;
  int r = 0;
  for (const BatchSeq& s : batch) {
    seqs.push_back({r, s.T, s.pos0, s.pages});
    r += s.T;
  }
  be.attention_batch(q, k, v, q_norm, k_norm, nw, eps, H, Hkv, Dh, rope, k_pool, v_pool, seqs,
                     window, scores, out);
}

int batch_logits(Backend& be, const std::vector<BatchSeq>& batch, const Buffer& x,
                 const Tensor& norm, NormWeight nw, int D, double eps, Buffer& xn,
                 const Tensor& lm_head, Buffer& logits) {
  // Each sequence's last k rows of x, normalised into consecutive rows of xn; rows that
  // follow each other in x (a step of decoding sequences: all of them) in one norm.
  int r = 0, n = 0, run_x = 0, run_n = 0, run = 0;
  auto flush = [&] {
    if (run == 0) return;
    Buffer xv = batch_rows(x, run_x, run, D), xnv = batch_rows(xn, run_n, run, D);
    be.norm(xv, norm, nw, run, D, eps, xnv);
  };
  for (const BatchSeq& q : batch) {
    const int k = q.logit_rows();
    const int first = r + q.T - k;
    if (k > 0 && (run == 0 || first != run_x + run)) {
      flush();
      run_x = first;
      run_n = n;
      run = 0;
    }
    run += k;
    r += q.T;
    n += k;
  }
  flush();
  if (n > 0) be.matmul(xn, lm_head, nullptr, n, logits);
  return n;
}

}  // namespace arbiter
