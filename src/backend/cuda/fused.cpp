// The CUDA tier's fused decode ops (cuda_tier.h): for T == 1 one kernel each, norm + GEMV,
// norm + gate/up GEMV + SwiGLU, GEMV + residual add, q/k norm + RoPE + KV store (+ the decode
// attention), with the stage taps applied inside the kernels (kernels.h Tap); otherwise the
// Backend's default composition. Matrices kept packed in a block format take quant_ops.cpp's
// forms (q/k/v stacked, GEMV + add, gate/up GEMV + SwiGLU) or the composition. Each computes the bits of the
// op-by-op path.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_tier.h"
#include "core/error.h"

namespace arbiter {

using cuda::PosRef;

void CudaBackend::rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                                 double eps, Buffer& xn, bool keep_xn, const StageTap* norm_tap,
                                 const MatmulTarget* outs, int n_outs, const NormAdd* pre) {
  if (!norm_gemv(x, w, nw, T, D, eps, xn, keep_xn, norm_tap, outs, n_outs, nullptr, pre))
    Backend::rmsnorm_matmul(x, w, nw, T, D, eps, xn, keep_xn, norm_tap, outs, n_outs);
}

void CudaBackend::rmsnorm_matmul_conv(const Buffer& x, const Tensor& w, NormWeight nw, int T,
                                      int D, double eps, Buffer& xn, const StageTap* norm_tap,
                                      const MatmulTarget* outs, int n_outs,
                                      const ConvTarget& conv) {
  if (!tuning_.ssm_fused ||
      !norm_gemv(x, w, nw, T, D, eps, xn, false, norm_tap, outs, n_outs, &conv, nullptr))
    Backend::rmsnorm_matmul_conv(x, w, nw, T, D, eps, xn, norm_tap, outs, n_outs, conv);
}

bool CudaBackend::norm_gemv(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                            double eps, Buffer& xn, bool keep_xn, const StageTap* norm_tap,
                            const MatmulTarget* outs, int n_outs, const ConvTarget* conv,
                            const NormAdd* pre) {
  const bool step = single_token(T) && tuning_.gemv && tuning_.fused && n_outs >= 1 && n_outs <= 3;
  const cuda::DevMat* mats[3] = {};  // looked up once: a lookup samples the host tensor's bytes
  for (int i = 0; step && i < n_outs; ++i) mats[i] = &weights_->matrix(*outs[i].W);
  bool fuse = step && cuda::gemv_fusable(ct_, D);
  for (int i = 0; fuse && i < n_outs; ++i)
    fuse = mats[i]->cols == D && !mats[i]->packed() &&
           (outs[i].out->dtype == DType::F32 || outs[i].out->dtype == ct_);
  // The conv reads its rows as the compute type stores them, without a bias.
  if (fuse && conv)
    fuse = conv->of >= 0 && conv->of < n_outs && outs[conv->of].out->dtype == ct_ &&
           (!outs[conv->of].bias || outs[conv->of].bias->empty()) && conv->K >= 1;
  const bool pre_inside = fuse && pre_fusable(pre, x, D, norm_tap || (conv && outs[conv->of].tap));
  if (!pre_inside) norm_add(pre, nw, T, D, eps);
  if (step && !conv && mats[0]->packed() &&
      packed_rmsnorm_matmul(x, w, nw, D, eps, xn, keep_xn, norm_tap, outs, n_outs, mats))
    return true;
  if (!fuse) return false;
  if (conv) stats_.record("rmsnorm_matmul_conv", "cuda.norm_gemv_conv");
  else stats_.record("rmsnorm_matmul", prov_norm_gemv_);
  check_act(x, D, "rmsnorm_matmul x");
  if (keep_xn) check_act(xn, D, "rmsnorm_matmul xn");
  const float* norm_w = vec(w, D, "rmsnorm", nw == NormWeight::OnePlus);
  cuda::GemvArgs a;
  a.x = x.ptr;
  a.norm_w = norm_w;
  a.eps = float(eps);
  a.K = D;
  a.n_seg = n_outs;
  a.N = 0;
  a.xn = keep_xn ? xn.ptr : nullptr;
  std::vector<int64_t> sig = {20, int64_t(x.ptr), int64_t(norm_w), D, n_outs, int64_t(a.xn)};
  for (int i = 0; i < n_outs; ++i) {
    const cuda::DevMat& m = *mats[i];
    const float* bp = target_bias(outs[i], m.rows);
    const int f32 = outs[i].out->dtype == DType::F32 ? 1 : 0;
    a.seg[i] = cuda::GemvSeg{m.ptr, m.ld, bp, outs[i].out->ptr, int(m.rows), f32};
    a.N += int(m.rows);
    sig.insert(sig.end(), {int64_t(m.ptr), m.ld, int64_t(bp), int64_t(outs[i].out->ptr), m.rows, f32});
  }
  sig.push_back(cuda::sig_bits(eps));
  if (pre_inside) gemv_pre(*pre, nw, D, a, sig);
  const StageTap* conv_in = nullptr;  // the product the conv reads: tapped inside the kernel
  int64_t C = 0;
  if (conv) {
    C = mats[conv->of]->rows;
    const int K = conv->K;
    check_act(*conv->act, C, "rmsnorm_matmul_conv act");
    check_act(*conv->state, (K - 1) * C, "rmsnorm_matmul_conv state");
    a.conv = cuda::GemvConv{conv->of, vec(*conv->w, C * K, "ssm_conv"),
                            conv->bias ? vec(*conv->bias, C, "ssm_conv") : nullptr, K,
                            conv->state->ptr, conv->act->ptr};
    sig.insert(sig.end(), {conv->of, int64_t(a.conv.w), int64_t(a.conv.b), K,
                           int64_t(a.conv.state), int64_t(a.conv.act)});
    conv_in = outs[conv->of].tap;
  }
  const bool tapped = norm_tap != nullptr || conv_in != nullptr;
  if (tapped) stage_taps({{norm_tap, D}, {conv_in, C}}, a.tapped, a.taps);
  submit(std::move(sig), false, 0, [=, this](const cuda::StepCtx&) {
    cuda::launch_gemv_fused(ct_, cuda::kGemvNorm, a, sm_, stream_);
  });
  if (tapped) collect_taps();
  for (int i = 0; i < n_outs; ++i)
    if (!conv || i != conv->of) apply_tap(outs[i].tap, *outs[i].out, T, int(mats[i]->rows));
  if (conv) {
    apply_tap(conv->tap, *conv->act, T, int(C));
    apply_tap(conv->state_tap, *conv->state, conv->K - 1, int(C));
  }
  return true;
}

bool CudaBackend::pre_fusable(const NormAdd* pre, const Buffer& x, int D, bool tapped) const {
  return pre && !tapped && !pre->norm && !pre->sum && pre->residual->ptr == x.ptr &&
         x.dtype == ct_ && pre->y->dtype == ct_ && pre->y->n >= D;
}

void CudaBackend::gemv_pre(const NormAdd& pre, NormWeight nw, int D, cuda::GemvArgs& a,
                           std::vector<int64_t>& sig) {
  stats_.record("rmsnorm_add", "cuda.in_norm_gemv");
  if (!pre_done_.ptr) {  // zero between launches: each launch's last block resets it
    ensure(pre_done_, sizeof(unsigned));
    ARB_CUDA(cudaMemsetAsync(pre_done_.ptr, 0, sizeof(unsigned), stream_));
  }
  a.pre_y = pre.y->ptr;
  a.pre_w = vec(*pre.w, D, "rmsnorm", nw == NormWeight::OnePlus);
  a.pre_x = pre.residual->ptr;
  a.pre_done = static_cast<unsigned*>(pre_done_.ptr);
  sig.insert(sig.end(), {int64_t(a.pre_y), int64_t(a.pre_w), int64_t(a.pre_x)});
}

void CudaBackend::rmsnorm_glu(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                              double eps, Buffer& xn, const Tensor& w_gate, const Tensor& w_up,
                              GluAct act_fn, Buffer& gate, Buffer& up, Buffer& act,
                              const GluTaps& taps, const NormAdd* pre) {
  const bool step = single_token(T) && tuning_.gemv && tuning_.fused;
  const cuda::DevMat* gm = step ? &weights_->matrix(w_gate) : nullptr;
  const cuda::DevMat* um = step ? &weights_->matrix(w_up) : nullptr;
  bool fuse = step && cuda::gemv_fusable(ct_, D);
  fuse = fuse && !gm->packed() && !um->packed() && gm->cols == D && um->cols == D &&
         gm->rows == um->rows && gm->ld == um->ld;
  const bool pre_inside = fuse && pre_fusable(pre, x, D, taps.norm || taps.gate || taps.up);
  if (!pre_inside) norm_add(pre, nw, T, D, eps);
  if (step && gm->packed() && act_fn == GluAct::SiLU &&
      packed_rmsnorm_swiglu(x, w, nw, D, eps, xn, *gm, *um, act, taps))
    return;
  if (!fuse)
    return Backend::rmsnorm_glu(x, w, nw, T, D, eps, xn, w_gate, w_up, act_fn, gate, up, act,
                                taps);
  stats_.record("rmsnorm_glu", prov_norm_glu_);
  const cuda::DevMat &g = *gm, &u = *um;
  const float* norm_w = vec(w, D, "rmsnorm", nw == NormWeight::OnePlus);
  check_act(x, D, "rmsnorm_glu x");
  check_act(act, g.rows, "rmsnorm_glu act");
  cuda::GemvArgs a;
  a.x = x.ptr;
  a.norm_w = norm_w;
  a.eps = float(eps);
  a.K = D;
  a.N = int(g.rows);
  a.n_seg = 2;
  a.seg[0] = cuda::GemvSeg{g.ptr, g.ld, nullptr, nullptr, int(g.rows), 0};
  a.seg[1] = cuda::GemvSeg{u.ptr, u.ld, nullptr, nullptr, int(u.rows), 0};
  a.res = act.ptr;
  a.gelu = act_fn == GluAct::GeluTanh;
  const bool tapped = taps.norm || taps.gate || taps.up;
  if (tapped)
    stage_taps({{taps.norm, D}, {taps.gate, g.rows}, {taps.up, g.rows}}, a.tapped, a.taps);
  std::vector<int64_t> sig = {kTagNormGlu, int64_t(x.ptr), int64_t(norm_w), D, int64_t(g.ptr),
                              int64_t(u.ptr), g.ld, g.rows, int64_t(act.ptr),
                              cuda::sig_bits(eps), a.gelu};
  if (pre_inside) gemv_pre(*pre, nw, D, a, sig);
  submit(std::move(sig), false, 0, [=, this](const cuda::StepCtx&) {
    cuda::launch_gemv_fused(ct_, cuda::kGemvNormGlu, a, sm_, stream_);
  });
  if (tapped) collect_taps();
  apply_tap(taps.act, act, T, int(g.rows));
}

void CudaBackend::matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp,
                             Buffer& residual, double scale, const StageTap* product,
                             const StageTap* sum) {
  const cuda::DevMat* mp = single_token(T) && tuning_.gemv && tuning_.fused ? &weights_->matrix(W) : nullptr;
  // The packed form has no residual scale (Granite): the composition then.
  if (mp && mp->packed() && scale == 1 && packed_matmul_add(x, *mp, residual, product, sum))
    return;
  if (!mp || mp->packed() || !cuda::gemv_fusable(ct_, int(mp->cols)))
    return Backend::matmul_add(x, W, T, tmp, residual, scale, product, sum);
  stats_.record("matmul_add", prov_gemv_add_);
  const cuda::DevMat& m = *mp;
  check_act(x, m.cols, "matmul_add x");
  check_act(residual, m.rows, "matmul_add residual");
  cuda::GemvArgs a;
  a.x = x.ptr;
  a.K = int(m.cols);
  a.N = int(m.rows);
  a.n_seg = 1;
  a.seg[0] = cuda::GemvSeg{m.ptr, m.ld, nullptr, nullptr, int(m.rows), 0};
  a.res = residual.ptr;
  a.res_scale = float(scale);
  // The next kernel loads its weights during this one unless the launch before is the
  // gate/up GEMV (this is the down projection): then those loads would compete with the
  // gate/up rows still streaming after its wait (gemv.cu).
  a.launch_early = graph_->last_tag() != kTagNormGlu;
  if (product) stage_taps({{product, m.rows}}, a.tapped, a.taps);
  submit({22, int64_t(x.ptr), int64_t(m.ptr), m.ld, m.rows, m.cols, int64_t(residual.ptr),
          a.launch_early, cuda::sig_bits(a.res_scale)},
         false, 0, [=, this](const cuda::StepCtx&) {
           cuda::launch_gemv_fused(ct_, cuda::kGemvAdd, a, sm_, stream_);
         });
  if (product) collect_taps();
  apply_tap(sum, residual, T, int(m.rows));
}

void CudaBackend::rmsnorm_add(Buffer& y, const Tensor& w, NormWeight nw, int T, int D,
                              double eps, Buffer& residual, const StageTap* norm_tap,
                              const StageTap* sum) {
  if (norm_tap || !tuning_.fused || !cuda::rmsnorm_add_fusable(ct_, D))
    return Backend::rmsnorm_add(y, w, nw, T, D, eps, residual, norm_tap, sum);
  stats_.record("rmsnorm_add", "cuda.rmsnorm_add");
  check_act(y, int64_t(T) * D, "rmsnorm_add y");
  check_act(residual, int64_t(T) * D, "rmsnorm_add residual");
  const float* wp = vec(w, D, "rmsnorm", nw == NormWeight::OnePlus);
  const void* yp = y.ptr;
  void* rp = residual.ptr;
  const float e = float(eps);
  submit({27, int64_t(yp), int64_t(wp), T, D, cuda::sig_bits(eps), int64_t(rp)}, false, 0,
         [=, this](const cuda::StepCtx&) {
           cuda::launch_rmsnorm_add(ct_, yp, wp, T, D, e, rp, stream_);
         });
  apply_tap(sum, residual, T, D);
}

void CudaBackend::qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H,
                                int Hkv, int Dh, int pos0, const RopeSpec& rope,
                                Buffer& k_cache, Buffer& v_cache, const AttentionTaps& taps) {
  if (!qk_fusable(T, Hkv, Dh, pos0, rope, k_cache, v_cache))
    return Backend::qk_rope_store(q, k, v, q_norm, k_norm, qk_nw, eps, T, H, Hkv, Dh, pos0, rope,
                                  k_cache, v_cache, taps);
  stats_.record("qk_rope_store", "cuda.qk_rope_store");
  cuda::QkRopeArgs a =
      qk_args(q, k, v, q_norm, k_norm, qk_nw, eps, H, Hkv, Dh, pos0, rope, k_cache, v_cache);
  const bool tapped = stage_qk_taps(taps, H, Hkv, Dh, a);
  std::vector<int64_t> sig = {23};
  append_qk_sig(sig, a);
  submit(std::move(sig), true, pos0, [=, this](const cuda::StepCtx& c) {
    cuda::QkRopeArgs b = a;
    b.pos = PosRef{c.pos_dev, pos0};
    cuda::launch_qk_rope_store(ct_, b, stream_);
  });
  if (tapped) collect_taps();
}

void CudaBackend::qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                    const Tensor* k_norm, NormWeight qk_nw, double eps, int T,
                                    int H, int Hkv, int Dh, int pos0, const RopeSpec& rope,
                                    Buffer& k_cache, Buffer& v_cache, int window,
                                    const AttentionScores& scores, Buffer& out,
                                    const AttentionTaps& taps) {
  // The tuned decode kernel takes no softcap (Gemma 2: attend() runs the flash kernel).
  if (!qk_fusable(T, Hkv, Dh, pos0, rope, k_cache, v_cache) || !tuning_.attn_direct ||
      !cuda::attention_decode_fits(H, Hkv, Dh) || scores.softcap != 0)
    return Backend::qk_rope_attention(q, k, v, q_norm, k_norm, qk_nw, eps, T, H, Hkv, Dh, pos0,
                                      rope, k_cache, v_cache, window, scores, out, taps);
  stats_.record("qk_rope_attention", "cuda.qk_rope_attn_decode");
  const int cap = check_attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, out);
  cuda::QkRopeArgs a =
      qk_args(q, k, v, q_norm, k_norm, qk_nw, eps, H, Hkv, Dh, pos0, rope, k_cache, v_cache);
  const bool tapped = stage_qk_taps(taps, H, Hkv, Dh, a);
  // attention()'s scale and scaled_attention()'s, as attend() takes them.
  const float scale = scores.scale == 0 ? float(1.0 / std::sqrt(double(Dh))) : float(scores.scale);
  submit_decode_attention(q, k_cache, v_cache, H, Hkv, Dh, window, scale, 0.f, out, cap, pos0,
                          &a);
  if (tapped) collect_taps();
  apply_tap(taps.out, out, T, H * Dh);
}

/// The device bias of a rmsnorm_matmul output (null without one), its length and the
/// output's room checked against the matrix's rows.
const float* CudaBackend::target_bias(const MatmulTarget& o, int64_t rows) {
  ARB_CHECK(o.out->n >= rows, "[cuda] matmul: output holds %lld elements, needs %lld",
            (long long)o.out->n, (long long)rows);
  if (!o.bias || o.bias->empty()) return nullptr;
  const cuda::DevVec& bv = weights_->vector(*o.bias);
  ARB_CHECK(bv.n == rows, "[cuda] matmul: bias '%s' has %lld elements, output has %lld",
            o.bias->name.c_str(), (long long)bv.n, (long long)rows);
  return bv.ptr;
}

/// Whether the fused q/k norm + RoPE + KV store kernels take this step.
bool CudaBackend::qk_fusable(int T, int Hkv, int Dh, int pos0, const RopeSpec& rope, const Buffer& k_cache,
                const Buffer& v_cache) const {
  return single_token(T) && tuning_.fused && cuda::qk_rope_fusable(ct_, Dh) && Dh == rope.dims &&
         pos0 >= 0 && int64_t(pos0 + 1) * Hkv * Dh <= std::min(k_cache.n, v_cache.n);
}

/// The direct decode attention (T == 1), with the step's q/k norm + RoPE + KV store folded
/// in when qk is given. The grid's splits come from the cache size, never the position (one
/// graph serves every position): about two blocks per SM, at least attn_split_keys (256)
/// cache rows per split, at most attn_max_splits (8); the kernel uses the first ceil(keys /
/// attn_split_keys) of them.
void CudaBackend::submit_decode_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                             int H, int Hkv, int Dh, int window, float scale, float softcap,
                             Buffer& out, int cap, int pos0, const cuda::QkRopeArgs* qk) {
  const int group = H / Hkv;
  int hpb = group;  // query heads per block
  if (Hkv <= cuda::kMaxSplitColumnsKvHeads)
    for (int d = std::min(tuning_.attn_heads_per_block, group); d >= 1; --d)
      if (group % d == 0) {
        hpb = d;
        break;
      }
  const int columns = H / hpb;
  const int split_keys = std::clamp(tuning_.attn_split_keys, 1, kMaxSplitKeys);
  const int n_splits =
      std::clamp(std::min((2 * sm_count_ + columns - 1) / columns, cap / split_keys), 1,
                 std::clamp(tuning_.attn_max_splits, 1, 32));
  float* part = nullptr;
  if (n_splits > 1) {
    ensure(part_, size_t(H) * n_splits * (Dh + 2) * sizeof(float));
    part = static_cast<float*>(part_.ptr);
  }
  cuda::AttnArgs a =
      attn_args(q, k_cache, v_cache, 1, H, Hkv, Dh, window, scale, softcap, out, n_splits, part);
  a.split_keys = split_keys;
  a.heads_per_block = hpb;
  unsigned* ctr = counters_;
  std::vector<int64_t> sig = {24, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache),
                              int64_t(a.out), int64_t(part), H, Hkv, Dh, window, n_splits,
                              a.split_keys, a.heads_per_block, int64_t(ctr), a.rows,
                              cuda::sig_bits(a.scale), cuda::sig_bits(a.softcap)};
  const bool fused = qk != nullptr;
  const cuda::QkRopeArgs qa = fused ? *qk : cuda::QkRopeArgs{};
  if (fused) append_qk_sig(sig, qa);
  submit(std::move(sig), true, pos0, [=, this](const cuda::StepCtx& c) {
    cuda::AttnArgs b = a;
    b.pos = PosRef{c.pos_dev, pos0};
    cuda::QkRopeArgs qb = qa;
    qb.pos = b.pos;
    cuda::launch_attention_decode(ct_, b, ctr, fused ? &qb : nullptr, stream_);
  });
}

/// qk_rope_store's arguments (device norm weights and RoPE table looked up and checked).
cuda::QkRopeArgs CudaBackend::qk_args(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                      const Tensor* k_norm, NormWeight qk_nw, double eps, int H,
                                      int Hkv, int Dh, int pos0, const RopeSpec& rope,
                                      Buffer& k_cache, Buffer& v_cache) {
  const int kv_dim = Hkv * Dh;
  check_act(q, int64_t(H) * Dh, "qk_rope_store q");
  check_act(k, kv_dim, "qk_rope_store k");
  check_act(v, kv_dim, "qk_rope_store v");
  check_act(k_cache, 0, "k cache");
  check_act(v_cache, 0, "v cache");
  cuda::QkRopeArgs a;
  a.cs = rope_table(rope, pos0 + 1);
  a.q = q.ptr;
  a.k = k.ptr;
  a.v = v.ptr;
  a.k_cache = k_cache.ptr;
  a.v_cache = v_cache.ptr;
  const bool one_plus = qk_nw == NormWeight::OnePlus;
  if (q_norm) a.qn = vec(*q_norm, Dh, "q norm", one_plus);
  if (k_norm) a.kn = vec(*k_norm, Dh, "k norm", one_plus);
  a.eps = float(eps);
  a.H = H;
  a.Hkv = Hkv;
  a.Dh = Dh;
  a.adjacent = rope.layout == RopeLayout::Adjacent;
  return a;
}

void CudaBackend::append_qk_sig(std::vector<int64_t>& sig, const cuda::QkRopeArgs& a) {
  sig.insert(sig.end(), {int64_t(a.q), int64_t(a.k), int64_t(a.v), int64_t(a.k_cache),
                         int64_t(a.v_cache), int64_t(a.qn), int64_t(a.kn), cuda::sig_bits(a.eps),
                         a.H, a.Hkv,
                         a.Dh, a.adjacent, int64_t(a.cs)});
}

/// Device copies of the stage taps of one fused launch (kernels.h Tap), each for an output
/// of n elements: fault noise (f32) and overwrite values uploaded, record space reserved in
/// tap_mem_; sets tapped and dev[i]. The launch that reads them runs at once, outside any
/// step graph (the step is flushed here); collect_taps() then brings the records back.
void CudaBackend::stage_taps(std::initializer_list<std::pair<const StageTap*, int64_t>> taps, bool& tapped,
                cuda::Tap* dev) {
  flush();
  const size_t es = cuda::elem_size(ct_);
  auto span = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t total = 0;
  for (const auto& [t, n] : taps)
    if (t)
      total += (t->fault && !t->noise.empty() ? span(size_t(n) * 4) : 0) +
               (t->overwrite ? span(size_t(n) * es) : 0) + (t->record ? span(size_t(n) * es) : 0);
  ensure(tap_mem_, std::max<size_t>(total, 1));
  uint8_t* base = static_cast<uint8_t*>(tap_mem_.ptr);
  std::vector<std::vector<uint8_t>> uploads;  // alive until the copies are done
  auto upload = [&](std::vector<uint8_t> bytes, size_t& off) {
    void* at = base + off;
    ARB_CUDA(cudaMemcpyAsync(at, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream_));
    off += span(bytes.size());
    uploads.push_back(std::move(bytes));
    return at;
  };
  size_t off = 0;
  int i = 0;
  records_.clear();
  for (const auto& [t, n] : taps) {
    cuda::Tap& d = dev[i++];
    d = cuda::Tap{};
    if (!t) continue;
    if (t->fault) {
      ARB_CHECK(t->noise.empty() || int64_t(t->noise.size()) == n,
                "[cuda] stage tap: %zu noise values for %lld outputs", t->noise.size(), (long long)n);
      d.fault = true;
      d.scale = float(t->scale);
      d.bias = float(t->bias);
      if (!t->noise.empty()) {
        std::vector<uint8_t> f(size_t(n) * 4);
        for (int64_t j = 0; j < n; ++j) {
          const float v = float(t->noise[size_t(j)]);
          std::memcpy(f.data() + j * 4, &v, 4);
        }
        d.noise = static_cast<const float*>(upload(std::move(f), off));
      }
    }
    if (t->overwrite) {
      ARB_CHECK(int64_t(t->overwrite->size()) == n,
                "[cuda] stage tap: %zu values to overwrite %lld outputs", t->overwrite->size(),
                (long long)n);
      d.overwrite = upload(cuda::encode(ct_, t->overwrite->data(), n), off);
    }
    if (t->record) {
      d.record = base + off;
      records_.push_back({t->record, d.record, n});
      off += span(size_t(n) * es);
    }
  }
  ARB_CUDA(cudaStreamSynchronize(stream_));
  tapped = true;
}

/// stage_taps of the fused q/k norm + RoPE (+ attention): true when any is tapped.
bool CudaBackend::stage_qk_taps(const AttentionTaps& t, int H, int Hkv, int Dh, cuda::QkRopeArgs& a) {
  if (!t.q_norm && !t.k_norm && !t.q_rope && !t.k_rope) return false;
  cuda::Tap dev[4];
  stage_taps({{t.q_norm, int64_t(H) * Dh},
              {t.k_norm, int64_t(Hkv) * Dh},
              {t.q_rope, int64_t(H) * Dh},
              {t.k_rope, int64_t(Hkv) * Dh}},
             a.tapped, dev);
  a.q_norm = dev[0], a.k_norm = dev[1], a.q_rope = dev[2], a.k_rope = dev[3];
  return true;
}

/// The records of the latest stage_taps, as f64 into their StageTaps' vectors.
void CudaBackend::collect_taps() {
  ARB_CUDA(cudaStreamSynchronize(stream_));
  for (const TapRecord& r : records_) {
    std::vector<uint8_t> host(size_t(r.n) * cuda::elem_size(ct_));
    ARB_CUDA(cudaMemcpyAsync(host.data(), r.dev, host.size(), cudaMemcpyDeviceToHost, stream_));
    ARB_CUDA(cudaStreamSynchronize(stream_));
    r.dst->resize(size_t(r.n));
    row_to_f64(ct_, host.data(), r.dst->data(), r.n);
  }
  records_.clear();
}

}  // namespace arbiter
