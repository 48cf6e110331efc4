// Logits summary on the device: per row of f32 logits, the non-finite count, the f64
// logsumexp, the target logit and the top-K, so only O(K) numbers per row cross the bus.
//
// Three kernels. row_stats (T x S blocks, each one slice of a row): non-finite count, max and
// the best (key, id) of the slice. row_expsum (T x S): the slice's sum of exp(x - max) in
// f64 with the row max from the partials. summarize_final (one block of 1024 per row): the
// partials combined in slice order (deterministic), lse, target, and the top-K; K = 1 comes
// from the slices' best (key, id), larger K from the radix select below. S fills the device
// when T is small (a decode step has one row of up to ~150k logits). The greedy pick
// (pick_kernel) takes the same top-1 of one row in one kernel that can sit at the end of a
// decode step's graph: the slices' best meet in an atomicMax, and the last block hands the
// token to the next step on the device and to the host through mapped memory.
// Top-K is an exact radix select on an order-preserving
// 32-bit key (four 8-bit histogram passes find the K-th largest key tau), then every key
// above tau plus the lowest-id keys equal to tau (a block scan over contiguous id ranges)
// are collected and rank-sorted by (value descending, id ascending). NaN maps to the lowest
// key and -0 to +0, which reproduces the f64 oracle's order: descending, ties to the lower
// id, NaN last (ref_backend.cpp summarize_row).
#include <algorithm>

#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarpsPer = kThreads / 32;

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  if (f == 0.f) return 0x80000000u;  // -0 and +0 tie, as they do as doubles
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Reduction over the block (any multiple of 32 threads up to 1024) in a fixed tree; every
/// thread gets the result. red needs blockDim.x / 32 entries.
template <class R, class Op>
__device__ R block_reduce(R v, R* red, Op op, R identity) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < n_warps ? red[lane] : identity;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  const R r = red[0];
  __syncthreads();
  return r;
}

/// Exclusive prefix sum of one int per thread over the block (thread order).
__device__ int block_exclusive_scan(int v, int* scan) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) scan[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = scan[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    scan[lane] = w;
  }
  __syncthreads();
  const int r = inc - v + (warp > 0 ? scan[warp - 1] : 0);
  __syncthreads();
  return r;
}

/// Packs (key, id) so that a larger u64 is the better entry: larger key, then lower id.
__device__ __forceinline__ unsigned long long pack_best(uint32_t key, int id) {
  return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - uint32_t(id));
}

constexpr int kSliceThreads = 256;

__device__ __forceinline__ void slice_of(int V, int S, int s, int& lo, int& hi) {
  const int len = (V + S - 1) / S;
  lo = min(V, s * len);
  hi = min(V, lo + len);
}

__global__ void __launch_bounds__(kSliceThreads)
    row_stats_kernel(const float* logits, int V, int S, SummaryScratch w) {
  __shared__ unsigned long long red_u[kSliceThreads / 32];
  __shared__ float red_f[kSliceThreads / 32];
  const int row = blockIdx.x, s = blockIdx.y;
  const float* x = logits + int64_t(row) * V;
  int lo, hi;
  slice_of(V, S, s, lo, hi);
  unsigned long long nf = 0, best = 0;
  float mx = -INFINITY;
#pragma unroll 8
  for (int i = lo + int(threadIdx.x); i < hi; i += kSliceThreads) {
    const float v = x[i];
    if (!isfinite(v)) ++nf;
    else mx = fmaxf(mx, v);
    const unsigned long long b = pack_best(order_key(v), i);
    best = b > best ? b : best;
  }
  nf = block_reduce(
      nf, red_u, [](unsigned long long a, unsigned long long b) { return a + b; }, 0ull);
  best = block_reduce(
      best, red_u, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; }, 0ull);
  mx = block_reduce(mx, red_f, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
  if (threadIdx.x == 0) {
    const int k = row * S + s;
    w.nonfinite[k] = nf;
    w.best[k] = best;
    w.max[k] = mx;
  }
}

__global__ void __launch_bounds__(kSliceThreads)
    row_expsum_kernel(const float* logits, int V, int S, SummaryScratch w) {
  __shared__ double red_d[kSliceThreads / 32];
  const int row = blockIdx.x, s = blockIdx.y;
  unsigned long long nf = 0;
  float mx = -INFINITY;
  for (int j = 0; j < S; ++j) {  // the row's statistics from every slice (same order in all)
    nf += w.nonfinite[row * S + j];
    mx = fmaxf(mx, w.max[row * S + j]);
  }
  double sum = 0.0;
  if (nf == 0) {
    const float* x = logits + int64_t(row) * V;
    int lo, hi;
    slice_of(V, S, s, lo, hi);
    const double m = mx;
#pragma unroll 8
    for (int i = lo + int(threadIdx.x); i < hi; i += kSliceThreads) sum += exp(double(x[i]) - m);
  }
  sum = block_reduce(sum, red_d, [](double a, double b) { return a + b; }, 0.0);
  if (threadIdx.x == 0) w.sum[row * S + s] = sum;
}

__global__ void __launch_bounds__(kThreads)
    summarize_kernel(const float* logits, int V, int K, int S, const int32_t* targets,
                     SummaryScratch w, SummaryOut o) {
  __shared__ unsigned hist[256];
  __shared__ int scan[kWarpsPer];
  __shared__ uint32_t sel_prefix;
  __shared__ int sel_need, n_gt;
  __shared__ uint32_t cand_key[kMaxTopK];
  __shared__ int32_t cand_id[kMaxTopK];

  const int row = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + int64_t(row) * V;

  if (tid == 0) {
    // Slice partials in slice order: the same sum on every run.
    unsigned long long nf = 0, best = 0;
    float mx = -INFINITY;
    double sum = 0.0;
    for (int j = 0; j < S; ++j) {
      nf += w.nonfinite[row * S + j];
      mx = fmaxf(mx, w.max[row * S + j]);
      best = w.best[row * S + j] > best ? w.best[row * S + j] : best;
      sum += w.sum[row * S + j];
    }
    // logsumexp in f64 with the max subtracted; NaN when any logit is not finite (like ref).
    o.lse[row] = nf == 0 ? double(mx) + log(sum) : __longlong_as_double(0x7ff8000000000000LL);
    o.nonfinite[row] = nf;
    const int32_t t = targets[row];
    o.target[row] = (t >= 0 && t < V) ? x[t] : __int_as_float(0x7fc00000);
    if (K == 1) {
      const int id = int(0xffffffffu - uint32_t(best & 0xffffffffu));
      o.top_ids[row] = id;
      o.top_vals[row] = x[id];
    }
  }
  if (K == 1) return;  // block-uniform

  // Radix select: the K-th largest key tau, and how many keys equal to tau to take.
  uint32_t prefix = 0, mask = 0;
  int need = K;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < V; i += kThreads) {
      const uint32_t k = order_key(x[i]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      int cum = 0, b = 255;
      for (; b > 0; --b) {
        if (cum + int(hist[b]) >= need) break;
        cum += int(hist[b]);
      }
      sel_need = need - cum;
      sel_prefix = prefix | (uint32_t(b) << shift);
    }
    __syncthreads();
    need = sel_need;
    prefix = sel_prefix;
    mask |= 255u << shift;
  }
  const uint32_t tau = prefix;
  const int n_greater = K - need;

  // Keys above tau, in any order (they are sorted below).
  if (tid == 0) n_gt = 0;
  __syncthreads();
#pragma unroll 4
  for (int i = tid; i < V; i += kThreads) {
    const uint32_t k = order_key(x[i]);
    if (k > tau) {
      const int p = atomicAdd(&n_gt, 1);
      if (p < kMaxTopK) {
        cand_key[p] = k;
        cand_id[p] = i;
      }
    }
  }
  // The `need` lowest ids whose key equals tau: each thread scans a contiguous id range.
  const int span = (V + kThreads - 1) / kThreads;
  const int b0 = min(V, tid * span), b1 = min(V, b0 + span);
  int cnt = 0;
  for (int i = b0; i < b1; ++i) cnt += order_key(x[i]) == tau;
  int before = block_exclusive_scan(cnt, scan);
  for (int i = b0; i < b1 && before < need; ++i)
    if (order_key(x[i]) == tau) {
      cand_key[n_greater + before] = tau;
      cand_id[n_greater + before] = i;
      ++before;
    }
  __syncthreads();

  // Rank sort: (key descending, id ascending); candidates are distinct by id.
  for (int c = tid; c < K; c += kThreads) {
    const uint32_t kc = cand_key[c];
    const int32_t ic = cand_id[c];
    int rank = 0;
    for (int j = 0; j < K; ++j) {
      const uint32_t kj = cand_key[j];
      rank += (kj > kc) || (kj == kc && cand_id[j] < ic);
    }
    o.top_ids[int64_t(row) * K + rank] = ic;
    o.top_vals[int64_t(row) * K + rank] = x[ic];
  }
}

__global__ void __launch_bounds__(kSliceThreads) pick_kernel(const float* x, int V, PickArgs p) {
  __shared__ unsigned long long red[kSliceThreads / 32];
  __shared__ bool last;
  griddep_wait();
  griddep_launch();
  int lo, hi;
  slice_of(V, int(gridDim.x), int(blockIdx.x), lo, hi);
  unsigned long long best = 0;
  for (int i = lo + int(threadIdx.x); i < hi; i += kSliceThreads) {
    const unsigned long long b = pack_best(order_key(x[i]), i);
    best = b > best ? b : best;
  }
  best = block_reduce(
      best, red, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; }, 0ull);
  if (threadIdx.x == 0) {
    atomicMax(&p.state->best, best);
    __threadfence();
    last = atomicAdd(&p.state->ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  const int32_t id = int32_t(0xffffffffu - uint32_t(atomicExch(&p.state->best, 0ull)));
  p.state->ticket = 0;
  *p.token = id;
  if (p.pos) *p.pos += 1;
  p.ring[p.state->seq % unsigned(p.n_ring)] = id;
  p.state->seq += 1;
  __threadfence_system();
}

}  // namespace

int summarize_slices(int T, int V, int sm_count) {
  const int by_device = (2 * sm_count + T - 1) / max(T, 1);
  const int by_length = (V + 1023) / 1024;  // at least ~4 elements per thread
  return std::max(1, std::min({by_device, by_length, kMaxSlices}));
}

void launch_summarize(const float* logits, int T, int V, int K, const int32_t* targets, int S,
                      const SummaryScratch& w, const SummaryOut& o, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(S));
  row_stats_kernel<<<grid, kSliceThreads, 0, s>>>(logits, V, S, w);
  ARB_LAUNCHED("row_stats_kernel", s);
  row_expsum_kernel<<<grid, kSliceThreads, 0, s>>>(logits, V, S, w);
  ARB_LAUNCHED("row_expsum_kernel", s);
  summarize_kernel<<<T, kThreads, 0, s>>>(logits, V, K, S, targets, w, o);
  ARB_LAUNCHED("summarize_kernel", s);
}

void launch_pick(const float* row, int V, const PickArgs& p, int sm_count, cudaStream_t s) {
  const int S = summarize_slices(1, V, sm_count);
  launch_decode_k(pick_kernel, dim3(unsigned(S)), dim3(kSliceThreads), 0, s, row, V, p);
  ARB_LAUNCHED("pick_kernel", s);
}

}  // namespace arbiter::cuda
