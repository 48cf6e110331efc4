// The fast CPU tier: f32 activations, SIMD kernels (kernels.h) on a persistent thread pool.
// This file dispatches each op to the kernel of the configured ISA and records the provider
// that served it ("cpu.gemv_bf16_avx512", "cpu.gemm_f32_blas", "cpu.attention_avx512", ...).
// Weights are read in their storage dtype (see kernels.h for why they are not widened), from
// huge-page copies of the file's bytes by default (CpuOptions::hugepage_weights).
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/probes.h"
#include "backend/cpu/ssm.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "backend/rope.h"

namespace arbiter::cpu {

const char* gemm_impl_name(GemmImpl g) { return g == GemmImpl::Own ? "own" : "blas"; }

// The own kernel is the default: its determinism rests on our code alone (one FMA chain per
// element), not on OpenBLAS internals. bench/README.md has the own-vs-OpenBLAS numbers;
// ARBITER_CPU_GEMM=blas selects OpenBLAS.
GemmImpl default_gemm_impl() { return GemmImpl::Own; }

namespace {

float* f32(const Buffer& b) { return static_cast<float*>(b.ptr); }

// Below these sizes an op runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelElems = 1 << 15;
constexpr int64_t kElemChunk = 1 << 14;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& o)
      : pool_(o.threads), isa_(o.isa), gemm_(o.gemm), hugepage_weights_(o.hugepage_weights),
        act_quant_(o.act_quant), bf16_dot_(o.bf16_dot) {
    const auto& isas = available_isas();
    ARB_CHECK(std::find(isas.begin(), isas.end(), isa_) != isas.end(),
              "[cpu] ISA %s is not compiled in or not supported by this CPU", isa_name(isa_));
    if (gemm_ == GemmImpl::Blas) blas_pin_single_thread();
    rows_ = &row_kernels(isa_);
    suffix_ = std::string("_") + isa_name(isa_);
  }

  ~CpuBackend() override {
    for (const auto& a : arenas_) munmap(a.first, a.second);
  }

  std::string device_name() const override { return "cpu"; }

  // Huge-page copies of the large weights (CpuOptions::hugepage_weights). A Session calls
  // this once per sequence: a tensor whose copy still holds its bytes is kept. The bytes are
  // compared, not only the address, because a model loaded after another one was freed
  // can be mapped at the same address.
  void prepare(const Prepare& p) override {
    for (const WeightUse& u : p.weights) {
      if (act_quant_ && qgemm_kernel(isa_, u.tensor->dtype, u.tensor->cols())) int8_gemm_ = true;
      if (x_form(*u.tensor) == kXBf16) bf16_gemm_ = true;
    }
    if (!hugepage_weights_) return;
    constexpr size_t kMinBytes = size_t(256) << 10, kAlign = 64, kHuge = size_t(2) << 20;
    std::vector<const Tensor*> todo;
    size_t total = 0;
    for (const WeightUse& u : p.weights) {
      const Tensor* t = u.tensor;
      if (t->nbytes() < kMinBytes) continue;
      auto it = copies_.find(t->data);
      if (it != copies_.end() &&
          (it->second.ptr == nullptr ||  // tied tensors share data: queued once
           (it->second.bytes == t->nbytes() && std::memcmp(it->second.ptr, t->data, t->nbytes()) == 0)))
        continue;
      copies_[t->data] = Copy{nullptr, t->nbytes()};
      todo.push_back(t);
      total += (t->nbytes() + kAlign - 1) / kAlign * kAlign;
    }
    if (todo.empty()) return;
    const size_t bytes = (total + kHuge - 1) / kHuge * kHuge + kHuge;  // + slack to align
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ARB_CHECK(mem != MAP_FAILED, "[cpu] cannot map %zu bytes for huge-page weight copies (%s); "
              "ARBITER_CPU_WEIGHTS=mmap reads the file mapping instead", bytes, std::strerror(errno));
    arenas_.emplace_back(mem, bytes);
    auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + kHuge - 1) / kHuge * kHuge);
    madvise(base, bytes - kHuge, MADV_HUGEPAGE);
    std::vector<uint8_t*> dst(todo.size());
    size_t off = 0;
    for (size_t i = 0; i < todo.size(); ++i) {
      dst[i] = base + off;
      copies_[todo[i]->data].ptr = dst[i];
      off += (todo[i]->nbytes() + kAlign - 1) / kAlign * kAlign;
    }
    // After each copy the source's pages, touched only by the copy, are handed back with
    // MADV_PAGEOUT, so the weights stay resident once. PAGEOUT reclaims (a file page is
    // read again if touched) and never discards, so memory that is no file mapping loses
    // nothing; the range is widened to whole pages, which can only cost a re-read.
    pool_.parallel_for_dynamic(int64_t(todo.size()), int64_t(todo.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const Tensor& t = *todo[size_t(i)];
        std::memcpy(dst[size_t(i)], t.data, t.nbytes());
        const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data) / 4096 * 4096;
        const uintptr_t hi = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes() + 4095) / 4096 * 4096;
        madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_PAGEOUT);
      }
    });
  }

  // The f32 FMA peak of this tier's ISA on all of its threads: what its GEMM could reach;
  // the 8-bit dot peak (4x) or the bf16 pair-dot peak (2x) once a model with weights for the
  // integer or the bf16 GEMM was prepared: its prefill runs partly on those, and only the
  // highest peak among its instructions bounds it.
  std::vector<double> peak_gflops(int passes, std::string* source) override {
    if (int8_gemm_) {
      if (source) *source = int8_probe_source(isa_, pool_.size(), passes);
      return measure_int8_gops(isa_, pool_.size(), passes);
    }
    if (bf16_gemm_) {
      if (source) *source = bf16_dot_probe_source(pool_.size(), passes);
      return measure_bf16_dot_gflops(pool_.size(), passes);
    }
    if (source) *source = fma_probe_source(isa_, pool_.size(), passes);
    return measure_fma_gflops(isa_, pool_.size(), passes);
  }
  DType compute() const override { return DType::F32; }

  Buffer alloc(int64_t n, bool logits) override {
    ARB_CHECK(n >= 0, "[cpu] alloc of %lld elements", (long long)n);
    // Large buffers (KV cache, scratch) get 2 MiB alignment and transparent huge pages:
    // streaming reads from 4 KiB pages reach about half the bandwidth on the dev machine.
    const size_t bytes = std::max<size_t>(size_t(n) * sizeof(float), 64);
    const size_t align = bytes >= (size_t(2) << 20) ? (size_t(2) << 20) : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    ARB_CHECK(p != nullptr, "[cpu] out of memory allocating %zu bytes", rounded);
    if (align > 64) madvise(p, rounded, MADV_HUGEPAGE);
    std::memset(p, 0, rounded);
    Buffer b;
    b.ptr = p;
    b.n = n;
    b.dtype = DType::F32;
    return b;
  }
  void free(Buffer& b) override {
    std::free(b.ptr);
    b = Buffer{};
  }
  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override {
    ARB_ASSERT(off >= 0 && off + n <= b.n);
    for (int64_t i = 0; i < n; ++i) dst[i] = f32(b)[off + i];
  }
  void write(Buffer& b, int64_t off, int64_t n, const double* src) override {
    ARB_ASSERT(off >= 0 && off + n <= b.n);
    for (int64_t i = 0; i < n; ++i) f32(b)[off + i] = float(src[i]);
  }

  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override {
    const int64_t V = table.rows(), D = table.cols();
    ARB_ASSERT(out.n >= T * D);
    for (int t = 0; t < T; ++t)
      ARB_CHECK(ids[t] >= 0 && ids[t] < V, "[cpu] embed: token id %d out of range [0, %lld)",
                ids[t], (long long)V);
    WidenFn widen = widen_kernel(isa_, table.dtype);
    if (widen) {
      stats_.record("embed", std::string("cpu.embed_") + dtype_name(table.dtype) + suffix_);
      for (int t = 0; t < T; ++t) widen(table.row(ids[t]), f32(out) + t * D, D);
    } else {
      stats_.record_fallback("embed", "cpu.embed_generic");
      for (int t = 0; t < T; ++t) row_to_f32(table.dtype, table.row(ids[t]), f32(out) + t * D, D);
    }
  }

  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps,
               Buffer& out) override {
    stats_.record("rmsnorm", "cpu.rmsnorm" + suffix_);
    ARB_ASSERT(w.numel() == N && x.n >= int64_t(R) * N && out.n >= int64_t(R) * N);
    widen_small(w, wbuf_);
    norm_rows(x, R, N, eps, out);
  }

  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T,
              Buffer& out) override {
    const int64_t N = W.rows(), K = W.cols();
    ARB_ASSERT(x.n >= T * K && out.n >= T * N && x.ptr != out.ptr);
    check_columns(W);
    ARB_ASSERT(!bias || bias->numel() == N);
    begin_input_rounding();
    GemvFn gemv = gemv_kernel(isa_, W.dtype);
    if (gemv && T == 1 && !row_invariant_) {
      const MatmulTarget one{&W, bias, &out, nullptr};
      return gemv_group(f32(x), K, &one, 1);
    }
    const std::string dt = dtype_name(W.dtype);
    const void* wdata = weight_data(W);
    const float* bp = nullptr;
    if (bias) {
      widen_small(*bias, bias_buf_[0]);
      bp = bias_buf_[0].data();
    }
    if (!gemv) return matmul_generic(x, W, bp, T, out);
    GemmProblem p;
    p.x = f32(x);
    p.W = wdata;
    p.wtype = W.dtype;
    p.bias = bp;
    p.out = f32(out);
    p.T = T;
    p.N = N;
    p.K = K;
    // T > 1 (or row-invariant) on bf16 weights: x rounded to bf16 as a decode step rounds it.
    if (x_form(W) == kXBf16) {
      round_x_bf16(p.x, T, K, wdata, N);
      stats_.record("matmul", "cpu.gemm_bf16_bf16" + suffix_);
      return gemm_bf16_dot(xb_.data(), p, pool_);
    }
    // T > 1 (or row-invariant) on weights with an integer GEMM: every token's x quantized as
    // a decode step quantizes it (CpuOptions::act_quant).
    QGemmFn qgemm = act_quant_ ? qgemm_kernel(isa_, W.dtype, K) : nullptr;
    if (qgemm) {
      const float* xp = f32(x);
      float* yp = f32(out);
      quantize_x(xp, T, K, act_q8_block(W.dtype), W.dtype, wdata, N);
      pack_act_q8(xq_rows_.data(), T, xq_panels_);
      stats_.record("matmul", "cpu.gemm_" + dt + "_q8" + suffix_);
      // Chunks of whole row tiles: any split gives the same out (kernels.h).
      const int64_t tiles = (N + kQGemmRows - 1) / kQGemmRows;
      pool_.parallel_for_dynamic(tiles, int64_t(pool_.size()) * 8, [&](int64_t a, int64_t b) {
        const int64_t n0 = a * kQGemmRows, n1 = std::min(N, b * kQGemmRows);
        qgemm(wdata, N, K, xq_panels_, yp, n0, n1);
        if (bp)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = n0; n < n1; ++n) yp[t * N + n] += bp[n];
      });
      return;
    }
    // Row invariance: OpenBLAS's result for a row may depend on T (its kernel choice), the own
    // kernel's never does (one FMA chain per element, kernels.h).
    if (gemm_ == GemmImpl::Blas && !row_invariant_) {
      stats_.record("matmul", "cpu.gemm_" + dt + "_blas");
      gemm_blas(isa_, p, pool_);
    } else {
      stats_.record("matmul", "cpu.gemm_" + dt + suffix_);
      gemm_own(isa_, p, pool_);
    }
  }

  // rmsnorm_matmul's and rmsnorm_glu's projections: at T == 1 one gemv_group, unless a tap,
  // the input-rounding measure (drift, opcheck: per matmul), or a mix of kernels that
  // quantize x differently asks for the matmuls one by one.
  void matmuls(const Buffer& x, int T, const MatmulTarget* outs, int n_outs) override {
    bool group = T == 1 && !row_invariant_ && !measure_input_rounding_;
    const int form = group ? x_form(*outs[0].W) : 0;
    for (int i = 0; group && i < n_outs; ++i) {
      const Tensor& W = *outs[i].W;
      ARB_ASSERT(W.cols() == outs[0].W->cols());
      group = !outs[i].tap && gemv_kernel(isa_, W.dtype) && x_form(W) == form;
    }
    if (!group) return Backend::matmuls(x, T, outs, n_outs);
    begin_input_rounding();
    for (int i = 0; i < n_outs; ++i) check_columns(*outs[i].W);
    gemv_group(f32(x), outs[0].W->cols(), outs, n_outs);
  }

  // The form a matmul of W takes x in: f32 (0), 8-bit codes in blocks of 32 or 256 (the
  // integer kernels', CpuOptions::act_quant), or bf16 (kXBf16: gemv_bf16_dot and
  // gemm_bf16_dot, CpuOptions::bf16_dot). matmuls groups targets of one form: x is converted
  // once.
  static constexpr int kXBf16 = -1;
  int x_form(const Tensor& W) const {
    if (W.dtype == DType::BF16) return bf16_dot_ && W.cols() % 2 == 0 && bf16_dot(isa_) ? kXBf16 : 0;
    return act_quant_ && qgemv_kernel(isa_, W.dtype) ? act_q8_block(W.dtype) : 0;
  }

  struct GemvJob {  // a target's kernel and rows [row0, row0 + N) of the region
    const void* w;
    GemvFn gemv;
    QGemvFn qgemv;
    bool xbf16;  // gemv_bf16_dot on x rounded to bf16
    const float* bias;
    float* y;
    int64_t row0, N;
  };
  // T == 1: outs[i].out = x @ W_i^T (+ bias_i) for each target, every kernel known to exist,
  // the rows of all targets in one parallel region (claimed chunks, 8 a thread: a thread
  // whose core the host takes away holds up at most one small chunk), so the workers are
  // woken and waited for once. Block formats with an integer kernel use x quantized to 8 bits
  // (CpuOptions::act_quant), bf16 weights x rounded to bf16 (CpuOptions::bf16_dot), once for
  // all targets (matmuls groups only targets of one x_form). Any split gives each row the
  // same bits (kernels.h).
  void gemv_group(const float* xp, int64_t K, const MatmulTarget* outs, int n) {
    std::vector<GemvJob>& jobs = gemv_jobs_;
    jobs.resize(size_t(n));
    if (bias_buf_.size() < size_t(n)) bias_buf_.resize(size_t(n));
    int64_t rows = 0;
    for (int i = 0; i < n; ++i) {
      const MatmulTarget& o = outs[i];
      const Tensor& W = *o.W;
      const bool has_bias = o.bias && !o.bias->empty();
      if (has_bias) widen_small(*o.bias, bias_buf_[size_t(i)]);
      const int form = x_form(W);
      GemvJob& j = jobs[size_t(i)];
      j = {weight_data(W), gemv_kernel(isa_, W.dtype),
           form > 0 ? qgemv_kernel(isa_, W.dtype) : nullptr, form == kXBf16,
           has_bias ? bias_buf_[size_t(i)].data() : nullptr, f32(*o.out), rows, W.rows()};
      const std::string dt = dtype_name(W.dtype);
      if (j.qgemv) {
        if (i == 0) quantize_x(xp, 1, K, form, W.dtype, j.w, j.N);
        stats_.record("matmul", "cpu.gemv_" + dt + "_q8" + suffix_);
      } else if (j.xbf16) {
        if (i == 0) round_x_bf16(xp, 1, K, j.w, j.N);
        stats_.record("matmul", "cpu.gemv_bf16_bf16" + suffix_);
      } else {
        stats_.record("matmul", "cpu.gemv_" + dt + suffix_);
      }
      rows += j.N;
    }
    auto body = [&](int64_t r0, int64_t r1) {
      for (const GemvJob& j : jobs) {
        const int64_t n0 = std::max(r0, j.row0) - j.row0;
        const int64_t n1 = std::min(r1, j.row0 + j.N) - j.row0;
        if (n0 >= n1) continue;
        if (j.qgemv) j.qgemv(j.w, K, xq_rows_[0], j.y, n0, n1);
        else if (j.xbf16) gemv_bf16_dot(j.w, K, xb_.data(), j.y, n0, n1);
        else j.gemv(j.w, K, xp, j.y, n0, n1);
        if (j.bias)
          for (int64_t r = n0; r < n1; ++r) j.y[r] += j.bias[r];
      }
    };
    if (rows * K >= kParallelElems) pool_.parallel_for_dynamic(rows, int64_t(pool_.size()) * 8, body);
    else body(0, rows);
  }

  void check_columns(const Tensor& W) const {
    ARB_CHECK(W.cols() % block_elems(W.dtype) == 0,
              "[cpu] matmul: %s tensor '%s' has %lld columns (expected a multiple of %d)",
              dtype_name(W.dtype), W.name.c_str(), (long long)W.cols(), block_elems(W.dtype));
  }

  // The integer kernels' input: x's T rows quantized to 8-bit codes in blocks of `block`
  // (xq_rows_), named for the trace header, and while drift or opcheck measure
  // (measure_input_rounding_) the squared error each row's codes add to each of its N
  // outputs of W (act_q8_rounding).
  void quantize_x(const float* xp, int64_t T, int64_t K, int block, DType wt, const void* wdata, int64_t N) {
    if (int64_t(xq_rows_.size()) < T) xq_rows_.resize(size_t(T));
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quantize_act_q8(xp + t * K, K, block, xq_rows_[size_t(t)]);
    });
    stats_.record_act_quant(act_q8_name(block));
    if (!measure_input_rounding_) return;
    input_rounding_.resize(size_t(T * N));
    pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
      for (int64_t t = 0; t < T; ++t)
        act_q8_rounding(wt, wdata, K, xq_rows_[size_t(t)], input_rounding_.data() + t * N + n0, n0, n1);
    });
  }

  // x's T rows rounded to bf16 for the bf16 dot kernels (xb_), named for the trace header,
  // and while drift or opcheck measure, the squared error the rounding adds to each of the N
  // outputs of W (act_bf16_rounding).
  void round_x_bf16(const float* xp, int64_t T, int64_t K, const void* wdata, int64_t N) {
    xb_.resize(size_t(T * K));
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      round_act_bf16(xp + t0 * K, (t1 - t0) * K, xb_.data() + t0 * K);
    });
    stats_.record_act_quant("bf16");
    if (!measure_input_rounding_) return;
    input_rounding_.resize(size_t(T * N));
    pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
      for (int64_t t = 0; t < T; ++t)
        act_bf16_rounding(wdata, K, xp + t * K, xb_.data() + t * K, input_rounding_.data() + t * N + n0, n0, n1);
    });
  }

  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) override {
    stats_.record("rope", "cpu.rope");
    ARB_ASSERT(Dh % 2 == 0 && x.n >= int64_t(T) * nh * Dh);
    const int half = Dh / 2;
    ARB_CHECK(rope.dims == Dh, "[cpu] rope: heads of %d, RoPE of %d dimensions", Dh, rope.dims);
    std::vector<double> inv = rope_inv_freq(rope);
    // cos/sin per (position, i) computed once in f64 and rounded to f32; q and k of one
    // layer ask for the same table, so it is kept until the positions or frequencies change.
    if (rope_pos0_ != pos0 || rope_T_ < T || rope_inv_ != inv) {
      rope_cos_.resize(size_t(T) * half);
      rope_sin_.resize(size_t(T) * half);
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
          const double angle = double(pos0 + t) * inv[size_t(i)];
          rope_cos_[size_t(t) * half + i] = float(std::cos(angle));
          rope_sin_[size_t(t) * half + i] = float(std::sin(angle));
        }
      rope_pos0_ = pos0;
      rope_T_ = T;
      rope_inv_ = std::move(inv);
    }
    float* xp = f32(x);
    const bool adjacent = rope.layout == RopeLayout::Adjacent;
    auto body = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* c = rope_cos_.data() + t * half;
        const float* s = rope_sin_.data() + t * half;
        for (int h = 0; h < nh; ++h) {
          float* head = xp + (t * nh + h) * Dh;
          if (adjacent) {
            for (int i = 0; i < half; ++i) {
              const float xa = head[2 * i], xb = head[2 * i + 1];
              head[2 * i] = xa * c[i] - xb * s[i];
              head[2 * i + 1] = xb * c[i] + xa * s[i];
            }
          } else {
            float* a = head;
            float* b = head + half;
            for (int i = 0; i < half; ++i) {
              const float xa = a[i], xb = b[i];
              a[i] = xa * c[i] - xb * s[i];
              b[i] = xb * c[i] + xa * s[i];
            }
          }
        }
      }
    };
    if (int64_t(T) * nh * Dh >= kParallelElems) pool_.parallel_for(T, body);
    else body(0, T);
  }

  void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T,
                int pos0, int kv_dim) override {
    stats_.record("kv_store", "cpu.kv_store");
    const int rows = kv_cache_rows(k_cache, v_cache, kv_dim);
    ARB_CHECK(T <= rows, "[cpu] kv_store: %d rows into a cache of %d", T, rows);
    ARB_ASSERT(k.n >= int64_t(T) * kv_dim && v.n >= int64_t(T) * kv_dim);
    // At most two runs of rows: up to the ring's end, then from its start.
    for (int t = 0; t < T;) {
      const int row = (pos0 + t) % rows, n = std::min(T - t, rows - row);
      const int64_t at = int64_t(row) * kv_dim, from = int64_t(t) * kv_dim;
      std::memcpy(f32(k_cache) + at, f32(k) + from, sizeof(float) * size_t(n) * kv_dim);
      std::memcpy(f32(v_cache) + at, f32(v) + from, sizeof(float) * size_t(n) * kv_dim);
      t += n;
    }
  }

  void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
                 int H, int Hkv, int Dh, int window, Buffer& out) override {
    stats_.record("attention", "cpu.attention" + suffix_);
    attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, 1.0 / std::sqrt(double(Dh)), 0, out);
  }

  void kv_store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                      const KvPages& pages, int T, int pos0, int kv_dim) override {
    stats_.record("kv_store", "cpu.kv_store_paged");
    check_kv_pages(k_pool, v_pool, kv_dim, pages, pos0 + T, "cpu");
    ARB_ASSERT(k.n >= int64_t(T) * kv_dim && v.n >= int64_t(T) * kv_dim);
    const size_t bytes = sizeof(float) * size_t(kv_dim);
    for (int t = 0; t < T; ++t) {
      const int64_t at = pages.row(pos0 + t) * kv_dim, from = int64_t(t) * kv_dim;
      std::memcpy(f32(k_pool) + at, f32(k) + from, bytes);
      std::memcpy(f32(v_pool) + at, f32(v) + from, bytes);
    }
  }

  void attention_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                       const KvPages& pages, int T, int pos0, int H, int Hkv, int Dh, int window,
                       const AttentionScores& scores, Buffer& out) override {
    const bool plain = scores.scale == 0 && scores.softcap == 0;
    stats_.record(plain ? "attention" : "scaled_attention", "cpu.attention_paged" + suffix_);
    check_kv_pages(k_pool, v_pool, Hkv * Dh, pages, pos0 + T, "cpu");
    attend(q, k_pool, v_pool, T, pos0, H, Hkv, Dh, window,
           plain ? 1.0 / std::sqrt(double(Dh)) : scores.scale, scores.softcap, out, &pages);
  }

  // The default's arithmetic (each row normalised, rotated and stored as alone; each (head,
  // token) unit attended by the same kernel), with one pool wake for every sequence's
  // attention units instead of one per sequence and layer (64 streams: 64 per layer).
  void attention_batch(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                       const Tensor* k_norm, NormWeight nw, double eps, int H, int Hkv, int Dh,
                       const RopeSpec* rope, Buffer& k_pool, Buffer& v_pool,
                       const std::vector<PagedSeq>& seqs, int window,
                       const AttentionScores& scores, Buffer& out) override {
    ARB_CHECK(Hkv > 0 && H % Hkv == 0, "[cpu] attention_batch: H %d, Hkv %d", H, Hkv);
    ARB_ASSERT(rope || (!q_norm && !k_norm));
    const int q_dim = H * Dh, kv_dim = Hkv * Dh;
    int rows = 0;
    for (const PagedSeq& sq : seqs) {
      ARB_CHECK(sq.row0 == rows && sq.T >= 1, "[cpu] attention_batch: sequence rows out of order");
      rows += sq.T;
    }
    if (q_norm) norm(q, *q_norm, nw, rows * H, Dh, eps, q);
    if (k_norm) norm(k, *k_norm, nw, rows * Hkv, Dh, eps, k);
    const bool plain = scores.scale == 0 && scores.softcap == 0;
    stats_.record(plain ? "attention" : "scaled_attention", "cpu.attention_paged" + suffix_);
    std::vector<AttentionArgs> args;
    std::vector<int64_t> first_unit;  // of each sequence, in one numbering
    int64_t units = 0;
    for (const PagedSeq& sq : seqs) {
      Buffer qv = buffer_view(q, int64_t(sq.row0) * q_dim, int64_t(sq.T) * q_dim);
      Buffer kv = buffer_view(k, int64_t(sq.row0) * kv_dim, int64_t(sq.T) * kv_dim);
      const Buffer vv = buffer_view(v, int64_t(sq.row0) * kv_dim, int64_t(sq.T) * kv_dim);
      if (rope) {
        this->rope(qv, sq.T, H, Dh, sq.pos0, *rope);
        this->rope(kv, sq.T, Hkv, Dh, sq.pos0, *rope);
      }
      kv_store_paged(kv, vv, k_pool, v_pool, sq.pages, sq.T, sq.pos0, kv_dim);
      Buffer ov = buffer_view(out, int64_t(sq.row0) * q_dim, int64_t(sq.T) * q_dim);
      const AttentionArgs a =
          attention_args(qv, k_pool, v_pool, sq.T, sq.pos0, H, Hkv, Dh, window,
                         plain ? 1.0 / std::sqrt(double(Dh)) : scores.scale, scores.softcap, ov,
                         &sq.pages);
      args.push_back(a);
      first_unit.push_back(units);
      units += int64_t(H) * sq.T;
    }
    pool_.parallel_for(units, [&](int64_t u0, int64_t u1) {
      size_t i = size_t(std::upper_bound(first_unit.begin(), first_unit.end(), u0) - first_unit.begin()) - 1;
      for (; i < args.size() && first_unit[i] < u1; ++i) {
        const int64_t base = first_unit[i], end = base + int64_t(H) * args[i].T;
        rows_->attention(args[i], std::max(u0, base) - base, std::min(u1, end) - base);
      }
    });
  }

  void set_row_invariant(bool on) override { row_invariant_ = on; }

  void scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                        int pos0, int H, int Hkv, int Dh, int window, double scale,
                        double softcap, Buffer& out) override {
    stats_.record("scaled_attention", "cpu.attention" + suffix_);
    attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, scale, softcap, out);
  }

  void rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps,
                  Buffer& out) override {
    stats_.record("rmsnorm_1p", "cpu.rmsnorm_1p" + suffix_);
    ARB_ASSERT(w.numel() == N && x.n >= int64_t(R) * N && out.n >= int64_t(R) * N);
    widen_small(w, wbuf_);
    for (float& v : wbuf_) v += 1.f;  // in f32, as HF's (1.0 + self.weight.float())
    norm_rows(x, R, N, eps, out);
  }

  // Scalar loops: gemma's element-wise ops are a small share of a forward (the matmuls
  // dominate); SIMD versions would follow swiglu's in row_ops.cpp.
  void geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("geglu", "cpu.geglu");
    ARB_ASSERT(gate.n >= n && up.n >= n && out.n >= n);
    const float *g = f32(gate), *u = f32(up);
    float* o = f32(out);
    const float c = float(std::sqrt(2.0 / 3.14159265358979323846));
    elementwise(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        o[i] = 0.5f * g[i] * (1.f + std::tanh(c * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
    });
  }

  void ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C, int K,
                Buffer& state, Buffer& out) override {
    stats_.record("ssm_conv", "cpu.ssm_conv");
    ARB_ASSERT(w.numel() == int64_t(C) * K && (!bias || bias->numel() == C) && K >= 1);
    ARB_ASSERT(x.n >= int64_t(T) * C && out.n >= int64_t(T) * C && state.n >= int64_t(K - 1) * C);
    widen_small(w, wbuf_);
    if (bias) widen_small(*bias, bias_buf_[0]);
    ssm_conv_f32(f32(x), wbuf_.data(), bias ? bias_buf_[0].data() : nullptr, T, C, K, f32(state),
                 f32(out));
  }

  void ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log, const Tensor& D,
                const Tensor& dt_bias, double dt_min, double dt_max, int T, int nh, int hd, int G,
                int N, int chunk, Buffer& state, Buffer& y) override {
    ARB_ASSERT(nh % G == 0 && A_log.numel() == nh && D.numel() == nh && dt_bias.numel() == nh);
    ARB_ASSERT(chunk >= 1);
    std::vector<float> a_log, d, db;
    widen_small(A_log, a_log);
    widen_small(D, d);
    widen_small(dt_bias, db);
    ScanArgs a;
    a.xbc = f32(xbc);
    a.dt_raw = f32(dt_raw);
    a.a_log = a_log.data();
    a.d = d.data();
    a.dt_bias = db.data();
    a.dt_min = dt_min;
    a.dt_max = dt_max;
    a.T = T;
    a.nh = nh;
    a.hd = hd;
    a.G = G;
    a.N = N;
    a.chunk = chunk;
    a.state = f32(state);
    a.y = f32(y);
    // The decode step runs the recurrence; a prefill the chunked form, as HF does (backend.h).
    // Row-invariant (continuous batching): the recurrence at every T, since the chunked
    // form's sums depend on where a prefill's chunks start, which the batch decides.
    if (T == 1 || row_invariant_) {
      stats_.record("ssm_scan", "cpu.ssm_scan");
      ssm_scan_f32(a, pool_);
    } else {
      stats_.record("ssm_scan", "cpu.ssm_scan_chunked" + suffix_);
      ssm_scan_chunked_f32(isa_, a, pool_);
    }
  }

  void rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W, int group,
                     double eps, Buffer& out) override {
    stats_.record("rmsnorm_gated", "cpu.rmsnorm_gated");
    ARB_ASSERT(group >= 1 && W % group == 0 && w.numel() == W);
    widen_small(w, wbuf_);
    rmsnorm_gated_f32(f32(y), f32(z), wbuf_.data(), R, W, group, float(eps), f32(out));
  }

  void relu2(const Buffer& x, int64_t n, Buffer& out) override {
    stats_.record("relu2", "cpu.relu2");
    ARB_ASSERT(x.n >= n && out.n >= n);
    const float* xp = f32(x);
    float* o = f32(out);
    elementwise(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float v = std::max(xp[i], 0.f);
        o[i] = v * v;
      }
    });
  }

  void scale(Buffer& x, int64_t n, double s) override {
    stats_.record("scale", "cpu.scale");
    ARB_ASSERT(x.n >= n);
    float* xp = f32(x);
    const float sf = float(s);
    elementwise(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) xp[i] *= sf;
    });
  }

  void softcap(Buffer& x, int64_t n, double cap) override {
    stats_.record("softcap", "cpu.softcap");
    ARB_ASSERT(x.n >= n);
    float* xp = f32(x);
    const float cf = float(cap);
    elementwise(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) xp[i] = std::tanh(xp[i] / cf) * cf;
    });
  }

  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("swiglu", "cpu.swiglu" + suffix_);
    ARB_ASSERT(gate.n >= n && up.n >= n && out.n >= n);
    const float *g = f32(gate), *u = f32(up);
    float* o = f32(out);
    elementwise(n, [&](int64_t i0, int64_t i1) { rows_->swiglu(g, u, i0, i1, o); });
  }

  void add(Buffer& x, const Buffer& y, int64_t n) override {
    stats_.record("add", "cpu.add" + suffix_);
    ARB_ASSERT(x.n >= n && y.n >= n);
    float* xp = f32(x);
    const float* yp = f32(y);
    elementwise(n, [&](int64_t i0, int64_t i1) { rows_->add(xp, yp, i0, i1); });
  }

  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override {
    stats_.record("summarize", "cpu.summarize");
    ARB_ASSERT(logits.n >= int64_t(T) * V && K <= V);
    out.resize(size_t(T));
    const float* lp = f32(logits);
    // Each row widened exactly to f64, then the ref tier's summarize_row: the summary is a
    // function of the f32 logits only, identical to what ref computes from the same values.
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      thread_local std::vector<double> row;
      row.resize(size_t(V));
      for (int64_t t = t0; t < t1; ++t) {
        const float* src = lp + t * V;
        for (int v = 0; v < V; ++v) row[size_t(v)] = src[v];
        summarize_row(row.data(), V, K, targets[t], out[size_t(t)]);
      }
    });
  }

  // summarize's top-1 of the row without the rest of its summary (widening V logits and the
  // exp of each in f64 took ~6% of a decode step of qwen3-0.6b Q4_K_M): the larger logit
  // first, ties to the lower id, NaN last. Each thread scans one slice; the slices' winners
  // are merged in order, so a tie still goes to the lower id.
  void pick_greedy(const Buffer& logits, int row, int V) override {
    ARB_ASSERT(logits.n >= int64_t(row + 1) * V && V > 0);
    const float* lp = f32(logits) + int64_t(row) * V;
    auto beats = [](float x, float best) { return x > best || (best != best && x == x); };
    const int64_t parts = std::min<int64_t>(int64_t(pool_.size()), V);
    std::vector<int64_t> win(static_cast<size_t>(parts));
    pool_.parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = V * p / parts, e = V * (p + 1) / parts;
        int64_t best = b;
        for (int64_t v = b + 1; v < e; ++v)
          if (beats(lp[v], lp[best])) best = v;
        win[size_t(p)] = best;
      }
    });
    int64_t best = win[0];
    for (int64_t w : win)
      if (beats(lp[w], lp[best])) best = w;
    push_pick(int32_t(best));
  }

 private:
  // pages: a paged pool (checked by the caller) instead of a cache or ring.
  // The attention kernel's arguments for T queries at pos0 over a cache, or over a paged pool
  // when pages is given (rows found through its block table).
  static AttentionArgs attention_args(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                                      int T, int pos0, int H, int Hkv, int Dh, int window,
                                      double scale, double softcap, Buffer& out,
                                      const KvPages* pages) {
    ARB_ASSERT(Hkv > 0 && H % Hkv == 0);
    ARB_ASSERT(q.n >= int64_t(T) * H * Dh && out.n >= int64_t(T) * H * Dh);
    AttentionArgs a;
    if (pages) {
      a.rows = kv_cache_rows(k_cache, v_cache, Hkv * Dh);
      a.blocks = pages->blocks;
      a.block_rows = pages->block_rows;
    } else {
      a.rows = attention_cache_rows(k_cache, v_cache, Hkv * Dh, T, pos0, window, "cpu");
    }
    a.q = f32(q);
    a.k_cache = f32(k_cache);
    a.v_cache = f32(v_cache);
    a.out = f32(out);
    a.T = T;
    a.pos0 = pos0;
    a.H = H;
    a.Hkv = Hkv;
    a.Dh = Dh;
    a.window = window;
    a.scale = scale;
    a.softcap = softcap;
    return a;
  }

  void attend(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
              int H, int Hkv, int Dh, int window, double scale, double softcap, Buffer& out,
              const KvPages* pages = nullptr) {
    const AttentionArgs a =
        attention_args(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, scale, softcap, out, pages);
    // Units are (head, token) with the head outermost, so static chunks split the heads and
    // each thread gets the same mix of short (early) and long (late) causal rows.
    pool_.parallel_for(int64_t(H) * T, [&](int64_t u0, int64_t u1) { rows_->attention(a, u0, u1); });
  }

  // W's bytes: its huge-page copy when prepare() made one, else the tensor's own.
  const void* weight_data(const Tensor& W) const {
    auto it = copies_.find(W.data);
    return it != copies_.end() ? it->second.ptr : W.data;
  }

  // out = rmsnorm of x with the widened weight in wbuf_.
  void norm_rows(const Buffer& x, int R, int N, double eps, Buffer& out) {
    const float* xp = f32(x);
    float* op = f32(out);
    const float* wp = wbuf_.data();
    auto body = [&](int64_t r0, int64_t r1) { rows_->rmsnorm(xp, wp, r0, r1, N, eps, op); };
    if (int64_t(R) * N >= kParallelElems) pool_.parallel_for(R, body);
    else body(0, R);
  }

  // Small vectors (norm weights, biases) widened per call: N floats, not a model copy.
  static void widen_small(const Tensor& t, std::vector<float>& dst) {
    dst.resize(size_t(t.numel()));
    row_to_f32(t.dtype, t.data, dst.data(), t.numel());
  }

  template <class F>
  void elementwise(int64_t n, F&& body) {
    if (n >= kParallelElems) {
      const int64_t chunks = (n + kElemChunk - 1) / kElemChunk;
      pool_.parallel_for(chunks, [&](int64_t c0, int64_t c1) {
        body(c0 * kElemChunk, std::min(n, c1 * kElemChunk));
      });
    } else {
      body(0, n);
    }
  }

  // Weights with no SIMD kernel (f64): widen each row, scalar dot products.
  void matmul_generic(const Buffer& x, const Tensor& W, const float* bias, int T, Buffer& out) {
    stats_.record_fallback("matmul", "cpu.matmul_generic");
    const int64_t N = W.rows(), K = W.cols();
    const float* xp = f32(x);
    float* yp = f32(out);
    pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t n = n0; n < n1; ++n) {
        row_to_f32(W.dtype, W.row(n), row.data(), K);
        for (int t = 0; t < T; ++t) {
          float acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += xp[t * K + k] * row[size_t(k)];
          yp[t * N + n] = acc + (bias ? bias[n] : 0.f);
        }
      }
    });
  }

  ThreadPool pool_;
  Isa isa_;
  GemmImpl gemm_;
  bool hugepage_weights_;
  bool act_quant_;
  bool bf16_dot_;
  std::vector<ActQ8> xq_rows_;  // x quantized for the integer kernels (quantize_x)
  ActQ8Panels xq_panels_;       // the integer GEMM's: xq_rows_ in panels
  bool int8_gemm_ = false;  // a prepared model has weights the integer GEMM reads (peak_gflops)
  std::vector<uint16_t> xb_;  // x rounded to bf16 for the bf16 dot kernels (round_x_bf16)
  bool bf16_gemm_ = false;    // ... and weights gemm_bf16_dot reads
  bool row_invariant_ = false;  // set_row_invariant: the own GEMM, the scan's recurrence at every T
  struct Copy {
    const void* ptr;
    size_t bytes;
  };
  std::unordered_map<const void*, Copy> copies_;   // tensor data -> its huge-page copy
  std::vector<std::pair<void*, size_t>> arenas_;   // the mappings holding the copies
  const RowKernels* rows_ = nullptr;
  std::string suffix_;
  std::vector<float> wbuf_;
  std::vector<std::vector<float>> bias_buf_ = std::vector<std::vector<float>>(1);  // a target's
  std::vector<GemvJob> gemv_jobs_;
  std::vector<float> rope_cos_, rope_sin_;
  std::vector<double> rope_inv_;
  int rope_pos0_ = -1, rope_T_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opts) {
  return std::make_unique<CpuBackend>(opts);
}

}  // namespace arbiter::cpu

namespace arbiter {

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  cpu::CpuOptions o;
  o.threads = threads;
  if (const char* e = std::getenv("ARBITER_CPU_ISA"); e && *e) {
    const std::string v = e;
    bool found = false;
    for (cpu::Isa isa : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512})
      if (v == cpu::isa_name(isa)) {
        o.isa = isa;
        found = true;
      }
    ARB_CHECK(found, "[cpu] ARBITER_CPU_ISA=%s (expected scalar, avx2 or avx512)", e);
  }
  if (const char* e = std::getenv("ARBITER_CPU_WEIGHTS"); e && *e) {
    const std::string v = e;
    ARB_CHECK(v == "hugepage" || v == "mmap", "[cpu] ARBITER_CPU_WEIGHTS=%s (expected hugepage or mmap)", e);
    o.hugepage_weights = v == "hugepage";
  }
  if (const char* e = std::getenv("ARBITER_CPU_GEMM"); e && *e) {
    const std::string v = e;
    ARB_CHECK(v == "own" || v == "blas", "[cpu] ARBITER_CPU_GEMM=%s (expected own or blas)", e);
    o.gemm = v == "own" ? cpu::GemmImpl::Own : cpu::GemmImpl::Blas;
  }
  if (const char* e = std::getenv("ARBITER_CPU_ACT_QUANT"); e && *e) {
    const std::string v = e;
    ARB_CHECK(v == "1" || v == "0", "[cpu] ARBITER_CPU_ACT_QUANT=%s (expected 1 or 0)", e);
    o.act_quant = v == "1";
  }
  if (const char* e = std::getenv("ARBITER_CPU_BF16_DOT"); e && *e) {
    const std::string v = e;
    ARB_CHECK(v == "1" || v == "0", "[cpu] ARBITER_CPU_BF16_DOT=%s (expected 1 or 0)", e);
    o.bf16_dot = v == "1";
  }
  return cpu::make_cpu_backend(o);
}

}  // namespace arbiter
