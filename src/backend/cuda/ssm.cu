// The Mamba2 mixer's ops on the CUDA tier (backend.h ssm_conv, ssm_scan, rmsnorm_gated):
// plain kernels, one owner per output and per state element, f32 arithmetic, the output
// rounded once to the compute type. The scan's state stays f32 across tokens and calls (as
// on cpu): a bf16 state would round every decay-and-add, T times over a sequence.
#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// --- ssm_conv -------------------------------------------------------------------------------
// A thread per channel c runs every token: with seq = [state (K-1 rows); x (T rows)],
// out[t, c] = silu(sum_k w[c, k] seq[t + k, c] + b[c]) (k in order, f32), then the channel's
// state rows become seq's last K-1 rows. The thread reads and writes only its own channel, so
// the state update needs no barrier: row r takes seq row T + r, which is x's (T + r >= K - 1)
// or old state row T + r > r, not yet overwritten when the rows go in increasing order.
template <class T>
__global__ void ssm_conv_kernel(const T* x, const float* w, const float* b, int T_, int C, int K,
                                T* state, T* out) {
  griddep_wait();
  griddep_launch();
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    auto seq = [&](int r) {
      return r < K - 1 ? to_f(state[int64_t(r) * C + c]) : to_f(x[int64_t(r - (K - 1)) * C + c]);
    };
    const float bias = b ? b[c] : 0.f;
    for (int t = 0; t < T_; ++t) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc += w[int64_t(c) * K + k] * seq(t + k);
      out[int64_t(t) * C + c] = from_f<T>(silu(acc + bias));
    }
    // Values of seq are compute-type values already: the copy is exact.
    for (int r = 0; r < K - 1; ++r) state[int64_t(r) * C + c] = from_f<T>(seq(T_ + r));
  }
}

// --- ssm_scan -------------------------------------------------------------------------------
// A warp per (head h, row p) of the state [nh, hd, N]: lane l keeps elements n = l + 32 j
// (j < kScanPerLane) of the row's N-vector in registers through all T tokens, then writes
// them back. Per token (the cpu tier's order of operations):
//   dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max), decay = exp(dt * -exp(A_log))
//   s[n] = decay s[n] + (dt x) B[n];  y = warp_sum(sum_n s[n] C[n]) + D x
constexpr int kScanPerLane = kMaxScanState / 32;

template <class T>
__global__ void ssm_scan_kernel(const T* xbc, const T* dt_raw, const float* a_log,
                                const float* d_skip, const float* dt_bias, float dt_min,
                                float dt_max, int T_, int nh, int hd, int G, int N, float* state,
                                T* y) {
  griddep_wait();
  griddep_launch();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // h * hd + p
  const int lane = threadIdx.x % 32;
  if (row >= nh * hd) return;
  const int h = row / hd, g = h / (nh / G);
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  float* srow = state + int64_t(row) * N;
  float s[kScanPerLane];
#pragma unroll
  for (int j = 0; j < kScanPerLane; ++j) {
    const int n = lane + 32 * j;
    s[j] = n < N ? srow[n] : 0.f;
  }
  const float A = -expf(a_log[h]), skip = d_skip[h], bias = dt_bias[h];
  for (int t = 0; t < T_; ++t) {
    const T* xt = xbc + int64_t(t) * width;
    const T* Bt = xt + I + int64_t(g) * N;
    const T* Ct = xt + I + int64_t(G) * N + int64_t(g) * N;
    const float v = to_f(dt_raw[int64_t(t) * nh + h]) + bias;
    float dt = v > 20.f ? v : log1pf(expf(v));  // torch softplus, threshold 20
    dt = fminf(fmaxf(dt, dt_min), dt_max);
    const float decay = expf(dt * A);
    const float xp = to_f(xt[row]), dtx = dt * xp;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kScanPerLane; ++j) {
      const int n = lane + 32 * j;
      if (n < N) {
        s[j] = decay * s[j] + dtx * to_f(Bt[n]);
        acc += s[j] * to_f(Ct[n]);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[int64_t(t) * I + row] = from_f<T>(acc + skip * xp);
  }
#pragma unroll
  for (int j = 0; j < kScanPerLane; ++j) {
    const int n = lane + 32 * j;
    if (n < N) srow[n] = s[j];
  }
}

// --- rmsnorm_gated --------------------------------------------------------------------------
// A block per (row, group): v = y silu(z) in f32, the sum of squares through a warp tree and
// shared memory (as rmsnorm_block_kernel), then out = v / rms(v) * w, v recomputed (same bits).
template <class T>
__global__ void rmsnorm_gated_kernel(const T* y, const T* z, const float* w, int W, int group,
                                     float eps, T* out) {
  griddep_wait();
  griddep_launch();
  __shared__ float red[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int groups = W / group;
  const int r = blockIdx.x / groups, g0 = (blockIdx.x % groups) * group;
  const int64_t o = int64_t(r) * W + g0;
  auto gated = [&](int i) { return to_f(y[o + i]) * silu(to_f(z[o + i])); };
  float ss = 0.f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = gated(i);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = warp_sum(lane < n_warps ? red[lane] : 0.f);
    if (lane == 0) red[0] = ss;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / float(group) + eps);
  for (int i = threadIdx.x; i < group; i += blockDim.x)
    out[o + i] = from_f<T>(gated(i) * inv * w[g0 + i]);
}

}  // namespace

void launch_ssm_conv(DType ct, const void* x, const float* w, const float* b, int T, int C, int K,
                     void* state, void* out, cudaStream_t s) {
  const int blocks = (C + kThreads - 1) / kThreads;
  ARB_DISPATCH_CTYPE(ct, E,
                     launch_k(ssm_conv_kernel<E>, dim3(blocks), dim3(kThreads), 0, s,
                              static_cast<const E*>(x), w, b, T, C, K, static_cast<E*>(state),
                              static_cast<E*>(out)));
  ARB_LAUNCHED("ssm_conv_kernel", s);
}

void launch_ssm_scan(DType ct, const ScanArgs& a, cudaStream_t s) {
  const int warps = 4, rows = a.nh * a.hd;
  ARB_DISPATCH_CTYPE(ct, E,
                     launch_k(ssm_scan_kernel<E>, dim3((rows + warps - 1) / warps),
                              dim3(32 * warps), 0, s, static_cast<const E*>(a.xbc),
                              static_cast<const E*>(a.dt_raw), a.a_log, a.d, a.dt_bias, a.dt_min,
                              a.dt_max, a.T, a.nh, a.hd, a.G, a.N, a.state,
                              static_cast<E*>(a.y)));
  ARB_LAUNCHED("ssm_scan_kernel", s);
}

void launch_rmsnorm_gated(DType ct, const void* y, const void* z, const float* w, int R, int W,
                          int group, float eps, void* out, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, E,
                     launch_k(rmsnorm_gated_kernel<E>, dim3(R * (W / group)), dim3(kThreads), 0,
                              s, static_cast<const E*>(y), static_cast<const E*>(z), w, W, group,
                              eps, static_cast<E*>(out)));
  ARB_LAUNCHED("rmsnorm_gated_kernel", s);
}

}  // namespace arbiter::cuda
