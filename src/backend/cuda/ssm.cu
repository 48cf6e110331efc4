// The Mamba2 mixer's ops on the CUDA tier (backend.h ssm_conv, ssm_scan, rmsnorm_gated):
// plain kernels, one owner per output and per state element, f32 arithmetic, the output
// rounded once to the compute type. The scan's state stays f32 across tokens and calls (as
// on cpu): a bf16 state would round every decay-and-add, T times over a sequence. The scan
// runs the recurrence for the decode step and HF's chunked form for a prefill (backend.h).
#include <algorithm>

#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr int kThreads = 256;

// --- ssm_conv -------------------------------------------------------------------------------
// A thread per channel c runs every token through conv_step (device_common.cuh): with
// seq = [state (K-1 rows); x (T rows)], out[t, c] = silu(sum_k w[c, k] seq[t + k, c] + b[c]),
// the channel's state moving a row per token, so that it ends as seq's last K-1 rows. The
// thread reads and writes only its own channel: no barrier.
template <class T>
__global__ void ssm_conv_kernel(const T* x, const float* w, const float* b, int T_, int C, int K,
                                T* state, T* out) {
  griddep_wait();
  griddep_launch();
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
    for (int t = 0; t < T_; ++t)
      out[int64_t(t) * C + c] = from_f<T>(conv_step(w, b, C, K, c, x[int64_t(t) * C + c], state));
}

// --- ssm_scan -------------------------------------------------------------------------------
// dt of token t, head h: clamp(softplus(dt_raw + dt_bias)), torch's softplus linear above 20.
template <class T>
__device__ __forceinline__ float scan_dt(const T* dt_raw, int64_t t, int nh, int h, float bias,
                                         float dt_min, float dt_max) {
  const float v = to_f(dt_raw[t * nh + h]) + bias;
  const float dt = v > 20.f ? v : log1pf(expf(v));
  return fminf(fmaxf(dt, dt_min), dt_max);
}

// The decode step (T == 1; any T computes the recurrence). A warp per (head h, row p) of the
// state [nh, hd, N]: lane l keeps elements n = l + 32 j (j < kScanPerLane) of the row's
// N-vector in registers through all T tokens, then writes them back. Per token (the cpu
// tier's order of operations):
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
    const float dt = scan_dt(dt_raw, t, nh, h, bias, dt_min, dt_max);
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

// The chunked form (SSD; HF GraniteMoeHybridMambaLayer.torch_forward's "ssd naive" branch and
// mamba_ssm's chunk scan), for a prefill. Tokens [c0, c0 + L) form chunk c (Q tokens, the last
// may be shorter); la_t = dt_t A is token t's log-decay and seg(t, s) = la_{s+1} + ... + la_t
// (HF segment_sum: summed, not a difference of cumulative sums, which cancels). Three kernels:
//   1. chunk_state, a block per (chunk, head): the chunk's own state (from zero),
//      dS[p, n] = sum_s exp(seg(last, s)) dt_s x_s[p] B_s[n], and its decay
//      exp(seg(last, c0 - 1)).
//   2. chunk_pass, a thread per state element: the one sequential pass over the chunks,
//      S <- decay_c S + dS_c, leaving in chunk c's slot the state entering it; S is the
//      final state.
//   3. chunk_out, a block per (token t, head): y_t = exp(seg(t, c0 - 1)) C_t . S_in
//      + sum_{s <= t in the chunk} (C_t . B_s) exp(seg(t, s)) dt_s x_s + D x_t.
// All in f32 (x, B, C, dt read from the compute type); only y is rounded to it.
template <class T>
__global__ void ssm_chunk_state_kernel(const T* xbc, const T* dt_raw, const float* a_log,
                                       const float* dt_bias, float dt_min, float dt_max, int T_,
                                       int nh, int hd, int G, int N, int Q, float* cstate,
                                       float* cdecay) {
  griddep_wait();
  griddep_launch();
  extern __shared__ float sm[];
  float *la = sm, *w = sm + Q;  // [Q] each
  const int c = blockIdx.x, h = blockIdx.y, c0 = c * Q, L = min(Q, T_ - c0);
  const int g = h / (nh / G);
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  const float A = -expf(a_log[h]);
  for (int s = threadIdx.x; s < L; s += blockDim.x) {
    w[s] = scan_dt(dt_raw, c0 + s, nh, h, dt_bias[h], dt_min, dt_max);
    la[s] = w[s] * A;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < L; s += blockDim.x) {
    float seg = 0.f;  // seg(last, s)
    for (int k = L - 1; k > s; --k) seg += la[k];
    w[s] *= expf(seg);
  }
  if (threadIdx.x == 0) {
    float seg = 0.f;
    for (int k = L - 1; k >= 0; --k) seg += la[k];
    cdecay[int64_t(c) * nh + h] = expf(seg);
  }
  __syncthreads();
  const T* x0 = xbc + int64_t(c0) * width + int64_t(h) * hd;  // x_s at + s * width
  const T* B0 = xbc + int64_t(c0) * width + I + int64_t(g) * N;
  float* out = cstate + (int64_t(c) * nh + h) * hd * N;
  for (int i = threadIdx.x; i < hd * N; i += blockDim.x) {
    const int p = i / N, n = i % N;
    float acc = 0.f;
    for (int s = 0; s < L; ++s) acc += w[s] * to_f(x0[s * width + p]) * to_f(B0[s * width + n]);
    out[i] = acc;
  }
}

__global__ void ssm_chunk_pass_kernel(float* cstate, const float* cdecay, int n_chunks, int nh,
                                      int64_t per_head, float* state) {
  griddep_wait();
  griddep_launch();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, states = nh * per_head;
  if (i >= states) return;
  const int h = int(i / per_head);
  float S = state[i];
  for (int c = 0; c < n_chunks; ++c) {
    float* slot = cstate + int64_t(c) * states + i;
    const float dS = *slot;
    *slot = S;
    S = cdecay[int64_t(c) * nh + h] * S + dS;
  }
  state[i] = S;
}

template <class T>
__global__ void ssm_chunk_out_kernel(const T* xbc, const T* dt_raw, const float* a_log,
                                     const float* d_skip, const float* dt_bias, float dt_min,
                                     float dt_max, int nh, int hd, int G, int N, int Q,
                                     const float* cstate, T* y) {
  griddep_wait();
  griddep_launch();
  extern __shared__ float sm[];
  float *la = sm, *m = sm + Q;  // [Q] each
  __shared__ float in_decay;
  const int t = blockIdx.x, h = blockIdx.y, c = t / Q, c0 = c * Q, j = t - c0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int g = h / (nh / G);
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  const float A = -expf(a_log[h]);
  for (int s = threadIdx.x; s <= j; s += blockDim.x) {
    m[s] = scan_dt(dt_raw, c0 + s, nh, h, dt_bias[h], dt_min, dt_max);
    la[s] = m[s] * A;
  }
  __syncthreads();
  const T* x0 = xbc + int64_t(c0) * width;
  const T* Ct = xbc + int64_t(t) * width + I + int64_t(G + g) * N;
  // m[s] = (C_t . B_s) exp(seg(t, s)) dt_s: a warp per s, lanes over n and over seg's terms.
  for (int s = warp; s <= j; s += n_warps) {
    const T* Bs = x0 + s * width + I + int64_t(g) * N;
    float cb = 0.f, seg = 0.f;
    for (int n = lane; n < N; n += 32) cb += to_f(Ct[n]) * to_f(Bs[n]);
    for (int k = s + 1 + lane; k <= j; k += 32) seg += la[k];
    cb = warp_sum(cb);
    seg = warp_sum(seg);
    if (lane == 0) m[s] *= cb * expf(seg);
  }
  if (warp == n_warps - 1) {  // exp(seg(t, c0 - 1)): the entering state's decay
    float cum = 0.f;
    for (int k = lane; k <= j; k += 32) cum += la[k];
    cum = warp_sum(cum);
    if (lane == 0) in_decay = expf(cum);
  }
  __syncthreads();
  const float* S = cstate + (int64_t(c) * nh + h) * hd * N;  // the state entering chunk c
  const float skip = d_skip[h];
  for (int p = threadIdx.x; p < hd; p += blockDim.x) {
    float off = 0.f, diag = 0.f;
    for (int n = 0; n < N; ++n) off += S[int64_t(p) * N + n] * to_f(Ct[n]);
    for (int s = 0; s <= j; ++s) diag += m[s] * to_f(x0[s * width + int64_t(h) * hd + p]);
    const float xp = to_f(xbc[int64_t(t) * width + int64_t(h) * hd + p]);
    y[int64_t(t) * I + int64_t(h) * hd + p] = from_f<T>(in_decay * off + diag + skip * xp);
  }
}

// --- rmsnorm_gated --------------------------------------------------------------------------
// A block of kGatedThreads per (row, group): v = y silu(z) in f32, the sum of squares through a
// warp tree and shared memory (as rmsnorm_block_kernel), then out = v / rms(v) * w, v
// recomputed (same bits). A decode step has one row and one group of thousands of columns
// (granite-4.0-h-1b: 3,072): 1,024 threads keep their few loads in flight together, where 256
// took 13.5 us (ncu, H200, docs/evidence/h200/profile-s20.txt).
constexpr int kGatedThreads = 1024;
template <class T>
__global__ void __launch_bounds__(kGatedThreads)
    rmsnorm_gated_kernel(const T* y, const T* z, const float* w, int W, int group, float eps,
                         T* out) {
  griddep_wait();
  griddep_launch();
  __shared__ float red[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int groups = W / group;
  const int r = blockIdx.x / groups, g0 = (blockIdx.x % groups) * group;
  const int64_t o = int64_t(r) * W + g0;
  auto gated = [&](int i) { return to_f(y[o + i]) * silu(to_f(z[o + i])); };
  float ss = 0.f;
#pragma unroll 4
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

int64_t ssm_scan_scratch_floats(const ScanArgs& a) {
  if (a.T <= 1 || a.recurrence) return 0;
  const int Q = std::min(a.chunk, a.T), n_chunks = (a.T + Q - 1) / Q;
  return int64_t(n_chunks) * a.nh * (int64_t(a.hd) * a.N + 1);
}

void launch_ssm_scan(DType ct, const ScanArgs& a, cudaStream_t s) {
  if (a.T > 1 && !a.recurrence) {
    const int Q = std::min(a.chunk, a.T), n_chunks = (a.T + Q - 1) / Q;
    const int64_t per_head = int64_t(a.hd) * a.N, states = a.nh * per_head;
    float *cstate = a.scratch, *cdecay = a.scratch + n_chunks * states;
    const size_t smem = 2 * size_t(Q) * sizeof(float);
    ARB_DISPATCH_CTYPE(ct, E,
                       launch_k(ssm_chunk_state_kernel<E>, dim3(n_chunks, a.nh), dim3(kThreads),
                                smem, s, static_cast<const E*>(a.xbc),
                                static_cast<const E*>(a.dt_raw), a.a_log, a.dt_bias, a.dt_min,
                                a.dt_max, a.T, a.nh, a.hd, a.G, a.N, Q, cstate, cdecay));
    ARB_LAUNCHED("ssm_chunk_state_kernel", s);
    launch_k(ssm_chunk_pass_kernel, dim3(unsigned((states + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, s, cstate, static_cast<const float*>(cdecay), n_chunks, a.nh,
             per_head, a.state);
    ARB_LAUNCHED("ssm_chunk_pass_kernel", s);
    ARB_DISPATCH_CTYPE(ct, E,
                       launch_k(ssm_chunk_out_kernel<E>, dim3(a.T, a.nh), dim3(128), smem, s,
                                static_cast<const E*>(a.xbc), static_cast<const E*>(a.dt_raw),
                                a.a_log, a.d, a.dt_bias, a.dt_min, a.dt_max, a.nh, a.hd, a.G,
                                a.N, Q, static_cast<const float*>(cstate),
                                static_cast<E*>(a.y)));
    ARB_LAUNCHED("ssm_chunk_out_kernel", s);
    return;
  }
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
                     launch_k(rmsnorm_gated_kernel<E>, dim3(R * (W / group)), dim3(kGatedThreads), 0,
                              s, static_cast<const E*>(y), static_cast<const E*>(z), w, W, group,
                              eps, static_cast<E*>(out)));
  ARB_LAUNCHED("rmsnorm_gated_kernel", s);
}

}  // namespace arbiter::cuda
