// Device-side helpers shared by the .cu files: f32 conversion of the compute types, 16-byte
// vector loads, warp reductions, the tensor-core MMA and the dispatch from DType to a C++
// element type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace arbiter::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Elements of T in one 16-byte vector.
template <class T>
struct Vec16 {
  static constexpr int N = 16 / int(sizeof(T));
};

/// Loads 16 bytes (p must be 16-byte aligned) and widens them to f32.
template <class T>
__device__ __forceinline__ void load16(const T* p, float (&f)[Vec16<T>::N]) {
  uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < Vec16<T>::N; ++i) f[i] = to_f(e[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int pos_of(const PosRef& p) { return p.dev ? *p.dev : p.host; }

/// KV-cache rows of key positions (AttnArgs::rows: position p at row p % rows). An attention
/// block reads keys in [lo, lo + rows) only (attention_cache_rows), so one division per thread
/// gives the ring lap of lo, base = ring_base(lo, rows), and each key's row is then a
/// subtraction and a compare: ring_row(key, base, rows). A cache that holds every position
/// has base 0 and row = key.
__device__ __forceinline__ int ring_base(int lo, int rows) { return lo - lo % rows; }
__device__ __forceinline__ int64_t ring_row(int key, int base, int rows) {
  const int r = key - base;
  return r < rows ? r : r - rows;
}
/// A key's row: through a paged pool's block table when `pages` is given (AttnArgs::blocks),
/// else ring_row.
__device__ __forceinline__ int64_t key_row(int key, int base, int rows, const int* pages,
                                           int block_rows) {
  return pages ? int64_t(pages[key / block_rows]) * block_rows + key % block_rows
               : ring_row(key, base, rows);
}

/// Programmatic dependent launch (sm_90). Every kernel of the tier calls griddep_wait()
/// before it reads anything an earlier kernel wrote (or writes anything an earlier kernel
/// reads): it returns once the preceding grid has completed and its writes are visible (at
/// once when the kernel was launched without PDL). griddep_launch() lets the next kernel
/// start its prologue (weight loads) while this one runs. Only weights, which no kernel
/// writes, may be read before griddep_wait().
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Launches kernel<<<grid, block, smem, s>>>(args...), with the PDL attribute when
/// pdl_enabled(). The kernel must call griddep_wait() before touching activations.
template <class... KArgs, class... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
              Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, KArgs(args)...);  // errors: ARB_LAUNCHED
}
/// launch_k for the kernels of a decode step's chain (embedding, GEMVs, decode attention,
/// pick): each with the most-shared L1/shared split (prefer_max_shared), so that the next
/// kernel's blocks can land beside the running one's. Not the prefill kernels: their own
/// splits are left to the driver.
template <class... KArgs, class... Args>
void launch_decode_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t s, Args... args) {
  prefer_max_shared(reinterpret_cast<const void*>(kernel));
  launch_k(kernel, grid, block, smem, s, args...);
}

/// 16 read-only bytes of a weight row, which a decode step streams once: not allocated in L1
/// (ld.global.nc.L1::no_allocate), so that what the SM's warps share stays there, and first
/// out of L2 (an L2::evict_first policy), so that what later kernels and steps read again
/// stays there: the KV cache, the activations, the norm weights. H200, synth qwen3-0.6b bf16
/// decode, one call (docs/evidence/h200/decode-variants-s12.txt): 1,828-1,829 against
/// 1,808-1,809 tok/s; -p 2048 1,818-1,819 against 1,792-1,799.
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 r;
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(pol));
  return r;
}

/// 16-byte row chunks of a warp: lane l holds elements [l V + j 32 V, + V) in chunk j
/// (zeros past n). The canonical order of the tier's row reductions: a lane sums its chunks
/// in order, element by element, then the warp's shuffle tree (warp_sum). kStream: loaded by
/// ldg_stream (weight rows, each read once per step).
template <class T, int NCH, bool kStream = false>
__device__ __forceinline__ void load_chunks(const T* p, int n, int lane, uint4 (&v)[NCH]) {
  constexpr int V = Vec16<T>::N;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int k = lane * V + j * 32 * V;
    const uint4* q = reinterpret_cast<const uint4*>(p + k);
    v[j] = k >= n ? make_uint4(0, 0, 0, 0) : kStream ? ldg_stream(q) : __ldg(q);
  }
}
/// The gated activations of swiglu/geglu and the fused gate/up GEMV (one definition, so the
/// fused and the op-by-op paths compile the same arithmetic): silu(g) * u, and HF
/// gelu_pytorch_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

/// One output of Mamba2's causal conv (Backend::ssm_conv) in channel c: silu(sum_k w[c, k]
/// seq(k) + b[c]), k in increasing order, f32, where seq(k) is row k of the K rows that end at
/// the token. ssm_conv_kernel (a prefill's tokens side by side) and conv_step (the in_proj
/// GEMV's one token) take it: one arithmetic.
template <class F>
__device__ __forceinline__ float conv_out(const float* w, const float* b, int K, int c, F seq) {
  const float* wc = w + int64_t(c) * K;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += wc[k] * seq(k);
  return silu(acc + (b ? b[c] : 0.f));
}
/// One token of the conv in channel c of C: conv_out of [the channel's state rows 0..K-2; x],
/// and the state shifted a row (row K-2 becomes x; T values copied as they are).
template <class T>
__device__ __forceinline__ float conv_step(const float* w, const float* b, int C, int K, int c,
                                           T x, T* state) {
  const float out = conv_out(w, b, K, c, [&](int k) {
    return k < K - 1 ? to_f(state[int64_t(k) * C + c]) : to_f(x);
  });
  // Rows in increasing order: row r takes row r + 1 before that one is overwritten.
  for (int r = 0; r < K - 1; ++r)
    state[int64_t(r) * C + c] = r + 1 < K - 1 ? state[int64_t(r + 1) * C + c] : x;
  return out;
}
__device__ __forceinline__ float gelu_tanh_mul(float g, float u) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi) rounded to f32
  return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
}

/// Sum of squares of a row in chunks (chunk(j): this lane's chunk j, e.g. from shared memory,
/// one chunk live at a time), in the canonical order; the same in every lane.
template <class T, int NCH, class Chunk>
__device__ __forceinline__ float chunks_sumsq_by(Chunk chunk) {
  constexpr int V = Vec16<T>::N;
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const uint4 c = chunk(j);
    const T* e = reinterpret_cast<const T*>(&c);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float f = to_f(e[i]);
      ss = fmaf(f, f, ss);
    }
  }
  return warp_sum(ss);
}
/// The same of a row held in chunks.
template <class T, int NCH>
__device__ __forceinline__ float chunks_sumsq(const uint4 (&v)[NCH]) {
  return chunks_sumsq_by<T, NCH>([&](int j) { return v[j]; });
}
/// 1 / sqrt(mean(x^2) + eps) as every RMSNorm of the tier computes it.
__device__ __forceinline__ float inv_rms(float sumsq, int n, float eps) {
  return 1.0f / sqrtf(sumsq / float(n) + eps);
}
/// N consecutive f32 weights (p 16-byte aligned, N a multiple of 4) in N / 4 vector loads:
/// a warp's scalar loads of its lanes' 8-element chunks cost 4x the L1 wavefronts.
template <int N>
__device__ __forceinline__ void load_f32s(const float* p, float (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p + i));
    w[i] = v.x;
    w[i + 1] = v.y;
    w[i + 2] = v.z;
    w[i + 3] = v.w;
  }
}
/// One normalised element, rounded to T: x * inv * w (two products, no fma: the same in
/// every kernel that normalises).
template <class T>
__device__ __forceinline__ T norm_elem(float x, float inv, float w) {
  return from_f<T>(__fmul_rn(__fmul_rn(x, inv), w));
}

// Rotation of the pair (a, b) by (cos, sin): explicit roundings (no fma contraction), so the
// unfused kernel and the fused decode kernels compute the same bits.
__device__ __forceinline__ float rope_a(float xa, float xb, float2 c) {
  return __fsub_rn(__fmul_rn(xa, c.x), __fmul_rn(xb, c.y));
}
__device__ __forceinline__ float rope_b(float xa, float xb, float2 c) {
  return __fadd_rn(__fmul_rn(xb, c.x), __fmul_rn(xa, c.y));
}

/// A stage tap (kernels.h Tap) on element i of a stage's output v (a value of T); writer:
/// whether this thread records it (one of the blocks that compute the value).
template <class T>
__device__ __forceinline__ T tap_value(const Tap& t, int64_t i, T v, bool writer) {
  if (t.fault) v = from_f<T>(to_f(v) * t.scale + t.bias + (t.noise ? t.noise[i] : 0.f));
  if (t.record && writer) static_cast<T*>(t.record)[i] = v;
  if (t.overwrite) v = static_cast<const T*>(t.overwrite)[i];
  return v;
}

/// The taps of one head in norm_rope_head (TAP): its norm's and its rotation's, at elements
/// base + i of those stages' outputs.
struct HeadTaps {
  const Tap* norm = nullptr;
  const Tap* rope = nullptr;
  int64_t base = 0;
  bool writer = false;
};

/// One warp: the head x[Dh] RMS-normalised (when nw; sum of squares in the canonical chunk
/// order, each value rounded to T as the op-by-op norm stores it), then rotated by the RoPE
/// row cs[Dh / 2] (each output rounded to T as rope_kernel stores it), into sm[Dh] as f32
/// (exact T values). NCH = chunks per lane (Dh <= NCH x 32 x V). TAP: the stage taps of ht
/// after the norm and after the rotation. PE > 0: element i at sm[i + i / PE * 4] (the decode
/// attention's padded slices of PE elements). Ends with __syncwarp.
template <class T, int NCH, bool TAP = false, int PE = 0>
__device__ __forceinline__ void norm_rope_head(const T* x, const float* nw, float eps, int Dh,
                                               const float2* cs, bool adjacent, float* sm,
                                               int lane, const HeadTaps& ht = HeadTaps{}) {
  constexpr int V = Vec16<T>::N;
  auto at = [](int i) { return PE ? i + i / (PE ? PE : 1) * 4 : i; };
  uint4 c[NCH];
  load_chunks<T, NCH>(x, Dh, lane, c);
  const float inv = nw ? inv_rms(chunks_sumsq<T, NCH>(c), Dh, eps) : 1.f;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int k = lane * V + j * 32 * V;
    if (k >= Dh) continue;
    const T* e = reinterpret_cast<const T*>(&c[j]);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (!nw) {
        sm[at(k + i)] = to_f(e[i]);
        continue;
      }
      T y = norm_elem<T>(to_f(e[i]), inv, nw[k + i]);
      if constexpr (TAP) y = tap_value(*ht.norm, ht.base + k + i, y, ht.writer);
      sm[at(k + i)] = to_f(y);
    }
  }
  __syncwarp();
  const int half = Dh / 2;
  for (int i = lane; i < half; i += 32) {  // each pair read and written by one lane
    const int ia = adjacent ? 2 * i : i, ib = adjacent ? 2 * i + 1 : i + half;
    const float xa = sm[at(ia)], xb = sm[at(ib)];
    T ya = from_f<T>(rope_a(xa, xb, cs[i])), yb = from_f<T>(rope_b(xa, xb, cs[i]));
    if constexpr (TAP) {
      ya = tap_value(*ht.rope, ht.base + ia, ya, ht.writer);
      yb = tap_value(*ht.rope, ht.base + ib, yb, ht.writer);
    }
    sm[at(ia)] = to_f(ya);
    sm[at(ib)] = to_f(yb);
  }
  __syncwarp();
}

/// d += a b on tensor cores: one mma.sync m16n8k16 row.col with f32 accumulation, T the
/// element type of a and b (__nv_bfloat16 or __half). Lane (g = lane / 4, t = lane % 4) holds
/// pairs of T, the lower k (or column) in the low 16 bits: a[0] = A[g][2t, 2t+1],
/// a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
/// b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] =
/// D[g+8][2t, 2t+1]. (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type".)
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "mma_16816 takes bf16 or f16 operands");
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace arbiter::cuda

/// Runs the statement with `T` bound to the element type of a compute type (f32, f16, bf16);
/// any other DType is an internal error (the backend only computes in those).
#define ARB_DISPATCH_CTYPE(ct, T, ...)        \
  switch (ct) {                               \
    case ::arbiter::DType::F32: {             \
      using T = float;                        \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
    case ::arbiter::DType::F16: {             \
      using T = __half;                       \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
    case ::arbiter::DType::BF16: {            \
      using T = __nv_bfloat16;                \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
    default:                                  \
      ARB_ASSERT(!"not a CUDA compute type"); \
  }
