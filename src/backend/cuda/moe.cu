// Mixture-of-experts kernels of the CUDA tier (Backend::moe, sigmoid_gate): the router on the
// device, the selected experts read through per-layer device tables of weight pointers, so a
// decode step learns nothing on the host and stays graph-capturable.
//
//   route:    a block per token, a thread per expert; scores in f64 as route()
//             (backend/moe_routing.cpp) computes them, so the device picks what the host
//             oracle would pick from the same stored logits (only the order of the softmax's
//             sum differs: ~1e-16 relative).
//   decode:   T == 1. A warp per output row: gate/up rows of the slot's expert (its id read
//             from the router's output, both rows read together), then the down rows (a warp
//             per slot), summed over the slots; for moe_add, added to the residual there.
//   prefill:  T > 1. A counting sort of the (token, slot) pairs by expert (one block), then a
//             tiled GEMM over the groups (tiles of kMoeTileRows rows of one expert), gate/up
//             and down, on tensor cores in bf16/f16 (moe_group_gemm_mma), on CUDA cores in
//             f32 or under ARBITER_CUDA_MOE_MMA=0 (moe_group_gemm), then the weighted sum per
//             token. Grids are sized for the worst grouping; a tile past the groups returns at
//             once, so the host never waits for the group sizes.
// Every projection is rounded to the compute type where matmul would round it, the
// activation as swiglu/relu2 compute it, each expert's output too; the k weighted outputs
// are summed in f32 in ascending expert id (fmaf, as in both paths), so a result depends on
// neither the schedule nor the path's tiling beyond the dot products' order.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/device_common.cuh"

namespace arbiter::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;

// The ordering key of every top-k: NaN ranks with -inf (route()'s `ranked`).
__device__ __forceinline__ double rank_key(double v) { return isnan(v) ? -INFINITY : v; }

// (key, index) pairs: a larger key wins, ties go to the lower index.
__device__ __forceinline__ bool better(double k1, int i1, double k2, int i2) {
  return k1 > k2 || (k1 == k2 && i1 < i2);
}

__device__ __forceinline__ double warp_max_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// --- routing -------------------------------------------------------------------------------
// The block's max (fmax) or sum of v, in every thread: each warp's, then the warps' in warp
// order, so the order depends on the block size alone. `part` holds a value per warp.
template <bool kMax>
__device__ __forceinline__ double block_reduce_d(double v, double* part) {
  v = kMax ? warp_max_d(v) : warp_sum_d(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) v = kMax ? fmax(v, part[w]) : v + part[w];
  return v;
}

// A block per token, a thread per expert. Each expert counts the experts that beat it, which
// is its place in route()'s order: the top k (and the (k+1)-th, for the margin) in one pass
// with no sequential rounds. The k weights' sums are taken by each picking thread in pick
// order, as route() adds them. (Session 31's kernel, a warp per token picking in k + 1 warp
// argmax rounds and one lane for the weights, cost 10-13% of a MoE decode step on an H100:
// call C of session 32.)
template <class T>
__global__ void moe_route_kernel(MoeRouteArgs a) {
  constexpr int W = kMoeMaxExperts / 32;
  __shared__ double part_max[W], part_sum[W], sel[kMoeMaxExperts], key[kMoeMaxExperts];
  __shared__ double gscore[kMoeMaxGroups];
  __shared__ unsigned char keep[kMoeMaxGroups];
  __shared__ double pick_sel[kMoeMaxTopK + 1], pick_w[kMoeMaxTopK];
  griddep_wait();
  griddep_launch();
  const int t = blockIdx.x, e = threadIdx.x, E = a.E, k = a.k;
  const bool live = e < E;
  double score = live ? double(to_f(static_cast<const T*>(a.logits)[int64_t(t) * E + e]))
                      : -INFINITY;
  if (!a.topk_first) {
    if (a.sigmoid) {
      score = 1.0 / (1.0 + exp(-score));
    } else {  // softmax in f64, max-subtracted (route()'s softmax)
      const double mx = block_reduce_d<true>(score, part_max);
      const double ex = live ? exp(score - mx) : 0.0;
      score = ex / block_reduce_d<false>(ex, part_sum);
    }
  }
  double s = live && a.bias ? score + double(a.bias[e]) : score;
  if (a.n_group > 1) {
    // A group scores the sum of its two best selection scores; experts outside the
    // topk_group best groups compete with 0.0 (HF get_topk_indices' masked_fill).
    const int G = a.n_group, per = E / G;
    if (live) sel[e] = s;
    __syncthreads();
    if (e < G) {
      int b1 = -1, b2 = -1;
      for (int i = e * per; i < (e + 1) * per; ++i) {
        const double v = rank_key(sel[i]);
        if (b1 < 0 || v > rank_key(sel[b1])) b2 = b1, b1 = i;
        else if (b2 < 0 || v > rank_key(sel[b2])) b2 = i;
      }
      gscore[e] = sel[b1] + sel[b2];
    }
    __syncthreads();
    if (e < G) {
      int place = 0;
      for (int g = 0; g < G; ++g) place += better(rank_key(gscore[g]), g, rank_key(gscore[e]), e);
      keep[e] = place < a.topk_group;
    }
    __syncthreads();
    if (live && !keep[e / per]) s = 0.0;
  }
  if (live) key[e] = rank_key(s);
  __syncthreads();
  const int n_pick = k < E ? k + 1 : k;
  if (live) {
    const double mine = key[e];
    int place = 0;
#pragma unroll 8
    for (int j = 0; j < E; ++j) place += better(key[j], j, mine, e);
    if (place < n_pick) pick_sel[place] = s;
    if (place < k) {
      a.ids[int64_t(t) * k + place] = e;
      pick_w[place] = score;
    }
  }
  __syncthreads();
  // Weights in pick order, each sum in that order, as route() takes them.
  double w = e < k ? pick_w[e] : 0.0;
  if (a.topk_first) {  // Granite: softmax over the k selected logits
    double mx = -INFINITY;
    for (int i = 0; i < k; ++i) mx = mx < pick_w[i] ? pick_w[i] : mx;
    __syncthreads();
    if (e < k) pick_w[e] = w = exp(w - mx);
    __syncthreads();
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += pick_w[i];
    w /= sum;
  }
  if (a.norm) {
    __syncthreads();
    if (e < k) pick_w[e] = w;
    __syncthreads();
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += pick_w[i];
    w /= sum + a.norm_eps;
  }
  if (e < k) a.weights[int64_t(t) * k + e] = float(w * a.scale);
  if (e == 0) a.margin[t] = k < E ? pick_sel[k - 1] - pick_sel[k] : INFINITY;
}

// --- shared pieces of the expert kernels ----------------------------------------------------
template <class T>
__device__ __forceinline__ bool aligned16(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// dot(w[0, K), x[0, K)) over a warp, f32: 16-byte chunks per lane when both rows allow them.
// Every lane returns the sum.
template <class T>
__device__ __forceinline__ float warp_dot(const T* w, const T* x, int K) {
  constexpr int V = Vec16<T>::N;
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  if (K % V == 0 && aligned16(w) && aligned16(x)) {
#pragma unroll 4
    for (int c = lane * V; c < K; c += 32 * V) {
      float wf[V], xf[V];
      load16(w + c, wf);
      load16(x + c, xf);
#pragma unroll
      for (int i = 0; i < V; ++i) acc = fmaf(wf[i], xf[i], acc);
    }
  } else {
    for (int c = lane; c < K; c += 32) acc = fmaf(to_f(w[c]), to_f(x[c]), acc);
  }
  return warp_sum(acc);
}

// warp_dot(a, x, K) and warp_dot(b, x, K), the same sums, with both rows' loads in flight at
// once rather than one row's after the other's.
template <class T>
__device__ __forceinline__ void warp_dot2(const T* a, const T* b, const T* x, int K, float& da,
                                          float& db) {
  constexpr int V = Vec16<T>::N;
  const int lane = threadIdx.x % 32;
  if (!(K % V == 0 && aligned16(a) && aligned16(b) && aligned16(x))) {
    da = warp_dot(a, x, K);
    db = warp_dot(b, x, K);
    return;
  }
  float acc_a = 0.f, acc_b = 0.f;
#pragma unroll 8
  for (int c = lane * V; c < K; c += 32 * V) {
    float af[V], bf[V], xf[V];
    load16(a + c, af);
    load16(b + c, bf);
    load16(x + c, xf);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      acc_a = fmaf(af[i], xf[i], acc_a);
      acc_b = fmaf(bf[i], xf[i], acc_b);
    }
  }
  da = warp_sum(acc_a);
  db = warp_sum(acc_b);
}

// warp_dot(w + r ld, x, K) for the n <= R rows r, the same sums, every row's loads in flight
// at once; rows r >= n are not read (their sums are 0).
template <class T, int R>
__device__ __forceinline__ void warp_dot_rows(const T* w, int64_t ld, int n, const T* x, int K,
                                              float (&d)[R]) {
  constexpr int V = Vec16<T>::N;
  const int lane = threadIdx.x % 32;
  if (!(K % V == 0 && ld % V == 0 && aligned16(w) && aligned16(x))) {
#pragma unroll
    for (int r = 0; r < R; ++r) d[r] = r < n ? warp_dot(w + r * ld, x, K) : 0.f;
    return;
  }
  float acc[R] = {};
#pragma unroll 4
  for (int c = lane * V; c < K; c += 32 * V) {
    float wf[R][V], xf[V];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < n) load16(w + r * ld + c, wf[r]);
      else
#pragma unroll
        for (int i = 0; i < V; ++i) wf[r][i] = 0.f;
    }
    load16(x + c, xf);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < V; ++i) acc[r] = fmaf(wf[r][i], xf[i], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) d[r] = warp_sum(acc[r]);
}

// The activation of rounded projections, as swiglu_kernel / relu2_kernel compute it.
template <class T, bool kRelu2>
__device__ __forceinline__ T expert_act(float gate_acc, float up_acc) {
  const float u = to_f(from_f<T>(up_acc));
  if (kRelu2) {
    const float v = fmaxf(u, 0.f);
    return from_f<T>(v * v);
  }
  const float g = to_f(from_f<T>(gate_acc));
  return from_f<T>(g / (1.0f + expf(-g)) * u);
}

// --- decode (T == 1) ------------------------------------------------------------------------
constexpr int kDecodeWarps = 4;

// act[slot, f] for slot = blockIdx.y, f a warp's row.
template <class T, bool kRelu2>
__global__ void moe_gateup_gemv(MoeTables w, const T* x, const int* ids, T* act) {
  griddep_wait();  // the router's ids
  griddep_launch();
  const int slot = blockIdx.y, f = blockIdx.x * kDecodeWarps + threadIdx.x / 32;
  if (f >= w.F) return;
  const int e = ids[slot];
  const T* up = static_cast<const T*>(w.up[e]) + int64_t(f) * w.ld_in;
  float u = 0.f, g = 0.f;
  if (kRelu2) u = warp_dot(up, x, w.D);
  else warp_dot2(up, static_cast<const T*>(w.gate[e]) + int64_t(f) * w.ld_in, x, w.D, u, g);
  if (threadIdx.x % 32 == 0) act[int64_t(slot) * w.F + f] = expert_act<T, kRelu2>(g, u);
}

// out[d] = sum over the slots in ascending expert id of weight * T(act[slot] . down_e[d]): a
// block per R rows d and a warp per slot, so the k experts' rows are read at once (a warp that
// walked the slots one after the other waited for memory k times: 18 us of qwen3-30b-a3b's
// layer for 6 us of bytes, docs/evidence/h200/profile-s20.txt); a thread per row then sums the
// k products in ascending expert id. R = 4 for short rows (down_rows), so a lane has 8-16 of
// its 16-byte loads in flight.
template <class T, int R>
__global__ void moe_down_gemv(MoeTables w, const T* act, const int* ids, const float* weights,
                              T* out, MoeResidualArgs res) {
  __shared__ float y_of[R][kMoeMaxTopK], w_of[kMoeMaxTopK];  // by rank
  griddep_wait();
  griddep_launch();
  const int d0 = blockIdx.x * R, slot = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = min(R, w.D - d0);
  const int e = ids[slot];
  int rank = 0;  // the slot's place in ascending expert id (a token's experts are distinct)
  for (int j = 0; j < w.k; ++j) rank += ids[j] < e;
  float y[R];
  warp_dot_rows<T, R>(static_cast<const T*>(w.down[e]) + int64_t(d0) * w.ld_down, w.ld_down, n,
                      act + int64_t(slot) * w.F, w.F, y);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) y_of[r][rank] = y[r];
    w_of[rank] = weights[slot];
  }
  __syncthreads();
  if (int(threadIdx.x) >= n) return;
  float acc = 0.f;
  for (int r = 0; r < w.k; ++r) acc = fmaf(w_of[r], to_f(from_f<T>(y_of[threadIdx.x][r])), acc);
  const int d = d0 + int(threadIdx.x);
  if (!res.residual) {
    out[d] = from_f<T>(acc);
    return;
  }
  float o = to_f(from_f<T>(acc));
  if (res.shared) o = to_f(from_f<T>(o + to_f(static_cast<const T*>(res.shared)[d])));
  if (res.scale != 1.f) o = to_f(from_f<T>(o * res.scale));
  T* residual = static_cast<T*>(res.residual);
  residual[d] = from_f<T>(to_f(residual[d]) + o);
}

// --- prefill (T > 1) ------------------------------------------------------------------------
constexpr int kSortWarps = 16;

// One block: each warp counts its contiguous segment of the (token, slot) pairs per expert
// (the lanes of one expert found with match_any, their leader adding them), the per-expert
// prefix over the warps gives each warp's first place within each group, one thread the group
// and tile starts, then each warp places its segment 32 pairs at a time, advancing its own
// places. Each group holds its pairs in token order, as a serial pass over the pairs would
// place them. (Session 36's kernel had a thread per expert scan all pairs: 274 us of a
// Nemotron MoE layer's pp512, Nsight Compute on an H200.)
__global__ void moe_sort_kernel(const int* ids, int n, int k, int E, MoeSortBufs b) {
  __shared__ int at[kSortWarps][kMoeMaxExperts];  // a warp's count, then its next place
  __shared__ int start[kMoeMaxExperts];
  griddep_wait();
  griddep_launch();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = threadIdx.x; j < kSortWarps * E; j += blockDim.x) at[j / E][j % E] = 0;
  __syncthreads();
  const int per = (n + kSortWarps - 1) / kSortWarps;
  const int seg0 = min(n, warp * per), seg1 = min(n, seg0 + per);
  for (int i0 = seg0; i0 < seg1; i0 += 32) {
    const int i = i0 + lane;
    const int e = i < seg1 ? ids[i] : -1;
    const unsigned same = __match_any_sync(~0u, e);
    if (e >= 0 && lane == __ffs(same) - 1) at[warp][e] += __popc(same);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int sum = 0;
    for (int w = 0; w < kSortWarps; ++w) {
      const int c = at[w][e];
      at[w][e] = sum;
      sum += c;
    }
    start[e] = sum;  // the group's size until the starts below replace it
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, tile = 0;
    for (int e = 0; e < E; ++e) {
      const int count = start[e];
      start[e] = b.offsets[e] = off;
      b.tiles[e] = tile;
      off += count;
      tile += (count + kMoeTileRows - 1) / kMoeTileRows;
    }
    b.offsets[E] = off;
    b.tiles[E] = tile;
  }
  __syncthreads();
  for (int i0 = seg0; i0 < seg1; i0 += 32) {
    const int i = i0 + lane;
    const int e = i < seg1 ? ids[i] : -1;
    const unsigned same = __match_any_sync(~0u, e);
    const int leader = __ffs(same) - 1;
    int first = 0;
    if (e >= 0 && lane == leader) {
      first = start[e] + at[warp][e];
      at[warp][e] += __popc(same);
    }
    first = __shfl_sync(~0u, first, leader);
    if (e >= 0) {
      const int pos = first + __popc(same & ((1u << lane) - 1));
      b.tok_of[pos] = i / k;
      b.row_of[i] = pos;
    }
    __syncwarp();
  }
}

constexpr int kTileN = 64, kTileK = 32, kGemmThreads = 256;
enum GemmMode { kGateUp = 0, kUpRelu2 = 1, kDown = 2 };

// A block's part of a grouped GEMM: one expert's sorted rows [row0, row0 + rows) (rows <=
// kMoeTileRows) by output columns; the product's K and N, and the expert's weights [N, K] at
// row stride ld (w1: the gate's, kGateUp only).
template <class T, int kMode>
struct GroupTile {
  int row0, rows, K, N;
  int64_t ld;
  const T* w0;
  const T* w1;
  // The input row of the tile's row r: its token's row of x (gate/up), its sorted row (down).
  __device__ int src(const MoeSortBufs& b, int r) const {
    return kMode == kDown ? row0 + r : b.tok_of[row0 + r];
  }
};

// Tile blockIdx.x of the groups; false past the last group (the grid is sized for the worst
// grouping).
template <class T, int kMode>
__device__ __forceinline__ bool group_tile(const MoeTables& w, const MoeSortBufs& b,
                                           GroupTile<T, kMode>& g) {
  const int tile = blockIdx.x, E = w.E;
  if (tile >= b.tiles[E]) return false;
  int lo = 0, hi = E - 1;  // the last expert whose tiles start at or before this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.tiles[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int e = lo;
  g.row0 = b.offsets[e] + (tile - b.tiles[e]) * kMoeTileRows;
  g.rows = min(kMoeTileRows, b.offsets[e + 1] - g.row0);
  g.K = kMode == kDown ? w.F : w.D;
  g.N = kMode == kDown ? w.D : w.F;
  g.ld = kMode == kDown ? w.ld_down : w.ld_in;
  g.w0 = static_cast<const T*>(kMode == kDown ? w.down[e] : w.up[e]);
  g.w1 = kMode == kGateUp ? static_cast<const T*>(w.gate[e]) : nullptr;
  return true;
}

// An output from its f32 sums (gate's unused but in kGateUp): the activation of the rounded
// projections, or the rounded down product.
template <class T, int kMode>
__device__ __forceinline__ T group_out(float up, float gate) {
  if constexpr (kMode == kDown) return from_f<T>(up);
  else return expert_act<T, kMode == kUpRelu2>(gate, up);
}

// CUDA-core form (f32, and bf16/f16 under ARBITER_CUDA_MOE_MMA=0): one tile of kMoeTileRows
// sorted rows of one expert by kTileN output columns, K in steps of kTileK through shared memory
// in f32; a thread computes 2 rows x 4 columns (and the gate's too), each output one f32 fma
// chain over K.
template <class T, int kMode>
__global__ void moe_group_gemm(MoeTables w, const T* in, MoeSortBufs b, T* outp) {
  __shared__ float as[kMoeTileRows][kTileK + 1];
  __shared__ float bs[kMode == kGateUp ? 2 : 1][kTileN][kTileK + 1];
  griddep_wait();
  griddep_launch();
  GroupTile<T, kMode> g;
  if (!group_tile(w, b, g)) return;
  const int n0 = blockIdx.y * kTileN, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  constexpr int kG = kMode == kGateUp ? 1 : 0;  // the gate's weight tile (only in kGateUp)
  float acc[2][2][4] = {};  // [up or down, gate][row][col]
  for (int k0 = 0; k0 < g.K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kMoeTileRows * kTileK; i += kGemmThreads) {
      const int r = i / kTileK, c = i % kTileK;
      float v = 0.f;
      if (r < g.rows && k0 + c < g.K) v = to_f(in[int64_t(g.src(b, r)) * g.K + k0 + c]);
      as[r][c] = v;
    }
    for (int i = threadIdx.x; i < kTileN * kTileK; i += kGemmThreads) {
      const int n = i / kTileK, c = i % kTileK;
      const bool in_range = n0 + n < g.N && k0 + c < g.K;
      const int64_t at = int64_t(n0 + n) * g.ld + k0 + c;
      bs[0][n][c] = in_range ? to_f(g.w0[at]) : 0.f;
      if (kMode == kGateUp) bs[kG][n][c] = in_range ? to_f(g.w1[at]) : 0.f;
    }
    __syncthreads();
    for (int c = 0; c < kTileK; ++c) {
      const float a0 = as[ty * 2][c], a1 = as[ty * 2 + 1][c];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float b0 = bs[0][tx * 4 + j][c];
        acc[0][0][j] = fmaf(a0, b0, acc[0][0][j]);
        acc[0][1][j] = fmaf(a1, b0, acc[0][1][j]);
        if (kMode == kGateUp) {
          const float b1 = bs[kG][tx * 4 + j][c];
          acc[1][0][j] = fmaf(a0, b1, acc[1][0][j]);
          acc[1][1][j] = fmaf(a1, b1, acc[1][1][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = ty * 2 + i, n = n0 + tx * 4 + j;
      if (r < g.rows && n < g.N)
        outp[int64_t(g.row0 + r) * g.N + n] = group_out<T, kMode>(acc[0][i][j], acc[1][i][j]);
    }
}

// Row stride of the tensor-core form's shared tiles in elements: 8 past kTileK (80 bytes), so
// a warp's 32-bit fragment loads (8 rows g, word t of each) fall in 32 distinct banks, and
// every row starts 16-byte aligned for the chunk stores.
constexpr int kMmaLd = kTileK + 8;
static_assert(kGemmThreads == 4 * kTileN && kTileK == 4 * 8 && kMoeTileRows <= kTileN,
              "moe_group_gemm_mma stages a chunk of 8 values of a row per thread");

// Values [k, k + 8) of a row of K values (zeros past K, all zeros for a null row) as one
// 16-byte chunk of T: one vector load when `vec` (K, the row stride and the base all multiples
// of 8 elements: a chunk is then wholly inside or past K), else value by value.
template <class T>
__device__ __forceinline__ uint4 load_chunk(const T* row, int k, int K, bool vec) {
  if (!row || k >= K) return make_uint4(0, 0, 0, 0);
  if (vec) return *reinterpret_cast<const uint4*>(row + k);
  const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
  uint32_t v[4] = {};
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (k + j < K) v[j / 2] |= uint32_t(h[k + j]) << (16 * (j % 2));
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// A pair of T at p (even index within a row): one 32-bit fragment register.
template <class T>
__device__ __forceinline__ uint32_t pair_at(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Tensor-core form (bf16/f16): the tile of moe_group_gemm, K in steps of kTileK staged in
// shared memory in T (thread i holds chunk i % 4 of row i / 4 of the activations, i < 128, and
// of each weight tile; the next step's chunks load into registers while this one computes).
// Warp w takes the tile's rows 16 (w / 4) + [0, 16) and columns 16 (w % 4) + [0, 16): per 16
// values of K two m16n8k16 MMAs (four with the gate) into f32 accumulators, so an output is a
// chain of 16-term tensor-core dot products in k order, whatever rows share its tile.
template <class T, int kMode>
__global__ void moe_group_gemm_mma(MoeTables w, const T* in, MoeSortBufs b, T* outp) {
  constexpr int kMats = kMode == kGateUp ? 2 : 1;  // up or down, then the gate
  __shared__ __align__(16) T as[kMoeTileRows][kMmaLd];
  __shared__ __align__(16) T bs[kMats][kTileN][kMmaLd];
  griddep_wait();
  griddep_launch();
  GroupTile<T, kMode> g;
  if (!group_tile(w, b, g)) return;
  const int n0 = blockIdx.y * kTileN;
  const int cr = threadIdx.x / 4, ck = threadIdx.x % 4 * 8;  // this thread's chunk
  const bool stage_a = cr < kMoeTileRows;
  const T* arow = stage_a && cr < g.rows ? in + int64_t(g.src(b, cr)) * g.K : nullptr;
  const T* brow[kMats];
  brow[0] = n0 + cr < g.N ? g.w0 + int64_t(n0 + cr) * g.ld : nullptr;
  if constexpr (kMats == 2) brow[1] = n0 + cr < g.N ? g.w1 + int64_t(n0 + cr) * g.ld : nullptr;
  const uintptr_t bases = reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(g.w0) |
                          reinterpret_cast<uintptr_t>(g.w1);  // w1 null but in kGateUp
  const bool vec = g.K % 8 == 0 && g.ld % 8 == 0 && bases % 16 == 0;
  uint4 ac, bc[kMats];
  auto load = [&](int k0) {
    ac = load_chunk(arow, k0 + ck, g.K, vec);
#pragma unroll
    for (int m = 0; m < kMats; ++m) bc[m] = load_chunk(brow[m], k0 + ck, g.K, vec);
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
  const int wr = warp / 4 * 16, wc = warp % 4 * 16;
  float acc[kMats][2][4] = {};  // [up or down, gate][n8 block][fragment element]
  load(0);
  for (int k0 = 0; k0 < g.K; k0 += kTileK) {
    if (stage_a) *reinterpret_cast<uint4*>(&as[cr][ck]) = ac;
#pragma unroll
    for (int m = 0; m < kMats; ++m) *reinterpret_cast<uint4*>(&bs[m][cr][ck]) = bc[m];
    __syncthreads();
    if (k0 + kTileK < g.K) load(k0 + kTileK);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      const int k = kk + 2 * t;
      const uint32_t a[4] = {pair_at(&as[wr + gr][k]), pair_at(&as[wr + gr + 8][k]),
                             pair_at(&as[wr + gr][k + 8]), pair_at(&as[wr + gr + 8][k + 8])};
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
          const T* bn = bs[m][wc + 8 * j + gr];  // B[k][n] = W[n][k]: a pair of W's row
          mma_16816<T>(acc[m][j], a, pair_at(bn + k), pair_at(bn + k + 8));
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // D[gr + 8 (i / 2)][2t + i % 2] of n8 block j
      const int r = wr + gr + 8 * (i / 2), n = n0 + wc + 8 * j + 2 * t + i % 2;
      if (r < g.rows && n < g.N)
        outp[int64_t(g.row0 + r) * g.N + n] =
            group_out<T, kMode>(acc[0][j][i], acc[kMats - 1][j][i]);
    }
}

// One grouped GEMM: on tensor cores for bf16/f16 when `mma`, else on CUDA cores.
template <class T, int kMode>
void launch_group_gemm(bool mma, dim3 grid, cudaStream_t s, const MoeTables& w, const T* in,
                       const MoeSortBufs& sb, T* out) {
  if constexpr (!std::is_same_v<T, float>)
    if (mma) {
      launch_k(moe_group_gemm_mma<T, kMode>, grid, dim3(kGemmThreads), 0, s, w, in, sb, out);
      return;
    }
  launch_k(moe_group_gemm<T, kMode>, grid, dim3(kGemmThreads), 0, s, w, in, sb, out);
}

// out[t, d] = sum over t's slots in ascending expert id of weight * y[its sorted row, d].
template <class T>
__global__ void moe_combine_kernel(const T* y, const int* ids, const float* weights,
                                   const int* row_of, int k, int D, T* out) {
  __shared__ int order[kMoeMaxTopK];
  griddep_wait();
  griddep_launch();
  const int t = blockIdx.x;
  const int* tok_ids = ids + int64_t(t) * k;
  if (threadIdx.x < k) {
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += tok_ids[j] < tok_ids[threadIdx.x];
    order[rank] = threadIdx.x;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < k; ++r) {
      const int slot = order[r];
      const int64_t row = row_of[int64_t(t) * k + slot];
      acc = fmaf(weights[int64_t(t) * k + slot], to_f(y[row * D + d]), acc);
    }
    out[int64_t(t) * D + d] = from_f<T>(acc);
  }
}

template <class T>
__global__ void sigmoid_gate_kernel(T* y, const T* g, int T_, int D) {
  griddep_wait();
  griddep_launch();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(T_) * D;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = to_f(g[i / D]);
    y[i] = from_f<T>(to_f(y[i]) * (1.0f / (1.0f + expf(-gv))));
  }
}

// Down rows per block for rows of F values: 4 for rows of up to 1,024 (H200, same call,
// bench -p 512 -n 128: qwen3-30b-a3b, F = 768, 317.3 -> 330.2 tok/s; granite-4.0-h-tiny,
// F = 512, 397.9 -> 404.8), 1 for longer rows (nemotron-3-nano-30b-a3b, F = 1856: 294.7 with
// 1, 291.0 with 4).
int down_rows(int F) { return F <= 1024 ? 4 : 1; }

}  // namespace

void launch_moe_route(DType ct, const MoeRouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  const dim3 block((a.E + 31) / 32 * 32);  // a thread per expert
  ARB_DISPATCH_CTYPE(ct, T, launch_decode_k(moe_route_kernel<T>, dim3(a.T), block, 0, s, a));
  ARB_LAUNCHED("moe_route_kernel", s);
}

void launch_moe_decode(DType ct, const MoeTables& w, const void* x, const int* ids,
                       const float* weights, void* act, void* out, const MoeResidualArgs& res,
                       cudaStream_t s) {
  const dim3 block(32 * kDecodeWarps);
  const dim3 gu((w.F + kDecodeWarps - 1) / kDecodeWarps, w.k);
  const int R = down_rows(w.F);
  const dim3 dn((w.D + R - 1) / R);
  ARB_DISPATCH_CTYPE(ct, T, {
    if (w.relu2)
      launch_decode_k(moe_gateup_gemv<T, true>, gu, block, 0, s, w, static_cast<const T*>(x),
                      ids, static_cast<T*>(act));
    else
      launch_decode_k(moe_gateup_gemv<T, false>, gu, block, 0, s, w, static_cast<const T*>(x),
                      ids, static_cast<T*>(act));
    ARB_LAUNCHED("moe_gateup_gemv", s);
    if (R == 4)
      launch_decode_k(moe_down_gemv<T, 4>, dn, dim3(32 * w.k), 0, s, w,
                      static_cast<const T*>(act), ids, weights, static_cast<T*>(out), res);
    else
      launch_decode_k(moe_down_gemv<T, 1>, dn, dim3(32 * w.k), 0, s, w,
                      static_cast<const T*>(act), ids, weights, static_cast<T*>(out), res);
  });
  ARB_LAUNCHED("moe_down_gemv", s);
}

void launch_moe_prefill(DType ct, const MoeTables& w, const void* x, int T_, const int* ids,
                        const float* weights, const MoeSortBufs& sb, void* act, void* y,
                        void* out, bool mma, cudaStream_t s) {
  if (T_ == 0) return;
  const int n = T_ * w.k;
  launch_k(moe_sort_kernel, dim3(1), dim3(32 * kSortWarps), 0, s, ids, n, w.k, w.E, sb);
  ARB_LAUNCHED("moe_sort_kernel", s);
  // Tiles of all groups together: sum of ceil(count_e / rows) <= n / rows + min(E, n).
  const int max_tiles = (n + kMoeTileRows - 1) / kMoeTileRows + (w.E < n ? w.E : n);
  const dim3 g_in(max_tiles, (w.F + kTileN - 1) / kTileN), g_dn(max_tiles, (w.D + kTileN - 1) /
                                                                           kTileN);
  ARB_DISPATCH_CTYPE(ct, T, {
    const T* xp = static_cast<const T*>(x);
    if (w.relu2) launch_group_gemm<T, kUpRelu2>(mma, g_in, s, w, xp, sb, static_cast<T*>(act));
    else launch_group_gemm<T, kGateUp>(mma, g_in, s, w, xp, sb, static_cast<T*>(act));
    ARB_LAUNCHED("moe_group_gemm (gate/up)", s);
    launch_group_gemm<T, kDown>(mma, g_dn, s, w, static_cast<const T*>(act), sb,
                                static_cast<T*>(y));
    ARB_LAUNCHED("moe_group_gemm (down)", s);
    launch_k(moe_combine_kernel<T>, dim3(T_), dim3(256), 0, s, static_cast<const T*>(y), ids,
             weights, static_cast<const int*>(sb.row_of), w.k, w.D, static_cast<T*>(out));
  });
  ARB_LAUNCHED("moe_combine_kernel", s);
}

void launch_sigmoid_gate(DType ct, void* y, const void* g, int T_, int D, cudaStream_t s) {
  const int64_t n = int64_t(T_) * D;
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, 4096));
  ARB_DISPATCH_CTYPE(ct, T, launch_k(sigmoid_gate_kernel<T>, dim3(blocks), dim3(256), 0, s,
                                     static_cast<T*>(y), static_cast<const T*>(g), T_, D));
  ARB_LAUNCHED("sigmoid_gate_kernel", s);
}

}  // namespace arbiter::cuda
