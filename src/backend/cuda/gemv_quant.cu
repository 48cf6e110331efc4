// Kernels that read ggml's packed block formats (core/quant.h; docs/quantization.md) on the
// device, as uploaded (weights.h: the blocks as stored, each row padded to a 16-byte stride),
// through the decoders of quant_decode.cuh:
//  - the decode GEMV (T == 1): out[N] = W[N, K] @ x[K], x in the compute type, never
//    quantized; every weight dequantized in registers, f32 accumulation;
//  - the dequantization of rows into the compute type (the prefill's GEMM workspace tiles,
//    the embedding rows of a packed token table), each value the exact one rounded once.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/quant_decode.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/quant.h"

namespace arbiter::cuda {

namespace {

// core/quant.cpp's codebooks kIQ4NLValues and kMXFP4Values (E2M1 doubled), as floats.
__constant__ float kTableIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
__constant__ float kTableMXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// Byte i of w (< 2^8) minus off, as f32 without an integer conversion (whose throughput is a
/// quarter of an FMA's): the byte becomes the low mantissa of 2^23.
__device__ __forceinline__ float byte_minus(uint32_t w, int i, float magic_off) {
  return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | unsigned(i))) - magic_off;
}

/// sum_j value_j * x_j over a unit, given sx0, sx1 = the sums of x over its halves: the quants
/// dotted with x in f32 (two chains, one per half), then the halves' scales and mins applied
/// once (a * sum q x + b * sum x).
template <DType Q>
__device__ __forceinline__ float unit_dot(const Unit& u, const float (&x)[32], float sx0,
                                          float sx1, const float* tab) {
  using F = Fmt<Q>;
  constexpr float kMagic = 8388608.f + float(F::kOff);
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t w = u.q[j];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float v = F::kTable ? tab[(w >> (8 * i)) & 0xFF] : byte_minus(w, i, kMagic);
      if (j < 4) s0 = fmaf(v, x[4 * j + i], s0);
      else s1 = fmaf(v, x[4 * j + i], s1);
    }
  }
  float r = F::kOneScale ? u.a0 * (s0 + s1) : fmaf(u.a0, s0, u.a1 * s1);
  if constexpr (F::kMin) r += F::kOneScale ? u.b0 * (sx0 + sx1) : fmaf(u.b0, sx0, u.b1 * sx1);
  return r;
}

__device__ __forceinline__ float load_x(DType ct, const void* x, int k) {
  switch (ct) {
    case DType::F16: return __half2float(static_cast<const __half*>(x)[k]);
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[k]);
    default: return static_cast<const float*>(x)[k];
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// --- the decode GEMV ------------------------------------------------------------------------
// A warp takes ROWS rows at a time (with SW, the SwiGLU form: ROWS gate rows and the same ROWS
// up rows) and streams them in pieces of PB blocks (~0.5-1.7 KB a
// row) by cp.async into its shared-memory ring of kQStages pieces, kQStages - 1 pieces ahead
// of the one it computes (the first ones issued before griddepcontrol.wait, while the previous
// kernel runs). x is widened once per block into shared memory in f32, 32 values per unit at
// a stride of 36 floats (the lanes' units then sit in distinct banks), with the sum of each
// half-unit beside it (sum(x) per 16 values: the min terms' factor, shared by every row).
// Lane l takes units l, l + 32, ... of each piece: it reads the unit's 32 x values once and
// dots them with each of the ROWS rows' quants. A row's sum: each lane's units in order, then
// the warp's shuffle tree: deterministic.
constexpr int kQStages = 3, kQWarps = 4;

struct QGemvArgs {
  DType ct = DType::BF16;
  int mode = kQGemvPlain;
  const void* x = nullptr;
  /// The matrices, their rows stacked (kQGemvPlain: up to 3, e.g. q, k, v; else 1; seg[0].out
  /// is the residual of kQGemvAdd, the activation of kQGemvSwiglu).
  QGemvSeg seg[3];
  int n_seg = 1;
  const uint8_t* W2 = nullptr;  // kQGemvSwiglu: the up rows (seg[0].W: the gate rows)
  int64_t rb = 0;  // bytes from one row to the next (every matrix)
  int N = 0, K = 0;  // N: the rows of all segments
  const float* norm_w = nullptr;  // the tensor-core kernel: x normalised first (launch_qgemv)
  float eps = 0.f;
};

/// The segment of stacked row `row` and the row within it.
__device__ __forceinline__ int locate(const QGemvArgs& a, int row, int& rr) {
  int si = 0;
  rr = row;
  while (si + 1 < a.n_seg && rr >= a.seg[si].rows) rr -= a.seg[si++].rows;
  return si;
}

__device__ __forceinline__ float load_ct(DType ct, const void* p, int i) { return load_x(ct, p, i); }
/// f rounded to the compute type (as a store and a load of it would give).
__device__ __forceinline__ float round_ct(DType ct, float f) {
  return ct == DType::F16 ? __half2float(__float2half_rn(f))
         : ct == DType::BF16 ? __bfloat162float(__float2bfloat16_rn(f)) : f;
}
__device__ __forceinline__ void store_ct(DType ct, void* p, int i, float f) {
  if (ct == DType::F16) static_cast<__half*>(p)[i] = __float2half_rn(f);
  else if (ct == DType::BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(f);
  else static_cast<float*>(p)[i] = f;
}

/// Stacked row `stacked` done: v = its row of W @ x (v2: the up row's, SwiGLU form), written
/// as the launch's form writes it.
template <bool SW>
__device__ __forceinline__ void qgemv_store(const QGemvArgs& a, int stacked, float v, float v2) {
  int row;
  const QGemvSeg& sg = a.seg[locate(a, stacked, row)];
  if constexpr (SW) {
    // act = silu(gate) * up, gate and up rounded first: matmul, matmul, swiglu's bits.
    const float gt = round_ct(a.ct, v), up = round_ct(a.ct, v2);
    store_ct(a.ct, sg.out, row, gt / (1.0f + expf(-gt)) * up);
  } else if (a.mode == kQGemvAdd) {  // res += product rounded: matmul then add's bits
    store_ct(a.ct, sg.out, row, load_ct(a.ct, sg.out, row) + round_ct(a.ct, v));
  } else {
    const float y = sg.bias ? v + sg.bias[row] : v;
    if (sg.out_f32) static_cast<float*>(sg.out)[row] = y;
    else store_ct(a.ct, sg.out, row, y);
  }
}

template <DType Q, int ROWS, bool SW>
__global__ void __launch_bounds__(kQWarps * 32) qgemv_kernel(QGemvArgs a) {
  using F = Fmt<Q>;
  constexpr int UPB = F::B / 32, UPP = F::PB * UPB, PBYTES = F::PB * F::BB;
  constexpr int LR = SW ? 2 * ROWS : ROWS;  // rows loaded per group
  static_assert(PBYTES % 16 == 0 && UPP % 32 == 0, "a piece: 16-byte multiple, 32-unit multiple");
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float tab[16];
  const int nunits = a.K / 32, nblocks = a.K / F::B;
  const int npieces = (nblocks + F::PB - 1) / F::PB;
  float* xs = reinterpret_cast<float*>(smem);  // unit u at xs + 36 u
  float* sxs = xs + nunits * 36;               // sum of x over half-unit h
  uint8_t* ring = smem + (size_t(nunits) * 38 * 4 + 15) / 16 * 16 +
                  size_t(threadIdx.x / 32) * kQStages * LR * PBYTES;
  const int lane = threadIdx.x % 32;
  const int gstride = gridDim.x * kQWarps;
  // The issue cursor: row group ig, piece ip, ring slot islot.
  int ig = blockIdx.x * kQWarps + threadIdx.x / 32, ip = 0, islot = 0;
  auto issue = [&] {
    if (ig * ROWS < a.N) {
      const int chunks = (min(F::PB, nblocks - ip * F::PB) * F::BB + 15) / 16;
      uint8_t* dst = ring + islot * LR * PBYTES;
#pragma unroll
      for (int r = 0; r < LR; ++r) {
        const int row = ig * ROWS + r % ROWS;
        if (row >= a.N) continue;
        int rr;
        const int si = locate(a, row, rr);
        const uint8_t* src = static_cast<const uint8_t*>(r < ROWS ? a.seg[si].W : a.W2) +
                             int64_t(rr) * a.rb + int64_t(ip) * PBYTES;
        for (int c = lane; c < chunks; c += 32) cp_async16(dst + r * PBYTES + 16 * c, src + 16 * c);
      }
      if (++ip == npieces) ip = 0, ig += gstride;
    }
    cp_async_commit();  // an empty group past the end keeps the count uniform
    islot = islot + 1 == kQStages ? 0 : islot + 1;
  };
#pragma unroll
  for (int i = 0; i < kQStages - 1; ++i) issue();
  griddep_wait();
  griddep_launch();
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) xs[(k / 32) * 36 + k % 32] = load_x(a.ct, a.x, k);
  if (F::kTable && threadIdx.x < 16)
    tab[threadIdx.x] = (F::kTable == 2 ? kTableMXFP4 : kTableIQ4NL)[threadIdx.x];
  __syncthreads();
  for (int h = threadIdx.x; h < 2 * nunits; h += blockDim.x) {
    const float* p = xs + (h / 2) * 36 + (h % 2) * 16;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s += p[i];
    sxs[h] = s;
  }
  __syncthreads();
  int cslot = 0;
  for (int g = blockIdx.x * kQWarps + threadIdx.x / 32; g * ROWS < a.N; g += gstride) {
    float acc[LR];
#pragma unroll
    for (int r = 0; r < LR; ++r) acc[r] = 0.f;
    for (int p = 0; p < npieces; ++p) {
      issue();
      cp_async_wait<kQStages - 1>();
      __syncwarp();
      const uint8_t* piece = ring + cslot * LR * PBYTES;
#pragma unroll
      for (int i = 0; i < UPP / 32; ++i) {
        const int u = lane + 32 * i, gu = p * UPP + u;
        if (gu >= nunits) break;
        float x[32];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 v = reinterpret_cast<const float4*>(xs + gu * 36)[j];
          x[4 * j] = v.x, x[4 * j + 1] = v.y, x[4 * j + 2] = v.z, x[4 * j + 3] = v.w;
        }
        const float sx0 = sxs[2 * gu], sx1 = sxs[2 * gu + 1];
#pragma unroll
        for (int r = 0; r < LR; ++r) {
          if (g * ROWS + r % ROWS >= a.N) continue;
          Unit un;
          F::unit(piece + r * PBYTES + (u / UPB) * F::BB, u % UPB, un);
          acc[r] += unit_dot<Q>(un, x, sx0, sx1, tab);
        }
      }
      __syncwarp();  // every lane is done with the slot before a later issue refills it
      cslot = cslot + 1 == kQStages ? 0 : cslot + 1;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[r]);
      const float v2 = SW ? warp_sum(acc[SW ? r + ROWS : r]) : 0.f;
      if (lane == 0 && g * ROWS + r < a.N) qgemv_store<SW>(a, g * ROWS + r, v, v2);
    }
  }
  cp_async_wait<0>();
}

/// Dynamic shared memory of the GEMV for rows of K values, `rows` loaded per warp.
template <DType Q>
size_t qgemv_smem(int K, int rows) {
  return (size_t(K / 32) * 38 * 4 + 15) / 16 * 16 +
         size_t(kQWarps) * kQStages * rows * Fmt<Q>::PB * Fmt<Q>::BB;
}
// The dynamic shared memory a block may take on sm_90 (227 KB), less room for the kernel's
// static table.
constexpr size_t kQSmemMax = 226 * 1024;

/// Blocks of one GEMV kernel resident per SM with `smem` bytes and `threads` a block (the
/// occupancy calculator, cached per kernel, size and threads; the first call also lifts the
/// kernel's shared-memory limit).
template <class Kernel>
int resident_blocks(Kernel k, size_t smem, int threads = kQWarps * 32) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(k), smem, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  prefer_max_shared(reinterpret_cast<const void*>(k));  // as launch_decode_k will
  ARB_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kQSmemMax)));
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    n = 1;
  }
  return cache.emplace(key, std::max(n, 1)).first->second;
}

template <DType Q, int ROWS, bool SW>
void qgemv_launch(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  const size_t smem = qgemv_smem<Q>(a.K, SW ? 2 * ROWS : ROWS);
  const int groups = (a.N + ROWS - 1) / ROWS;
  const int blocks =
      std::max(1, std::min((groups + kQWarps - 1) / kQWarps,
                           resident_blocks(qgemv_kernel<Q, ROWS, SW>, smem) * sm_count));
  launch_decode_k(qgemv_kernel<Q, ROWS, SW>, dim3(blocks), dim3(kQWarps * 32), smem, s, a);
}

/// Rows per warp: 4 (x read once for four rows) while three blocks fit an SM's shared memory,
/// else 2, else 1; 0 when not even one row fits (the caller dequantizes instead). The SwiGLU
/// form loads each row twice (gate and up).
template <DType Q>
int qgemv_rows(int K, bool sw) {
  const int m = sw ? 2 : 1;
  if (qgemv_smem<Q>(K, 4 * m) <= kQSmemMax / 3) return 4;
  if (qgemv_smem<Q>(K, 2 * m) <= kQSmemMax / 2) return 2;
  return qgemv_smem<Q>(K, m) <= kQSmemMax ? 1 : 0;
}

template <DType Q, bool SW>
bool qgemv_rows_launch(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  switch (qgemv_rows<Q>(a.K, SW)) {
    case 4: qgemv_launch<Q, 4, SW>(a, sm_count, s); return true;
    case 2: qgemv_launch<Q, 2, SW>(a, sm_count, s); return true;
    case 1: qgemv_launch<Q, 1, SW>(a, sm_count, s); return true;
    default: return false;
  }
}

template <DType Q>
bool qgemv_typed(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  return a.mode == kQGemvSwiglu ? qgemv_rows_launch<Q, true>(a, sm_count, s)
                                : qgemv_rows_launch<Q, false>(a, sm_count, s);
}

// --- the decode GEMV on tensor cores (Q4_K, Q5_K and Q6_K, bf16 and f16) -------------------
// A tile is 16 rows (the SwiGLU form: 8 gate rows in the MMA's rows 0..7 and the same 8 up rows
// in 8..15). A block of S warps runs tiles blockIdx.x, + gridDim.x, ...; warp w takes
// super-blocks w, w + S, ... of each, each lane loading its bytes of rows g and g + 8 straight
// into registers, the next super-block's (across tiles too) while it computes the current one.
// S depends on K only (qmma_split), so a row's sum does not depend on how many rows a launch
// stacks or on the form. (A cp.async ring of 3-4 super-blocks per warp in shared memory, 3
// blocks an SM, measured slower on the H200: 280 against 303 tok/s, qwen3-8b Q4_K_M.)
//
// A super-block is one chain of m16n8k16 MMAs (f32 accumulators): A = 16 rows x 16 quants as
// q - off, exact in the compute type (the quant becomes the low mantissa of 128 (bf16) or 1024
// (f16), whose last place is 1, and 128 + off or 1024 + off is subtracted); B = x. B's and D's 8
// columns stand for the super-block's 8 scale groups (Q4_K/Q5_K: sub-blocks of 32; Q6_K: a
// half's 8 groups of 16, so a chain per half): column j of B holds x where the MMA's quants
// belong to group j and 0 elsewhere, so D[row, j] is group j's sum of q x, every product exact.
// Then per (row, group) the scales in f32: a D + b sum(x) (b the min's term), in group order
// per lane, then the quad's shuffle tree (each lane holds 2 groups of 2 rows), then the warps in
// order. A lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 of A and D and column g of
// B; within an MMA its 4 k slots stand for 4 quants of one group (any order of k serves, as
// long as A and B share it).
constexpr int kMmaRows = 16, kMmaMaxWarps = 8;

/// The element type of the bf16 (F16 false) or f16 form: mma_16816's operands.
template <bool F16>
using MmaElem = std::conditional_t<F16, __half, __nv_bfloat16>;

/// Bytes 0 and 2 of v (sel 0x4240) or 1 and 3 (0x4341), quants below 128, as a pair of the
/// compute type holding q - OFF exactly (lower k in the low half).
template <bool F16, int OFF>
__device__ __forceinline__ uint32_t quant_pair(uint32_t v, unsigned sel) {
  constexpr uint32_t kBias = (F16 ? 0x6400u : 0x4300u) + OFF;
  const uint32_t m = __byte_perm(v, F16 ? 0x64646464u : 0x43434343u, sel);
  uint32_t r;
  if constexpr (F16) asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(kBias | kBias << 16));
  else asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(kBias | kBias << 16));
  return r;
}
/// The sum of the two values of a pair of the compute type, in f32.
template <bool F16>
__device__ __forceinline__ float pair_sum(uint32_t p) {
  return F16 ? __half2float(__ushort_as_half(uint16_t(p))) +
                   __half2float(__ushort_as_half(uint16_t(p >> 16)))
             : __uint_as_float(p << 16) + __uint_as_float(p & 0xFFFF0000u);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
/// 8 values of x: from global memory, or (XS) from the block's normalised copy in shared memory.
template <bool XS>
__device__ __forceinline__ uint4 ldx16(const uint16_t* p) {
  if constexpr (XS) return *reinterpret_cast<const uint4*>(p);
  else return ldg16(p);
}
/// 8 bytes at p, which is only 2-byte aligned (Q6_K's 210-byte blocks): three aligned words
/// and two funnel shifts.
__device__ __forceinline__ void ld8_a2(const uint8_t* p, uint32_t& w0, uint32_t& w1) {
  const uintptr_t ad = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(ad & ~uintptr_t(3));
  const unsigned sh = unsigned(ad & 3) * 8;
  const uint32_t x0 = __ldg(base), x1 = __ldg(base + 1), x2 = __ldg(base + 2);
  w0 = __funnelshift_r(x0, x1, sh);
  w1 = __funnelshift_r(x1, x2, sh);
}
/// The pairs of x that MMA k slots (2t, 2t + 1) and (2t + 8, 2t + 9) take from 4 consecutive
/// values x0..x3 held as words (x0, x1), (x2, x3): (x0, x2) and (x1, x3), matching quant_pair's
/// bytes 0, 2 and 1, 3 of a word of 4 quants.
__device__ __forceinline__ void x_pairs(uint32_t w01, uint32_t w23, uint32_t& lo, uint32_t& hi) {
  lo = __byte_perm(w01, w23, 0x5410);
  hi = __byte_perm(w01, w23, 0x7632);
}

template <DType Q>
struct MmaFmt;

/// Q4_K and Q5_K (kFifth: Q5_K's fifth bit of value l of sub-block s is bit s of qh[l]).
template <bool kFifth>
struct MmaKQuant {
  // Lane t reads bytes 16 t..16 t + 15 of each 64-byte half c of qs: sub-block pair
  // p = 2c + t / 2, values l = 16 (t % 2) + 4i + byte of word i, the low nibbles group 2p, the
  // high ones 2p + 1 (Q5_K: and bytes 16 (t % 2)..+15 of qh, whose bit 2p + nibble tops them).
  // So the MMA of (c, i, nibble) puts group 4c + 2 (t / 2) + nibble in lane t's k slots, and
  // lane (g, t) holds x in B only where that group is g: for c = g / 4, nibble = g % 2 and
  // t / 2 = (g / 2) % 2 (the lane then holds half of group g's x).
  static constexpr int BB = kFifth ? 176 : 144, kQs = kFifth ? 48 : 16;
  struct Lane {
    uint4 h, q0, q1;  // d, dmin, scales; this lane's 16 bytes of qs halves 0 and 1
    uint4 qh;         // Q5_K: this lane's 16 bytes of qh
  };
  __device__ __forceinline__ static void load(const uint8_t* b, int t, Lane& o) {
    o.h = ldg16(b);
    o.q0 = ldg16(b + kQs + 16 * t);
    o.q1 = ldg16(b + kQs + 64 + 16 * t);
    if constexpr (kFifth) o.qh = ldg16(b + 16 + 16 * (t & 1));
  }
  template <bool F16, bool XS>
  __device__ __forceinline__ static void step(const Lane (&L)[2], const uint16_t* x, int sb,
                                              int g, int t, float (&acc)[2]) {
    uint32_t xlo[4] = {0, 0, 0, 0}, xhi[4] = {0, 0, 0, 0};
    float half = 0.f;  // this lane's half of group g's sum of x (0 in the lanes without x)
    if ((t >> 1) == ((g >> 1) & 1)) {
      const uint16_t* xp = x + 256 * sb + 32 * g + 16 * (t & 1);
      const uint4 v0 = ldx16<XS>(xp), v1 = ldx16<XS>(xp + 8);
      const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) half += pair_sum<F16>(w[i]);
#pragma unroll
      for (int i = 0; i < 4; ++i) x_pairs(w[2 * i], w[2 * i + 1], xlo[i], xhi[i]);
    }
    // Group j's sum: its two halves (lanes 4j + 2 ((j / 2) % 2) + 0, 1); this lane's groups are
    // 2t and 2t + 1.
    const float whole = half + __shfl_xor_sync(0xffffffffu, half, 1);
    const float sx0 = __shfl_sync(0xffffffffu, whole, 8 * t + 2 * (t & 1));
    const float sx1 = __shfl_sync(0xffffffffu, whole, 8 * t + 4 + 2 * (t & 1));
    float D[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int nib = 0; nib < 2; ++nib) {
          const uint32_t mk = (c == (g >> 2) && nib == (g & 1)) ? ~0u : 0u;
          uint32_t A[4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t w = word(c ? L[r].q1 : L[r].q0, i);
            uint32_t v = (nib ? w >> 4 : w) & 0x0F0F0F0Fu;
            if constexpr (kFifth)
              v |= ((word(L[r].qh, i) >> (4 * c + 2 * (t >> 1) + nib)) & 0x01010101u) << 4;
            A[r] = quant_pair<F16, 0>(v, 0x4240);
            A[2 + r] = quant_pair<F16, 0>(v, 0x4341);
          }
          mma_16816<MmaElem<F16>>(D, A, xlo[i] & mk, xhi[i] & mk);
        }
    // D[2r + e] = row g + 8r, group 2t + e; its scale and min (ggml's get_scale_min_k4) from
    // bytes 2t + e of the 12 scale bytes, the header's words y, z, w.
    const unsigned sh = 16 * (t & 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4 h = L[r].h;
      const uint32_t scw = t >= 2 ? (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u)
                                  : h.y & 0x3F3F3F3Fu;
      const uint32_t mw = t >= 2 ? ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u)
                                 : h.z & 0x3F3F3F3Fu;
      const float d = __half2float(__ushort_as_half(uint16_t(h.x)));
      const float dmin = __half2float(__ushort_as_half(uint16_t(h.x >> 16)));
      const float a0 = d * float((scw >> sh) & 0xFF), a1 = d * float((scw >> (sh + 8)) & 0xFF);
      const float b0 = -(dmin * float((mw >> sh) & 0xFF));
      const float b1 = -(dmin * float((mw >> (sh + 8)) & 0xFF));
      acc[r] += fmaf(a0, D[2 * r], b0 * sx0);
      acc[r] += fmaf(a1, D[2 * r + 1], b1 * sx1);
    }
  }
};

template <>
struct MmaFmt<DType::Q4_K> : MmaKQuant<false> {};
template <>
struct MmaFmt<DType::Q5_K> : MmaKQuant<true> {};

template <>
struct MmaFmt<DType::Q6_K> {
  // Per half n (128 values, scales 8n..8n + 7 for groups of 16), lane t reads the 8 bytes
  // 8t..8t + 7 of ql[64n..] (a), of ql[64n + 32..] (b) and of qh[32n..]: values l = 8t + 4w +
  // byte of word w in each quarter k of the half (value 32k + l: a's low nibbles for k = 0, b's
  // for 1, a's high for 2, b's high for 3, with bits 2k of qh above). The MMA of (k, w) puts
  // group 2k + t / 2 in lane t's k slots: lane (g, t) holds x in B for k = g / 2 when
  // t / 2 = g % 2.
  static constexpr int BB = 210;
  struct Lane {
    uint32_t a[2][2], b[2][2], qh[2][2];  // [half][word]
    uint32_t sc;  // int8 scales 2t, 2t + 1 of half 0 (bits 0..15) and half 1 (16..31)
    uint32_t d;   // f16 bits
  };
  __device__ __forceinline__ static void load(const uint8_t* b, int t, Lane& o) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      ld8_a2(b + 64 * n + 8 * t, o.a[n][0], o.a[n][1]);
      ld8_a2(b + 64 * n + 32 + 8 * t, o.b[n][0], o.b[n][1]);
      ld8_a2(b + 128 + 32 * n + 8 * t, o.qh[n][0], o.qh[n][1]);
    }
    const uint16_t* h = reinterpret_cast<const uint16_t*>(b);
    o.sc = uint32_t(__ldg(h + 96 + t)) | uint32_t(__ldg(h + 100 + t)) << 16;
    o.d = __ldg(h + 104);
  }
  template <bool F16, bool XS>
  __device__ __forceinline__ static void step(const Lane (&L)[2], const uint16_t* x, int sb,
                                              int g, int t, float (&acc)[2]) {
    const bool act = (t >> 1) == (g & 1);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      uint32_t xlo[2] = {0, 0}, xhi[2] = {0, 0};
      if (act) {
        const uint4 v = ldx16<XS>(x + 256 * sb + 128 * n + 32 * (g >> 1) + 8 * t);
        x_pairs(v.x, v.y, xlo[0], xhi[0]);
        x_pairs(v.z, v.w, xlo[1], xhi[1]);
      }
      float D[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const uint32_t mk = k == (g >> 1) ? ~0u : 0u;
          uint32_t A[4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t lo = (k % 2 ? L[r].b[n][w] : L[r].a[n][w]) >> (4 * (k / 2));
            const uint32_t h = L[r].qh[n][w];
            const uint32_t hi = k == 0 ? h << 4 : k == 1 ? h << 2 : k == 2 ? h : h >> 2;
            const uint32_t v = (lo & 0x0F0F0F0Fu) | (hi & 0x30303030u);
            A[r] = quant_pair<F16, 32>(v, 0x4240);
            A[2 + r] = quant_pair<F16, 32>(v, 0x4341);
          }
          mma_16816<MmaElem<F16>>(D, A, xlo[w] & mk, xhi[w] & mk);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float d = __half2float(__ushort_as_half(uint16_t(L[r].d)));
        const uint32_t s = L[r].sc >> (16 * n);
        acc[r] += (d * float(int8_t(s & 0xFF))) * D[2 * r];
        acc[r] += (d * float(int8_t((s >> 8) & 0xFF))) * D[2 * r + 1];
      }
    }
  }
};

/// The rmsnorm op's xn (rmsnorm_vec_kernel's arithmetic: each lane's 8-value chunks k = 8 lane
/// + 256 j in j order, the warp's shuffle tree, norm_elem) into xs, each warp of the block the
/// sum of squares, chunk j normalised by warp j % nwarps.
template <class T>
__device__ __forceinline__ void normalise_x(const T* x, int K, const float* w, float eps,
                                            int warp, int nwarps, int lane, uint4* xs) {
  const int nch = (K + 255) / 256;
  float ss = 0.f;
  for (int j = 0; j < nch; ++j) {
    const int k = 8 * lane + 256 * j;
    if (k >= K) continue;  // the op's chunks past K are zeros: fmaf(0, 0, ss) == ss
    const uint4 v = ldg16(x + k);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = to_f(e[i]);
      ss = fmaf(f, f, ss);
    }
  }
  const float inv = inv_rms(warp_sum(ss), K, eps);
  for (int j = warp; j < nch; j += nwarps) {
    const int k = 8 * lane + 256 * j;
    if (k >= K) continue;
    uint4 v = ldg16(x + k);
    T* e = reinterpret_cast<T*>(&v);
    float wv[8];
    load_f32s<8>(w + k, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = norm_elem<T>(to_f(e[i]), inv, wv[i]);
    xs[k / 8] = v;
  }
}

template <DType Q, bool F16, bool SW, bool NORM>
__global__ void __launch_bounds__(kMmaMaxWarps * 32, 2) qmma_kernel(QGemvArgs a, int S) {
  using M = MmaFmt<Q>;
  using T = MmaElem<F16>;
  extern __shared__ uint4 qmma_xn[];  // NORM: the normalised x [K]
  constexpr int OUT = SW ? 8 : 16;  // output rows per tile
  __shared__ float part[2][kMmaMaxWarps][kMmaRows];  // the warps' sums, by tile parity
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int nsb = a.K / 256, ntiles = (a.N + OUT - 1) / OUT;
  // This lane's rows of a tile: g and g + 8 (SW: gate row g and up row g); past N, the last.
  auto row_ptr = [&](int tile, int r) {
    const int row = min(tile * OUT + g + (SW ? 0 : 8 * r), a.N - 1);
    int rr;
    const int si = locate(a, row, rr);
    return static_cast<const uint8_t*>(SW && r ? a.W2 : a.seg[si].W) + int64_t(rr) * a.rb;
  };
  auto load = [&](int tile, int sb, typename M::Lane (&L)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) M::load(row_ptr(tile, r) + int64_t(sb) * M::BB, t, L[r]);
  };
  float acc[2] = {0.f, 0.f};
  int parity = 0;
  auto finish = [&](int tile) {  // tile's sums: lanes, quads, then the warps in order
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float v = acc[r];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) part[parity][warp][g + 8 * r] = v;
      acc[r] = 0.f;
    }
    __syncthreads();
    if (threadIdx.x < OUT) {
      float v = 0.f, v2 = 0.f;
      for (int w = 0; w < S; ++w) {
        v += part[parity][w][threadIdx.x];
        if (SW) v2 += part[parity][w][8 + threadIdx.x];
      }
      const int row = tile * OUT + int(threadIdx.x);
      if (row < a.N) qgemv_store<SW>(a, row, v, v2);
    }
    parity ^= 1;  // the next tile's sums go to the other half: no second barrier
  };
  // The work of this warp: (tile, super-block) in order, the next one's bytes always loading.
  int tile = blockIdx.x, sb = warp;
  auto advance = [&](int& tl, int& s) {
    if ((s += S) >= nsb) s = warp, tl += gridDim.x;
  };
  typename M::Lane bufA[2], bufB[2];
  if (tile < ntiles) load(tile, sb, bufA);
  griddep_wait();
  griddep_launch();
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  if constexpr (NORM) {
    normalise_x<T>(static_cast<const T*>(a.x), a.K, a.norm_w, a.eps, warp, S, lane, qmma_xn);
    __syncthreads();
    x = reinterpret_cast<const uint16_t*>(qmma_xn);
  }
  // Two register sets in turn.
  while (tile < ntiles) {
    int nt = tile, ns = sb;
    advance(nt, ns);
    if (nt < ntiles) load(nt, ns, bufB);
    M::template step<F16, NORM>(bufA, x, sb, g, t, acc);
    if (nt != tile) finish(tile);
    tile = nt, sb = ns;
    if (tile >= ntiles) break;
    advance(nt, ns);
    if (nt < ntiles) load(nt, ns, bufA);
    M::template step<F16, NORM>(bufB, x, sb, g, t, acc);
    if (nt != tile) finish(tile);
    tile = nt, sb = ns;
  }
}

/// Warps per tile for rows of nsb super-blocks: every warp at least one super-block, at most
/// 8 (H200, qwen3-8b Q4_K_M decode: 8, 4 and 2 warps gave 303.4, 272.2 and 219.3 tok/s).
int qmma_split(int nsb) { return std::max(1, std::min(kMmaMaxWarps, nsb)); }

/// Whether the tensor-core GEMV takes format qt in compute type ct.
bool qmma_takes(DType ct, DType qt, int K) {
  return (ct == DType::BF16 || ct == DType::F16) &&
         (qt == DType::Q4_K || qt == DType::Q5_K || qt == DType::Q6_K) && K % 256 == 0;
}

template <DType Q, bool F16, bool SW, bool NORM>
void qmma_launch(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  const int S = qmma_split(a.K / 256);
  const int tiles = (a.N + (SW ? 8 : 16) - 1) / (SW ? 8 : 16);
  const size_t smem = NORM ? size_t(a.K) * 2 : 0;
  const int blocks =
      std::min(tiles, resident_blocks(qmma_kernel<Q, F16, SW, NORM>, smem, 32 * S) * sm_count);
  launch_decode_k(qmma_kernel<Q, F16, SW, NORM>, dim3(blocks), dim3(32 * S), smem, s, a, S);
}

template <DType Q, bool F16>
void qmma_forms(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  const bool sw = a.mode == kQGemvSwiglu, norm = a.norm_w != nullptr;
  if (sw) norm ? qmma_launch<Q, F16, true, true>(a, sm_count, s)
               : qmma_launch<Q, F16, true, false>(a, sm_count, s);
  else norm ? qmma_launch<Q, F16, false, true>(a, sm_count, s)
            : qmma_launch<Q, F16, false, false>(a, sm_count, s);
}

template <DType Q>
void qmma_typed(const QGemvArgs& a, int sm_count, cudaStream_t s) {
  if (a.ct == DType::F16) qmma_forms<Q, true>(a, sm_count, s);
  else qmma_forms<Q, false>(a, sm_count, s);
}

// --- dequantization into the compute type ---------------------------------------------------
template <class T>
__device__ __forceinline__ T from_d(double v);
template <>
__device__ __forceinline__ float from_d<float>(double v) { return float(v); }
template <>
__device__ __forceinline__ __half from_d<__half>(double v) { return __double2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_d<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}

/// dst[r, :K] (row stride ld) = row (ids ? ids[r] : row0 + r) of W, for r < rows: a thread per
/// 16 bytes of output (8 bf16/f16 or 4 f32 values of a unit), consecutive threads writing
/// consecutive pieces (one 16-byte store each when `vec`: dst and ld allow it); each value
/// exact in f64 (unit_value), then rounded once to T.
template <DType Q, class T>
__global__ void dequant_kernel(const uint8_t* W, int64_t rb, const int32_t* ids, int64_t row0,
                               int rows, int K, T* dst, int64_t ld, bool vec) {
  using F = Fmt<Q>;
  constexpr int UPB = F::B / 32, V = 16 / int(sizeof(T)), P = 32 / V;
  griddep_wait();  // ids may be the previous kernel's pick
  griddep_launch();
  const int upr = K / 32;
  const int64_t total = int64_t(rows) * upr * P;
  const float* tab = F::kTable == 2 ? kTableMXFP4 : kTableIQ4NL;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t unit = i / P;
    const int piece = int(i % P), r = int(unit / upr), gu = int(unit % upr);
    const int64_t src = ids ? int64_t(ids[r]) : row0 + r;
    Unit u;
    F::unit(W + src * rb + int64_t(gu / UPB) * F::BB, gu % UPB, u);
    union {
      T v[V];
      uint4 u4;
    } out;
#pragma unroll
    for (int w = 0; w < V / 4; ++w) {
      const int word = piece * (V / 4) + w;
      uint32_t q = u.q[0];
#pragma unroll
      for (int k = 1; k < 8; ++k) q = word == k ? u.q[k] : q;  // no local-memory indexing
#pragma unroll
      for (int b = 0; b < 4; ++b)
        out.v[4 * w + b] = from_d<T>(unit_value<F>(u, q, 4 * word + b, tab));
    }
    T* o = dst + int64_t(r) * ld + int64_t(gu) * 32 + piece * V;
    if (vec) {
      *reinterpret_cast<uint4*>(o) = out.u4;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = out.v[j];
    }
  }
}

template <DType Q>
void dequant_typed(DType ct, const uint8_t* W, int64_t rb, const int32_t* ids, int64_t row0,
                   int rows, int K, void* dst, int64_t ld, cudaStream_t s) {
  const size_t es = ctype_size(ct);
  const int64_t pieces = int64_t(rows) * (K / 32) * (32 * int64_t(es) / 16);
  const int blocks = int(std::clamp<int64_t>((pieces + 255) / 256, 1, int64_t(1) << 16));
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && (ld * int64_t(es)) % 16 == 0;
  ARB_DISPATCH_CTYPE(ct, T,
                     launch_decode_k(dequant_kernel<Q, T>, dim3(blocks), dim3(256), 0, s, W, rb,
                                     ids, row0, rows, K, static_cast<T*>(dst), ld, vec));
}

/// f.template run<Q>() for the packed format qt.
template <class Fn>
auto dispatch_packed(DType qt, const Fn& f) {
  switch (qt) {
    case DType::Q8_0: return f.template run<DType::Q8_0>();
    case DType::Q4_0: return f.template run<DType::Q4_0>();
    case DType::Q4_1: return f.template run<DType::Q4_1>();
    case DType::Q5_0: return f.template run<DType::Q5_0>();
    case DType::Q5_1: return f.template run<DType::Q5_1>();
    case DType::Q2_K: return f.template run<DType::Q2_K>();
    case DType::Q3_K: return f.template run<DType::Q3_K>();
    case DType::Q4_K: return f.template run<DType::Q4_K>();
    case DType::Q5_K: return f.template run<DType::Q5_K>();
    case DType::Q6_K: return f.template run<DType::Q6_K>();
    case DType::IQ4_NL: return f.template run<DType::IQ4_NL>();
    case DType::IQ4_XS: return f.template run<DType::IQ4_XS>();
    case DType::MXFP4: return f.template run<DType::MXFP4>();
    default: break;
  }
  throw Error(std::string("[cuda] no packed kernel reads ") + dtype_name(qt));
}

struct FitsFn {
  int K;
  bool sw;
  template <DType Q>
  bool run() const { return K % Fmt<Q>::B == 0 && qgemv_rows<Q>(K, sw) > 0; }
};
struct GemvFn {
  const QGemvArgs& a;
  int sm_count;
  cudaStream_t s;
  template <DType Q>
  bool run() const { return qgemv_typed<Q>(a, sm_count, s); }
};
struct DequantFn {
  DType ct;
  const uint8_t* W;
  int64_t rb;
  const int32_t* ids;
  int64_t row0;
  int rows, K;
  void* dst;
  int64_t ld;
  cudaStream_t s;
  template <DType Q>
  bool run() const {
    dequant_typed<Q>(ct, W, rb, ids, row0, rows, K, dst, ld, s);
    return true;
  }
};

}  // namespace

bool packed_on_device(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4:
      return true;
    default:
      return false;
  }
}

bool qgemv_fits(DType ct, DType qt, int K, int mode, bool mma) {
  if (mma && qmma_takes(ct, qt, K)) return true;
  return dispatch_packed(qt, FitsFn{K, mode == kQGemvSwiglu});
}

bool qgemv_norm_fits(DType ct, DType qt, int K, int mode, bool mma) {
  return mma && mode != kQGemvAdd && qmma_takes(ct, qt, K) && gemv_fusable(ct, K);
}

void launch_qgemv(DType ct, DType qt, int mode, const void* x, const QGemvSeg* seg, int n_seg,
                  const void* W2, int64_t rb, int K, bool mma, int sm_count, cudaStream_t s,
                  const float* norm_w, float eps) {
  ARB_CHECK(n_seg >= 1 && n_seg <= 3 && (n_seg == 1 || mode == kQGemvPlain),
            "[cuda] packed gemv: %d matrices in mode %d", n_seg, mode);
  ARB_CHECK(!norm_w || qgemv_norm_fits(ct, qt, K, mode, mma),
            "[cuda] packed gemv: no fused norm for %s rows of %d values", dtype_name(qt), K);
  QGemvArgs a;
  a.ct = ct;
  a.mode = mode;
  a.x = x;
  a.n_seg = n_seg;
  a.N = 0;
  for (int i = 0; i < n_seg; ++i) {
    a.seg[i] = seg[i];
    a.N += seg[i].rows;
  }
  a.W2 = static_cast<const uint8_t*>(W2);
  a.rb = rb;
  a.K = K;
  a.norm_w = norm_w;
  a.eps = eps;
  if (mma && qmma_takes(ct, qt, K)) {
    if (qt == DType::Q4_K) qmma_typed<DType::Q4_K>(a, sm_count, s);
    else if (qt == DType::Q5_K) qmma_typed<DType::Q5_K>(a, sm_count, s);
    else qmma_typed<DType::Q6_K>(a, sm_count, s);
    ARB_LAUNCHED("qmma_kernel", s);
    return;
  }
  const bool ok = dispatch_packed(qt, GemvFn{a, sm_count, s});
  ARB_CHECK(ok, "[cuda] packed gemv: %s rows of %d values do not fit shared memory",
            dtype_name(qt), K);
  ARB_LAUNCHED("qgemv_kernel", s);
}

void launch_dequant_rows(DType ct, DType qt, const void* W, int64_t rb, const int32_t* ids,
                         int64_t row0, int rows, int K, void* dst, int64_t ld, cudaStream_t s) {
  if (rows <= 0) return;
  dispatch_packed(qt, DequantFn{ct, static_cast<const uint8_t*>(W), rb, ids, row0, rows, K,
                                dst, ld, s});
  ARB_LAUNCHED("dequant_kernel", s);
}

}  // namespace arbiter::cuda
