// The CUDA tier: activations in bf16/f16/f32 on one device, f32 accumulation everywhere,
// logits in f32. Weights are uploaded once in the compute dtype (Q8_0 dequantised on the
// device at upload), keyed by the host tensor; the KV cache lives on the device; only token
// ids and positions go up, and only summaries (or logits asked for by read()) come back.
//
// Decode steps (T == 1) are replayed as CUDA graphs. The model calls ops one by one, so the
// graph is built here: an embed of one token opens a "step"; its ops are queued (each as a
// launch closure plus a signature of everything it launches with except the position and
// the token id). Every graph_segment_ops queued launches (once the step's position is known),
// and when something needs the results on the host (summarize, read, write, sync, free, the
// next embed), the queue runs as a segment: as a replay of a graph captured earlier for the
// same signature, as a fresh capture when the signature was seen before, or op by op. So the
// GPU runs the first segments while the host queues the rest (the host needs ~100 us to
// queue a 28-layer step). In a step, position-dependent kernels (RoPE, KV store, attention)
// and the embedding gather read the position and the token id from a small device array
// that the first segment uploads, so one graph serves every position. A replay runs exactly
// the kernels the op-by-op path runs, with the same arguments: results are byte-identical.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda_factory.h"
#include "core/error.h"
#include "backend/rope.h"

namespace arbiter {

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

size_t elem_size(DType t) { return t == DType::F32 ? 4 : 2; }

/// n values as the device stores them in t (f32, or bf16/f16 rounded to nearest even).
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

/// A device allocation that grows; growing frees the old block (callers flush first).
struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
};

static_assert(cuda::kMaxTopK >= kMaxSummaryTopK, "summarize must take every K the engine asks for");

/// Identity of a host weight tensor: its address, shape, dtype and a sample of its bytes
/// (so a different model mapped at the same address is not mistaken for the old one).
struct WeightKey {
  const void* data;
  int64_t numel, cols;  // the shape too: two views of the same bytes are different matrices
  DType dt;
  uint64_t sample;
  bool operator==(const WeightKey& o) const {
    return data == o.data && numel == o.numel && cols == o.cols && dt == o.dt &&
           sample == o.sample;
  }
};
struct WeightKeyHash {
  size_t operator()(const WeightKey& k) const {
    return std::hash<const void*>()(k.data) ^ (k.sample * 0x9e3779b97f4a7c15ull) ^
           size_t(k.numel);
  }
};

WeightKey weight_key(const Tensor& t) {
  const size_t n = t.nbytes();
  const auto* p = static_cast<const uint8_t*>(t.data);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over 4 samples of up to 16 bytes
  const size_t offs[4] = {0, n / 3, 2 * n / 3, n >= 16 ? n - 16 : 0};
  for (size_t off : offs)
    for (size_t i = off; i < std::min(n, off + 16); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return WeightKey{t.data, t.numel(), t.cols(), t.dtype, h};
}

/// Weight matrix on the device in the compute dtype, rows padded to a 16-byte stride.
struct DevMat {
  void* ptr = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
};
/// 1-D weight (norm scale, bias) on the device in f32.
struct DevVec {
  float* ptr = nullptr;
  int64_t n = 0;
};

/// Arguments of a queued launch that vary per step (the rest are in the closure).
struct StepCtx {
  const int* pos_dev;     // device position, or nullptr: use the op's host position
  const int32_t* ids_dev; // device token ids for the embedding gather
};

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType ct) : device_(device), ct_(ct) {
    ARB_CUDA(cudaSetDevice(device));
    cudaDeviceProp prop{};
    ARB_CUDA(cudaGetDeviceProperties(&prop, device));
    name_ = strformat("cuda:%d %s", device, prop.name);
    sm_count_ = prop.multiProcessorCount;
    sm_ = sm_count_;
    ARB_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ARB_CUDA(cudaEventCreateWithFlags(&step_ev_, cudaEventDisableTiming));
    ARB_CUDA(cudaMallocHost(&h_step_, 2 * sizeof(int)));
    ARB_CUDA(cudaMalloc(&d_step_, 2 * sizeof(int)));
    ARB_CUDA(cudaHostAlloc(&h_picks_, kPickSlots * sizeof(int32_t), cudaHostAllocMapped));
    ARB_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_picks_), h_picks_, 0));
    ARB_CUDA(cudaMalloc(&pick_state_, sizeof(cuda::PickState)));
    ARB_CUDA(cudaMemset(pick_state_, 0, sizeof(cuda::PickState)));
    for (cudaEvent_t& e : pick_ev_) ARB_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ARB_CUBLAS(cublasLtCreate(&lt_));
    ARB_CUDA(cudaMalloc(&lt_ws_, kLtWorkspace));
    cuda::attention_init();
    ARB_CUDA(cudaMalloc(&counters_, sizeof(unsigned) * cuda::kDecodeCounterWords));
    ARB_CUDA(cudaMemset(counters_, 0, sizeof(unsigned) * cuda::kDecodeCounterWords));
    tuning_.gemv = env_on("ARBITER_CUDA_GEMV", true);
    tuning_.graphs = env_on("ARBITER_CUDA_GRAPH", true) && !cuda::sync_after_launch();
    tuning_.fused = env_on("ARBITER_CUDA_FUSED", true);
    tuning_.attn_direct = env_on("ARBITER_CUDA_ATTN_DIRECT", true);
    tuning_.attn_mma = env_on("ARBITER_CUDA_ATTN_MMA", true);
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
    prov_norm_swiglu_ = "cuda.norm_gemv_swiglu_" + dt;
    prov_gemv_add_ = "cuda.gemv_add_" + dt;
  }

  ~CudaBackend() override {
    try {
      flush();
    } catch (...) {
    }
    cudaStreamSynchronize(stream_);
    for (auto& g : graphs_) cudaGraphExecDestroy(g.exec);
    for (auto& [k, p] : plans_) {
      cublasLtMatmulDescDestroy(p.op);
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
    }
    for (auto& [k, m] : mats_) cudaFree(m.ptr);
    for (auto& [k, v] : vecs_) cudaFree(v.ptr);
    for (DevBuf* b : {&staging_, &ids_, &part_, &acc_, &rope_cs_, &sum_out_, &sum_scratch_,
                      &targets_, &tap_mem_})
      cudaFree(b->ptr);
    cudaFree(lt_ws_);
    cudaFree(counters_);
    cublasLtDestroy(lt_);
    cudaFree(d_step_);
    cudaFreeHost(h_step_);
    cudaEventDestroy(step_ev_);
    cudaFreeHost(h_picks_);
    cudaFree(pick_state_);
    for (cudaEvent_t e : pick_ev_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string device_name() const override { return name_; }
  DType compute() const override { return ct_; }

  // --- weights ----------------------------------------------------------------------------
  void prepare(const Prepare& p) override {
    flush();
    // Keep only this model's weights: a previous model's copies would hold device memory.
    std::unordered_map<WeightKey, bool, WeightKeyHash> keep;
    for (const WeightUse& u : p.weights) keep[weight_key(*u.tensor)] = true;
    ARB_CUDA(cudaStreamSynchronize(stream_));
    for (auto it = mats_.begin(); it != mats_.end();)
      if (keep.count(it->first)) ++it;
      else {
        cudaFree(it->second.ptr);
        it = mats_.erase(it);
      }
    for (auto it = vecs_.begin(); it != vecs_.end();)
      if (keep.count(it->first)) ++it;
      else {
        cudaFree(it->second.ptr);
        it = vecs_.erase(it);
      }
    for (const WeightUse& u : p.weights) {
      if (u.tensor->shape.size() >= 2) device_matrix(*u.tensor);
      else device_vector(*u.tensor);
    }
    for (const RopeSpec& r : p.ropes) ensure_rope_table(r, std::min(std::max(p.max_pos, 1), 4096));
    // The staging block is as large as the largest weight; give it back.
    ARB_CUDA(cudaStreamSynchronize(stream_));
    ARB_CUDA(cudaFree(staging_.ptr));
    staging_ = DevBuf{};
  }

  // --- memory -----------------------------------------------------------------------------
  Buffer alloc(int64_t n, bool logits) override {
    ARB_CHECK(n >= 0, "[cuda] alloc of %lld elements", (long long)n);
    Buffer b;
    b.n = n;
    b.dtype = logits ? DType::F32 : ct_;
    ARB_CUDA(cudaMalloc(&b.ptr, std::max<size_t>(1, size_t(n) * elem_size(b.dtype))));
    return b;
  }

  void free(Buffer& b) override {
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

  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override {
    ARB_CHECK(off >= 0 && n >= 0 && off + n <= b.n, "[cuda] read [%lld, %lld) of a %lld-element buffer",
              (long long)off, (long long)(off + n), (long long)b.n);
    flush();
    const size_t es = elem_size(b.dtype);
    std::vector<uint8_t> host(size_t(n) * es);
    ARB_CUDA(cudaMemcpyAsync(host.data(), static_cast<const uint8_t*>(b.ptr) + size_t(off) * es,
                             host.size(), cudaMemcpyDeviceToHost, stream_));
    ARB_CUDA(cudaStreamSynchronize(stream_));
    row_to_f64(b.dtype, host.data(), dst, n);
  }

  void write(Buffer& b, int64_t off, int64_t n, const double* src) override {
    ARB_CHECK(off >= 0 && n >= 0 && off + n <= b.n, "[cuda] write [%lld, %lld) of a %lld-element buffer",
              (long long)off, (long long)(off + n), (long long)b.n);
    flush();
    const size_t es = elem_size(b.dtype);
    const std::vector<uint8_t> host = encode(b.dtype, src, n);
    ARB_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(b.ptr) + size_t(off) * es, host.data(),
                             host.size(), cudaMemcpyHostToDevice, stream_));
    ARB_CUDA(cudaStreamSynchronize(stream_));
  }

  void sync() override {
    flush();
    ARB_CUDA(cudaStreamSynchronize(stream_));
  }

  // --- ops --------------------------------------------------------------------------------
  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override {
    embed_ids(table, ids, T, out);
  }

  void embed_picked(const Tensor& table, Buffer& out) override {
    ARB_CHECK(has_pick_, "[cuda] embed of a picked token before any pick");
    embed_ids(table, nullptr, 1, out);
  }

  // --- greedy decode with the token kept on the device ------------------------------------
  // One kernel (launch_pick) takes summarize's top-1 and writes it to the step's device token
  // slot (d_step_[1], which the next embed_picked's step then does not upload) and to a
  // host-mapped slot with an event, so the next step can be queued before the host has the
  // token. Inside a decode step the pick is the step graph's last kernel and also advances
  // the device position (d_step_[0]), so a step at the next position uploads nothing: the
  // GPU goes from one step to the next without a copy between them.
  void pick_greedy(const Buffer& logits, int row, int V) override {
    stats_.record("pick_greedy", "cuda.pick");
    ARB_CHECK(row >= 0, "[cuda] pick: row %d", row);
    check_summarize(logits, row + 1, V, 1);
    ARB_CHECK(pending_picks_.size() < size_t(kPickSlots), "[cuda] pick: %d picks not taken",
              kPickSlots);
    const float* x = static_cast<const float*>(logits.ptr) + int64_t(row) * V;
    cuda::PickArgs p;
    p.state = pick_state_;
    p.token = d_step_ + 1;
    p.ring = d_picks_;
    p.n_ring = kPickSlots;
    submit({17, int64_t(x), V}, false, 0, [=, this](const StepCtx& c) {
      cuda::PickArgs q = p;
      q.pos = c.pos_dev ? d_step_ : nullptr;
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

  int32_t take_pick() override {
    ARB_CHECK(!pending_picks_.empty(), "[cuda] no pick left to take");
    const int slot = pending_picks_.front();
    pending_picks_.pop_front();
    ARB_CUDA(cudaEventSynchronize(pick_ev_[slot]));
    return h_picks_[slot];
  }

  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) override {
    stats_.record("rmsnorm", "cuda.rmsnorm_warp");
    check_act(x, int64_t(R) * N, "rmsnorm x");
    check_act(out, int64_t(R) * N, "rmsnorm out");
    const DevVec& v = device_vector(w);
    ARB_CHECK(v.n == N, "[cuda] rmsnorm: weight '%s' has %lld elements, rows have %d",
              w.name.c_str(), (long long)v.n, N);
    const void* xp = x.ptr;
    void* op = out.ptr;
    const float* wp = v.ptr;
    const float e = float(eps);
    int64_t ebits;
    {
      double d = eps;
      std::memcpy(&ebits, &d, 8);
    }
    submit({2, int64_t(xp), int64_t(wp), R, N, ebits, int64_t(op)}, false, 0,
           [=, this](const StepCtx&) { cuda::launch_rmsnorm(ct_, xp, wp, R, N, e, op, stream_); });
  }

  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T, Buffer& out) override {
    const DevMat& m = device_matrix(W);
    const int N = int(m.rows), K = int(m.cols);
    check_act(x, int64_t(T) * K, "matmul x");
    ARB_CHECK(out.dtype == DType::F32 || out.dtype == ct_,
              "[cuda] matmul: output buffer of dtype %s", dtype_name(out.dtype));
    ARB_CHECK(out.n >= int64_t(T) * N, "[cuda] matmul: output holds %lld elements, needs %lld",
              (long long)out.n, (long long)T * N);
    const float* bp = nullptr;
    if (bias) {
      const DevVec& bv = device_vector(*bias);
      ARB_CHECK(bv.n == N, "[cuda] matmul: bias '%s' has %lld elements, output has %d",
                bias->name.c_str(), (long long)bv.n, N);
      bp = bv.ptr;
    }
    const DType ot = out.dtype == DType::F32 ? DType::F32 : ct_;
    const void* xp = x.ptr;
    const void* wp = m.ptr;
    const int64_t ld = m.ld;
    void* op = out.ptr;
    if (T == 1 && tuning_.gemv) {
      stats_.record("matmul", prov_gemv_);
      submit({3, int64_t(xp), int64_t(wp), ld, int64_t(bp), N, K, int(ot), int64_t(op)}, false, 0,
             [=, this](const StepCtx&) {
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
           false, 0, [=, this](const StepCtx&) {
             static const float alpha = 1.f, beta = 0.f;
             ARB_CUBLAS(cublasLtMatmul(lt_, pp->op, &alpha, wp, pp->a, xp, pp->b, &beta, gp, pp->c,
                                       gp, pp->c, &pp->algo, lt_ws_, kLtWorkspace, stream_));
             if (bp) cuda::launch_bias_out(static_cast<const float*>(gp), bp, T, N, ot, op, stream_);
           });
  }

  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) override {
    stats_.record("rope", "cuda.rope_table");
    check_act(x, int64_t(T) * nh * Dh, "rope x");
    ARB_CHECK(Dh == rope.dims && Dh % 2 == 0, "[cuda] rope: heads of %d, RoPE of %d dimensions",
              Dh, rope.dims);
    ARB_CHECK(pos0 >= 0, "[cuda] rope: position %d", pos0);
    ensure_rope_table(rope, pos0 + T);
    void* xp = x.ptr;
    const float2* cs = static_cast<const float2*>(rope_cs_.ptr);
    const bool adj = rope.layout == RopeLayout::Adjacent;
    submit({5, int64_t(xp), T, nh, Dh, int64_t(cs), adj}, true, pos0,
           [=, this](const StepCtx& c) {
             cuda::launch_rope(ct_, xp, T, nh, Dh, PosRef{c.pos_dev, pos0}, cs, adj, stream_);
           });
  }

  void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T,
                int pos0, int kv_dim) override {
    stats_.record("kv_store", "cuda.kv_store");
    check_act(k, int64_t(T) * kv_dim, "kv_store k");
    check_act(v, int64_t(T) * kv_dim, "kv_store v");
    ARB_CHECK(pos0 >= 0 && int64_t(pos0 + T) * kv_dim <= std::min(k_cache.n, v_cache.n),
              "[cuda] kv_store: rows [%d, %d) outside the cache (%lld rows)", pos0, pos0 + T,
              (long long)(k_cache.n / std::max(kv_dim, 1)));
    check_act(k_cache, 0, "k cache");
    check_act(v_cache, 0, "v cache");
    const void *kp = k.ptr, *vp = v.ptr;
    void *kc = k_cache.ptr, *vc = v_cache.ptr;
    submit({6, int64_t(kp), int64_t(vp), int64_t(kc), int64_t(vc), T, kv_dim}, true, pos0,
           [=, this](const StepCtx& c) {
             cuda::launch_kv_store(ct_, kp, vp, kc, vc, T, PosRef{c.pos_dev, pos0}, kv_dim,
                                   stream_);
           });
  }

  void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
                 int H, int Hkv, int Dh, int window, Buffer& out) override {
    const int cap = check_attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, out);
    // Every kernel below takes the same arguments; they differ in splits and scratch.
    auto args = [&](int n_splits, float* part) {
      return attn_args(q, k_cache, v_cache, T, H, Hkv, Dh, window, out, n_splits, part);
    };
    if (T == 1 && tuning_.attn_direct && cuda::attention_decode_fits(H, Hkv, Dh)) {
      stats_.record("attention", "cuda.attn_decode_direct");
      submit_decode_attention(q, k_cache, v_cache, H, Hkv, Dh, window, out, cap, pos0, nullptr);
      return;
    }
    if (tuning_.attn_mma && cuda::attention_mma_fits(ct_, T, Dh)) {
      // Prefill on tensor cores: one block per 64 (query, head) rows, no key splits.
      stats_.record("attention", "cuda.flash_attn_prefill_mma");
      const cuda::AttnArgs a = args(1, nullptr);
      submit({25, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache), int64_t(a.out), T, H, Hkv,
              Dh, window},
             true, pos0, [=, this](const StepCtx& c) {
               cuda::AttnArgs b = a;
               b.pos = PosRef{c.pos_dev, pos0};
               cuda::launch_attention_mma(ct_, b, stream_);
             });
      return;
    }
    // Split the key range so the grid fills the device. A single-token step uses the cache
    // size instead of the position, so its launch shape (and graph) is position-independent.
    stats_.record("attention", T == 1 ? "cuda.attn_decode" : "cuda.flash_attn_prefill");
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
            int64_t(part), T, H, Hkv, Dh, window, n_splits},
           true, pos0, [=, this](const StepCtx& c) {
             cuda::AttnArgs b = a;
             b.pos = PosRef{c.pos_dev, pos0};
             cuda::launch_attention(ct_, b, stream_);
           });
  }

  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("swiglu", "cuda.swiglu");
    check_act(gate, n, "swiglu gate");
    check_act(up, n, "swiglu up");
    check_act(out, n, "swiglu out");
    const void *gp = gate.ptr, *up_p = up.ptr;
    void* op = out.ptr;
    submit({8, int64_t(gp), int64_t(up_p), n, int64_t(op)}, false, 0,
           [=, this](const StepCtx&) { cuda::launch_swiglu(ct_, gp, up_p, n, op, stream_); });
  }

  void add(Buffer& x, const Buffer& y, int64_t n) override {
    stats_.record("add", "cuda.add");
    check_act(x, n, "add x");
    check_act(y, n, "add y");
    void* xp = x.ptr;
    const void* yp = y.ptr;
    submit({9, int64_t(xp), int64_t(yp), n}, false, 0,
           [=, this](const StepCtx&) { cuda::launch_add(ct_, xp, yp, n, stream_); });
  }

  // --- fused ops (T == 1: one kernel each; otherwise the default composition) ----------
  // Each fused kernel computes the bits of the op-by-op path (same reduction orders, same
  // roundings), so decode traces do not depend on whether a stage hook was attached.

  void rmsnorm_matmul(const Buffer& x, const Tensor& w, int T, int D, double eps, Buffer& xn,
                      const StageTap* norm_tap, const MatmulTarget* outs, int n_outs) override {
    bool fuse = T == 1 && tuning_.gemv && tuning_.fused && n_outs >= 1 && n_outs <= 3 &&
                cuda::gemv_fusable(ct_, D);
    const DevMat* mats[3] = {};  // looked up once: a lookup samples the host tensor's bytes
    for (int i = 0; fuse && i < n_outs; ++i) {
      mats[i] = &device_matrix(*outs[i].W);
      fuse = mats[i]->cols == D &&
             (outs[i].out->dtype == DType::F32 || outs[i].out->dtype == ct_);
    }
    if (!fuse) return Backend::rmsnorm_matmul(x, w, T, D, eps, xn, norm_tap, outs, n_outs);
    stats_.record("rmsnorm_matmul", prov_norm_gemv_);
    check_act(x, D, "rmsnorm_matmul x");
    const DevVec& nv = device_vector(w);
    ARB_CHECK(nv.n == D, "[cuda] rmsnorm: weight '%s' has %lld elements, rows have %d",
              w.name.c_str(), (long long)nv.n, D);
    cuda::GemvArgs a;
    a.x = x.ptr;
    a.norm_w = nv.ptr;
    a.eps = float(eps);
    a.K = D;
    a.n_seg = n_outs;
    a.N = 0;
    std::vector<int64_t> sig = {20, int64_t(x.ptr), int64_t(nv.ptr), D, n_outs};
    for (int i = 0; i < n_outs; ++i) {
      const DevMat& m = *mats[i];
      const float* bp = nullptr;
      if (outs[i].bias && !outs[i].bias->empty()) {
        const DevVec& bv = device_vector(*outs[i].bias);
        ARB_CHECK(bv.n == m.rows, "[cuda] matmul: bias '%s' has %lld elements, output has %lld",
                  outs[i].bias->name.c_str(), (long long)bv.n, (long long)m.rows);
        bp = bv.ptr;
      }
      ARB_CHECK(outs[i].out->n >= m.rows, "[cuda] matmul: output holds %lld elements, needs %lld",
                (long long)outs[i].out->n, (long long)m.rows);
      const int f32 = outs[i].out->dtype == DType::F32 ? 1 : 0;
      a.seg[i] = cuda::GemvSeg{m.ptr, m.ld, bp, outs[i].out->ptr, int(m.rows), f32};
      a.N += int(m.rows);
      sig.insert(sig.end(), {int64_t(m.ptr), m.ld, int64_t(bp), int64_t(outs[i].out->ptr), m.rows, f32});
    }
    int64_t ebits;
    std::memcpy(&ebits, &eps, 8);
    sig.push_back(ebits);
    const bool tapped = norm_tap != nullptr;
    if (tapped) stage_taps({{norm_tap, D}}, a.tapped, a.taps);
    submit(std::move(sig), false, 0, [=, this](const StepCtx&) {
      cuda::launch_gemv_fused(ct_, cuda::kGemvNorm, a, sm_, stream_);
    });
    if (tapped) collect_taps();
    for (int i = 0; i < n_outs; ++i) apply_tap(outs[i].tap, *outs[i].out, T, int(mats[i]->rows));
  }

  void rmsnorm_swiglu(const Buffer& x, const Tensor& w, int T, int D, double eps, Buffer& xn,
                      const Tensor& w_gate, const Tensor& w_up, Buffer& gate, Buffer& up,
                      Buffer& act, const SwigluTaps& taps) override {
    bool fuse = T == 1 && tuning_.gemv && tuning_.fused && cuda::gemv_fusable(ct_, D);
    const DevMat* gm = fuse ? &device_matrix(w_gate) : nullptr;
    const DevMat* um = fuse ? &device_matrix(w_up) : nullptr;
    fuse = fuse && gm->cols == D && um->cols == D && gm->rows == um->rows && gm->ld == um->ld;
    if (!fuse)
      return Backend::rmsnorm_swiglu(x, w, T, D, eps, xn, w_gate, w_up, gate, up, act, taps);
    stats_.record("rmsnorm_swiglu", prov_norm_swiglu_);
    const DevMat &g = *gm, &u = *um;
    const DevVec& nv = device_vector(w);
    ARB_CHECK(nv.n == D, "[cuda] rmsnorm: weight '%s' has %lld elements, rows have %d",
              w.name.c_str(), (long long)nv.n, D);
    check_act(x, D, "rmsnorm_swiglu x");
    check_act(act, g.rows, "rmsnorm_swiglu act");
    cuda::GemvArgs a;
    a.x = x.ptr;
    a.norm_w = nv.ptr;
    a.eps = float(eps);
    a.K = D;
    a.N = int(g.rows);
    a.n_seg = 2;
    a.seg[0] = cuda::GemvSeg{g.ptr, g.ld, nullptr, nullptr, int(g.rows), 0};
    a.seg[1] = cuda::GemvSeg{u.ptr, u.ld, nullptr, nullptr, int(u.rows), 0};
    a.res = act.ptr;
    const bool tapped = taps.norm || taps.gate || taps.up;
    if (tapped)
      stage_taps({{taps.norm, D}, {taps.gate, g.rows}, {taps.up, g.rows}}, a.tapped, a.taps);
    int64_t ebits;
    std::memcpy(&ebits, &eps, 8);
    submit({kTagNormSwiglu, int64_t(x.ptr), int64_t(nv.ptr), D, int64_t(g.ptr), int64_t(u.ptr),
            g.ld, g.rows, int64_t(act.ptr), ebits},
           false, 0, [=, this](const StepCtx&) {
             cuda::launch_gemv_fused(ct_, cuda::kGemvNormSwiglu, a, sm_, stream_);
           });
    if (tapped) collect_taps();
    apply_tap(taps.act, act, T, int(g.rows));
  }

  void matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp, Buffer& residual,
                  const StageTap* product, const StageTap* sum) override {
    const DevMat* mp = T == 1 && tuning_.gemv && tuning_.fused ? &device_matrix(W) : nullptr;
    if (!mp || !cuda::gemv_fusable(ct_, int(mp->cols)))
      return Backend::matmul_add(x, W, T, tmp, residual, product, sum);
    stats_.record("matmul_add", prov_gemv_add_);
    const DevMat& m = *mp;
    check_act(x, m.cols, "matmul_add x");
    check_act(residual, m.rows, "matmul_add residual");
    cuda::GemvArgs a;
    a.x = x.ptr;
    a.K = int(m.cols);
    a.N = int(m.rows);
    a.n_seg = 1;
    a.seg[0] = cuda::GemvSeg{m.ptr, m.ld, nullptr, nullptr, int(m.rows), 0};
    a.res = residual.ptr;
    // The next kernel loads its weights during this one unless the launch before is the
    // gate/up GEMV (this is the down projection): then those loads would compete with the
    // gate/up rows still streaming after its wait (gemv.cu).
    a.launch_early = last_tag_ != kTagNormSwiglu;
    if (product) stage_taps({{product, m.rows}}, a.tapped, a.taps);
    submit({22, int64_t(x.ptr), int64_t(m.ptr), m.ld, m.rows, m.cols, int64_t(residual.ptr),
            a.launch_early},
           false, 0, [=, this](const StepCtx&) {
             cuda::launch_gemv_fused(ct_, cuda::kGemvAdd, a, sm_, stream_);
           });
    if (product) collect_taps();
    apply_tap(sum, residual, T, int(m.rows));
  }

  void qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                     const Tensor* k_norm, double eps, int T, int H, int Hkv, int Dh, int pos0,
                     const RopeSpec& rope, Buffer& k_cache, Buffer& v_cache,
                     const AttentionTaps& taps) override {
    if (!qk_fusable(T, Hkv, Dh, pos0, rope, k_cache, v_cache))
      return Backend::qk_rope_store(q, k, v, q_norm, k_norm, eps, T, H, Hkv, Dh, pos0, rope,
                                    k_cache, v_cache, taps);
    stats_.record("qk_rope_store", "cuda.qk_rope_store");
    cuda::QkRopeArgs a =
        qk_args(q, k, v, q_norm, k_norm, eps, H, Hkv, Dh, pos0, rope, k_cache, v_cache);
    const bool tapped = stage_qk_taps(taps, H, Hkv, Dh, a);
    std::vector<int64_t> sig = {23};
    append_qk_sig(sig, a);
    submit(std::move(sig), true, pos0, [=, this](const StepCtx& c) {
      cuda::QkRopeArgs b = a;
      b.pos = PosRef{c.pos_dev, pos0};
      cuda::launch_qk_rope_store(ct_, b, stream_);
    });
    if (tapped) collect_taps();
  }

  void qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                         const Tensor* k_norm, double eps, int T, int H, int Hkv, int Dh,
                         int pos0, const RopeSpec& rope, Buffer& k_cache, Buffer& v_cache,
                         int window, Buffer& out, const AttentionTaps& taps) override {
    if (!qk_fusable(T, Hkv, Dh, pos0, rope, k_cache, v_cache) || !tuning_.attn_direct ||
        !cuda::attention_decode_fits(H, Hkv, Dh))
      return Backend::qk_rope_attention(q, k, v, q_norm, k_norm, eps, T, H, Hkv, Dh, pos0, rope,
                                        k_cache, v_cache, window, out, taps);
    stats_.record("qk_rope_attention", "cuda.qk_rope_attn_decode");
    const int cap = check_attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, out);
    cuda::QkRopeArgs a =
        qk_args(q, k, v, q_norm, k_norm, eps, H, Hkv, Dh, pos0, rope, k_cache, v_cache);
    const bool tapped = stage_qk_taps(taps, H, Hkv, Dh, a);
    submit_decode_attention(q, k_cache, v_cache, H, Hkv, Dh, window, out, cap, pos0, &a);
    if (tapped) collect_taps();
    apply_tap(taps.out, out, T, H * Dh);
  }

  /// Whether the fused q/k norm + RoPE + KV store kernels take this step.
  bool qk_fusable(int T, int Hkv, int Dh, int pos0, const RopeSpec& rope, const Buffer& k_cache,
                  const Buffer& v_cache) const {
    return T == 1 && tuning_.fused && cuda::qk_rope_fusable(ct_, Dh) && Dh == rope.dims &&
           pos0 >= 0 && int64_t(pos0 + 1) * Hkv * Dh <= std::min(k_cache.n, v_cache.n);
  }

  std::vector<double> read_bandwidth_gbs(int passes) override {
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

  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override {
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

  // --- tuning and counters (cuda_backend.h) -----------------------------------------------
  CudaGraphStats graph_stats() const { return gstats_; }
  CudaTuning tuning() const { return tuning_; }
  void set_tuning(const CudaTuning& t) {
    flush();
    tuning_ = t;
    // Cached graphs hold the kernels of the old choices under the same op signatures.
    for (CachedGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    if (cuda::sync_after_launch()) tuning_.graphs = tuning_.pdl = false;
    cuda::set_pdl(tuning_.pdl);
  }

 private:
  static constexpr size_t kLtWorkspace = size_t(32) << 20;
  static constexpr int kMaxSplitKeys = 1 << 20;  // keeps the kernel's split count in int range
  static constexpr size_t kMaxGraphs = 64;  // segments (a 28-layer decode step has about 5)

  struct Queued {
    std::vector<int64_t> sig;
    std::function<void(const StepCtx&)> run;
    bool advances_pos = false;
  };
  struct CachedGraph {
    std::vector<int64_t> sig;
    cudaGraphExec_t exec = nullptr;
  };

  /// Checks attention's arguments; returns the cache's rows.
  int check_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                      int pos0, int H, int Hkv, int Dh, const Buffer& out) const {
    ARB_CHECK(Hkv > 0 && H % Hkv == 0 && Dh > 0 && Dh <= cuda::kMaxHeadDim,
              "[cuda] attention: H %d, Hkv %d, Dh %d (H must be a multiple of Hkv, Dh <= %d)", H,
              Hkv, Dh, cuda::kMaxHeadDim);
    const int kv_dim = Hkv * Dh;
    const int cap = int(std::min(k_cache.n, v_cache.n) / kv_dim);  // cache rows
    ARB_CHECK(pos0 >= 0 && pos0 + T <= cap, "[cuda] attention: positions [%d, %d) outside the cache (%d rows)",
              pos0, pos0 + T, cap);
    check_act(q, int64_t(T) * H * Dh, "attention q");
    check_act(out, int64_t(T) * H * Dh, "attention out");
    check_act(k_cache, 0, "k cache");
    check_act(v_cache, 0, "v cache");
    return cap;
  }

  cuda::AttnArgs attn_args(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                           int H, int Hkv, int Dh, int window, Buffer& out, int n_splits,
                           float* part) const {
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
    a.scale = float(1.0 / std::sqrt(double(Dh)));
    return a;
  }

  /// The direct decode attention (T == 1), with the step's q/k norm + RoPE + KV store folded
  /// in when qk is given. The grid's splits come from the cache size, never the position (one
  /// graph serves every position): about two blocks per SM, at least attn_split_keys (256)
  /// cache rows per split, at most attn_max_splits (8); the kernel uses the first ceil(keys /
  /// attn_split_keys) of them.
  void submit_decode_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                               int H, int Hkv, int Dh, int window, Buffer& out, int cap, int pos0,
                               const cuda::QkRopeArgs* qk) {
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
    cuda::AttnArgs a = attn_args(q, k_cache, v_cache, 1, H, Hkv, Dh, window, out, n_splits, part);
    a.split_keys = split_keys;
    a.heads_per_block = hpb;
    unsigned* ctr = counters_;
    std::vector<int64_t> sig = {24, int64_t(a.q), int64_t(a.k_cache), int64_t(a.v_cache),
                                int64_t(a.out), int64_t(part), H, Hkv, Dh, window, n_splits,
                                a.split_keys, a.heads_per_block, int64_t(ctr)};
    const bool fused = qk != nullptr;
    const cuda::QkRopeArgs qa = fused ? *qk : cuda::QkRopeArgs{};
    if (fused) append_qk_sig(sig, qa);
    submit(std::move(sig), true, pos0, [=, this](const StepCtx& c) {
      cuda::AttnArgs b = a;
      b.pos = PosRef{c.pos_dev, pos0};
      cuda::QkRopeArgs qb = qa;
      qb.pos = b.pos;
      cuda::launch_attention_decode(ct_, b, ctr, fused ? &qb : nullptr, stream_);
    });
  }

  /// qk_rope_store's arguments (device norm weights and RoPE table looked up and checked).
  cuda::QkRopeArgs qk_args(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                           const Tensor* k_norm, double eps, int H, int Hkv, int Dh, int pos0,
                           const RopeSpec& rope, Buffer& k_cache, Buffer& v_cache) {
    const int kv_dim = Hkv * Dh;
    check_act(q, int64_t(H) * Dh, "qk_rope_store q");
    check_act(k, kv_dim, "qk_rope_store k");
    check_act(v, kv_dim, "qk_rope_store v");
    check_act(k_cache, 0, "k cache");
    check_act(v_cache, 0, "v cache");
    ensure_rope_table(rope, pos0 + 1);
    cuda::QkRopeArgs a;
    a.q = q.ptr;
    a.k = k.ptr;
    a.v = v.ptr;
    a.k_cache = k_cache.ptr;
    a.v_cache = v_cache.ptr;
    if (q_norm) {
      const DevVec& n = device_vector(*q_norm);
      ARB_CHECK(n.n == Dh, "[cuda] q norm '%s' has %lld elements, heads have %d",
                q_norm->name.c_str(), (long long)n.n, Dh);
      a.qn = n.ptr;
    }
    if (k_norm) {
      const DevVec& n = device_vector(*k_norm);
      ARB_CHECK(n.n == Dh, "[cuda] k norm '%s' has %lld elements, heads have %d",
                k_norm->name.c_str(), (long long)n.n, Dh);
      a.kn = n.ptr;
    }
    a.eps = float(eps);
    a.H = H;
    a.Hkv = Hkv;
    a.Dh = Dh;
    a.adjacent = rope.layout == RopeLayout::Adjacent;
    a.cs = static_cast<const float2*>(rope_cs_.ptr);
    return a;
  }
  static void append_qk_sig(std::vector<int64_t>& sig, const cuda::QkRopeArgs& a) {
    int64_t ebits;
    const double eps = a.eps;
    std::memcpy(&ebits, &eps, 8);
    sig.insert(sig.end(), {int64_t(a.q), int64_t(a.k), int64_t(a.v), int64_t(a.k_cache),
                           int64_t(a.v_cache), int64_t(a.qn), int64_t(a.kn), ebits, a.H, a.Hkv,
                           a.Dh, a.adjacent, int64_t(a.cs)});
  }

  /// Device copies of the stage taps of one fused launch (kernels.h Tap), each for an output
  /// of n elements: fault noise (f32) and overwrite values uploaded, record space reserved in
  /// tap_mem_; sets tapped and dev[i]. The launch that reads them runs at once, outside any
  /// step graph (the step is flushed here); collect_taps() then brings the records back.
  void stage_taps(std::initializer_list<std::pair<const StageTap*, int64_t>> taps, bool& tapped,
                  cuda::Tap* dev) {
    flush();
    const size_t es = elem_size(ct_);
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
        d.overwrite = upload(encode(ct_, t->overwrite->data(), n), off);
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
  bool stage_qk_taps(const AttentionTaps& t, int H, int Hkv, int Dh, cuda::QkRopeArgs& a) {
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
  void collect_taps() {
    ARB_CUDA(cudaStreamSynchronize(stream_));
    for (const TapRecord& r : records_) {
      std::vector<uint8_t> host(size_t(r.n) * elem_size(ct_));
      ARB_CUDA(cudaMemcpyAsync(host.data(), r.dev, host.size(), cudaMemcpyDeviceToHost, stream_));
      ARB_CUDA(cudaStreamSynchronize(stream_));
      r.dst->resize(size_t(r.n));
      row_to_f64(ct_, host.data(), r.dst->data(), r.n);
    }
    records_.clear();
  }

  void check_act(const Buffer& b, int64_t n, const char* what) const {
    ARB_CHECK(b.ptr != nullptr && b.n >= n, "[cuda] %s: buffer holds %lld elements, needs %lld",
              what, (long long)b.n, (long long)n);
    ARB_CHECK(b.dtype == ct_, "[cuda] %s: buffer dtype %s, the tier computes in %s",
              what, dtype_name(b.dtype), dtype_name(ct_));
  }

  /// Grows a workspace. Queued launches may point at the old block: run them first.
  void ensure(DevBuf& b, size_t bytes) {
    if (b.bytes >= bytes) return;
    flush();
    ARB_CUDA(cudaStreamSynchronize(stream_));
    const size_t want = std::max(bytes, b.bytes * 2);
    ARB_CUDA(cudaFree(b.ptr));
    b = DevBuf{};
    ARB_CUDA(cudaMalloc(&b.ptr, want));
    b.bytes = want;
  }

  void check_summarize(const Buffer& logits, int T, int V, int K) const {
    ARB_CHECK(logits.dtype == DType::F32 && logits.n >= int64_t(T) * V,
              "[cuda] summarize: logits buffer of %lld %s elements for [%d, %d]",
              (long long)logits.n, dtype_name(logits.dtype), T, V);
    ARB_CHECK(K >= 1 && K <= V && K <= cuda::kMaxTopK, "[cuda] summarize: top-k %d outside [1, %d]",
              K, std::min(V, cuda::kMaxTopK));
  }
  /// Queues summarize's kernel for logits rows [T, V] (targets: host ids, or nullptr for
  /// none) into sum_out_: lse f64[T], nonfinite u64[T], target f32[T], top ids i32[T*K], top
  /// values f32[T*K]; returns those device pointers.
  cuda::SummaryOut summarize_on_device(const Buffer& logits, int T, int V, int K,
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
  void embed_ids(const Tensor& table, const int32_t* ids, int T, Buffer& out) {
    stats_.record("embed", "cuda.embed");
    flush();  // an embed starts a new forward
    const DevMat& m = device_matrix(table);
    check_act(out, int64_t(T) * m.cols, "embed out");
    for (int t = 0; ids && t < T; ++t)
      ARB_CHECK(ids[t] >= 0 && ids[t] < m.rows, "[cuda] embed: token id %d outside [0, %lld)",
                ids[t], (long long)m.rows);
    const bool step = T == 1 && tuning_.graphs;
    if (step) {
      step_open_ = true;
      step_uploaded_ = false;
      step_pos_set_ = false;
      seg_pos_uniform_ = true;
      step_pos_ = 0;
      step_id_ = ids ? ids[0] : 0;
      step_id_on_device_ = !ids;
    } else if (ids) {
      ensure(ids_, size_t(T) * sizeof(int32_t));
      ARB_CUDA(cudaMemcpyAsync(ids_.ptr, ids, size_t(T) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    }
    const int32_t* eager_ids = ids ? static_cast<const int32_t*>(ids_.ptr) : d_step_ + 1;
    const void* tp = m.ptr;
    const int64_t ld = m.ld, D = m.cols;
    void* op = out.ptr;
    submit({1, int64_t(tp), ld, D, T, int64_t(op)}, false, 0, [=, this](const StepCtx& c) {
      cuda::launch_embed(ct_, tp, ld, D, step ? c.ids_dev : eager_ids, T, op, stream_);
    });
  }

  /// Runs a launch now, or queues it while a single-token step is open. sig identifies the
  /// launch (all arguments but the position); pos_dep marks launches that read pos0.
  /// advances_pos: the launch adds one to the device position when it runs in a step
  /// (launch_pick).
  void submit(std::vector<int64_t> sig, bool pos_dep, int pos0,
              std::function<void(const StepCtx&)> run, bool advances_pos = false) {
    last_tag_ = sig.empty() ? 0 : sig[0];
    if (!step_open_) {
      run(StepCtx{nullptr, static_cast<const int32_t*>(ids_.ptr)});
      return;
    }
    if (pos_dep) {
      if (!step_pos_set_) {
        step_pos_ = pos0;
        step_pos_set_ = true;
      } else if (pos0 != step_pos_) {
        seg_pos_uniform_ = false;
      }
    }
    sig.insert(sig.begin(), int64_t(sig.size()));
    queue_.push_back(Queued{std::move(sig), std::move(run), advances_pos});
    // A full segment runs now, so the GPU works while the host queues the rest of the step
    // (once the position is known: the first segment uploads it). A step that embeds a pick
    // is queued while the GPU still runs earlier steps, so it runs whole: every segment
    // boundary drains the GPU (H200, synth qwen3-0.6b bf16 decode: 1,616-1,622 against
    // 1,588-1,589 tok/s in segments of 32).
    if (tuning_.graph_segment_ops > 0 && step_pos_set_ && !step_id_on_device_ &&
        int(queue_.size()) >= tuning_.graph_segment_ops)
      run_segment();
  }

  /// Runs the queued single-token step (its last segment) and closes it.
  void flush() {
    if (!step_open_) return;
    step_open_ = false;
    run_segment();
  }

  /// Runs the queued segment of the open step: a replay of a graph captured for the same
  /// signature, a capture (second sighting of the signature), or op by op.
  void run_segment() {
    std::vector<Queued> ops;
    ops.swap(queue_);
    const bool uniform = seg_pos_uniform_;
    seg_pos_uniform_ = true;
    if (ops.empty()) return;
    if (!step_uploaded_) {
      // A picked token is in d_step_[1] already (pick_greedy wrote it there), and the pick
      // of the previous step may have left this step's position in d_step_[0].
      if (!step_id_on_device_ || device_pos_ != step_pos_) {
        // The previous upload of (pos, id) must have been consumed before we rewrite it.
        ARB_CUDA(cudaEventSynchronize(step_ev_));
        h_step_[0] = step_pos_;
        h_step_[1] = step_id_;
        const size_t n = step_id_on_device_ ? 1 : 2;
        ARB_CUDA(cudaMemcpyAsync(d_step_, h_step_, n * sizeof(int), cudaMemcpyHostToDevice,
                                 stream_));
        ARB_CUDA(cudaEventRecord(step_ev_, stream_));
        device_pos_ = step_pos_;
      }
      step_uploaded_ = true;
    }
    const StepCtx ctx{uniform ? d_step_ : nullptr, d_step_ + 1};
    if (uniform)  // the launches that advance the device position get it (ctx.pos_dev)
      for (const Queued& q : ops) device_pos_ += q.advances_pos ? 1 : 0;
    if (!uniform) {
      for (Queued& q : ops) q.run(ctx);
      ++gstats_.eager_steps;
      return;
    }
    std::vector<int64_t> sig;
    for (const Queued& q : ops) sig.insert(sig.end(), q.sig.begin(), q.sig.end());
    for (CachedGraph& g : graphs_)
      if (g.sig == sig) {
        ARB_CUDA(cudaGraphLaunch(g.exec, stream_));
        ++gstats_.replays;
        return;
      }
    if (std::find(seen_sigs_.begin(), seen_sigs_.end(), sig) == seen_sigs_.end()) {
      for (Queued& q : ops) q.run(ctx);
      ++gstats_.eager_steps;
      if (seen_sigs_.size() >= kMaxGraphs) seen_sigs_.pop_front();
      seen_sigs_.push_back(std::move(sig));
      return;
    }
    // Second sighting of this segment: capture it once, then replay.
    cudaGraph_t graph = nullptr;
    ARB_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      for (Queued& q : ops) q.run(ctx);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    ARB_CUDA(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    ARB_CUDA(e);
    if (graphs_.size() >= kMaxGraphs) {
      ARB_CUDA(cudaStreamSynchronize(stream_));
      cudaGraphExecDestroy(graphs_.front().exec);
      graphs_.pop_front();
    }
    graphs_.push_back(CachedGraph{std::move(sig), exec});
    ARB_CUDA(cudaGraphLaunch(exec, stream_));
    ++gstats_.captures;
  }

  const DevMat& device_matrix(const Tensor& t) {
    const WeightKey key = weight_key(t);
    auto it = mats_.find(key);
    if (it != mats_.end()) return it->second;
    ARB_CHECK(!t.empty() && t.shape.size() <= 2, "[cuda] weight '%s': expected a matrix",
              t.name.c_str());
    DevMat m;
    m.rows = t.rows();
    m.cols = t.cols();
    const int64_t align = int64_t(16 / cuda::ctype_size(ct_));
    m.ld = (m.cols + align - 1) / align * align;
    DType st;
    const void* src = upload_raw(t, st);
    ARB_CUDA(cudaMalloc(&m.ptr, size_t(m.rows * m.ld) * cuda::ctype_size(ct_)));
    cuda::launch_convert_matrix(st, src, m.rows, m.cols, ct_, m.ptr, m.ld, stream_);
    ARB_CUDA(cudaStreamSynchronize(stream_));
    return mats_.emplace(key, m).first->second;
  }

  const DevVec& device_vector(const Tensor& t) {
    const WeightKey key = weight_key(t);
    auto it = vecs_.find(key);
    if (it != vecs_.end()) return it->second;
    ARB_CHECK(!t.empty(), "[cuda] weight '%s' is missing", t.name.c_str());
    DevVec v;
    v.n = t.numel();
    DType st;
    const void* src = upload_raw(t, st);
    ARB_CUDA(cudaMalloc(&v.ptr, size_t(v.n) * sizeof(float)));
    cuda::launch_convert_vector(st, src, v.n, v.ptr, stream_);
    ARB_CUDA(cudaStreamSynchronize(stream_));
    return vecs_.emplace(key, v).first->second;
  }

  /// Copies a weight's bytes to the staging block (f64 is widened to f32 on the host first;
  /// every other storage type is converted on the device).
  const void* upload_raw(const Tensor& t, DType& st) {
    std::vector<float> widened;
    const void* src = t.data;
    size_t bytes = t.nbytes();
    switch (t.dtype) {
      case DType::F32: st = DType::F32; break;
      case DType::F16: st = DType::F16; break;
      case DType::BF16: st = DType::BF16; break;
      case DType::Q8_0:
        ARB_CHECK(t.cols() % kQ8BlockSize == 0,
                  "[cuda] weight '%s': Q8_0 rows of %lld values (need a multiple of 32)",
                  t.name.c_str(), (long long)t.cols());
        st = DType::Q8_0;
        break;
      case DType::F64:
        widened.resize(size_t(t.numel()));
        row_to_f32(DType::F64, t.data, widened.data(), t.numel());
        src = widened.data();
        bytes = widened.size() * sizeof(float);
        st = DType::F32;
        break;
    }
    if (staging_.bytes < bytes) {
      ARB_CUDA(cudaStreamSynchronize(stream_));
      ARB_CUDA(cudaFree(staging_.ptr));
      staging_ = DevBuf{};
      ARB_CUDA(cudaMalloc(&staging_.ptr, bytes));
      staging_.bytes = bytes;
    }
    ARB_CUDA(cudaMemcpyAsync(staging_.ptr, src, bytes, cudaMemcpyHostToDevice, stream_));
    ARB_CUDA(cudaStreamSynchronize(stream_));  // widened (if any) dies at return
    return staging_.ptr;
  }

  /// (cos, sin) of pos * inv_freq[i] for positions [0, P): angles and their cos/sin in f64
  /// on the host (the oracle's own angles), rounded once to f32. Computing pos * inv_freq in
  /// f32 on the device instead would put an angle error of up to pos * 2^-24 rad into every
  /// rotation (0.1 mrad at position 4096), far above f32 rounding of cos and sin.
  void ensure_rope_table(const RopeSpec& rope, int positions) {
    if (rope == rope_key_ && positions <= rope_positions_) return;
    int P = rope == rope_key_ ? rope_positions_ : 0;
    P = std::max({positions, 2 * P, 1024});
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
    ARB_CUDA(cudaFree(rope_cs_.ptr));
    rope_cs_ = DevBuf{};
    ARB_CUDA(cudaMalloc(&rope_cs_.ptr, cs.size() * sizeof(float)));
    rope_cs_.bytes = cs.size() * sizeof(float);
    ARB_CUDA(cudaMemcpyAsync(rope_cs_.ptr, cs.data(), rope_cs_.bytes, cudaMemcpyHostToDevice,
                             stream_));
    ARB_CUDA(cudaStreamSynchronize(stream_));
    rope_key_ = rope;
    rope_positions_ = P;
  }

  /// cuBLASLt plan for out[T, N] = x[T, K] @ W[N, K]^T, in column-major terms
  /// D[N, T] = op(A = W stored K x N, ld)^T @ B (= x, K x T). Compute type CUBLAS_COMPUTE_32F
  /// (true f32 for f32 inputs: no TF32), f32 scale; split-K reductions only in f32.
  const GemmPlan& gemm_plan(int T, int N, int K, int64_t ld, DType out_t) {
    const auto key = std::make_tuple(T, N, K, ld, int(out_t));
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
    ARB_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, cuda_t(out_t), uint64_t(N), uint64_t(T), N));
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

  int device_;
  DType ct_;
  std::string name_;
  // provider names of --stats, built once (ops run ~170 times per decode step)
  std::string prov_gemv_, prov_gemm_, prov_norm_gemv_, prov_norm_swiglu_, prov_gemv_add_;
  int sm_count_ = 1, sm_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  unsigned* counters_ = nullptr;  // decode attention's tickets (kDecodeCounterWords)
  CudaTuning tuning_;
  CudaGraphStats gstats_;

  std::unordered_map<WeightKey, DevMat, WeightKeyHash> mats_;
  std::unordered_map<WeightKey, DevVec, WeightKeyHash> vecs_;
  std::map<std::tuple<int, int, int, int64_t, int>, GemmPlan> plans_;
  DevBuf staging_, ids_, part_, acc_, rope_cs_, sum_out_, sum_scratch_, targets_, tap_mem_;
  struct TapRecord {
    std::vector<double>* dst;
    const void* dev;
    int64_t n;
  };
  std::vector<TapRecord> records_;  // of the latest stage_taps
  RopeSpec rope_key_{-1, 0.0, {}, RopeLayout::Half};  // what rope_cs_ holds (dims -1: none)
  int rope_positions_ = 0;

  // single-token step state
  bool step_open_ = false, step_uploaded_ = false, step_pos_set_ = false;
  bool seg_pos_uniform_ = true;  // every position-dependent op of the segment at step_pos_
  int step_pos_ = 0, step_id_ = 0;
  std::vector<Queued> queue_;
  std::deque<std::vector<int64_t>> seen_sigs_;  // segments seen (captured on a second sighting)
  std::deque<CachedGraph> graphs_;
  bool step_id_on_device_ = false;  // the open step embeds the latest pick
  static constexpr int64_t kTagNormSwiglu = 21;  // rmsnorm_swiglu's signature tag
  int64_t last_tag_ = 0;  // the signature tag of the latest launch submitted (matmul_add)
  static constexpr int kPickSlots = 64;
  int32_t* h_picks_ = nullptr;  // pinned and mapped, a slot per pick not taken
  int32_t* d_picks_ = nullptr;  // h_picks_ as the device sees it
  cuda::PickState* pick_state_ = nullptr;
  cudaEvent_t pick_ev_[kPickSlots] = {};
  std::deque<int> pending_picks_;  // slots, oldest first
  int next_pick_slot_ = 0;
  bool has_pick_ = false;
  int* h_step_ = nullptr;  // pinned (pos, id)
  int* d_step_ = nullptr;
  int device_pos_ = -1;  // what d_step_[0] holds once the queued work has run (-1: unknown)
  cudaEvent_t step_ev_ = nullptr;
};

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
    throw Error(strformat("[cuda] no CUDA device (cudaGetDeviceCount: %s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
  }
  ARB_CHECK(device >= 0 && device < count, "[cuda] device cuda:%d does not exist (%d device%s)",
            device, count, count == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(device, ct);
}

CudaGraphStats cuda_graph_stats(const Backend& be) { return as_cuda(be).graph_stats(); }
CudaTuning cuda_tuning(const Backend& be) { return as_cuda(be).tuning(); }
void cuda_set_tuning(Backend& be, const CudaTuning& t) { as_cuda(be).set_tuning(t); }

}  // namespace arbiter
