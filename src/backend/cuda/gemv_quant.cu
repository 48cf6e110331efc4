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
      if (lane != 0 || g * ROWS + r >= a.N) continue;
      int row;
      const QGemvSeg& sg = a.seg[locate(a, g * ROWS + r, row)];
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

/// Blocks of one GEMV kernel resident per SM with `smem` bytes (the occupancy calculator,
/// cached per kernel and size; the first call also lifts the kernel's shared-memory limit).
template <class Kernel>
int resident_blocks(Kernel k, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(reinterpret_cast<const void*>(k), smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  prefer_max_shared(reinterpret_cast<const void*>(k));  // as launch_decode_k will
  ARB_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kQSmemMax)));
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kQWarps * 32, smem) != cudaSuccess) {
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
/// unit; each value exact in f64 (unit_value), then rounded once to T.
template <DType Q, class T>
__global__ void dequant_kernel(const uint8_t* W, int64_t rb, const int32_t* ids, int64_t row0,
                               int rows, int K, T* dst, int64_t ld) {
  using F = Fmt<Q>;
  constexpr int UPB = F::B / 32;
  griddep_wait();  // ids may be the previous kernel's pick
  griddep_launch();
  const int upr = K / 32;
  const int64_t total = int64_t(rows) * upr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int r = int(i / upr), gu = int(i % upr);
    const int64_t src = ids ? int64_t(ids[r]) : row0 + r;
    Unit u;
    F::unit(W + src * rb + int64_t(gu / UPB) * F::BB, gu % UPB, u);
    T* o = dst + int64_t(r) * ld + int64_t(gu) * 32;
    const float* tab = F::kTable == 2 ? kTableMXFP4 : kTableIQ4NL;
#pragma unroll
    for (int j = 0; j < 32; ++j) o[j] = from_d<T>(unit_value<F>(u, j, tab));
  }
}

template <DType Q>
void dequant_typed(DType ct, const uint8_t* W, int64_t rb, const int32_t* ids, int64_t row0,
                   int rows, int K, void* dst, int64_t ld, cudaStream_t s) {
  const int64_t units = int64_t(rows) * (K / 32);
  const int blocks = int(std::clamp<int64_t>((units + 255) / 256, 1, int64_t(1) << 16));
  ARB_DISPATCH_CTYPE(ct, T,
                     launch_decode_k(dequant_kernel<Q, T>, dim3(blocks), dim3(256), 0, s, W, rb,
                                     ids, row0, rows, K, static_cast<T*>(dst), ld));
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

bool qgemv_fits(DType qt, int K, int mode) {
  return dispatch_packed(qt, FitsFn{K, mode == kQGemvSwiglu});
}

void launch_qgemv(DType ct, DType qt, int mode, const void* x, const QGemvSeg* seg, int n_seg,
                  const void* W2, int64_t rb, int K, int sm_count, cudaStream_t s) {
  ARB_CHECK(n_seg >= 1 && n_seg <= 3 && (n_seg == 1 || mode == kQGemvPlain),
            "[cuda] packed gemv: %d matrices in mode %d", n_seg, mode);
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
