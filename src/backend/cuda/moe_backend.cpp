// The CUDA tier's mixture-of-experts ops (cuda_tier.h): Backend::moe (the router, the selected
// experts and their weighted sum on the device, kernels in moe.cu) and sigmoid_gate, with the
// per-layer device tables of expert weight pointers they read (the experts in the compute
// type: a matrix in a block format gets a widened copy, WeightCache::matrix(t, true)).
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_tier.h"
#include "core/error.h"

namespace arbiter {

const cuda::MoeTables& CudaBackend::moe_tables(const MoeExperts& ex, int D, int F) {
  const int E = ex.spec.n_experts;
  const auto key = std::make_tuple(ex.up[0]->data, ex.down[0]->data, E, ex.relu2);
  // The host addresses may be reused by other tensors (a model or a test freed and another
  // mapped): the entry stands only while the weight cache still gives its first and last
  // experts' device copies and the shapes match.
  const void* first = weights_->matrix(*ex.up[0], true).ptr;
  const void* last = weights_->matrix(*ex.down[size_t(E) - 1], true).ptr;
  auto it = moe_layers_.find(key);
  if (it != moe_layers_.end()) {
    const cuda::MoeTables& t = it->second.tables;
    if (it->second.first == first && it->second.last == last && t.D == D && t.F == F &&
        t.k == ex.spec.top_k)
      return t;
    flush();
    cudaStreamSynchronize(stream_);
    cudaFree(it->second.ptrs.ptr);
    moe_layers_.erase(it);
  }
  MoeLayer l;
  l.first = first, l.last = last;
  cuda::MoeTables& t = l.tables;
  t.D = D, t.F = F, t.E = E, t.k = ex.spec.top_k, t.relu2 = ex.relu2;
  std::vector<const void*> host(size_t(3) * E, nullptr);
  for (int e = 0; e < E; ++e) {
    const cuda::DevMat& up = weights_->matrix(*ex.up[size_t(e)], true);
    const cuda::DevMat& down = weights_->matrix(*ex.down[size_t(e)], true);
    if (e == 0) t.ld_in = up.ld, t.ld_down = down.ld;
    ARB_CHECK(up.ld == t.ld_in && down.ld == t.ld_down,
              "[cuda] moe: expert %d's rows are %lld/%lld apart, expert 0's %lld/%lld", e,
              (long long)up.ld, (long long)down.ld, (long long)t.ld_in, (long long)t.ld_down);
    host[size_t(E) + e] = up.ptr;
    host[size_t(2) * E + e] = down.ptr;
    if (!ex.relu2) {
      const cuda::DevMat& gate = weights_->matrix(*ex.gate[size_t(e)], true);
      ARB_CHECK(gate.ld == t.ld_in, "[cuda] moe: expert %d's gate rows are %lld apart, up's %lld",
                e, (long long)gate.ld, (long long)t.ld_in);
      host[size_t(e)] = gate.ptr;
    }
  }
  // The tables are uploaded once here, outside any step: a step only reads them.
  flush();
  cuda::grow(l.ptrs, host.size() * sizeof(void*), stream_);
  ARB_CUDA(cudaMemcpy(l.ptrs.ptr, host.data(), host.size() * sizeof(void*),
                      cudaMemcpyHostToDevice));
  const void* const* p = static_cast<const void* const*>(l.ptrs.ptr);
  t.gate = ex.relu2 ? nullptr : p;
  t.up = p + E;
  t.down = p + 2 * E;
  return moe_layers_.emplace(key, std::move(l)).first->second.tables;
}

void CudaBackend::moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                      Buffer& out, std::vector<Route>* routes) {
  run_moe(logits, x, ex, T, out, routes, nullptr, nullptr);
}

// A decode step's residual update rides on the down GEMV (moe.cu): one to three kernels a MoE
// layer fewer (qwen3-moe's add; Granite's add, scale and add). A tap, T > 1 or the fused kernels
// turned off take the ops one by one.
void CudaBackend::moe_add(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                          Buffer& out, std::vector<Route>* routes, Buffer& residual,
                          const MoeResidual& r) {
  if (!single_token(T) || !tuning_.fused || r.routed || r.sum || r.res)
    return Backend::moe_add(logits, x, ex, T, out, routes, residual, r);
  run_moe(logits, x, ex, T, out, routes, &residual, &r);
}

void CudaBackend::run_moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                          Buffer& out, std::vector<Route>* routes, Buffer* residual,
                          const MoeResidual* r) {
  const bool decode = single_token(T);  // else the grouped kernels (T == 1 under row invariance)
  const bool mma = tuning_.moe_mma && ct_ != DType::F32;  // the grouped GEMMs on tensor cores
  if (residual) stats_.record("moe_add", "cuda.moe_decode_add");
  else stats_.record("moe", decode ? "cuda.moe_decode"
                            : mma  ? "cuda.moe_grouped_mma"
                                   : "cuda.moe_grouped");
  int D = 0, F = 0;
  moe_check_experts(*this, ex, D, F);
  const RouterSpec& rs = ex.spec;
  const int E = rs.n_experts, k = rs.top_k;
  ARB_CHECK(E <= cuda::kMoeMaxExperts && k <= cuda::kMoeMaxTopK &&
                rs.n_group <= cuda::kMoeMaxGroups,
            "[cuda] moe: %d experts, %d per token, %d groups (the device router takes up to %d, "
            "%d and %d)", E, k, rs.n_group, cuda::kMoeMaxExperts, cuda::kMoeMaxTopK,
            cuda::kMoeMaxGroups);
  check_act(logits, int64_t(T) * E, "moe logits");
  check_act(x, int64_t(T) * D, "moe x");
  check_act(out, int64_t(T) * D, "moe out");
  cuda::MoeResidualArgs res;
  if (residual) {
    check_act(*residual, int64_t(T) * D, "moe_add residual");
    if (r->shared) check_act(*r->shared, int64_t(T) * D, "moe_add shared");
    res.shared = r->shared ? r->shared->ptr : nullptr;
    res.scale = float(r->scale);
    res.residual = residual->ptr;
  }
  if (T == 0) return;
  const cuda::MoeTables& tab = moe_tables(ex, D, F);
  // Scratch: ids, weights, margins, the sort's offsets / tiles / rows, act [T*k, F], y [T*k, D].
  const int64_t n = int64_t(T) * k;
  const size_t es = cuda::elem_size(ct_);
  size_t at = 0;
  auto carve = [&](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const size_t o_ids = carve(n * 4), o_w = carve(n * 4), o_margin = carve(size_t(T) * 8),
               o_off = carve(size_t(E + 1) * 4), o_tiles = carve(size_t(E + 1) * 4),
               o_tok = carve(n * 4), o_row = carve(n * 4), o_act = carve(n * F * es),
               o_y = carve(decode ? 0 : n * D * es);
  ensure(moe_ws_, at);
  uint8_t* ws = static_cast<uint8_t*>(moe_ws_.ptr);
  cuda::MoeRouteArgs ra;
  ra.logits = logits.ptr;
  ra.bias = ex.bias ? vec(*ex.bias, E, "moe") : nullptr;
  ra.T = T, ra.E = E, ra.k = k;
  ra.sigmoid = rs.scoring == RouterScoring::Sigmoid;
  ra.topk_first = rs.order == RouterOrder::TopKThenScore;
  ra.norm = rs.norm_topk_prob;
  ra.norm_eps = rs.norm_eps, ra.scale = rs.routed_scaling_factor;
  ra.n_group = rs.n_group, ra.topk_group = rs.topk_group;
  ra.ids = reinterpret_cast<int*>(ws + o_ids);
  ra.weights = reinterpret_cast<float*>(ws + o_w);
  ra.margin = reinterpret_cast<double*>(ws + o_margin);
  const cuda::MoeTables t = tab;
  const void* xp = x.ptr;
  void* op = out.ptr;
  void* act = ws + o_act;
  submit({44, int64_t(ra.logits), int64_t(ra.bias), T, E, k, ra.sigmoid, ra.topk_first, ra.norm,
          cuda::sig_bits(ra.norm_eps), cuda::sig_bits(ra.scale), ra.n_group, ra.topk_group,
          int64_t(ws)},
         false, 0, [=, this](const cuda::StepCtx&) { cuda::launch_moe_route(ct_, ra, stream_); });
  if (decode) {
    submit({45, int64_t(t.up), t.ld_in, t.ld_down, D, F, k, t.relu2, int64_t(xp), int64_t(ws),
            int64_t(op), int64_t(res.shared), cuda::sig_bits(res.scale), int64_t(res.residual)},
           false, 0,
           [=, this](const cuda::StepCtx&) {
             cuda::launch_moe_decode(ct_, t, xp, ra.ids, ra.weights, act, op, res, stream_);
           });
  } else {
    cuda::MoeSortBufs sb;
    sb.offsets = reinterpret_cast<int*>(ws + o_off);
    sb.tiles = reinterpret_cast<int*>(ws + o_tiles);
    sb.tok_of = reinterpret_cast<int*>(ws + o_tok);
    sb.row_of = reinterpret_cast<int*>(ws + o_row);
    void* y = ws + o_y;
    submit({46, int64_t(t.up), t.ld_in, t.ld_down, D, F, k, t.relu2, int64_t(xp), T,
            int64_t(ws), int64_t(op)},
           false, 0,
           [=, this](const cuda::StepCtx&) {
             cuda::launch_moe_prefill(ct_, t, xp, T, ra.ids, ra.weights, sb, act, y, op, mma,
                                      stream_);
           });
  }
  if (!routes) return;
  // The route log (traces, drift): the one case that brings the routing to the host.
  flush();
  std::vector<int> ids(static_cast<size_t>(n));
  std::vector<float> w(static_cast<size_t>(n));
  std::vector<double> margin(static_cast<size_t>(T));
  ARB_CUDA(cudaMemcpyAsync(ids.data(), ra.ids, ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
  ARB_CUDA(cudaMemcpyAsync(w.data(), ra.weights, w.size() * 4, cudaMemcpyDeviceToHost, stream_));
  ARB_CUDA(cudaMemcpyAsync(margin.data(), ra.margin, margin.size() * 8, cudaMemcpyDeviceToHost,
                           stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
  routes->assign(size_t(T), Route{});
  for (int tt = 0; tt < T; ++tt) {
    Route& r = (*routes)[size_t(tt)];
    r.ids.assign(ids.begin() + int64_t(tt) * k, ids.begin() + int64_t(tt + 1) * k);
    r.weights.assign(w.begin() + int64_t(tt) * k, w.begin() + int64_t(tt + 1) * k);
    r.margin = margin[size_t(tt)];
  }
}

void CudaBackend::sigmoid_gate(Buffer& y, const Buffer& g, int T, int D) {
  stats_.record("sigmoid_gate", "cuda.sigmoid_gate");
  check_act(y, int64_t(T) * D, "sigmoid_gate y");
  check_act(g, T, "sigmoid_gate g");
  void* yp = y.ptr;
  const void* gp = g.ptr;
  submit({47, int64_t(yp), int64_t(gp), T, D}, false, 0, [=, this](const cuda::StepCtx&) {
    cuda::launch_sigmoid_gate(ct_, yp, gp, T, D, stream_);
  });
}

}  // namespace arbiter
