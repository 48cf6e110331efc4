// Matrix-vector products for single-token forwards (T == 1, the decode step): out = W @ x,
// plus the fused forms the decode step uses (RMSNorm folded in front, SwiGLU or a residual
// add folded behind). Memory-bound: every weight byte is read once.
//
// Register kernel (rows of K <= 16 x 32 x V elements, K % V == 0, V = 16 / sizeof(T)): one
// warp per output row (two for the norm forms of rows of four chunks: the q/k/v and gate/up
// projections of 1,024-element rows in bf16/f16; grid-stride over rows when there are more
// rows than resident warps);
// each lane loads its NCH 16-byte chunks of the row (all of them at once: the whole row is
// in flight) BEFORE griddep_wait(), i.e. while the previous kernel still runs under
// programmatic dependent launch, without allocating them in L1, which keeps x and the norm
// weights that every warp of the SM reads (H200, synth qwen3-0.6b bf16 decode: 1,362 vs
// 1,234-1,262 tok/s in one call); then it reads x (in the fused-norm forms normalised once
// per block, each warp a share of the chunks, through shared memory), multiplies in f32 and
// reduces in a fixed order (chunk j into accumulator j % 4, then (a0 + a1) + (a2 + a3), then
// the warp's shuffle tree): deterministic, and the same arithmetic in the fused and the
// unfused forms, so a fused decode step is byte-identical to the same step run op by op
// (tests/cuda). Other shapes use the loop kernel (a row split along K over up to 4 warps), and
// the fused forms fall back to the op-by-op composition. The norm forms can run a
// Backend::NormAdd first (GemvArgs::pre_y, Gemma's post norm of the block before): every block
// computes x + rmsnorm(y), and the grid's last block to finish stores it into the residual.
// It replaced an epilogue of the o and down GEMVs in which their grid's last block normalised
// the row and added it, on the step's critical path (docs/performance.md, session 38). The
// norm form can end the rows of one segment with one token of Mamba2's conv (GemvConv,
// rmsnorm_matmul_conv): the hybrids' in_proj and ssm_conv in one launch (H100, Nsight
// Compute, a granite-4.0-h-1b layer: 32.2 us against 31.0 + 4.7 us; call-a-s35.txt).
#include "backend/cuda/device_common.cuh"
#include <algorithm>
#include <type_traits>

#include "core/error.h"

namespace arbiter::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

int chunks_for(DType ct, int K) {
  const int step = 32 * int(16 / ctype_size(ct));
  return (K + step - 1) / step;
}
/// NCH instantiated for the register kernel (a row's chunk count is rounded up to one).
int reg_nch(int n) {
  return n <= 1 ? 1 : n <= 4 ? 4 : n <= 6 ? 6 : n <= 8 ? 8 : n <= 12 ? 12 : n <= 16 ? 16 : 0;
}

/// Blocks of `kernel` (no dynamic shared memory) that fit on one SM, by the occupancy
/// calculator; 1 if it fails.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads) {
  int v = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();
    v = 1;
  }
  return std::max(v, 1);
}

/// The row's dot product in the canonical order; x_at(j) gives x's chunk j of this lane.
template <class T, int NCH, class XAt>
__device__ __forceinline__ float dot_chunks(const uint4 (&w)[NCH], XAt x_at) {
  constexpr int V = Vec16<T>::N;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const uint4 xj = x_at(j);
    const T* we = reinterpret_cast<const T*>(&w[j]);
    const T* xe = reinterpret_cast<const T*>(&xj);
#pragma unroll
    for (int i = 0; i < V; ++i) acc[j % 4] = fmaf(to_f(we[i]), to_f(xe[i]), acc[j % 4]);
  }
  return warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

template <class T>
__device__ __forceinline__ void store_out(void* out, int out_f32, int row, float v) {
  if (out_f32) static_cast<float*>(out)[row] = v;
  else static_cast<T*>(out)[row] = from_f<T>(v);
}

// Short rows (NCH <= 4, the D = 1024-class projections) with one row per warp are capped at
// 64 registers (four 8-warp blocks per SM), 80 for the gate/up form (three blocks).
//
// The norm forms of rows of four chunks (the q/k/v and gate/up projections of qwen3-0.6b)
// take ROWS = 2: a warp loads its two rows (row and row + stride; for gate/up two gate and two
// up rows) before the wait, in blocks of 4 warps. x and its norm are shared by the rows, so a
// row costs 48 registers instead of 64 (a gate/up pair 63 instead of 80), and the finer blocks
// pack beside the kernel before them (the down GEMV of the previous layer, the o GEMV), so
// more of the weights load while it runs. H200, synth qwen3-0.6b bf16 decode, one call each:
// q/k/v 1,700 tok/s against 1,673-1,679 (three rows per warp 1,670); then gate/up 1,735-1,736
// against 1,700 (in blocks of 2 warps 1,717-1,718).
//
// The add form with long rows (the o and down projections, NCH >= 8) keeps x in shared
// memory instead of registers (81 and 118 registers instead of 150 and 206 for qwen3-0.6b's
// 2048- and 3072-element rows), which leaves room on each SM for blocks of the next GEMV,
// and with a.launch_early lets that GEMV launch at once (launch_dependents before its own
// wait): behind the o projection the gate/up GEMV's blocks then load their weights during
// the attention. H200, synth qwen3-0.6b bf16 decode, one call: 1,660 tok/s against 1,620
// (-p 512: 1,657 against 1,611); x in shared memory without the early launch lost (1,578);
// these in blocks of 4 warps lost (1,673 against 1,700). Behind the down projection an early
// launch lost since: the next q/k/v GEMV's loads then run during the gate/up GEMV's, whose
// rows still stream after its wait, and the backend lets it in after the down GEMV's wait
// (session 11, docs/evidence/h200/decode-variants-s11.txt: 1,764-1,766 against 1,745 tok/s;
// -p 512 1,777 against 1,732; -p 2048 1,731 against 1,711).
//
// The q/k/v form (kGemvNorm, two rows per warp) reads the normalised x from shared memory in
// its dot products instead of holding it in registers, and is capped at 88 registers (91
// uncapped, 96 before): a block takes 11,264 registers instead of 12,288, so three of them
// instead of two load their rows beside a block of the down GEMV before it. H200, synth
// qwen3-0.6b bf16 decode (docs/evidence/h200/decode-variants-s11.txt): 1,741 tok/s against
// 1,735 in one call; with the decode attention's later launch_dependents (attention.cu)
// 1,752-1,755 against 1,739-1,741 in another. A cap of 80 lost (1,719-1,731), and so did the
// same for gate/up, whose blocks then all fit beside the o GEMV during the attention (1,684-
// 1,700).
template <int ROWS>
constexpr int warps_per_block() { return ROWS > 1 ? 4 : kWarpsPerBlock; }
/// Register cap per thread: the kernel's blocks per SM (64: four blocks of 8 warps; 80: three;
/// 128: two of 8 warps, or four of 4), 88 for the q/k/v form (above), else none.
///
/// Rows of five or six chunks (gemma3-1b's 1,152 elements, granite-4.0-h-1b's 1,536) have an
/// NCH of their own: at NCH 8 the gate/up form took 180 registers, one block an SM, and each
/// of its 8 warps went through about 6 row pairs one after the other, paying each one's load
/// latency (H200, Nsight Compute: gemma3-1b's gate/up GEMV 16.7 us for 31.9 MB, 0.43 of the
/// read bandwidth; call-c-s30.txt). At NCH 6 every form fits 128: two blocks an SM. H100,
/// synth bf16 decode tg128, alternating in one call (call-c-s31.txt): gemma3-1b 816 against
/// 738 tok/s, granite-4.0-h-1b 503-508 against 480-495; w1 traces identical (the chunks past
/// K added zeros).
template <int NCH, int MODE, int ROWS>
constexpr int max_regs() {
  if (ROWS > 1) return MODE == kGemvNorm ? 88 : 128;
  if (NCH <= 4) return MODE == kGemvNormGlu ? 80 : 64;
  if (NCH <= 6) return 128;
  return 255;
}
// TAP: the variant that applies a.taps (kernels.h) at the stages inside the fused forms; only
// drift, opcheck and --inject launch it. PRE: the variant of the norm forms (one row a warp,
// untapped) that runs the NormAdd first. Its code in every norm form cost qwen3-0.6b's decode
// 2.8%, which runs none (H100, synth bf16 decode tg128, alternating in one call: 1,593-1,595
// against 1,639 tok/s with the code compiled out; docs/evidence/h200/call-a-s39.txt).
// GemvConv's channel c, whose product is acc: the product rounded and stored as the plain
// form stores it (TAP: the stage ssm_xbc, taps[1], tapped first), then one token of
// ssm_conv_kernel's arithmetic (conv_step: conv_out, then the state's shift) on it and the
// channel's state.
template <class T, bool TAP>
__device__ __forceinline__ void conv_row(const GemvArgs& a, int c, float acc, void* out) {
  T v = from_f<T>(acc);
  if constexpr (TAP) v = tap_value(a.taps[1], c, v, true);
  static_cast<T*>(out)[c] = v;
  const GemvConv& p = a.conv;
  static_cast<T*>(p.act)[c] =
      from_f<T>(conv_step(p.w, p.b, a.seg[p.seg].rows, p.K, c, v, static_cast<T*>(p.state)));
}

template <class T, int NCH, int MODE, int ROWS = 1, bool TAP = false, bool PRE = false>
__global__ void __launch_bounds__(warps_per_block<ROWS>() * 32)
    __maxnreg__((max_regs<NCH, MODE, ROWS>())) gemv_reg_kernel(GemvArgs a) {
  static_assert(ROWS == 1 || MODE == kGemvNorm || MODE == kGemvNormGlu,
                "several rows per warp: the norm forms only");
  static_assert(!TAP || MODE != kGemvPlain, "no stage inside the plain form");
  constexpr bool kNorm = MODE == kGemvNorm || MODE == kGemvNormGlu;
  static_assert(!PRE || (kNorm && ROWS == 1 && !TAP), "the NormAdd: untapped norm forms");
  constexpr int WPB = warps_per_block<ROWS>();
  constexpr bool kSmemX = MODE == kGemvAdd && NCH >= 8;
  constexpr bool kXnShared = MODE == kGemvNorm && ROWS > 1;  // the dots read xn below
  const bool early = kSmemX && a.launch_early;
  if (early) griddep_launch();
  const int lane = threadIdx.x % 32;
  const int stride = gridDim.x * WPB;
  int row = blockIdx.x * WPB + threadIdx.x / 32;  // the warp's rows: row + r * stride, r < ROWS
  // Segment of a row (the fused q/k/v projection stacks up to three matrices).
  auto locate = [&](int r, int& si, int& rr) {
    si = 0;
    rr = r;
    while (si + 1 < a.n_seg && rr >= a.seg[si].rows) rr -= a.seg[si++].rows;
  };
  constexpr int kUp = MODE == kGemvNormGlu ? ROWS : 0;
  // The warp's current rows (w2: the up rows of SwiGLU) and, with kPipe, while they are
  // multiplied, the next ones: a warp with several rows in turn then has the next rows' loads
  // in flight during the current ones' dot products and stores, instead of paying each row's
  // latency alone (H100, synth bf16 decode, alternating in one call: granite-4.0-h-1b 532-542
  // against 513-517 tok/s, granite-4.0-h-tiny 448 against 433). Only where the second set of
  // weights fits the register cap with room to spare (ptxas spilled every form past three
  // quarters of it), and not in the forms with x in shared memory, which are kept small so
  // that blocks of the next GEMV fit beside them (with them too, qwen3-0.6b's o projection
  // went from three blocks an SM to two, and its decode from 1,641 to 1,626 tok/s: H100,
  // docs/evidence/h200/call-b-s37.txt).
  constexpr int kPipeRegs = 4 * NCH * (1 + 2 * ROWS * (kUp ? 2 : 1));  // x and two row sets
  constexpr bool kPipe = !kSmemX && 4 * kPipeRegs < 3 * max_regs<NCH, MODE, ROWS>();
  struct Rows {
    uint4 w[ROWS][NCH], w2[kUp ? kUp : 1][NCH];
    int si[ROWS], rr[ROWS];
  };
  auto load_rows = [&](int from, Rows& b) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (from + r * stride >= a.N) break;
      locate(from + r * stride, b.si[r], b.rr[r]);
      const GemvSeg& g = a.seg[b.si[r]];
      load_chunks<T, NCH, true>(static_cast<const T*>(g.W) + int64_t(b.rr[r]) * g.ld, a.K,
                                lane, b.w[r]);
      if constexpr (kUp > 0)
        load_chunks<T, NCH, true>(
            static_cast<const T*>(a.seg[1].W) + int64_t(b.rr[r]) * a.seg[1].ld, a.K, lane,
            b.w2[r]);
    }
  };
  Rows cur;
  if (row < a.N) load_rows(row, cur);
  constexpr int V = Vec16<T>::N;
  const int warp = threadIdx.x / 32;
  griddep_wait();
  if (!early) griddep_launch();
  // The add form's residual element, read with x right after the wait rather than after the
  // dot product, whose store it held up by a load's latency. With the decode attention's new
  // value row read early too (attention.cu), H200, synth qwen3-0.6b bf16 decode, one call:
  // 1,803-1,804 against 1,785 tok/s (docs/evidence/h200/decode-variants-s12.txt).
  T res0 = from_f<T>(0.f);
  if (MODE == kGemvAdd && lane == 0 && row < a.N)
    res0 = static_cast<const T*>(a.res)[cur.rr[0]];
  // x in chunks, normalised (and rounded to T, as the op-by-op RMSNorm stores it) when fused;
  // kSmemX: in shared memory (stage: chunk j loaded by warp j % WPB).
  uint4 x[NCH];
  auto stage = [&](const void* src, uint4* buf) {  // a row into shared memory, zeros past K
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
      const int k = lane * V + j * 32 * V;
      if (j % WPB == warp)
        buf[j * 32 + lane] =
            k < a.K ? __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(src) + k))
                    : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
  };
  __shared__ uint4 xs[kSmemX ? NCH * 32 : 1];
  if (kSmemX) {
    stage(a.x, xs);
  } else {
    load_chunks<T, NCH>(static_cast<const T*>(a.x), a.K, lane, x);
  }
  __shared__ uint4 xn[kNorm ? NCH * 32 : 1];  // the normalised x
  auto x_at = [&](int j) {
    return kSmemX ? xs[j * 32 + lane] : kXnShared ? xn[j * 32 + lane] : x[j];
  };
  // x + rmsnorm(pre_y) first. pre_y is staged in xn (free until the norm below), chunk j by
  // warp j % WPB, and every warp takes its sum of squares from there (in registers beside the
  // rows loaded before the wait, it made the forms spill); chunk j of the sum is computed by
  // warp j % WPB and shared through hs (x in element order), which the grid's last block
  // stores into x at the end.
  __shared__ uint4 hs[PRE ? NCH * 32 : 1];
  if constexpr (PRE) {
    stage(a.pre_y, xn);
    const float inv_y =
        inv_rms(chunks_sumsq_by<T, NCH>([&](int j) { return xn[j * 32 + lane]; }), a.K, a.eps);
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
      const int k = lane * V + j * 32 * V;
      if (j % WPB != warp) continue;
      if (k < a.K) {
        float pw[V];
        load_f32s<V>(a.pre_w + k, pw);
        const uint4 yj = xn[j * 32 + lane];
        T* r = reinterpret_cast<T*>(&x[j]);
        const T* e = reinterpret_cast<const T*>(&yj);
#pragma unroll
        for (int i = 0; i < V; ++i)
          r[i] = from_f<T>(to_f(r[i]) + to_f(norm_elem<T>(to_f(e[i]), inv_y, pw[i])));
      }
      hs[j * 32 + lane] = x[j];
    }
    __syncthreads();  // also: every warp has read xn's y before the norm writes xn
#pragma unroll
    for (int j = 0; j < NCH; ++j) x[j] = hs[j * 32 + lane];
  }
  if (kNorm) {
    // Every warp takes the sum of squares in the canonical order, but chunk j is normalised
    // by warp j % WPB alone and shared through shared memory: with every warp normalising all
    // of x (and reading all of its f32 weights) the SM's issue slots, not the DRAM, bounded
    // these kernels (H200, synth qwen3-0.6b bf16 decode, one call: 1,459 vs 1,319 tok/s).
    const float inv = inv_rms(chunks_sumsq<T, NCH>(x), a.K, a.eps);
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
      const int k = lane * V + j * 32 * V;
      T* e = reinterpret_cast<T*>(&x[j]);
      if (j % WPB == warp && k < a.K) {
        float nw[V];
        load_f32s<V>(a.norm_w + k, nw);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          e[i] = norm_elem<T>(to_f(e[i]), inv, nw[i]);
          // Every block normalises all of x; the first records it.
          if constexpr (TAP) e[i] = tap_value(a.taps[0], k + i, e[i], blockIdx.x == 0);
        }
        xn[j * 32 + lane] = x[j];
        if (MODE == kGemvNorm && a.xn && blockIdx.x == 0)
          *reinterpret_cast<uint4*>(static_cast<T*>(a.xn) + k) = x[j];
      } else if (kXnShared && j % WPB == warp) {
        xn[j * 32 + lane] = make_uint4(0, 0, 0, 0);  // past K: read by the dots
      }
    }
    __syncthreads();
    if (!kXnShared) {
#pragma unroll
      for (int j = 0; j < NCH; ++j)
        if (lane * V + j * 32 * V < a.K) x[j] = xn[j * 32 + lane];
    }
  }
  bool first = true;
  while (row < a.N) {
    const int next = row + ROWS * stride;
    [[maybe_unused]] Rows nxt;
    if (kPipe && next < a.N) load_rows(next, nxt);
    const auto& w = cur.w;
    const auto& si = cur.si;
    const auto& rr = cur.rr;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (row + r * stride >= a.N) break;
      const GemvSeg& g = a.seg[si[r]];
      const float acc = dot_chunks<T, NCH>(w[r], x_at);
      if constexpr (MODE == kGemvNormGlu) {
        // act = silu(gate) * up (or GeGLU's gelu_tanh) with gate and up rounded to T first, as
        // the op-by-op path does.
        const float gu = dot_chunks<T, NCH>(cur.w2[r], x_at);
        if (lane == 0) {
          T g = from_f<T>(acc), u = from_f<T>(gu);
          if constexpr (TAP) {
            g = tap_value(a.taps[1], rr[r], g, true);
            u = tap_value(a.taps[2], rr[r], u, true);
          }
          const float gt = to_f(g), up = to_f(u);
          static_cast<T*>(a.res)[rr[r]] = from_f<T>(a.gelu ? gelu_tanh_mul(gt, up) : silu_mul(gt, up));
        }
      } else if constexpr (MODE == kGemvAdd) {
        if (lane == 0) {
          T* res = static_cast<T*>(a.res);
          T p = from_f<T>(acc);
          if constexpr (TAP) p = tap_value(a.taps[0], rr[r], p, true);
          if (a.res_scale != 1.f) p = from_f<T>(to_f(p) * a.res_scale);  // scale()'s rounding
          res[rr[r]] = from_f<T>(to_f(first ? res0 : res[rr[r]]) + to_f(p));
        }
      } else if (lane == 0) {
        if (MODE == kGemvNorm && si[r] == a.conv.seg) conv_row<T, TAP>(a, rr[r], acc, g.out);
        else store_out<T>(g.out, g.out_f32, rr[r], g.bias ? acc + g.bias[rr[r]] : acc);
      }
    }
    row = next;
    first = false;
    if (row >= a.N) break;
    if constexpr (kPipe) cur = nxt;
    else load_rows(row, cur);
  }
  if constexpr (PRE) {
    // Every block has read x once it counts itself: the store needs no fence before it.
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(a.pre_done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    for (int c = threadIdx.x; c < NCH * 32 && c * V < a.K; c += blockDim.x)
      static_cast<uint4*>(a.pre_x)[c] = hs[c];
    if (threadIdx.x == 0) *a.pre_done = 0;
  }
}

// Loop kernel for long or odd rows (unfused only). Rows this long are few (gemma3-1b's down
// projection: 1,152 rows of 6,912), and one warp a row left most SMs one block of 8 warps,
// whose loads were all the SM had in flight: H200, synth gemma3-1b bf16 decode, Nsight
// Compute, 10.7 us for those 15.9 MB, 0.33 of the read bandwidth (docs/evidence/h200/
// call-c-s30.txt). So a row is split along K over `slices` warps of one block (loop_slices),
// each lane with up to 8 x 16-byte weight loads in flight (streamed, ldg_stream). The order is
// fixed: vector step i of a lane's slice goes to accumulator i % 4, the K % V tail (last
// slice) to accumulator 1; each slice's (a0 + a1) + (a2 + a3) through the warp's shuffle
// tree; then the slices' partials added in slice order by the row's first warp. Whole groups
// of 8 steps take no branch on the slice's end: with one, one warp a row lost 6% to session
// 30's kernel (llama-3.2-1b, call-a-s31.txt), most likely as x's loads waited on each other.
template <class T, class TO>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ W, int64_t ld,
                const float* __restrict__ bias, int N, int K, int slices,
                TO* __restrict__ out) {
  constexpr int V = Vec16<T>::N;
  constexpr int kStep = 32 * V;  // elements one warp covers per 16-byte load
  constexpr int U = 8;           // loads in flight per lane
  __shared__ float part[kWarpsPerBlock];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * (kWarpsPerBlock / slices) + warp / slices;
  const int slice = warp % slices;
  const int Kv = K / V * V;  // vectorised prefix
  const int steps = (Kv + kStep - 1) / kStep;
  const int k_end = min(Kv, int(int64_t(steps) * (slice + 1) / slices) * kStep);
  const T* w = W + int64_t(row) * ld;
  int k = int(int64_t(steps) * slice / slices) * kStep + lane * V;
  // U steps from k (when FULL, all of them before k_end): the U weight loads issued, then
  // step u into accumulator u % 4. FULL keeps the steps free of branches, so that x's loads
  // too can be issued together.
  uint4 wr[U];
  auto load = [&](auto full) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (full || k + u * kStep < k_end)
        wr[u] = ldg_stream(reinterpret_cast<const uint4*>(w + k + u * kStep));
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  auto use = [&](auto full) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!full && k + u * kStep >= k_end) continue;
      float x0[V];
      load16(x + k + u * kStep, x0);
      const T* we = reinterpret_cast<const T*>(&wr[u]);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[u % 4] = fmaf(to_f(we[i]), x0[i], acc[u % 4]);
    }
    k += U * kStep;
  };
  // The first group's weights before the wait (no kernel of the step writes them), so that
  // they load while the kernel before finishes. H100, synth bf16 decode tg128, alternating in
  // one call (docs/evidence/h200/call-a-s39.txt): gemma3-1b 877 against 844 tok/s,
  // llama-3.2-1b 1,013 against 986, qwen3-8b 167.5 against 164.8.
  const bool first = row < N && k + (U - 1) * kStep < k_end;
  if (first) load(std::true_type());
  griddep_wait();
  griddep_launch();
  if (row < N) {
    if (first) use(std::true_type());
    while (k + (U - 1) * kStep < k_end) {
      load(std::true_type());
      use(std::true_type());
    }
    if (k < k_end) {
      load(std::false_type());
      use(std::false_type());
    }
    if (slice == slices - 1)
      for (int j = Kv + lane; j < K; j += 32) acc[1] = fmaf(to_f(w[j]), to_f(x[j]), acc[1]);
  }
  const float sum = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  if (lane == 0) part[warp] = sum;
  __syncthreads();
  if (lane == 0 && slice == 0 && row < N) {
    float total = part[warp];
    for (int j = 1; j < slices; ++j) total += part[warp + j];
    out[row] = from_f<TO>(bias ? total + bias[row] : total);
  }
}

/// Warps per row of the loop kernel: doubled (up to 4) while the rows' warps fill less than
/// a wave of the kernel's resident warps and each slice keeps at least 4 vector steps. H100,
/// synth bf16 decode tg128, the settings alternating in one call (docs/evidence/h200/
/// call-b-s31.txt; session 30's kernel in brackets): gemma3-1b (down 1,152 x 6,912) 1 warp a
/// row 706, 2 740, 4 718 tok/s [662]; llama-3.2-1b (2,048 x 8,192) 951, 984, 978 [958];
/// qwen3-8b (4,096 x 12,288) 168.3, 168.6, 167.9 [168.1]. This rule picks 2, 2 and 1.
template <class T, class TO>
int loop_slices(int N, int K, int sm_count) {
  static const int blocks_per_sm = resident_blocks(gemv_kernel<T, TO>, kWarpsPerBlock * 32);
  const int64_t wave = int64_t(blocks_per_sm) * kWarpsPerBlock * sm_count;
  const int steps = (K / Vec16<T>::N + 31) / 32;
  int slices = 1;
  while (slices < 4 && int64_t(N) * slices * 2 <= wave && steps >= 4 * slices * 2)
    slices *= 2;
  return slices;
}

template <class T, class TO>
void gemv_loop_as(const void* x, const void* W, int64_t ld, const float* bias, int N, int K,
                  void* out, int sm_count, cudaStream_t s) {
  const int slices = loop_slices<T, TO>(N, K, sm_count);
  const int rows_per_block = kWarpsPerBlock / slices;
  launch_decode_k(gemv_kernel<T, TO>, dim3((N + rows_per_block - 1) / rows_per_block),
                  dim3(kWarpsPerBlock * 32), 0, s,
                  static_cast<const T*>(x), static_cast<const T*>(W), ld, bias, N, K, slices,
                  static_cast<TO*>(out));
}

template <class T>
void gemv_loop(const void* x, const void* W, int64_t ld, const float* bias, int N, int K,
               DType ot, void* out, int sm_count, cudaStream_t s) {
  if (ot == DType::F32) gemv_loop_as<T, float>(x, W, ld, bias, N, K, out, sm_count, s);
  else gemv_loop_as<T, T>(x, W, ld, bias, N, K, out, sm_count, s);
}

/// Blocks of the register kernel that fit on one SM (once per kernel).
template <class T, int NCH, int MODE, int ROWS, bool PRE = false>
int blocks_per_sm() {
  static const int n = resident_blocks(gemv_reg_kernel<T, NCH, MODE, ROWS, false, PRE>,
                                       warps_per_block<ROWS>() * 32);
  return n;
}

/// At most one wave of resident blocks (more rows loop inside the kernel: a second wave
/// would pay the whole load latency again).
/// The grid is sized by the untapped kernel's occupancy, so that a tapped launch runs the
/// same blocks over the same rows.
template <class T, int NCH, int MODE, int ROWS = 1, bool TAP = false, bool PRE = false>
void gemv_reg_launch(const GemvArgs& a, int sm_count, cudaStream_t s) {
  constexpr int WPB = warps_per_block<ROWS>();
  const int blocks = std::max(1, std::min((a.N + ROWS * WPB - 1) / (ROWS * WPB),
                                          blocks_per_sm<T, NCH, MODE, ROWS, PRE>() * sm_count));
  launch_decode_k(gemv_reg_kernel<T, NCH, MODE, ROWS, TAP, PRE>, dim3(blocks),
                  dim3(WPB * 32), 0, s, a);
}

template <class T, int MODE, bool TAP = false, bool PRE = false>
void gemv_reg_mode(const GemvArgs& a, int nch, int sm_count, cudaStream_t s) {
  switch (nch) {
    case 1: gemv_reg_launch<T, 1, MODE, 1, TAP, PRE>(a, sm_count, s); break;
    case 4: gemv_reg_launch<T, 4, MODE, 1, TAP, PRE>(a, sm_count, s); break;
    case 6: gemv_reg_launch<T, 6, MODE, 1, TAP, PRE>(a, sm_count, s); break;
    case 8: gemv_reg_launch<T, 8, MODE, 1, TAP, PRE>(a, sm_count, s); break;
    case 12: gemv_reg_launch<T, 12, MODE, 1, TAP, PRE>(a, sm_count, s); break;
    default: gemv_reg_launch<T, 16, MODE, 1, TAP, PRE>(a, sm_count, s); break;
  }
}

/// A norm form: rows of four chunks (1,024 elements in bf16/f16, 512 in f32; the q/k/v and
/// gate/up projections) two per warp when they fit in one wave, else one. With a NormAdd
/// (untapped launches only: CudaBackend::pre_fusable) the PRE variant, one row a warp.
template <class T, int MODE, bool TAP = false>
void gemv_norm_form(const GemvArgs& a, int nch, int sm_count, cudaStream_t s) {
  ARB_ASSERT(!TAP || !a.pre_y);
  if constexpr (!TAP)
    if (a.pre_y) return gemv_reg_mode<T, MODE, false, true>(a, nch, sm_count, s);
  constexpr int R = 2;
  if (nch == 4 && a.N <= R * warps_per_block<R>() * blocks_per_sm<T, 4, MODE, R>() * sm_count)
    gemv_reg_launch<T, 4, MODE, R, TAP>(a, sm_count, s);
  else
    gemv_reg_mode<T, MODE, TAP>(a, nch, sm_count, s);
}

template <class T, bool TAP>
void gemv_reg_forms(const GemvArgs& a, int mode, int nch, int sm_count, cudaStream_t s) {
  switch (mode) {
    case kGemvNorm: gemv_norm_form<T, kGemvNorm, TAP>(a, nch, sm_count, s); break;
    case kGemvNormGlu: gemv_norm_form<T, kGemvNormGlu, TAP>(a, nch, sm_count, s); break;
    default: gemv_reg_mode<T, kGemvAdd, TAP>(a, nch, sm_count, s); break;
  }
}

template <class T>
void gemv_reg(const GemvArgs& a, int mode, int nch, int sm_count, cudaStream_t s) {
  if (mode == kGemvPlain) gemv_reg_mode<T, kGemvPlain>(a, nch, sm_count, s);
  else if (a.tapped) gemv_reg_forms<T, true>(a, mode, nch, sm_count, s);
  else gemv_reg_forms<T, false>(a, mode, nch, sm_count, s);
}

}  // namespace

bool gemv_fusable(DType ct, int K) {
  const int V = int(16 / ctype_size(ct));
  return K > 0 && K % V == 0 && reg_nch(chunks_for(ct, K)) != 0;
}

void launch_gemv_fused(DType ct, int mode, const GemvArgs& a, int sm_count, cudaStream_t s) {
  const int nch = reg_nch(chunks_for(ct, a.K));
  ARB_CHECK(gemv_fusable(ct, a.K), "[cuda] fused gemv: rows of %d elements", a.K);
  ARB_DISPATCH_CTYPE(ct, T, gemv_reg<T>(a, mode, nch, sm_count, s));
  ARB_LAUNCHED("gemv_reg_kernel", s);
}

void launch_gemv(DType ct, const void* x, const void* W, int64_t ld, const float* bias, int N,
                 int K, DType ot, void* out, int sm_count, cudaStream_t s) {
  if (gemv_fusable(ct, K)) {
    GemvArgs a;
    a.x = x;
    a.K = K;
    a.N = N;
    a.n_seg = 1;
    a.seg[0] = GemvSeg{W, ld, bias, out, N, ot == DType::F32 && ct != DType::F32 ? 1 : 0};
    if (ct == DType::F32) a.seg[0].out_f32 = 1;
    launch_gemv_fused(ct, kGemvPlain, a, sm_count, s);
    return;
  }
  ARB_DISPATCH_CTYPE(ct, T, gemv_loop<T>(x, W, ld, bias, N, K, ot, out, sm_count, s));
  ARB_LAUNCHED("gemv_kernel", s);
}

}  // namespace arbiter::cuda
