// The CUDA tier's matmul of matrices kept in ggml's block formats (cuda_tier.h; kernels in
// gemv_quant.cu): the packed GEMV for a single token, else the matrix dequantized tile by tile
// into the compute type (a workspace grown like the tier's other scratch: no allocation inside
// a step, so it stays graph-capturable) and multiplied by cuBLASLt as a dense matrix is. And
// the fused decode forms on packed rows: the norm and q/k/v (matrices of one format in one
// launch), GEMV + residual add, the norm and gate/up GEMV + SwiGLU (the norm inside the
// tensor-core kernel's launches, else its own op).
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_tier.h"
#include "core/error.h"

namespace arbiter {

namespace {

/// The dequantized tile's size: large enough that each GEMM is wide (a few thousand rows of
/// a 1-4K row), small beside the packed weights (a 151,936-row lm_head is not widened whole).
constexpr size_t kTileBytes = size_t(64) << 20;

}  // namespace

const std::string& CudaBackend::packed_provider(const char* prefix, DType qt) {
  const auto key = std::make_pair(std::string(prefix), qt);
  auto it = packed_providers_.find(key);
  if (it == packed_providers_.end())
    it = packed_providers_.emplace(key, std::string(prefix) + dtype_name(qt)).first;
  return it->second;
}

void CudaBackend::matmul_packed(const Buffer& x, const cuda::DevMat& m, const float* bp, int T,
                                DType ot, Buffer& out) {
  const int N = int(m.rows), K = int(m.cols);
  const DType qt = m.st;
  const void* xp = x.ptr;
  const void* wp = m.ptr;
  const int64_t rb = m.ld;
  void* op = out.ptr;
  if (single_token(T) && tuning_.gemv &&
      cuda::qgemv_fits(ct_, qt, K, cuda::kQGemvPlain, tuning_.qgemv_mma)) {
    stats_.record("matmul", packed_provider("cuda.gemv_", qt));
    const cuda::QGemvSeg seg{wp, bp, op, N, ot == DType::F32 ? 1 : 0};
    submit({48, int64_t(xp), int64_t(wp), rb, int64_t(bp), N, K, int(ot), int64_t(op), int(qt)},
           false, 0, [=, this](const cuda::StepCtx&) {
             cuda::launch_qgemv(ct_, qt, cuda::kQGemvPlain, xp, &seg, 1, nullptr, rb, K,
                                tuning_.qgemv_mma, sm_, stream_);
           });
    return;
  }
  stats_.record("matmul", packed_provider(("cublaslt.gemm_" + std::string(dtype_name(ct_)) +
                                           "_from_").c_str(), qt));
  const size_t es = cuda::ctype_size(ct_);
  const int64_t ldw = int64_t((size_t(K) * es + 15) / 16 * 16 / es);
  // Tiles of a multiple of 128 rows: each tile's output columns then start 256-byte aligned,
  // as cuBLASLt's heuristic assumes of every pointer.
  const int64_t fit = int64_t(kTileBytes / (size_t(ldw) * es)) / 128 * 128;
  const int tile = int(std::min<int64_t>(N, std::max<int64_t>(fit, 128)));
  ensure(qw_, size_t(tile) * size_t(ldw) * es);
  // With a bias: the f32 product of every tile, then bias + one rounding (as matmul does).
  const DType gemm_out = bp ? DType::F32 : ot;
  void* gp = op;
  if (bp) {
    ensure(acc_, size_t(T) * N * sizeof(float));
    gp = acc_.ptr;
  }
  void* ws = qw_.ptr;
  const size_t gs = gemm_out == DType::F32 ? 4 : es;
  for (int n0 = 0; n0 < N; n0 += tile) {
    const int rows = std::min(tile, N - n0);
    const GemmPlan* pp = &gemm_plan(T, rows, K, ldw, gemm_out, N);
    void* gtile = static_cast<uint8_t*>(gp) + size_t(n0) * gs;
    submit({49, int64_t(xp), int64_t(wp), rb, n0, rows, N, K, T, int(qt), int(gemm_out),
            int64_t(gp), int64_t(ws)},
           false, 0, [=, this](const cuda::StepCtx&) {
             cuda::launch_dequant_rows(ct_, qt, wp, rb, nullptr, n0, rows, K, ws, ldw, stream_);
             static const float alpha = 1.f, beta = 0.f;
             ARB_CUBLAS(cublasLtMatmul(lt_, pp->op, &alpha, ws, pp->a, xp, pp->b, &beta, gtile,
                                       pp->c, gtile, pp->c, &pp->algo, lt_ws_, kLtWorkspace,
                                       stream_));
           });
  }
  if (bp)
    submit({50, int64_t(gp), int64_t(bp), T, N, int(ot), int64_t(op)}, false, 0,
           [=, this](const cuda::StepCtx&) {
             cuda::launch_bias_out(static_cast<const float*>(gp), bp, T, N, ot, op, stream_);
           });
}

/// The x a packed GEMV of a fused norm form reads: x itself, the norm's device weights in
/// norm_w, when its launches normalise it (inside); else xn, after the norm op and its tap.
const void* CudaBackend::packed_norm_input(const Buffer& x, const Tensor& w, NormWeight nw,
                                           int D, double eps, Buffer& xn, const StageTap* tap,
                                           bool inside, const float*& norm_w) {
  norm_w = nullptr;
  if (!inside) {
    norm(x, w, nw, 1, D, eps, xn);
    apply_tap(tap, xn, 1, D);
    return xn.ptr;
  }
  check_act(x, D, "packed norm x");
  norm_w = vec(w, D, "rmsnorm", nw == NormWeight::OnePlus);
  return x.ptr;
}

bool CudaBackend::packed_rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int D,
                                        double eps, Buffer& xn, bool keep_xn,
                                        const StageTap* norm_tap, const MatmulTarget* outs,
                                        int n_outs, const cuda::DevMat* const* mats) {
  const int T = 1;
  for (int i = 0; i < n_outs; ++i) {
    if (!mats[i]->packed() || mats[i]->cols != D ||
        !cuda::qgemv_fits(ct_, mats[i]->st, D, cuda::kQGemvPlain, tuning_.qgemv_mma) ||
        (outs[i].out->dtype != DType::F32 && outs[i].out->dtype != ct_))
      return false;
  }
  // The composition's order: the norm, its tap, then the products; consecutive matrices of
  // one format (q and k, often v too) share a launch. Untapped, each launch normalises x
  // itself when every one can (the tensor-core kernel), else (or to keep xn) the norm is its
  // own op.
  bool fuse_norm = norm_tap == nullptr && !keep_xn;
  for (int i = 0; fuse_norm && i < n_outs; ++i)
    fuse_norm = cuda::qgemv_norm_fits(ct_, mats[i]->st, D, cuda::kQGemvPlain, tuning_.qgemv_mma);
  const float* norm_w = nullptr;
  const void* xp = packed_norm_input(x, w, nw, D, eps, xn, norm_tap, fuse_norm, norm_w);
  const float feps = float(eps);
  for (int i = 0; i < n_outs;) {
    const DType qt = mats[i]->st;
    const int64_t rb = mats[i]->ld;
    cuda::QGemvSeg seg[3];
    int n = 0;
    std::vector<int64_t> sig = {53, int64_t(xp), rb, D, int(qt),
                                int64_t(norm_w), cuda::sig_bits(eps)};
    for (; i < n_outs && mats[i]->st == qt; ++i, ++n) {
      const cuda::DevMat& m = *mats[i];
      const float* bp = target_bias(outs[i], m.rows);
      const int f32 = outs[i].out->dtype == DType::F32 ? 1 : 0;
      seg[n] = cuda::QGemvSeg{m.ptr, bp, outs[i].out->ptr, int(m.rows), f32};
      sig.insert(sig.end(), {int64_t(m.ptr), int64_t(bp), int64_t(outs[i].out->ptr), m.rows, f32});
    }
    stats_.record("rmsnorm_matmul",
                  packed_provider(norm_w ? "cuda.norm_gemv_" : "cuda.gemv_", qt));
    submit(std::move(sig), false, 0, [=, this](const cuda::StepCtx&) {
      cuda::launch_qgemv(ct_, qt, cuda::kQGemvPlain, xp, seg, n, nullptr, rb, D,
                         tuning_.qgemv_mma, sm_, stream_, norm_w, feps);
    });
  }
  for (int i = 0; i < n_outs; ++i) apply_tap(outs[i].tap, *outs[i].out, T, int(mats[i]->rows));
  return true;
}

bool CudaBackend::packed_matmul_add(const Buffer& x, const cuda::DevMat& m, Buffer& residual,
                                    const StageTap* product, const StageTap* sum) {
  const int T = 1;
  // A tapped product is a value the fused form never rounds out: the composition then.
  if (product) return false;
  if (!m.packed() ||
      !cuda::qgemv_fits(ct_, m.st, int(m.cols), cuda::kQGemvAdd, tuning_.qgemv_mma))
    return false;
  check_act(x, m.cols, "matmul_add x");
  check_act(residual, m.rows, "matmul_add residual");
  stats_.record("matmul_add", packed_provider("cuda.gemv_add_", m.st));
  const DType qt = m.st;
  const void* xp = x.ptr;
  const void* wp = m.ptr;
  const int64_t rb = m.ld;
  const int N = int(m.rows), K = int(m.cols);
  void* rp = residual.ptr;
  const cuda::QGemvSeg seg{wp, nullptr, rp, N, 0};
  submit({51, int64_t(xp), int64_t(wp), rb, N, K, int64_t(rp), int(qt)}, false, 0,
         [=, this](const cuda::StepCtx&) {
           cuda::launch_qgemv(ct_, qt, cuda::kQGemvAdd, xp, &seg, 1, nullptr, rb, K,
                              tuning_.qgemv_mma, sm_, stream_);
         });
  apply_tap(sum, residual, T, N);
  return true;
}

bool CudaBackend::packed_rmsnorm_swiglu(const Buffer& x, const Tensor& w, NormWeight nw, int D,
                                        double eps, Buffer& xn, const cuda::DevMat& g,
                                        const cuda::DevMat& u, Buffer& act, const GluTaps& taps) {
  const int T = 1;
  // Tapped gate or up: values the fused form never rounds out: the composition then.
  if (taps.gate || taps.up) return false;
  if (!g.packed() || u.st != g.st || u.rows != g.rows || u.cols != D || g.cols != D ||
      u.ld != g.ld || !cuda::qgemv_fits(ct_, g.st, D, cuda::kQGemvSwiglu, tuning_.qgemv_mma))
    return false;
  check_act(act, g.rows, "rmsnorm_glu act");
  // The norm inside the launch (the tensor-core kernel, untapped), else as its own op; then
  // gate, up and SwiGLU in one launch.
  const DType qt = g.st;
  const bool fuse_norm =
      taps.norm == nullptr &&
      cuda::qgemv_norm_fits(ct_, qt, D, cuda::kQGemvSwiglu, tuning_.qgemv_mma);
  stats_.record("rmsnorm_glu",
                packed_provider(fuse_norm ? "cuda.norm_gemv_swiglu_" : "cuda.gemv_swiglu_", qt));
  const float* norm_w = nullptr;
  const void* xp = packed_norm_input(x, w, nw, D, eps, xn, taps.norm, fuse_norm, norm_w);
  const float feps = float(eps);
  const void *gp = g.ptr, *up = u.ptr;
  const int64_t rb = g.ld;
  const int F = int(g.rows);
  void* ap = act.ptr;
  const cuda::QGemvSeg seg{gp, nullptr, ap, F, 0};
  submit({52, int64_t(xp), int64_t(gp), int64_t(up), rb, F, D, int64_t(ap), int(qt),
          int64_t(norm_w), cuda::sig_bits(eps)},
         false, 0, [=, this](const cuda::StepCtx&) {
           cuda::launch_qgemv(ct_, qt, cuda::kQGemvSwiglu, xp, &seg, 1, up, rb, D,
                              tuning_.qgemv_mma, sm_, stream_, norm_w, feps);
         });
  apply_tap(taps.act, act, T, F);
  return true;
}

}  // namespace arbiter
