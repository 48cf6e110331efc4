// The CPU tier's kernel variants, exposed so that tests and benchmarks can run EVERY compiled
// path (scalar twin, AVX2, AVX-512; own GEMM and OpenBLAS), not only the one the backend
// picks. Internal to the cpu tier: model code only sees Backend.
//
// Weights stay in their storage dtype (f32, f16, bf16, ggml's block formats) and are widened
// to f32 inside the kernels, never converted at load: decode is memory-bandwidth bound (every
// weight byte is read once per token), so a bf16 row read as bf16 costs half the bytes of an f32
// copy. (The tier does copy the bytes unchanged into huge-page memory: CpuOptions::hugepage_weights.)
//
// Shapes: x [T, K] f32 activations; W [N, K] in its storage dtype; out [T, N] f32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace arbiter {
class ThreadPool;
}

namespace arbiter::cpu {

enum class Isa { Scalar, Avx2, Avx512 };
const char* isa_name(Isa isa);
/// ISAs compiled into this binary and supported by the running CPU, scalar first, best last.
const std::vector<Isa>& available_isas();
Isa best_isa();

enum class GemmImpl { Own, Blas };
const char* gemm_impl_name(GemmImpl g);
/// The GEMM used when nothing is forced (the faster one in bench/, see cpu_backend.cpp).
GemmImpl default_gemm_impl();

/// y[n] = dot(W[n, :], x) for n in [n0, n1); W rows of K elements of the variant's dtype,
/// contiguous. Each row's arithmetic is the same wherever it falls in [n0, n1) (a fixed
/// reduction order), so any split of the rows gives bit-identical y.
using GemvFn = void (*)(const void* W, int64_t K, const float* x, float* y, int64_t n0,
                        int64_t n1);
/// nullptr when no kernel exists for (isa, dtype) (f64 weights).
GemvFn gemv_kernel(Isa isa, DType dtype);

/// Activations quantized to 8 bits for the integer dot kernels (qdot.cpp), as llama.cpp's
/// q8_0 (blocks of 32) and q8_K (blocks of 256) do: block b has the f32 scale
/// d[b] = max|x| / 127 over its values and codes q = round(x / d[b]) in [-127, 127], so
/// |x - d[b] q| <= d[b] (1/2 + 2^-15); sums[i] = the sum of q over values [16 i, 16 i + 16).
/// A block holding a NaN or an infinity gets d = NaN and codes 0.
struct ActQ8 {
  int block = 0;  // 32 (q8_0) or 256 (q8_K)
  int64_t K = 0;
  std::vector<int8_t> q;        // [K]
  std::vector<float> d;         // [K / block]
  std::vector<int16_t> sums;    // [K / 16]; |sum| <= 16 * 127, and 16-bit lanes feed madd
};
/// The activation block the integer kernel of weight type t reads (its own block: 32 or
/// 256), 0 when t has no integer kernel (dense types, MLX blocks: they keep the f32 GEMV).
int act_q8_block(DType t);
/// "q8_0" for blocks of 32, "q8_K" for 256 (llama.cpp's names for the same layouts).
const char* act_q8_name(int block);
/// a = x[0, K) quantized in blocks of `block` (K a multiple of it).
void quantize_act_q8(const float* x, int64_t K, int block, ActQ8& a);
/// out[n - n0] = sum_k (w_nk r_k)^2 for the rows n in [n0, n1) of W [N, K] (type t, read
/// exactly in f64), r_k = d[b] (1/2 + 2^-15) the largest rounding quantize_act_q8 made of x_k
/// (block b): the squared error a's codes can add to y[n], as independent roundings add
/// (Backend::measure_input_rounding; the drift/opcheck bound of docs/localize.md).
void act_q8_rounding(DType t, const void* W, int64_t K, const ActQ8& a, double* out, int64_t n0,
                     int64_t n1);
/// y[n] = dot(W[n, :], the values a encodes) for n in [n0, n1): per sub-block an exact
/// integer dot of the weight codes with a.q, its scales applied in f32 (qdot.cpp). a must be
/// quantized with act_q8_block(dtype). Any split of the rows gives bit-identical y.
using QGemvFn = void (*)(const void* W, int64_t K, const ActQ8& a, float* y, int64_t n0,
                         int64_t n1);
/// nullptr when (isa, dtype) has no integer kernel.
QGemvFn qgemv_kernel(Isa isa, DType dtype);

/// Tokens per panel of the integer GEMM (qgemm.cpp): the 16 lanes of one zmm, two ymm.
constexpr int kPanel = 16;
/// T tokens' 8-bit activations (each quantized by quantize_act_q8 in the weights' block, so
/// its codes are a decode step's) in panels of kPanel tokens, the tokens in the lanes; tokens
/// past T are zeros.
struct ActQ8Panels {
  int64_t T = 0, K = 0, panels = 0;
  int block = 0;                // the rows' activation block: 256 (q8_K) or 32 (q8_0)
  std::vector<int8_t> q;        // [panels][K / 4][kPanel][4]
  std::vector<float> d;         // [panels][K / block][kPanel]
  std::vector<int32_t> sums;    // [panels][K / 32][kPanel]: sums (2 i, 2 i + 1) as 16-bit halves
};
/// p = rows[0, T) in panels (every row quantized in one block size, one K a multiple of 256).
void pack_act_q8(const ActQ8* rows, int64_t T, ActQ8Panels& p);
/// out[t, n] (row stride N) = dot(W[n, :], the values x encodes for token t), for the rows n
/// in [n0, n1) and every token: per sub-block an exact integer dot, the scales in f32. One
/// (n, t)'s bits depend neither on the row split, nor on T, nor on t's panel.
using QGemmFn = void (*)(const void* W, int64_t N, int64_t K, const ActQ8Panels& x, float* out,
                         int64_t n0, int64_t n1);
/// Weight rows per output tile of the integer GEMM (a 64-byte line of out per token): splits
/// of the rows at its multiples keep the tiles whole.
constexpr int kQGemmRows = 16;
/// The integer GEMM of rows of K elements, nullptr when (isa, dtype, K) has none: AVX2 and
/// AVX512-VNNI have one (Q4_K, Q5_K, Q6_K, Q8_0), for K a multiple of 256 (x quantized in
/// act_q8_block(dtype)); both give the same bits.
QGemmFn qgemm_kernel(Isa isa, DType dtype, int64_t K);

/// dst[n] = src[n] widened to f32 (exactly, or rounded once for the block formats with a min;
/// block formats: n a multiple of the block).
using WidenFn = void (*)(const void* src, float* dst, int64_t n);
WidenFn widen_kernel(Isa isa, DType dtype);

/// One T > 1 matmul: out[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]).
struct GemmProblem {
  const float* x = nullptr;
  const void* W = nullptr;
  DType wtype = DType::F32;
  const float* bias = nullptr;  // f32 [N] or nullptr
  float* out = nullptr;
  int64_t T = 0, N = 0, K = 0;
};
/// Runs the problem on the pool. Work is split over fixed blocks of output columns (N) whose
/// boundaries do not depend on the thread count, and every out element is one f32 FMA chain
/// over k = 0..K-1 (own kernel), so results are identical for any number of threads.
void gemm_own(Isa isa, const GemmProblem& p, ThreadPool& pool);
/// Same contract with OpenBLAS's sgemm (pinned to 1 thread) on weight panels widened to f32.
void gemm_blas(Isa isa, const GemmProblem& p, ThreadPool& pool);
/// bf16 weights against x rounded to bf16, as llama.cpp runs them: `vdpbf16ps` multiplies
/// pairs of bf16 values exactly and adds both products to an f32 chain (two roundings; bf16
/// inputs below bf16's smallest normal read as zero, and f32 results below f32's are flushed
/// to zero), twice the FMA's products per instruction and no widening of the weights. Only
/// AVX512-BF16 builds have these kernels: bf16_dot(isa) says whether the running ISA takes
/// them (CpuOptions::bf16_dot).
bool bf16_dot(Isa isa);
/// out[i] = x[i] rounded to bf16 (to nearest even; a result below the smallest normal
/// flushed to a zero of its sign, as vdpbf16ps would read it; NaN stays NaN).
void round_act_bf16(const float* x, int64_t n, uint16_t* out);
/// out[n - n0] = sum_k (w_nk (x_k - xb_k))^2 for the rows n in [n0, n1) of the bf16 W [N, K]:
/// the squared error xb's rounding of x adds to y[n] (as act_q8_rounding does for 8 bits).
void act_bf16_rounding(const void* W, int64_t K, const float* x, const uint16_t* xb, double* out,
                       int64_t n0, int64_t n1);
/// y[n] = dot(W[n, :], xb) for n in [n0, n1), W bf16 [N, K] (K even). Any split of the rows
/// gives bit-identical y.
void gemv_bf16_dot(const void* W, int64_t K, const uint16_t* xb, float* y, int64_t n0,
                   int64_t n1);
/// out[T, N] = xb[T, K] @ W^T (+ bias) with p's W (bf16), bias, out and shape (p.x unused), on
/// the pool. Every out element is one vdpbf16ps chain over the pairs of k = 0..K-1 (K even),
/// so its bits depend neither on T nor on the thread count.
void gemm_bf16_dot(const uint16_t* xb, const GemmProblem& p, ThreadPool& pool);

/// Calls openblas_set_num_threads(1) once: our pool parallelises, two pools on two cores fight.
void blas_pin_single_thread();

/// Element-wise and row ops of one ISA. All buffers f32.
struct AttentionArgs {
  const float* q = nullptr;        // [T, H, Dh]
  const float* k_cache = nullptr;  // [rows, Hkv*Dh], position p at row p % rows
  const float* v_cache = nullptr;  // [rows, Hkv*Dh]
  float* out = nullptr;            // [T, H*Dh]
  int T = 0, pos0 = 0, H = 0, Hkv = 0, Dh = 0, window = 0, rows = 0;
  // A paged pool (Backend::KvPages) instead: position p at row
  // blocks[p / block_rows] * block_rows + p % block_rows.
  const int32_t* blocks = nullptr;
  int block_rows = 0;
  double scale = 0;    // scores are scale * q.k (attention(): 1/sqrt(Dh))
  double softcap = 0;  // > 0: scores s -> tanh(s / softcap) * softcap (gemma 2)
};
struct RowKernels {
  /// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w for r in [r0, r1); out may alias x.
  void (*rmsnorm)(const float* x, const float* w, int64_t r0, int64_t r1, int N, double eps,
                  float* out);
  /// out[i] = silu(gate[i]) * up[i] for i in [i0, i1).
  void (*swiglu)(const float* gate, const float* up, int64_t i0, int64_t i1, float* out);
  /// x[i] += y[i] for i in [i0, i1).
  void (*add)(float* x, const float* y, int64_t i0, int64_t i1);
  /// Attention for work units [u0, u1), unit u = (head h = u / T, token t = u % T): two-pass
  /// softmax over one row of scores per thread (no [T, T] matrix).
  void (*attention)(const AttentionArgs& a, int64_t u0, int64_t u1);
};
const RowKernels& row_kernels(Isa isa);

/// What a CPU backend runs; the defaults are the fastest compiled paths. ARBITER_CPU_ISA
/// (scalar|avx2|avx512), ARBITER_CPU_GEMM (own|blas), ARBITER_CPU_WEIGHTS (hugepage|mmap),
/// ARBITER_CPU_ACT_QUANT (1|0) and ARBITER_CPU_BF16_DOT (1|0) override them in
/// make_cpu_backend.
struct CpuOptions {
  int threads = 0;  // <= 0: all cores
  Isa isa = best_isa();
  GemmImpl gemm = default_gemm_impl();
  /// true: prepare() copies each large weight, bytes unchanged, into anonymous memory
  /// advised MADV_HUGEPAGE, and the matmuls read the copy. A file mapping gets 4 KiB pages
  /// (the kernel gives no transparent huge pages to ext4 page cache), and streaming reads
  /// over 4 KiB pages reach about half the bandwidth on the dev machines
  /// (docs/performance.md). The cost: the copy at load, and the resident weight bytes twice
  /// (the file's pages, touched by the copy, stay mapped).
  bool hugepage_weights = true;
  /// true: a T == 1 matmul of a block format with an integer kernel (act_q8_block) quantizes
  /// x to 8 bits and runs qgemv_kernel (provider cpu.gemv_<dtype>_q8_<isa>), and any other
  /// matmul of a type with an integer GEMM quantizes every token and runs qgemm_kernel
  /// (cpu.gemm_<dtype>_q8_<isa>); the trace header records it (docs/traces.md). false: the
  /// f32 GEMV and GEMM of the dequantized weights.
  /// ARBITER_CPU_ACT_QUANT=0 sets false.
  bool act_quant = true;
  /// true: a matmul of bf16 weights (K even) on an ISA with the bf16 dot kernels (bf16_dot)
  /// rounds x to bf16 and runs gemv_bf16_dot or gemm_bf16_dot (providers
  /// cpu.gemv_bf16_bf16_<isa>, cpu.gemm_bf16_bf16_<isa>; the trace header's act_quant "bf16"),
  /// as llama.cpp runs bf16 weights: prefill at up to twice the f32 FMA's rate, for x's
  /// rounding (u = 2^-8 where the f32 path has 2^-24). Off by default: the tier's exact f32
  /// arithmetic on the most common checkpoint dtype is what its comparisons against ref
  /// rely on. ARBITER_CPU_BF16_DOT=1 sets it.
  bool bf16_dot = false;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opts);

}  // namespace arbiter::cpu
