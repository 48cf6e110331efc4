// The CUDA tier's Backend (cuda_tier.h): construction, memory, the plain ops, the greedy pick,
// logits summaries, RoPE tables, cuBLASLt plans and the factory. The fused decode ops are in
// fused.cpp, the MoE ops in moe_backend.cpp, the weight upload in weights.cpp, the
// decode-step graphs in step_graph.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_tier.h"
#include "backend/cuda_factory.h"
#include "backend/rope.h"
#include "core/error.h"

namespace arbiter {

namespace cuda {

std::vector<uint8_t> encode(DType t, const double* src, int64_t n) {
  std::vector<uint8_t> out(size_t(n) * elem_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const float f = float(src[i]);
    if (t == DType::F32) {
      std::memcpy(out.data() + i * 4, &f, 4);
    } else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

void grow(DevBuf& b, size_t bytes, cudaStream_t s) {
  if (b.bytes >= bytes) return;
  ARB_CUDA(cudaStreamSynchronize(s));
  const size_t want = std::max(bytes, b.bytes * 2);
  ARB_CUDA(cudaFree(b.ptr));
  b = DevBuf{};
  ARB_CUDA(cudaMalloc(&b.ptr, want));
  b.bytes = want;
}

}  // namespace cuda

namespace {

using cuda::PosRef;

bool env_on(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::strcmp(v, "0") != 0;
}

/// The integer in the variable, clamped to [lo, hi] (a malformed value reads as 0 first).
int env_int(const char* name, int dflt, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return int(std::clamp(std::strtol(v, nullptr, 10), long(lo), long(hi)));
}

static_assert(cuda::kMaxTopK >= kMaxSummaryTopK, "summarize must take every K the engine asks for");

}  // namespace

CudaBackend::CudaBackend(int device, DType ct) : device_(device), ct_(ct) {
  ARB_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  ARB_CUDA(cudaGetDeviceProperties(&prop, device));
  name_ = strformat("cuda:%d %s", device, prop.name);
  sm_count_ = prop.multiProcessorCount;
  sm_ = sm_count_;
  ARB_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  weights_ = std::make_unique<cuda::WeightCache>(ct_, stream_);
  graph_ = std::make_unique<cuda::StepGraph>(stream_);
  ARB_CUDA(cudaHostAlloc(&h_picks_, kPickSlots * sizeof(int32_t), cudaHostAllocMapped));
  ARB_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_picks_), h_picks_, 0));
  ARB_CUDA(cudaMalloc(&pick_state_, sizeof(cuda::PickState)));
  ARB_CUDA(cudaMemset(pick_state_, 0, sizeof(cuda::PickState)));
  for (cudaEvent_t& e : pick_ev_) ARB_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ARB_CUBLAS(cublasLtCreate(&lt_));
  ARB_CUDA(cudaMalloc(&lt_ws_, kLtWorkspace));
  cuda::attention_init();
  cuda::ssm_init();
  ARB_CUDA(cudaMalloc(&counters_, sizeof(unsigned) * cuda::kDecodeCounterWords));
  ARB_CUDA(cudaMemset(counters_, 0, sizeof(unsigned) * cuda::kDecodeCounterWords));
  tuning_.gemv = env_on("ARBITER_CUDA_GEMV", true);
  tuning_.graphs = env_on("ARBITER_CUDA_GRAPH", true) && !cuda::sync_after_launch();
  tuning_.fused = env_on("ARBITER_CUDA_FUSED", true);
  tuning_.attn_direct = env_on("ARBITER_CUDA_ATTN_DIRECT", true);
  tuning_.ssm_fused = env_on("ARBITER_CUDA_SSM_FUSED", true);
  tuning_.attn_mma = env_on("ARBITER_CUDA_ATTN_MMA", true);
  tuning_.qgemv_mma = env_on("ARBITER_CUDA_QGEMV_MMA", true);
  tuning_.moe_mma = env_on("ARBITER_CUDA_MOE_MMA", true);
  tuning_.attn_split_keys =
      env_int("ARBITER_CUDA_ATTN_SPLIT_KEYS", tuning_.attn_split_keys, 1, kMaxSplitKeys);
  tuning_.attn_max_splits =
      env_int("ARBITER_CUDA_ATTN_MAX_SPLITS", tuning_.attn_max_splits, 1, 32);
  tuning_.attn_heads_per_block = env_int("ARBITER_CUDA_ATTN_HEADS_PER_BLOCK",
                                         tuning_.attn_heads_per_block, 1, cuda::kMaxDecodeHeads);
  tuning_.graph_segment_ops =
      env_int("ARBITER_CUDA_GRAPH_SEGMENT", tuning_.graph_segment_ops, 0, 1 << 20);
  tuning_.pdl = cuda::pdl_enabled();
  const std::string dt = dtype_name(ct_);
  prov_gemv_ = "cuda.gemv_" + dt;
  prov_gemm_ = "cublaslt.gemm_" + dt;
  prov_norm_gemv_ = "cuda.norm_gemv_" + dt;
  prov_norm_glu_ = "cuda.norm_gemv_glu_" + dt;
  prov_gemv_add_ = "cuda.gemv_add_" + dt;
}

CudaBackend::~CudaBackend() {
  try {
    flush();
  } catch (...) {
  }
  cudaStreamSynchronize(stream_);
  graph_.reset();
  weights_.reset();
  for (auto& [k, p] : plans_) {
    cublasLtMatmulDescDestroy(p.op);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
  }
  for (cuda::DevBuf* b :
       {&ids_, &part_, &acc_, &sum_out_, &sum_scratch_, &targets_, &tap_mem_, &scan_, &moe_ws_, &qw_})
    cudaFree(b->ptr);
  for (RopeTable& t : rope_tables_) cudaFree(t.cs.ptr);
  for (auto& l : moe_layers_) cudaFree(l.second.ptrs.ptr);
  cudaFree(lt_ws_);
  cudaFree(counters_);
  cublasLtDestroy(lt_);
  cudaFreeHost(h_picks_);
  cudaFree(pick_state_);
  for (cudaEvent_t e : pick_ev_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
}

void CudaBackend::prepare(const Prepare& p) {
  flush();
  // Keep only this model's weights: a previous model's copies would hold device memory.
  std::vector<const Tensor*> weights;
  for (const WeightUse& u : p.weights) weights.push_back(u.tensor);
  weights_->prepare(weights);
  for (auto& l : moe_layers_) cudaFree(l.second.ptrs.ptr);
  moe_layers_.clear();  // their pointers were into the weights just freed
  for (const RopeSpec& r : p.ropes) rope_table(r, std::min(std::max(p.max_pos, 1), 4096));
}

// --- memory -----------------------------------------------------------------------------
Buffer CudaBackend::alloc(int64_t n, bool logits) {
  ARB_CHECK(n >= 0, "[cuda] alloc of %lld elements", (long long)n);
  Buffer b;
  b.n = n;
  b.dtype = logits ? DType::F32 : ct_;
  ARB_CUDA(cudaMalloc(&b.ptr, std::max<size_t>(1, size_t(n) * cuda::elem_size(b.dtype))));
  return b;
}

void CudaBackend::free(Buffer& b) {
  // Called from destructors (Session): never throws.
  try {
    flush();
  } catch (...) {
  }
  if (b.ptr) {
    cudaStreamSynchronize(stream_);
    cudaFree(b.ptr);
  }
  b = Buffer{};
}

void CudaBackend::read(const Buffer& b, int64_t off, int64_t n, double* dst) {
  ARB_CHECK(off >= 0 && n >= 0 && off + n <= b.n, "[cuda] read [%lld, %lld) of a %lld-element buffer",
            (long long)off, (long long)(off + n), (long long)b.n);
  flush();
  const size_t es = cuda::elem_size(b.dtype);
  std::vector<uint8_t> host(size_t(n) * es);
  ARB_CUDA(cudaMemcpyAsync(host.data(), static_cast<const uint8_t*>(b.ptr) + size_t(off) * es,
                           host.size(), cudaMemcpyDeviceToHost, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
  row_to_f64(b.dtype, host.data(), dst, n);
}

void CudaBackend::write(Buffer& b, int64_t off, int64_t n, const double* src) {
  ARB_CHECK(off >= 0 && n >= 0 && off + n <= b.n, "[cuda] write [%lld, %lld) of a %lld-element buffer",
            (long long)off, (long long)(off + n), (long long)b.n);
  flush();
  const size_t es = cuda::elem_size(b.dtype);
  const std::vector<uint8_t> host = cuda::encode(b.dtype, src, n);
  ARB_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(b.ptr) + size_t(off) * es, host.data(),
                           host.size(), cudaMemcpyHostToDevice, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
}

void CudaBackend::sync() {
  flush();
  ARB_CUDA(cudaStreamSynchronize(stream_));
}

// --- ops --------------------------------------------------------------------------------
void CudaBackend::embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) {
  embed_ids(table, ids, T, out);
}

void CudaBackend::embed_picked(const Tensor& table, Buffer& out) {
  ARB_CHECK(has_pick_, "[cuda] embed of a picked token before any pick");
  embed_ids(table, nullptr, 1, out);
}

// --- greedy decode with the token kept on the device ------------------------------------
// One kernel (launch_pick) takes summarize's top-1 and writes it to the step's device token
// slot (StepGraph::slots()[1], which the next embed_picked's step then does not upload) and
// to a host-mapped slot with an event, so the next step can be queued before the host has
// the token. Inside a decode step the pick is the step graph's last kernel and also advances
// the device position (slots()[0]), so a step at the next position uploads nothing: the GPU
// goes from one step to the next without a copy between them.
void CudaBackend::pick_greedy(const Buffer& logits, int row, int V) {
  stats_.record("pick_greedy", "cuda.pick");
  ARB_CHECK(row >= 0, "[cuda] pick: row %d", row);
  check_summarize(logits, row + 1, V, 1);
  ARB_CHECK(pending_picks_.size() < size_t(kPickSlots), "[cuda] pick: %d picks not taken",
            kPickSlots);
  const float* x = static_cast<const float*>(logits.ptr) + int64_t(row) * V;
  cuda::PickArgs p;
  p.state = pick_state_;
  p.token = graph_->slots() + 1;
  p.ring = d_picks_;
  p.n_ring = kPickSlots;
  submit({17, int64_t(x), V}, false, 0, [=, this](const cuda::StepCtx& c) {
    cuda::PickArgs q = p;
    q.pos = c.pos_dev ? graph_->slots() : nullptr;
    cuda::launch_pick(x, V, q, sm_count_, stream_);
  }, true);
  flush();
  // The kernel wrote slot seq % kPickSlots; seq counts picks as next_pick_slot_ does.
  const int slot = next_pick_slot_;
  next_pick_slot_ = (slot + 1) % kPickSlots;
  ARB_CUDA(cudaEventRecord(pick_ev_[slot], stream_));
  pending_picks_.push_back(slot);
  has_pick_ = true;
}

int32_t CudaBackend::take_pick() {
  ARB_CHECK(!pending_picks_.empty(), "[cuda] no pick left to take");
  const int slot = pending_picks_.front();
  pending_picks_.pop_front();
  ARB_CUDA(cudaEventSynchronize(pick_ev_[slot]));
  return h_picks_[slot];
}

void CudaBackend::rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) {
  stats_.record("rmsnorm", "cuda.rmsnorm_warp");
  norm_rows(x, vec(w, N, "rmsnorm"), R, N, eps, out);
}

void CudaBackend::rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps,
                             Buffer& out) {
  stats_.record("rmsnorm_1p", "cuda.rmsnorm_1p");
  // The weight vector 1 + w (f32), uploaded beside w at its first use.
  norm_rows(x, vec(w, N, "rmsnorm_1p", true), R, N, eps, out);
}

void CudaBackend::norm_rows(const Buffer& x, const float* wp, int R, int N, double eps,
                            Buffer& out) {
  check_act(x, int64_t(R) * N, "rmsnorm x");
  check_act(out, int64_t(R) * N, "rmsnorm out");
  const void* xp = x.ptr;
  void* op = out.ptr;
  const float e = float(eps);
  submit({2, int64_t(xp), int64_t(wp), R, N, cuda::sig_bits(eps), int64_t(op)}, false, 0,
         [=, this](const cuda::StepCtx&) { cuda::launch_rmsnorm(ct_, xp, wp, R, N, e, op, stream_); });
}

void CudaBackend::matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T, Buffer& out) {
  const cuda::DevMat& m = weights_->matrix(W);
  const int N = int(m.rows), K = int(m.cols);
  check_act(x, int64_t(T) * K, "matmul x");
  ARB_CHECK(out.dtype == DType::F32 || out.dtype == ct_,
            "[cuda] matmul: output buffer of dtype %s", dtype_name(out.dtype));
  ARB_CHECK(out.n >= int64_t(T) * N, "[cuda] matmul: output holds %lld elements, needs %lld",
            (long long)out.n, (long long)T * N);
  const float* bp = nullptr;
  if (bias) {
    const cuda::DevVec& bv = weights_->vector(*bias);
    ARB_CHECK(bv.n == N, "[cuda] matmul: bias '%s' has %lld elements, output has %d",
              bias->name.c_str(), (long long)bv.n, N);
    bp = bv.ptr;
  }
  const DType ot = out.dtype == DType::F32 ? DType::F32 : ct_;
  if (m.packed()) return matmul_packed(x, m, bp, T, ot, out);
  const void* xp = x.ptr;
  const void* wp = m.ptr;
  const int64_t ld = m.ld;
  void* op = out.ptr;
  if (single_token(T) && tuning_.gemv) {
    stats_.record("matmul", prov_gemv_);
    submit({3, int64_t(xp), int64_t(wp), ld, int64_t(bp), N, K, int(ot), int64_t(op)}, false, 0,
           [=, this](const cuda::StepCtx&) {
             cuda::launch_gemv(ct_, xp, wp, ld, bp, N, K, ot, op, sm_, stream_);
           });
    return;
  }
  stats_.record("matmul", prov_gemm_);
  // With a bias: f32 product into a workspace, then bias + one rounding (no bf16 epilogue
  // type questions, and the bias is added before the output is rounded).
  const DType gemm_out = bp ? DType::F32 : ot;
  const GemmPlan& plan = gemm_plan(T, N, K, ld, gemm_out);
  void* gp = op;
  if (bp) {
    ensure(acc_, size_t(T) * N * sizeof(float));
    gp = acc_.ptr;
  }
  const GemmPlan* pp = &plan;
  submit({4, int64_t(xp), int64_t(wp), ld, int64_t(bp), N, K, T, int(ot), int64_t(op),
          int64_t(gp), int64_t(pp)},
         false, 0, [=, this](const cuda::StepCtx&) {
           static const float alpha = 1.f, beta = 0.f;
           ARB_CUBLAS(cublasLtMatmul(lt_, pp->op, &alpha, wp, pp->a, xp, pp->b, &beta, gp, pp->c,
                                     gp, pp->c, &pp->algo, lt_ws_, kLtWorkspace, stream_));
           if (bp) cuda::launch_bias_out(static_cast<const float*>(gp), bp, T, N, ot, op, stream_);
         });
}

void CudaBackend::rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) {
  stats_.record("rope", "cuda.rope_table");
  check_act(x, int64_t(T) * nh * Dh, "rope x");
  ARB_CHECK(Dh == rope.dims && Dh % 2 == 0, "[cuda] rope: heads of %d, RoPE of %d dimensions",
            Dh, rope.dims);
  ARB_CHECK(pos0 >= 0, "[cuda] rope: position %d", pos0);
  const float2* cs = rope_table(rope, pos0 + T);
  void* xp = x.ptr;
  const bool adj = rope.layout == RopeLayout::Adjacent;
  submit({5, int64_t(xp), T, nh, Dh, int64_t(cs), adj}, true, pos0,
         [=, this](const cuda::StepCtx& c) {
           cuda::launch_rope(ct_, xp, T, nh, Dh, PosRef{c.pos_dev, pos0}, cs, adj, stream_);
         });
}

void CudaBackend::kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T,
              int pos0, int kv_dim) {
  stats_.record("kv_store", "cuda.kv_store");
  check_act(k, int64_t(T) * kv_dim, "kv_store k");
  check_act(v, int64_t(T) * kv_dim, "kv_store v");
  const int rows = kv_cache_rows(k_cache, v_cache, kv_dim);
  ARB_CHECK(pos0 >= 0 && T <= rows, "[cuda] kv_store: %d rows into a cache of %d", T, rows);
  check_act(k_cache, 0, "k cache");
  check_act(v_cache, 0, "v cache");
  const void *kp = k.ptr, *vp = v.ptr;
  void *kc = k_cache.ptr, *vc = v_cache.ptr;
  submit({6, int64_t(kp), int64_t(vp), int64_t(kc), int64_t(vc), T, kv_dim, rows}, true, pos0,
         [=, this](const cuda::StepCtx& c) {
           cuda::launch_kv_store(ct_, kp, vp, kc, vc, T, PosRef{c.pos_dev, pos0}, kv_dim, rows,
                                 stream_);
         });
}

void CudaBackend::attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
               int H, int Hkv, int Dh, int window, Buffer& out) {
  attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, float(1.0 / std::sqrt(double(Dh))), 0.f,
         out, "attention");
}

void CudaBackend::scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                                   int T, int pos0, int H, int Hkv, int Dh, int window,
                                   double scale, double softcap, Buffer& out) {
  ARB_CHECK(scale > 0 && softcap >= 0, "[cuda] scaled_attention: scale %g, softcap %g", scale,
            softcap);
  attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, float(scale), float(softcap), out,
         "scaled_attention");
}

void CudaBackend::attend(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                         int pos0, int H, int Hkv, int Dh, int window, float scale, float softcap,
                         Buffer& out, const char* op) {
  const int cap = check_attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, out);
  // Every kernel below takes the same arguments; they differ in splits and scratch.
  auto args = [&](int n_splits, float* part) {
    return attn_args(q, k_cache, v_cache, T, H, Hkv, Dh, window, scale, softcap, out, n_splits,
                     part);
  };
  // Capped scores (Gemma 2) go to the flash kernel alone (kernels.h AttnArgs::softcap).
  const bool capped = softcap > 0.f;
  if (T == 1 && !capped && tuning_.attn_direct && cuda::attention_decode_fits(H, Hkv, Dh)) {
    stats_.record(op, "cuda.attn_decode_direct");
    submit_decode_attention(q, k_cache, v_cache, H, Hkv, Dh, window, scale, softcap, out, cap,
                            pos0, nullptr);
    return;
  }
  if (!capped && tuning_.attn_mma && cuda::attention_mma_fits(ct_, T, Dh)) {
    // Prefill on tensor cores: one block per 64 (query, head) rows, no key splits.
    stats_.record(op, "cuda.flash_attn_prefill_mma");
    const cuda::AttnArgs a = args(1, nullptr);
    submit({25, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache), int64_t(a.out), T, H, Hkv,
            Dh, window, a.rows, cuda::sig_bits(scale), cuda::sig_bits(softcap)},
           true, pos0, [=, this](const cuda::StepCtx& c) {
             cuda::AttnArgs b = a;
             b.pos = PosRef{c.pos_dev, pos0};
             cuda::launch_attention_mma(ct_, b, stream_);
           });
    return;
  }
  // Split the key range so the grid fills the device. A single-token step uses the cache
  // size instead of the position, so its launch shape (and graph) is position-independent.
  stats_.record(op, T == 1 ? "cuda.attn_decode" : "cuda.flash_attn_prefill");
  const int base = cuda::attention_blocks(T, H, Hkv);
  int keys = T == 1 ? cap : pos0 + T;
  if (window > 0) keys = std::min(keys, window + T);
  const int want = (2 * sm_count_ + base - 1) / base;
  const int n_splits = std::clamp(std::min(want, keys / (T == 1 ? 32 : 64)), 1, 64);
  float* part = nullptr;
  if (n_splits > 1) {
    ensure(part_, size_t(T) * H * n_splits * (Dh + 2) * sizeof(float));
    part = static_cast<float*>(part_.ptr);
  }
  const cuda::AttnArgs a = args(n_splits, part);
  submit({7, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache), int64_t(a.out),
          int64_t(part), T, H, Hkv, Dh, window, n_splits, a.rows, cuda::sig_bits(scale),
          cuda::sig_bits(softcap)},
         true, pos0, [=, this](const cuda::StepCtx& c) {
           cuda::AttnArgs b = a;
           b.pos = PosRef{c.pos_dev, pos0};
           cuda::launch_attention(ct_, b, stream_);
         });
}

void CudaBackend::swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) {
  stats_.record("swiglu", "cuda.swiglu");
  check_act(gate, n, "swiglu gate");
  check_act(up, n, "swiglu up");
  check_act(out, n, "swiglu out");
  const void *gp = gate.ptr, *up_p = up.ptr;
  void* op = out.ptr;
  submit({8, int64_t(gp), int64_t(up_p), n, int64_t(op)}, false, 0,
         [=, this](const cuda::StepCtx&) { cuda::launch_swiglu(ct_, gp, up_p, n, op, stream_); });
}

void CudaBackend::add(Buffer& x, const Buffer& y, int64_t n) {
  stats_.record("add", "cuda.add");
  check_act(x, n, "add x");
  check_act(y, n, "add y");
  void* xp = x.ptr;
  const void* yp = y.ptr;
  submit({9, int64_t(xp), int64_t(yp), n}, false, 0,
         [=, this](const cuda::StepCtx&) { cuda::launch_add(ct_, xp, yp, n, stream_); });
}

// --- the gemma and hybrid families' ops ------------------------------------------------------
const float* CudaBackend::vec(const Tensor& t, int64_t n, const char* op, bool plus_one) {
  const cuda::DevVec& v = weights_->vector(t, plus_one);
  ARB_CHECK(v.n == n, "[cuda] %s: weight '%s' has %lld elements, needs %lld", op, t.name.c_str(),
            (long long)v.n, (long long)n);
  return v.ptr;
}

void CudaBackend::in_place(Buffer& x, int64_t n, float v, int tag, const char* op) {
  ARB_CHECK(x.ptr != nullptr && x.n >= n && (x.dtype == ct_ || x.dtype == DType::F32),
            "[cuda] %s: buffer of %lld %s elements, needs %lld", op, (long long)x.n,
            dtype_name(x.dtype), (long long)n);
  void* xp = x.ptr;
  const DType t = x.dtype;
  submit({tag, int64_t(xp), n, int(t), cuda::sig_bits(v)}, false, 0,
         [=, this](const cuda::StepCtx&) {
           if (tag == 34) cuda::launch_scale(t, xp, n, v, stream_);
           else cuda::launch_softcap(t, xp, n, v, stream_);
         });
}

void CudaBackend::scale(Buffer& x, int64_t n, double s) {
  stats_.record("scale", "cuda.scale");
  in_place(x, n, float(s), 34, "scale");
}

void CudaBackend::softcap(Buffer& x, int64_t n, double cap) {
  stats_.record("softcap", "cuda.softcap");
  ARB_CHECK(cap > 0, "[cuda] softcap: cap %g", cap);
  in_place(x, n, float(cap), 35, "softcap");
}

void CudaBackend::geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) {
  stats_.record("geglu", "cuda.geglu");
  check_act(gate, n, "geglu gate");
  check_act(up, n, "geglu up");
  check_act(out, n, "geglu out");
  const void *gp = gate.ptr, *up_p = up.ptr;
  void* op = out.ptr;
  submit({36, int64_t(gp), int64_t(up_p), n, int64_t(op)}, false, 0,
         [=, this](const cuda::StepCtx&) { cuda::launch_geglu(ct_, gp, up_p, n, op, stream_); });
}

void CudaBackend::relu2(const Buffer& x, int64_t n, Buffer& out) {
  stats_.record("relu2", "cuda.relu2");
  check_act(x, n, "relu2 x");
  check_act(out, n, "relu2 out");
  const void* xp = x.ptr;
  void* op = out.ptr;
  submit({33, int64_t(xp), n, int64_t(op)}, false, 0,
         [=, this](const cuda::StepCtx&) { cuda::launch_relu2(ct_, xp, n, op, stream_); });
}

void CudaBackend::ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C,
                           int K, Buffer& state, Buffer& out) {
  stats_.record("ssm_conv", "cuda.ssm_conv");
  ARB_CHECK(T >= 0 && C >= 1 && K >= 1, "[cuda] ssm_conv: T %d, C %d, K %d", T, C, K);
  check_act(x, int64_t(T) * C, "ssm_conv x");
  check_act(out, int64_t(T) * C, "ssm_conv out");
  check_act(state, int64_t(K - 1) * C, "ssm_conv state");
  ARB_CHECK(x.ptr != out.ptr, "[cuda] ssm_conv: out may not alias x");
  const float* wp = vec(w, int64_t(C) * K, "ssm_conv");  // [C, 1, K] as [C, K]
  const float* bp = bias ? vec(*bias, C, "ssm_conv") : nullptr;
  const void* xp = x.ptr;
  void *sp = state.ptr, *op = out.ptr;
  submit({30, int64_t(xp), int64_t(wp), int64_t(bp), T, C, K, int64_t(sp), int64_t(op)}, false, 0,
         [=, this](const cuda::StepCtx&) {
           cuda::launch_ssm_conv(ct_, xp, wp, bp, T, C, K, sp, op, stream_);
         });
}

void CudaBackend::ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log,
                           const Tensor& D, const Tensor& dt_bias, double dt_min, double dt_max,
                           int T, int nh, int hd, int G, int N, int chunk, Buffer& state,
                           Buffer& y) {
  // The decode step runs the recurrence; a prefill the chunked form, as HF does (backend.h).
  stats_.record("ssm_scan", T > 1 && !row_invariant_ ? "cuda.ssm_scan_chunked" : "cuda.ssm_scan");
  ARB_CHECK(T >= 0 && nh >= 1 && hd >= 1 && G >= 1 && nh % G == 0 && N >= 1 &&
                N <= cuda::kMaxScanState,
            "[cuda] ssm_scan: %d heads of %d, %d groups, state size %d (groups must divide the "
            "heads, state size <= %d)", nh, hd, G, N, cuda::kMaxScanState);
  ARB_CHECK(chunk >= 1 && std::min(chunk, T) <= cuda::kMaxScanChunk,
            "[cuda] ssm_scan: chunk size %d (the chunked scan takes 1 to %d)", chunk,
            cuda::kMaxScanChunk);
  const int64_t I = int64_t(nh) * hd;
  check_act(xbc, T * (I + 2 * int64_t(G) * N), "ssm_scan xbc");
  check_act(dt_raw, int64_t(T) * nh, "ssm_scan dt");
  check_act(y, T * I, "ssm_scan y");
  // f32, as on cpu: the state is rounded at every token otherwise (alloc(n, true) gives f32).
  ARB_CHECK(state.ptr != nullptr && state.dtype == DType::F32 && state.n >= I * N,
            "[cuda] ssm_scan: state buffer of %lld %s elements, needs %lld f32 (alloc it as "
            "logits)", (long long)state.n, dtype_name(state.dtype), (long long)(I * N));
  cuda::ScanArgs a;
  a.xbc = xbc.ptr;
  a.dt_raw = dt_raw.ptr;
  a.a_log = vec(A_log, nh, "ssm_scan");
  a.d = vec(D, nh, "ssm_scan");
  a.dt_bias = vec(dt_bias, nh, "ssm_scan");
  a.dt_min = float(dt_min);
  a.dt_max = float(dt_max);
  a.T = T;
  a.nh = nh;
  a.hd = hd;
  a.G = G;
  a.N = N;
  a.chunk = chunk;
  a.state = static_cast<float*>(state.ptr);
  a.y = y.ptr;
  a.recurrence = row_invariant_;
  if (const int64_t n = cuda::ssm_scan_scratch_floats(a); n > 0) {
    ensure(scan_, size_t(n) * sizeof(float));
    a.scratch = static_cast<float*>(scan_.ptr);
  }
  submit({31, int64_t(a.xbc), int64_t(a.dt_raw), int64_t(a.a_log), int64_t(a.d),
          int64_t(a.dt_bias), cuda::sig_bits(a.dt_min), cuda::sig_bits(a.dt_max), T, nh, hd, G, N,
          chunk, int64_t(a.state), int64_t(a.y), int64_t(a.scratch), a.recurrence},
         false, 0, [=, this](const cuda::StepCtx&) { cuda::launch_ssm_scan(ct_, a, stream_); });
}

void CudaBackend::rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W,
                                int group, double eps, Buffer& out) {
  stats_.record("rmsnorm_gated", "cuda.rmsnorm_gated");
  ARB_CHECK(R >= 0 && group >= 1 && W % group == 0,
            "[cuda] rmsnorm_gated: groups of %d do not divide rows of %d", group, W);
  check_act(y, int64_t(R) * W, "rmsnorm_gated y");
  check_act(z, int64_t(R) * W, "rmsnorm_gated z");
  check_act(out, int64_t(R) * W, "rmsnorm_gated out");
  const float* wp = vec(w, W, "rmsnorm_gated");
  const void *yp = y.ptr, *zp = z.ptr;
  void* op = out.ptr;
  const float e = float(eps);
  if (R == 0) return;
  submit({32, int64_t(yp), int64_t(zp), int64_t(wp), R, W, group, cuda::sig_bits(eps),
          int64_t(op)},
         false, 0, [=, this](const cuda::StepCtx&) {
           cuda::launch_rmsnorm_gated(ct_, yp, zp, wp, R, W, group, e, op, stream_);
         });
}

std::vector<double> CudaBackend::read_bandwidth_gbs(int passes) {
  // 2 GiB read with 16-byte streaming loads (well past the 60 MB L2), timed with events.
  flush();
  const size_t bytes = size_t(2) << 30;
  void* buf = nullptr;
  unsigned* sink = nullptr;
  ARB_CUDA(cudaMalloc(&buf, bytes));
  std::vector<double> out;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  try {
    ARB_CUDA(cudaMalloc(&sink, sizeof(unsigned) * 4 * size_t(sm_)));
    ARB_CUDA(cudaMemsetAsync(buf, 0x5a, bytes, stream_));  // never time untouched memory
    ARB_CUDA(cudaEventCreate(&e0));
    ARB_CUDA(cudaEventCreate(&e1));
    cuda::launch_read_probe(buf, bytes, sink, sm_, stream_);  // warm-up
    for (int p = 0; p < passes; ++p) {
      ARB_CUDA(cudaEventRecord(e0, stream_));
      cuda::launch_read_probe(buf, bytes, sink, sm_, stream_);
      ARB_CUDA(cudaEventRecord(e1, stream_));
      ARB_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      ARB_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      out.push_back(double(bytes) / (double(ms) * 1e-3) / 1e9);
    }
  } catch (...) {
    cudaStreamSynchronize(stream_);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(sink);
    cudaFree(buf);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(sink);
  cudaFree(buf);
  return out;
}

void CudaBackend::summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
               std::vector<LogitsSummary>& out) {
  stats_.record("summarize", "cuda.summarize_radix");
  flush();
  out.assign(size_t(T), LogitsSummary{});
  if (T <= 0) return;
  const cuda::SummaryOut o = summarize_on_device(logits, T, V, K, targets);
  // One copy of the whole block; the offsets of its parts are those of o.
  const auto* base = reinterpret_cast<const uint8_t*>(o.lse);
  auto off = [&](const void* p) { return size_t(static_cast<const uint8_t*>(p) - base); };
  std::vector<uint8_t> host(off(o.top_vals + size_t(T) * K));
  ARB_CUDA(cudaMemcpyAsync(host.data(), base, host.size(), cudaMemcpyDeviceToHost, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
  const uint8_t* h = host.data();
  for (int t = 0; t < T; ++t) {
    LogitsSummary& s = out[t];
    double lse;
    unsigned long long nf;
    float tg;
    std::memcpy(&lse, h + off(o.lse + t), 8);
    std::memcpy(&nf, h + off(o.nonfinite + t), 8);
    std::memcpy(&tg, h + off(o.target + t), 4);
    s.lse = lse;
    s.n_nonfinite = int64_t(nf);
    s.target_logit = targets[t] >= 0 && targets[t] < V ? double(tg) : std::nan("");
    s.top_ids.resize(K);
    s.top_logits.resize(K);
    for (int k = 0; k < K; ++k) {
      float v;
      std::memcpy(&s.top_ids[k], h + off(o.top_ids + size_t(t) * K + k), 4);
      std::memcpy(&v, h + off(o.top_vals + size_t(t) * K + k), 4);
      s.top_logits[k] = v;
    }
  }
}

void CudaBackend::set_tuning(const CudaTuning& t) {
  flush();
  tuning_ = t;
  // Cached graphs hold the kernels of the old choices under the same op signatures.
  graph_->clear();
  if (cuda::sync_after_launch()) tuning_.graphs = tuning_.pdl = false;
  cuda::set_pdl(tuning_.pdl);
}

/// Checks attention's arguments; returns the cache's rows.
int CudaBackend::check_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                    int pos0, int H, int Hkv, int Dh, int window, const Buffer& out) const {
  ARB_CHECK(Hkv > 0 && H % Hkv == 0 && Dh > 0 && Dh <= cuda::kMaxHeadDim,
            "[cuda] attention: H %d, Hkv %d, Dh %d (H must be a multiple of Hkv, Dh <= %d)", H,
            Hkv, Dh, cuda::kMaxHeadDim);
  ARB_CHECK(pos0 >= 0, "[cuda] attention: %d queries at position %d", T, pos0);
  const int cap = attention_cache_rows(k_cache, v_cache, Hkv * Dh, T, pos0, window, "cuda");
  check_act(q, int64_t(T) * H * Dh, "attention q");
  check_act(out, int64_t(T) * H * Dh, "attention out");
  check_act(k_cache, 0, "k cache");
  check_act(v_cache, 0, "v cache");
  return cap;
}

cuda::AttnArgs CudaBackend::attn_args(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                         int H, int Hkv, int Dh, int window, float scale, float softcap,
                         Buffer& out, int n_splits, float* part) const {
  cuda::AttnArgs a;
  a.q = q.ptr;
  a.k_cache = k_cache.ptr;
  a.v_cache = v_cache.ptr;
  a.out = out.ptr;
  a.part = part;
  a.T = T;
  a.H = H;
  a.Hkv = Hkv;
  a.Dh = Dh;
  a.window = window;
  a.n_splits = n_splits;
  a.scale = scale;
  a.softcap = softcap;
  a.rows = kv_cache_rows(k_cache, v_cache, Hkv * Dh);
  return a;
}

void CudaBackend::check_act(const Buffer& b, int64_t n, const char* what) const {
  ARB_CHECK(b.ptr != nullptr && b.n >= n, "[cuda] %s: buffer holds %lld elements, needs %lld",
            what, (long long)b.n, (long long)n);
  ARB_CHECK(b.dtype == ct_, "[cuda] %s: buffer dtype %s, the tier computes in %s",
            what, dtype_name(b.dtype), dtype_name(ct_));
}

/// Grows a workspace. Queued launches may point at the old block: run them first.
void CudaBackend::ensure(cuda::DevBuf& b, size_t bytes) {
  if (b.bytes >= bytes) return;
  flush();
  cuda::grow(b, bytes, stream_);
}

void CudaBackend::check_summarize(const Buffer& logits, int T, int V, int K) const {
  ARB_CHECK(logits.dtype == DType::F32 && logits.n >= int64_t(T) * V,
            "[cuda] summarize: logits buffer of %lld %s elements for [%d, %d]",
            (long long)logits.n, dtype_name(logits.dtype), T, V);
  ARB_CHECK(K >= 1 && K <= V && K <= cuda::kMaxTopK, "[cuda] summarize: top-k %d outside [1, %d]",
            K, std::min(V, cuda::kMaxTopK));
}

/// Queues summarize's kernel for logits rows [T, V] (targets: host ids, or nullptr for
/// none) into sum_out_: lse f64[T], nonfinite u64[T], target f32[T], top ids i32[T*K], top
/// values f32[T*K]; returns those device pointers.
cuda::SummaryOut CudaBackend::summarize_on_device(const Buffer& logits, int T, int V, int K,
                                     const int32_t* targets) {
  check_summarize(logits, T, V, K);
  const size_t n_lse = size_t(T) * 8, n_nf = size_t(T) * 8, n_tg = size_t(T) * 4,
               n_ids = size_t(T) * K * 4, n_vals = size_t(T) * K * 4;
  ensure(sum_out_, n_lse + n_nf + n_tg + n_ids + n_vals);
  ensure(targets_, size_t(T) * sizeof(int32_t));
  const int S = cuda::summarize_slices(T, V, sm_count_);
  ensure(sum_scratch_, size_t(T) * S * 32);
  if (targets)
    ARB_CUDA(cudaMemcpyAsync(targets_.ptr, targets, size_t(T) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  else  // every id -1: no target
    ARB_CUDA(cudaMemsetAsync(targets_.ptr, 0xff, size_t(T) * sizeof(int32_t), stream_));
  auto* base = static_cast<uint8_t*>(sum_out_.ptr);
  cuda::SummaryOut o;
  o.lse = reinterpret_cast<double*>(base);
  o.nonfinite = reinterpret_cast<unsigned long long*>(base + n_lse);
  o.target = reinterpret_cast<float*>(base + n_lse + n_nf);
  o.top_ids = reinterpret_cast<int32_t*>(base + n_lse + n_nf + n_tg);
  o.top_vals = reinterpret_cast<float*>(base + n_lse + n_nf + n_tg + n_ids);
  auto* sb = static_cast<uint8_t*>(sum_scratch_.ptr);
  const size_t n_part = size_t(T) * S;
  cuda::SummaryScratch w;
  w.nonfinite = reinterpret_cast<unsigned long long*>(sb);
  w.best = reinterpret_cast<unsigned long long*>(sb + n_part * 8);
  w.sum = reinterpret_cast<double*>(sb + n_part * 16);
  w.max = reinterpret_cast<float*>(sb + n_part * 24);
  cuda::launch_summarize(static_cast<const float*>(logits.ptr), T, V, K,
                         static_cast<const int32_t*>(targets_.ptr), S, w, o, stream_);
  return o;
}

/// The embedding gather of host ids, or (ids == nullptr, T == 1) of the latest pick, which
/// pick_greedy left in the device token slot.
void CudaBackend::embed_ids(const Tensor& table, const int32_t* ids, int T, Buffer& out) {
  flush();  // an embed starts a new forward
  const cuda::DevMat& m = weights_->matrix(table);
  stats_.record("embed", m.packed() ? packed_provider("cuda.embed_", m.st) : "cuda.embed");
  check_act(out, int64_t(T) * m.cols, "embed out");
  for (int t = 0; ids && t < T; ++t)
    ARB_CHECK(ids[t] >= 0 && ids[t] < m.rows, "[cuda] embed: token id %d outside [0, %lld)",
              ids[t], (long long)m.rows);
  const bool step = single_token(T) && tuning_.graphs;
  if (step) {
    graph_->open(ids ? ids[0] : 0, !ids);
  } else if (ids) {
    ensure(ids_, size_t(T) * sizeof(int32_t));
    ARB_CUDA(cudaMemcpyAsync(ids_.ptr, ids, size_t(T) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
    // A batched forward (row invariance: continuous batching) replays as a graph too, once its
    // launches' signature has been seen: its ids went up just now, and its rows' positions and
    // block tables go up with its first attention (paged.cpp), before the launches run.
    if (row_invariant_ && tuning_.graphs) graph_->open_batch();
  }
  const int32_t* eager_ids = ids ? static_cast<const int32_t*>(ids_.ptr) : graph_->slots() + 1;
  const void* tp = m.ptr;
  const int64_t ld = m.ld, D = m.cols;
  void* op = out.ptr;
  if (m.packed()) {  // the gathered rows dequantized on the device
    const DType qt = m.st;
    submit({1, int64_t(tp), ld, D, T, int64_t(op), int(qt), int64_t(eager_ids)}, false, 0,
           [=, this](const cuda::StepCtx& c) {
             cuda::launch_dequant_rows(ct_, qt, tp, ld, step ? c.ids_dev : eager_ids, 0, T,
                                       int(D), op, D, stream_);
           });
    return;
  }
  submit({1, int64_t(tp), ld, D, T, int64_t(op), int64_t(eager_ids)}, false, 0,
         [=, this](const cuda::StepCtx& c) {
           cuda::launch_embed(ct_, tp, ld, D, step ? c.ids_dev : eager_ids, T, op, stream_);
         });
}

/// (cos, sin) of pos * inv_freq[i] for positions [0, P): angles and their cos/sin in f64
/// on the host (the oracle's own angles), rounded once to f32. Computing pos * inv_freq in
/// f32 on the device instead would put an angle error of up to pos * 2^-24 rad into every
/// rotation (0.1 mrad at position 4096), far above f32 rounding of cos and sin.
const float2* CudaBackend::rope_table(const RopeSpec& rope, int positions) {
  auto it = std::find_if(rope_tables_.begin(), rope_tables_.end(),
                         [&](const RopeTable& t) { return t.spec == rope; });
  if (it != rope_tables_.end() && positions <= it->positions)
    return static_cast<const float2*>(it->cs.ptr);
  if (it == rope_tables_.end()) it = rope_tables_.insert(rope_tables_.end(), RopeTable{rope, {}, 0});
  const int P = std::max({positions, 2 * it->positions, 1024});
  const std::vector<double> inv = rope_inv_freq(rope);
  const int half = int(inv.size());
  std::vector<float> cs(size_t(P) * half * 2);
  for (int p = 0; p < P; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = double(p) * inv[i];
      cs[(size_t(p) * half + i) * 2] = float(std::cos(angle));
      cs[(size_t(p) * half + i) * 2 + 1] = float(std::sin(angle));
    }
  flush();
  ARB_CUDA(cudaStreamSynchronize(stream_));
  ARB_CUDA(cudaFree(it->cs.ptr));
  it->cs = cuda::DevBuf{};
  ARB_CUDA(cudaMalloc(&it->cs.ptr, cs.size() * sizeof(float)));
  it->cs.bytes = cs.size() * sizeof(float);
  ARB_CUDA(cudaMemcpyAsync(it->cs.ptr, cs.data(), it->cs.bytes, cudaMemcpyHostToDevice, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
  it->positions = P;
  return static_cast<const float2*>(it->cs.ptr);
}

/// cuBLASLt plan for out[T, N] = x[T, K] @ W[N, K]^T, in column-major terms
/// D[N, T] = op(A = W stored K x N, ld)^T @ B (= x, K x T); out's rows ldc apart (0: N; a
/// tile of a wider output's columns). Compute type CUBLAS_COMPUTE_32F
/// (true f32 for f32 inputs: no TF32), f32 scale; split-K reductions only in f32.
const CudaBackend::GemmPlan& CudaBackend::gemm_plan(int T, int N, int K, int64_t ld, DType out_t,
                                                    int64_t ldc) {
  if (ldc == 0) ldc = N;
  const auto key = std::make_tuple(T, N, K, ld, int(out_t), ldc);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  auto cuda_t = [](DType t) {
    return t == DType::F32 ? CUDA_R_32F : t == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  };
  GemmPlan p;
  ARB_CUBLAS(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ARB_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ARB_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  ARB_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, cuda_t(ct_), uint64_t(K), uint64_t(N), ld));
  ARB_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, cuda_t(ct_), uint64_t(K), uint64_t(T), K));
  ARB_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, cuda_t(out_t), uint64_t(N), uint64_t(T), ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  ARB_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspace;
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // NONE always allowed
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  try {
    ARB_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    ARB_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction));
    ARB_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &res,
                                              &found));
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  ARB_CHECK(found > 0, "[cuda] cuBLASLt has no algorithm for [%d, %d] x [%d, %d]^T (%s -> %s)",
            T, K, N, K, dtype_name(ct_), dtype_name(out_t));
  p.algo = res.algo;
  return plans_.emplace(key, p).first->second;
}

namespace {

CudaBackend& as_cuda(const Backend& be) {
  auto* c = dynamic_cast<const CudaBackend*>(&be);
  ARB_CHECK(c != nullptr, "[cuda] %s is not the CUDA tier", be.device_name().c_str());
  return const_cast<CudaBackend&>(*c);
}

}  // namespace

bool cuda_tier_built() { return true; }

std::string cuda_build_version() {
  return strformat("cuda-%d.%d", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
}

std::unique_ptr<Backend> make_cuda_backend(int device, const std::string& dtype) {
  DType ct;
  if (dtype.empty() || dtype == "bf16") ct = DType::BF16;
  else if (dtype == "f16") ct = DType::F16;
  else if (dtype == "f32") ct = DType::F32;
  else throw Error("[cuda] unknown --dtype '" + dtype + "' (expected bf16, f16 or f32)");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = CUDART_VERSION;
    cudaGetLastError();
    throw Error(cuda_no_device_message(e == cudaSuccess ? count : 0, driver, runtime,
                                       e != cudaSuccess ? cudaGetErrorString(e) : ""));
  }
  ARB_CHECK(device >= 0 && device < count, "[cuda] device cuda:%d does not exist (%d device%s)",
            device, count, count == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(device, ct);
}

CudaGraphStats cuda_graph_stats(const Backend& be) { return as_cuda(be).graph_stats(); }
CudaTuning cuda_tuning(const Backend& be) { return as_cuda(be).tuning(); }
void cuda_set_tuning(Backend& be, const CudaTuning& t) { as_cuda(be).set_tuning(t); }

}  // namespace arbiter
