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
// A thread per (channel c, tile of tokens): with seq = [state (K-1 rows); x (T rows)], out[t, c]
// = conv_out (device_common.cuh) of seq's rows t .. t + K - 1. Only the first tile reads the
// state (tiles hold at least K - 1 tokens); its thread then moves the channel's state to seq's
// last K - 1 rows, in increasing row order, each read before it is overwritten.
template <class T>
__global__ void ssm_conv_kernel(const T* x, const float* w, const float* b, int T_, int C, int K,
                                int tile, T* state, T* out) {
  griddep_wait();
  griddep_launch();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  auto seq = [&](int i) {
    return i < K - 1 ? state[int64_t(i) * C + c] : x[int64_t(i - (K - 1)) * C + c];
  };
  const int t0 = blockIdx.y * tile, t1 = min(T_, t0 + tile);
  for (int t = t0; t < t1; ++t)
    out[int64_t(t) * C + c] =
        from_f<T>(conv_out(w, b, K, c, [&](int k) { return to_f(seq(t + k)); }));
  if (blockIdx.y == 0)
    for (int r = 0; r < K - 1; ++r) state[int64_t(r) * C + c] = seq(T_ + r);
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
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // h * hd + p
  const int lane = threadIdx.x % 32;
  if (row >= nh * hd) return;
  const int h = row / hd, g = h / (nh / G);
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  // The state row and the head's constants are loaded before the wait: no kernel before this
  // one in the chain writes them (the state is this kernel's own, from the last step).
  float* srow = state + int64_t(row) * N;
  float s[kScanPerLane];
#pragma unroll
  for (int j = 0; j < kScanPerLane; ++j) {
    const int n = lane + 32 * j;
    s[j] = n < N ? srow[n] : 0.f;
  }
  const float A = -expf(a_log[h]), skip = d_skip[h], bias = dt_bias[h];
  griddep_wait();
  griddep_launch();
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
// (HF segment_sum). seg is taken as a difference of the chunk's cumulative sums in f64
// (chunk_cumsum): mamba_ssm's difference, without its cancellation, since f64 holds a chunk's
// sum of f32 terms to far below f32's rounding. Four kernels:
//   1. chunk_cb, a block per (token t, group g): CB[g, t, s] = C_t . B_s for the chunk's s <= t,
//      which every head of the group shares.
//   2. chunk_state, a block per (chunk, head, 16 rows p): the chunk's own state (from zero),
//      dS[p, n] = sum_s w_s x_s[p] B_s[n] with w_s = exp(seg(last, s)) dt_s, and its decay
//      exp(seg(last, c0 - 1)).
//   3. chunk_pass, a thread per state element: the one sequential pass over the chunks,
//      S <- decay_c S + dS_c, leaving in chunk c's slot the state entering it; S is the
//      final state.
//   4. chunk_out, a block per (16 tokens of a chunk, head): y_t = exp(seg(t, c0 - 1)) C_t . S_in
//      + sum_{s <= t in the chunk} dt_s (CB[t, s] exp(seg(t, s))) x_s + D x_t.
// All in f32 (x, B, C, dt read from the compute type) but the cumulative sums; only y is
// rounded to the compute type. Sums run in increasing s and n.
constexpr int kChunkTile = 16;   // chunk_state's rows p, chunk_out's tokens, a block
constexpr int kStateTokens = 32; // chunk_state: tokens staged in shared memory at a time
constexpr int kOutTokens = 256;  // chunk_out: tokens s of m[t, s] staged at a time
constexpr int kOutRows = 64;     // chunk_out: rows p a pass, kOutRows x 32 of S staged at a time

// dt[s] and cs[s] = la_0 + ... + la_s (f64) of the chunk's tokens s < n (from token c0), in
// shared memory; the whole block calls it. Warp 0 scans: lane l sums tokens [l q, l q + q),
// the lanes' totals are scanned across the warp, then each lane writes its prefix sums.
template <class T>
__device__ void chunk_cumsum(const T* dt_raw, int c0, int n, int nh, int h, float A, float bias,
                             float dt_min, float dt_max, float* dt, double* cs) {
  for (int s = threadIdx.x; s < n; s += blockDim.x)
    dt[s] = scan_dt(dt_raw, c0 + s, nh, h, bias, dt_min, dt_max);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, q = (n + 31) / 32, b = min(n, lane * q), e = min(n, b + q);
    double sum = 0;
    for (int s = b; s < e; ++s) sum += double(dt[s] * A);
    double inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    double run = inc - sum;
    for (int s = b; s < e; ++s) cs[s] = run += double(dt[s] * A);
  }
  __syncthreads();
}

template <class T>
__global__ void ssm_chunk_cb_kernel(const T* xbc, int T_, int nh, int hd, int G, int N, int Q,
                                    float* cb) {
  griddep_wait();
  griddep_launch();
  const int t = blockIdx.x, g = blockIdx.y, c0 = t / Q * Q, j = t - c0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  const T* Ct = xbc + int64_t(t) * width + I + int64_t(G + g) * N;
  float* out = cb + (int64_t(g) * T_ + t) * Q;
  for (int s = warp; s <= j; s += n_warps) {
    const T* Bs = xbc + int64_t(c0 + s) * width + I + int64_t(g) * N;
    float acc = 0.f;
    for (int n = lane; n < N; n += 32) acc += to_f(Ct[n]) * to_f(Bs[n]);
    acc = warp_sum(acc);
    if (lane == 0) out[s] = acc;
  }
}

// A warp per two rows p of the block's 16, lane l over n = l + 32 i: 2 x kScanPerLane sums in
// registers while the chunk's tokens pass through shared memory kStateTokens at a time.
template <class T>
__global__ void __launch_bounds__(256)
    ssm_chunk_state_kernel(const T* xbc, const T* dt_raw, const float* a_log,
                           const float* dt_bias, float dt_min, float dt_max, int T_, int nh,
                           int hd, int G, int N, int Q, float* cstate, float* cdecay) {
  griddep_wait();
  griddep_launch();
  extern __shared__ double smd[];
  const int c = blockIdx.x, h = blockIdx.y, p0 = blockIdx.z * kChunkTile;
  const int c0 = c * Q, L = min(Q, T_ - c0), g = h / (nh / G);
  double* cs = smd;                                     // [Q]
  float* w = reinterpret_cast<float*>(cs + Q);          // [Q]
  float* xw = w + Q;                                    // [kStateTokens][kChunkTile]
  float* Bt = xw + kStateTokens * kChunkTile;           // [kStateTokens][N]
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  const float A = -expf(a_log[h]);
  chunk_cumsum(dt_raw, c0, L, nh, h, A, dt_bias[h], dt_min, dt_max, w, cs);
  for (int s = threadIdx.x; s < L; s += blockDim.x) w[s] *= expf(float(cs[L - 1] - cs[s]));
  if (threadIdx.x == 0 && blockIdx.z == 0) cdecay[int64_t(c) * nh + h] = expf(float(cs[L - 1]));
  const int lane = threadIdx.x % 32, q0 = threadIdx.x / 32 * 2;
  float acc[2][kScanPerLane] = {};
  for (int s0 = 0; s0 < L; s0 += kStateTokens) {
    const int ns = min(kStateTokens, L - s0);
    __syncthreads();  // w written; the previous tokens consumed
    for (int i = threadIdx.x; i < ns * kChunkTile; i += blockDim.x) {
      const int s = i / kChunkTile, p = p0 + i % kChunkTile;
      xw[i] = p < hd ? w[s0 + s] * to_f(xbc[int64_t(c0 + s0 + s) * width + int64_t(h) * hd + p])
                     : 0.f;
    }
    for (int i = threadIdx.x; i < ns * N; i += blockDim.x) {
      const int s = i / N, n = i % N;
      Bt[i] = to_f(xbc[int64_t(c0 + s0 + s) * width + I + int64_t(g) * N + n]);
    }
    __syncthreads();
    for (int s = 0; s < ns; ++s)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float a = xw[s * kChunkTile + q0 + q];
#pragma unroll
        for (int i = 0; i < kScanPerLane; ++i)
          if (lane + 32 * i < N) acc[q][i] += a * Bt[s * N + lane + 32 * i];
      }
  }
  float* out = cstate + (int64_t(c) * nh + h) * hd * N;
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int i = 0; i < kScanPerLane; ++i) {
      const int p = p0 + q0 + q, n = lane + 32 * i;
      if (p < hd && n < N) out[int64_t(p) * N + n] = acc[q][i];
    }
}

size_t chunk_state_smem(int Q, int N) {
  return size_t(Q) * (sizeof(double) + sizeof(float)) +
         sizeof(float) * kStateTokens * (kChunkTile + N);
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

// 256 threads: thread (r, u) = (tid % 64, tid / 64) takes row p = p0 + r of tokens u + 4 k
// (k < 4) of the block's 16, for p0 = 0, 64, ... The tokens' m[t, s] pass through shared
// memory kOutTokens at a time, the entering state kOutRows x 32 at a time.
template <class T>
__global__ void __launch_bounds__(256)
    ssm_chunk_out_kernel(const T* xbc, const T* dt_raw, const float* a_log, const float* d_skip,
                         const float* dt_bias, float dt_min, float dt_max, int T_, int nh,
                         int hd, int G, int N, int Q, const float* cstate, const float* cb,
                         T* y) {
  griddep_wait();
  griddep_launch();
  constexpr int kPer = kChunkTile / 4;
  extern __shared__ double smd[];
  const int tiles = (Q + kChunkTile - 1) / kChunkTile;
  const int c = blockIdx.x / tiles, j0 = blockIdx.x % tiles * kChunkTile, h = blockIdx.y;
  const int c0 = c * Q, L = min(Q, T_ - c0);
  if (j0 >= L) return;
  const int nt = min(kChunkTile, L - j0), ns = j0 + nt;  // tokens here; tokens s they read
  const int g = h / (nh / G);
  double* cs = smd;                                         // [Q]
  float* dt = reinterpret_cast<float*>(cs + Q);             // [Q]
  float* m = dt + Q;                                        // [kChunkTile][kOutTokens]
  float* Ct = m + kChunkTile * kOutTokens;                  // [kChunkTile][N]
  float* Ss = Ct + kChunkTile * N;                          // [kOutRows][33]
  float* decay_in = Ss + kOutRows * 33;                     // [kChunkTile]
  const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
  const float A = -expf(a_log[h]);
  chunk_cumsum(dt_raw, c0, ns, nh, h, A, dt_bias[h], dt_min, dt_max, dt, cs);
  for (int i = threadIdx.x; i < nt * N; i += blockDim.x) {
    const int u = i / N, n = i % N;
    Ct[i] = to_f(xbc[int64_t(c0 + j0 + u) * width + I + int64_t(G + g) * N + n]);
  }
  if (threadIdx.x < nt) decay_in[threadIdx.x] = expf(float(cs[j0 + threadIdx.x]));
  const float* S = cstate + (int64_t(c) * nh + h) * hd * N;  // the state entering chunk c
  const float* cbt = cb + (int64_t(g) * T_ + c0 + j0) * Q;   // CB rows of the tokens here
  const int r = threadIdx.x % kOutRows, u = threadIdx.x / kOutRows;
  const float skip = d_skip[h];
  for (int p0 = 0; p0 < hd; p0 += kOutRows) {
    const int p = p0 + r;
    const T* xp = xbc + int64_t(c0) * width + int64_t(h) * hd + p;  // x_s[p] at + s * width
    float diag[kPer] = {}, off[kPer] = {};
    for (int s0 = 0; s0 < ns; s0 += kOutTokens) {
      const int nss = min(kOutTokens, ns - s0);
      __syncthreads();  // cs, dt, Ct written; the previous m consumed
      for (int i = threadIdx.x; i < kChunkTile * nss; i += blockDim.x) {
        const int v = i / nss, s = s0 + i % nss, jt = j0 + v;
        m[v * kOutTokens + s - s0] =
            v < nt && s <= jt ? dt[s] * (cbt[int64_t(v) * Q + s] * expf(float(cs[jt] - cs[s])))
                              : 0.f;
      }
      __syncthreads();
      if (p < hd)
        for (int s = 0; s < nss; ++s) {
          const float x = to_f(xp[int64_t(s0 + s) * width]);
#pragma unroll
          for (int k = 0; k < kPer; ++k) diag[k] += m[(u + 4 * k) * kOutTokens + s] * x;
        }
    }
    for (int n0 = 0; n0 < N; n0 += 32) {
      const int nn = min(32, N - n0);
      __syncthreads();
      for (int i = threadIdx.x; i < kOutRows * 32; i += blockDim.x) {
        const int pr = i / 32, n = i % 32;
        Ss[pr * 33 + n] = p0 + pr < hd && n < nn ? S[int64_t(p0 + pr) * N + n0 + n] : 0.f;
      }
      __syncthreads();
      for (int n = 0; n < nn; ++n) {
        const float sv = Ss[r * 33 + n];
#pragma unroll
        for (int k = 0; k < kPer; ++k) off[k] += sv * Ct[(u + 4 * k) * N + n0 + n];
      }
    }
    if (p < hd)
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int v = u + 4 * k;
        if (v >= nt) continue;
        const int64_t t = c0 + j0 + v;
        const float x = to_f(xbc[t * width + int64_t(h) * hd + p]);
        y[t * I + int64_t(h) * hd + p] = from_f<T>(decay_in[v] * off[k] + diag[k] + skip * x);
      }
  }
}

size_t chunk_out_smem(int Q, int N) {
  return size_t(Q) * (sizeof(double) + sizeof(float)) +
         sizeof(float) * (kChunkTile * (kOutTokens + N + 1) + kOutRows * 33);
}

template <class T>
void ssm_init_type() {
  ARB_CUDA(cudaFuncSetAttribute(ssm_chunk_state_kernel<T>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(chunk_state_smem(kMaxScanChunk, kMaxScanState))));
  ARB_CUDA(cudaFuncSetAttribute(ssm_chunk_out_kernel<T>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(chunk_out_smem(kMaxScanChunk, kMaxScanState))));
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
  if (T == 0) return;  // the state stays as it is
  const int tile = std::max(16, K - 1);
  const dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned((T + tile - 1) / tile));
  ARB_DISPATCH_CTYPE(ct, E,
                     launch_k(ssm_conv_kernel<E>, grid, dim3(kThreads), 0, s,
                              static_cast<const E*>(x), w, b, T, C, K, tile,
                              static_cast<E*>(state), static_cast<E*>(out)));
  ARB_LAUNCHED("ssm_conv_kernel", s);
}

int64_t ssm_scan_scratch_floats(const ScanArgs& a) {
  if (a.T <= 1 || a.recurrence) return 0;
  const int Q = std::min(a.chunk, a.T), n_chunks = (a.T + Q - 1) / Q;
  return int64_t(n_chunks) * a.nh * (int64_t(a.hd) * a.N + 1) + int64_t(a.G) * a.T * Q;
}

void ssm_init() {
  ssm_init_type<float>();
  ssm_init_type<__half>();
  ssm_init_type<__nv_bfloat16>();
}

void launch_ssm_scan(DType ct, const ScanArgs& a, cudaStream_t s) {
  if (a.T > 1 && !a.recurrence) {
    const int Q = std::min(a.chunk, a.T), n_chunks = (a.T + Q - 1) / Q;
    const int64_t per_head = int64_t(a.hd) * a.N, states = a.nh * per_head;
    float *cstate = a.scratch, *cdecay = cstate + n_chunks * states, *cb = cdecay + n_chunks * a.nh;
    const unsigned row_tiles = unsigned((a.hd + kChunkTile - 1) / kChunkTile);
    const unsigned token_tiles = unsigned(n_chunks * ((Q + kChunkTile - 1) / kChunkTile));
    ARB_DISPATCH_CTYPE(ct, E,
                       launch_k(ssm_chunk_cb_kernel<E>, dim3(a.T, a.G), dim3(128), 0, s,
                                static_cast<const E*>(a.xbc), a.T, a.nh, a.hd, a.G, a.N, Q, cb));
    ARB_LAUNCHED("ssm_chunk_cb_kernel", s);
    ARB_DISPATCH_CTYPE(ct, E,
                       launch_k(ssm_chunk_state_kernel<E>, dim3(n_chunks, a.nh, row_tiles),
                                dim3(256), chunk_state_smem(Q, a.N), s,
                                static_cast<const E*>(a.xbc), static_cast<const E*>(a.dt_raw),
                                a.a_log, a.dt_bias, a.dt_min, a.dt_max, a.T, a.nh, a.hd, a.G,
                                a.N, Q, cstate, cdecay));
    ARB_LAUNCHED("ssm_chunk_state_kernel", s);
    launch_k(ssm_chunk_pass_kernel, dim3(unsigned((states + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, s, cstate, static_cast<const float*>(cdecay), n_chunks, a.nh,
             per_head, a.state);
    ARB_LAUNCHED("ssm_chunk_pass_kernel", s);
    ARB_DISPATCH_CTYPE(ct, E,
                       launch_k(ssm_chunk_out_kernel<E>, dim3(token_tiles, a.nh), dim3(256),
                                chunk_out_smem(Q, a.N), s, static_cast<const E*>(a.xbc),
                                static_cast<const E*>(a.dt_raw), a.a_log, a.d, a.dt_bias,
                                a.dt_min, a.dt_max, a.T, a.nh, a.hd, a.G, a.N, Q,
                                static_cast<const float*>(cstate), static_cast<const float*>(cb),
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
