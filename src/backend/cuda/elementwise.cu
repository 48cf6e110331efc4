// Weight conversion, embedding gather, RMSNorm, RoPE, KV-cache store, SwiGLU, residual add
// and the bias epilogue of the CUDA tier. All arithmetic in f32, one rounding per output.
#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_block = kThreads) {
  int64_t b = (n + per_block - 1) / per_block;
  return int(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));  // grid-stride loops cover the rest
}

// --- weight conversion --------------------------------------------------------------------

__device__ __forceinline__ float load_storage(SType st, const void* src, int64_t r, int64_t c,
                                              int64_t cols) {
  const int64_t i = r * cols + c;
  switch (st) {
    case SType::F32: return static_cast<const float*>(src)[i];
    case SType::F16: return __half2float(static_cast<const __half*>(src)[i]);
    case SType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
    case SType::Q8_0: {
      // ggml block_q8_0: f16 scale d then 32 int8; value = d * q, exact in f32
      // (11-bit by 8-bit significands).
      const uint8_t* blk = static_cast<const uint8_t*>(src) + (i / 32) * 34;
      __half d = *reinterpret_cast<const __half*>(blk);
      int8_t q = reinterpret_cast<const int8_t*>(blk + 2)[i % 32];
      return __half2float(d) * float(q);
    }
  }
  return 0.f;
}

template <class T>
__global__ void convert_matrix_kernel(SType st, const void* src, int64_t rows, int64_t cols,
                                      T* dst, int64_t ld) {
  const int64_t n = rows * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / ld, c = i % ld;
    dst[i] = from_f<T>(c < cols ? load_storage(st, src, r, c, cols) : 0.f);
  }
}

__global__ void convert_vector_kernel(SType st, const void* src, int64_t n, float* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = load_storage(st, src, 0, i, n);
}

template <class T>
__global__ void embed_kernel(const T* table, int64_t ld, int64_t D, const int32_t* ids, int T_,
                             T* out) {
  const int t = blockIdx.y;
  const T* row = table + int64_t(ids[t]) * ld;
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < D;
       d += int64_t(gridDim.x) * blockDim.x)
    out[int64_t(t) * D + d] = row[d];
}

// --- RMSNorm ------------------------------------------------------------------------------
// One warp per row; sum of squares in f32 over lane-strided elements, fixed shuffle tree.
// HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w; we round once at the end (HF rounds
// x * rsqrt(...) to the input dtype before the weight multiply; the f64 oracle rounds never).
template <class T>
__global__ void rmsnorm_kernel(const T* x, const float* w, int R, int N, float eps, T* out) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= R) return;
  const T* xr = x + int64_t(row) * N;
  T* yr = out + int64_t(row) * N;
  float ss = 0.f;
#pragma unroll 4
  for (int i = lane; i < N; i += 32) {
    float v = to_f(xr[i]);
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(N) + eps);
  // Every lane has read its whole share of the row before any lane writes (the shuffles
  // above are a warp-wide barrier), so out may alias x.
#pragma unroll 4
  for (int i = lane; i < N; i += 32) yr[i] = from_f<T>(to_f(xr[i]) * inv * w[i]);
}

// Block per row for long rows (the D-wide block norms): one warp would need N/32 dependent
// load rounds; 256 threads need N/256. Same arithmetic, reduction through shared memory.
template <class T>
__global__ void rmsnorm_block_kernel(const T* x, const float* w, int N, float eps, T* out) {
  __shared__ float red[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const T* xr = x + int64_t(blockIdx.x) * N;
  T* yr = out + int64_t(blockIdx.x) * N;
  float ss = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const float v = to_f(xr[i]);
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = warp_sum(lane < n_warps ? red[lane] : 0.f);
    if (lane == 0) red[0] = ss;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / float(N) + eps);
  // Each element is read and written by the same thread after the barrier: out may alias x.
#pragma unroll 4
  for (int i = threadIdx.x; i < N; i += blockDim.x) yr[i] = from_f<T>(to_f(xr[i]) * inv * w[i]);
}

// --- RoPE ---------------------------------------------------------------------------------
template <class T>
__global__ void rope_kernel(T* x, int T_, int nh, int Dh, PosRef pos, const float2* cs,
                            bool adjacent) {
  const int half = Dh / 2;
  const int64_t n = int64_t(T_) * nh * half;
  const int pos0 = pos_of(pos);
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const int64_t th = idx / half;  // t * nh + h
    const int t = int(th / nh);
    const float2 c = cs[int64_t(pos0 + t) * half + i];
    const int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    T* head = x + th * Dh;
    const float xa = to_f(head[a]), xb = to_f(head[b]);
    head[a] = from_f<T>(xa * c.x - xb * c.y);
    head[b] = from_f<T>(xb * c.x + xa * c.y);
  }
}

template <class T>
__global__ void kv_store_kernel(const T* k, const T* v, T* kc, T* vc, int64_t n, PosRef pos,
                                int kv_dim) {
  const int64_t base = int64_t(pos_of(pos)) * kv_dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    kc[base + i] = k[i];
    vc[base + i] = v[i];
  }
}

template <class T>
__global__ void swiglu_kernel(const T* gate, const T* up, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    out[i] = from_f<T>(g / (1.0f + expf(-g)) * to_f(up[i]));
  }
}

template <class T>
__global__ void add_kernel(T* x, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) + to_f(y[i]));
}

template <class TO>
__global__ void bias_out_kernel(const float* acc, const float* bias, int T_, int N, TO* out) {
  const int64_t n = int64_t(T_) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<TO>(acc[i] + bias[i % N]);
}

}  // namespace

void launch_convert_matrix(SType st, const void* src, int64_t rows, int64_t cols, CType ct,
                           void* dst, int64_t ld, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T,
                     convert_matrix_kernel<T><<<blocks_for(rows * ld), kThreads, 0, s>>>(
                         st, src, rows, cols, static_cast<T*>(dst), ld));
  ARB_LAUNCHED("convert_matrix_kernel", s);
}

void launch_convert_vector(SType st, const void* src, int64_t n, float* dst, cudaStream_t s) {
  convert_vector_kernel<<<blocks_for(n), kThreads, 0, s>>>(st, src, n, dst);
  ARB_LAUNCHED("convert_vector_kernel", s);
}

void launch_embed(CType ct, const void* table, int64_t ld, int64_t D, const int32_t* ids, int T,
                  void* out, cudaStream_t s) {
  dim3 grid(unsigned((D + kThreads - 1) / kThreads), unsigned(T));
  ARB_DISPATCH_CTYPE(ct, E,
                     embed_kernel<E><<<grid, kThreads, 0, s>>>(static_cast<const E*>(table), ld,
                                                               D, ids, T, static_cast<E*>(out)));
  ARB_LAUNCHED("embed_kernel", s);
}

void launch_rmsnorm(CType ct, const void* x, const float* w, int R, int N, float eps, void* out,
                    cudaStream_t s) {
  const int rows_per_block = kThreads / 32;
  if (N >= 512) {
    ARB_DISPATCH_CTYPE(ct, T,
                       rmsnorm_block_kernel<T><<<R, kThreads, 0, s>>>(
                           static_cast<const T*>(x), w, N, eps, static_cast<T*>(out)));
  } else {
    ARB_DISPATCH_CTYPE(ct, T,
                       rmsnorm_kernel<T><<<(R + rows_per_block - 1) / rows_per_block, kThreads,
                                           0, s>>>(static_cast<const T*>(x), w, R, N, eps,
                                                   static_cast<T*>(out)));
  }
  ARB_LAUNCHED("rmsnorm_kernel", s);
}

void launch_rope(CType ct, void* x, int T, int nh, int Dh, PosRef pos, const float2* cs,
                 bool adjacent, cudaStream_t s) {
  const int64_t n = int64_t(T) * nh * (Dh / 2);
  ARB_DISPATCH_CTYPE(ct, E,
                     rope_kernel<E><<<blocks_for(n), kThreads, 0, s>>>(
                         static_cast<E*>(x), T, nh, Dh, pos, cs, adjacent));
  ARB_LAUNCHED("rope_kernel", s);
}

void launch_kv_store(CType ct, const void* k, const void* v, void* k_cache, void* v_cache, int T,
                     PosRef pos, int kv_dim, cudaStream_t s) {
  const int64_t n = int64_t(T) * kv_dim;
  ARB_DISPATCH_CTYPE(ct, E,
                     kv_store_kernel<E><<<blocks_for(n), kThreads, 0, s>>>(
                         static_cast<const E*>(k), static_cast<const E*>(v),
                         static_cast<E*>(k_cache), static_cast<E*>(v_cache), n, pos, kv_dim));
  ARB_LAUNCHED("kv_store_kernel", s);
}

void launch_swiglu(CType ct, const void* gate, const void* up, int64_t n, void* out,
                   cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T,
                     swiglu_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
                         static_cast<const T*>(gate), static_cast<const T*>(up), n,
                         static_cast<T*>(out)));
  ARB_LAUNCHED("swiglu_kernel", s);
}

void launch_add(CType ct, void* x, const void* y, int64_t n, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T,
                     add_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
                         static_cast<T*>(x), static_cast<const T*>(y), n));
  ARB_LAUNCHED("add_kernel", s);
}

void launch_bias_out(const float* acc, const float* bias, int T, int N, CType ot, void* out,
                     cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ot, TO,
                     bias_out_kernel<TO><<<blocks_for(int64_t(T) * N), kThreads, 0, s>>>(
                         acc, bias, T, N, static_cast<TO*>(out)));
  ARB_LAUNCHED("bias_out_kernel", s);
}

}  // namespace arbiter::cuda
