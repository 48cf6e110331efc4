// Matrix-vector product for single-token forwards (T == 1, the decode step): out = W @ x.
// Memory-bound: every weight byte is read once. One warp per output row, each lane loading
// 16 bytes of the row per step, four steps in flight, f32 accumulation, then a fixed
// shuffle tree (deterministic). x is read through the read-only cache (it is tiny and shared
// by all rows). Rows are padded at upload to a 16-byte stride, so every row start is aligned;
// the K % (16 / sizeof(T)) tail is handled element by element.
#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

template <class T, class TO>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ W, int64_t ld,
                const float* __restrict__ bias, int N, int K, TO* __restrict__ out) {
  constexpr int V = Vec16<T>::N;
  constexpr int kStep = 32 * V;  // elements one warp covers per 16-byte load
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* w = W + int64_t(row) * ld;
  const int Kv = K / V * V;  // vectorised prefix
  float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
  int k = lane * V;
  for (; k + 3 * kStep < Kv; k += 4 * kStep) {
    float w0[V], w1[V], w2[V], w3[V], x0[V], x1[V], x2[V], x3[V];
    load16(w + k, w0);
    load16(w + k + kStep, w1);
    load16(w + k + 2 * kStep, w2);
    load16(w + k + 3 * kStep, w3);
    load16(x + k, x0);
    load16(x + k + kStep, x1);
    load16(x + k + 2 * kStep, x2);
    load16(x + k + 3 * kStep, x3);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      acc0 = fmaf(w0[i], x0[i], acc0);
      acc1 = fmaf(w1[i], x1[i], acc1);
      acc2 = fmaf(w2[i], x2[i], acc2);
      acc3 = fmaf(w3[i], x3[i], acc3);
    }
  }
  for (; k < Kv; k += kStep) {
    float w0[V], x0[V];
    load16(w + k, w0);
    load16(x + k, x0);
#pragma unroll
    for (int i = 0; i < V; ++i) acc0 = fmaf(w0[i], x0[i], acc0);
  }
  for (int j = Kv + lane; j < K; j += 32) acc1 = fmaf(to_f(w[j]), to_f(x[j]), acc1);
  float acc = warp_sum((acc0 + acc1) + (acc2 + acc3));
  if (lane == 0) out[row] = from_f<TO>(bias ? acc + bias[row] : acc);
}

template <class T>
void gemv_out(const void* x, const void* W, int64_t ld, const float* bias, int N, int K,
              CType ot, void* out, cudaStream_t s) {
  const int blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (ot == CType::F32)
    gemv_kernel<T, float><<<blocks, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(W), ld, bias, N, K,
        static_cast<float*>(out));
  else
    gemv_kernel<T, T><<<blocks, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(W), ld, bias, N, K,
        static_cast<T*>(out));
}

}  // namespace

void launch_gemv(CType ct, const void* x, const void* W, int64_t ld, const float* bias, int N,
                 int K, CType ot, void* out, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T, gemv_out<T>(x, W, ld, bias, N, K, ot, out, s));
  ARB_LAUNCHED("gemv_kernel", s);
}

}  // namespace arbiter::cuda
