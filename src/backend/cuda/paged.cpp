// The CUDA tier's continuous batching (cuda_tier.h): the paged KV pool's store and attention,
// with every sequence of a batched forward in one launch per stage. A forward's rows each
// carry their own position and pool row, and each sequence its descriptor and block table
// (cuda::AttnArgs::seqs); they go up once per forward, as one array, and the layers reuse
// it. The attention is the flash kernel (attention.cu) without key splits, one grid slice per
// sequence, reading keys through the block table: a sequence's rows are a function of that
// sequence alone, whatever else the batch holds.
#include "backend/cuda/cuda_tier.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace arbiter {

using cuda::PosRef;

const int* CudaBackend::batch_meta(const std::vector<PagedSeq>& seqs, const Buffer& k_pool,
                                   const Buffer& v_pool, int kv_dim, BatchMeta& m) {
  ARB_CHECK(!seqs.empty(), "[cuda] attention_batch: no sequences");
  std::vector<int>& h = meta_next_;
  h.clear();
  m = BatchMeta{};
  for (const PagedSeq& s : seqs) {
    ARB_CHECK(s.T >= 1 && s.pos0 >= 0 && s.row0 == m.rows,
              "[cuda] attention_batch: sequence of %d rows at %d, row %d (rows in order)", s.T,
              s.pos0, s.row0);
    check_kv_pages(k_pool, v_pool, kv_dim, s.pages, s.pos0 + s.T, "cuda");
    ARB_CHECK(s.pages.block_rows == seqs[0].pages.block_rows,
              "[cuda] attention_batch: blocks of %d and %d rows in one pool", s.pages.block_rows,
              seqs[0].pages.block_rows);
    m.rows += s.T;
    m.max_T = std::max(m.max_T, s.T);
    m.positions = std::max(m.positions, s.pos0 + s.T);
  }
  m.block_rows = seqs[0].pages.block_rows;
  // [rows] positions, [rows] pool rows, [seqs x kSeqWords] descriptors, the block tables.
  for (const PagedSeq& s : seqs)
    for (int t = 0; t < s.T; ++t) h.push_back(s.pos0 + t);
  for (const PagedSeq& s : seqs)
    for (int t = 0; t < s.T; ++t) h.push_back(int(s.pages.row(s.pos0 + t)));
  // The descriptors of the sequences of several rows first, then those of one row, so that
  // each kind is a range of the array (attend_paged).
  const size_t desc = h.size();
  std::vector<int> first(seqs.size());
  for (size_t i = 1; i < seqs.size(); ++i) first[i] = first[i - 1] + seqs[i - 1].pages.n_blocks;
  for (const bool multi : {true, false})
    for (size_t i = 0; i < seqs.size(); ++i)
      if ((seqs[i].T > 1) == multi) {
        h.insert(h.end(), {seqs[i].row0, seqs[i].T, seqs[i].pos0, first[i]});
        m.n_multi += multi;
      }
  const size_t tables = h.size();
  for (const PagedSeq& s : seqs) h.insert(h.end(), s.pages.blocks, s.pages.blocks + s.pages.n_blocks);
  if (h != meta_host_ || meta_.ptr == nullptr) {
    ensure(meta_, h.size() * sizeof(int));
    // Stream-ordered: the previous forward's kernels have read the old array by then.
    ARB_CUDA(cudaMemcpyAsync(meta_.ptr, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice,
                             stream_));
    meta_host_.swap(h);
  }
  const int* d = static_cast<const int*>(meta_.ptr);
  m.pos = d;
  m.dst = d + m.rows;
  m.seqs = d + desc;
  m.blocks = d + tables;
  m.n_seqs = int(seqs.size());
  return d;
}

void CudaBackend::store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                              const BatchMeta& m, int kv_dim) {
  check_act(k, int64_t(m.rows) * kv_dim, "kv_store_paged k");
  check_act(v, int64_t(m.rows) * kv_dim, "kv_store_paged v");
  const void *kp = k.ptr, *vp = v.ptr;
  void *kc = k_pool.ptr, *vc = v_pool.ptr;
  const int rows = m.rows;
  const int* dst = m.dst;
  submit({40, int64_t(kp), int64_t(vp), int64_t(kc), int64_t(vc), rows, kv_dim, int64_t(dst)}, false,
         0, [=, this](const cuda::StepCtx&) {
           cuda::launch_kv_store(ct_, kp, vp, kc, vc, rows, PosRef{}, kv_dim, 1, stream_, dst);
         });
}

void CudaBackend::attend_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                               const BatchMeta& m, int H, int Hkv, int Dh, int window,
                               const AttentionScores& scores, Buffer& out) {
  ARB_CHECK(Hkv > 0 && H % Hkv == 0 && Dh > 0 && Dh <= cuda::kMaxHeadDim,
            "[cuda] attention: H %d, Hkv %d, Dh %d (H must be a multiple of Hkv, Dh <= %d)", H,
            Hkv, Dh, cuda::kMaxHeadDim);
  ARB_CHECK(scores.scale >= 0 && scores.softcap >= 0, "[cuda] attention: scale %g, softcap %g",
            scores.scale, scores.softcap);
  check_act(q, int64_t(m.rows) * H * Dh, "attention q");
  check_act(out, int64_t(m.rows) * H * Dh, "attention out");
  check_act(k_pool, 0, "k pool");
  check_act(v_pool, 0, "v pool");
  // attention()'s scale 1/sqrt(Dh) unless the scores name theirs (scaled_attention()).
  const float scale = scores.scale == 0 ? float(1.0 / std::sqrt(double(Dh))) : float(scores.scale);
  cuda::AttnArgs a =
      attn_args(q, k_pool, v_pool, m.max_T, H, Hkv, Dh, window, scale, float(scores.softcap),
                out, 1, nullptr);
  a.seqs = m.seqs;
  a.n_seqs = m.n_seqs;
  a.blocks = m.blocks;
  a.block_rows = m.block_rows;
  if (scores.softcap == 0 && tuning_.attn_direct && cuda::attention_decode_fits(H, Hkv, Dh)) {
    // The sequences of one row (a decoding sequence's step) go to the direct decode kernel,
    // a grid slice each, without key splits, a whole KV group per block: which kernel a
    // sequence gets, and its sums, do not depend on the rest of the batch. H200, qwen3-8b bf16
    // synth, bench --concurrency 64 -p 128 -n 64 (session 24, call B): 5,684 tok/s with a
    // group per block, 4,449 with a block per query head, 3,272 on the flash kernel.
    cuda::AttnArgs d = a;
    d.seqs = m.seqs + cuda::kSeqWords * m.n_multi;
    d.n_seqs = m.n_seqs - m.n_multi;
    d.T = 1;
    d.heads_per_block = H / Hkv;
    a.n_seqs = m.n_multi;
    if (d.n_seqs > 0) {
      unsigned* ctr = counters_;
      submit({43, int64_t(d.q), int64_t(d.k_cache), int64_t(d.v_cache), int64_t(d.out), H, Hkv,
              Dh, window, d.n_seqs, int64_t(d.seqs), int64_t(d.blocks), d.block_rows,
              cuda::sig_bits(d.scale)},
             false, 0, [=, this](const cuda::StepCtx&) {
               cuda::launch_attention_decode(ct_, d, ctr, nullptr, stream_);
             });
    }
    if (a.n_seqs == 0) return;
  }
  submit({41, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache), int64_t(a.out), m.max_T, H,
          Hkv, Dh, window, a.n_seqs, int64_t(a.seqs), int64_t(a.blocks), a.block_rows,
          cuda::sig_bits(a.scale), cuda::sig_bits(a.softcap)},
         false, 0, [=, this](const cuda::StepCtx&) { cuda::launch_attention(ct_, a, stream_); });
}

void CudaBackend::kv_store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool,
                                 Buffer& v_pool, const KvPages& pages, int T, int pos0,
                                 int kv_dim) {
  stats_.record("kv_store", "cuda.kv_store_paged");
  BatchMeta m;
  batch_meta({PagedSeq{0, T, pos0, pages}}, k_pool, v_pool, kv_dim, m);
  store_paged(k, v, k_pool, v_pool, m, kv_dim);
}

void CudaBackend::attention_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                                  const KvPages& pages, int T, int pos0, int H, int Hkv, int Dh,
                                  int window, const AttentionScores& scores, Buffer& out) {
  const bool plain = scores.scale == 0 && scores.softcap == 0;
  stats_.record(plain ? "attention" : "scaled_attention", "cuda.attention_paged");
  BatchMeta m;
  batch_meta({PagedSeq{0, T, pos0, pages}}, k_pool, v_pool, Hkv * Dh, m);
  attend_paged(q, k_pool, v_pool, m, H, Hkv, Dh, window, scores, out);
}

void CudaBackend::attention_batch(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                  const Tensor* k_norm, NormWeight nw, double eps, int H, int Hkv,
                                  int Dh, const RopeSpec* rope, Buffer& k_pool, Buffer& v_pool,
                                  const std::vector<PagedSeq>& seqs, int window,
                                  const AttentionScores& scores, Buffer& out) {
  stats_.record("attention_batch", "cuda.attention_batch");
  const int kv_dim = Hkv * Dh;
  BatchMeta m;
  batch_meta(seqs, k_pool, v_pool, kv_dim, m);
  check_act(q, int64_t(m.rows) * H * Dh, "attention_batch q");
  check_act(k, int64_t(m.rows) * kv_dim, "attention_batch k");
  if (q_norm) norm(q, *q_norm, nw, m.rows * H, Dh, eps, q);
  if (k_norm) norm(k, *k_norm, nw, m.rows * Hkv, Dh, eps, k);
  if (rope) {
    ARB_CHECK(Dh == rope->dims && Dh % 2 == 0, "[cuda] rope: heads of %d, RoPE of %d dimensions",
              Dh, rope->dims);
    const float2* cs = rope_table(*rope, m.positions);
    const bool adj = rope->layout == RopeLayout::Adjacent;
    const int rows = m.rows;
    const PosRef pos{nullptr, 0, m.pos};
    for (const std::pair<void*, int>& xh : {std::pair<void*, int>{q.ptr, H}, {k.ptr, Hkv}}) {
      void* x = xh.first;
      const int nh = xh.second;
      submit({42, int64_t(x), rows, nh, Dh, int64_t(cs), adj, int64_t(m.pos)}, false, 0,
             [=, this](const cuda::StepCtx&) {
               cuda::launch_rope(ct_, x, rows, nh, Dh, pos, cs, adj, stream_);
             });
    }
  }
  store_paged(k, v, k_pool, v_pool, m, kv_dim);
  attend_paged(q, k_pool, v_pool, m, H, Hkv, Dh, window, scores, out);
}

void CudaBackend::set_row_invariant(bool on) {
  flush();
  row_invariant_ = on;
}

}  // namespace arbiter
