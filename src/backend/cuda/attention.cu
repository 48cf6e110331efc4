// Causal GQA attention with an online softmax (flash-attention style), for prefill (T > 1)
// and the decode step (T == 1, key range split across blocks).
//
// A block takes 16 (query, head) rows that share one KV head (GQA: the query heads of a
// group read the same K/V tile once), walks the keys in tiles of 32 staged in shared memory
// as f32, and keeps per row the running max m, sum l and output o in registers (4 warps x 4
// rows; lanes own keys for the scores and head dimensions for P @ V). No [T, T] score matrix
// exists anywhere. Scores, exponentials and sums are f32; the output is rounded once.
// With n_splits > 1 each block covers one slice of the key range and writes (o, m, l) to a
// workspace; attn_combine merges the slices in split order (deterministic).
// The query position is read through PosRef, so a captured decode graph replays at any
// position; n_splits depends only on shapes and the cache size, never on the position.
// Prefill in bf16/f16 with Dh 64 or 128 runs on tensor cores instead (attn_tc_kernel below,
// mma.sync); attn_kernel keeps f32, other head sizes and ARBITER_CUDA_ATTN_MMA=0.
#include "backend/cuda/device_common.cuh"
#include "core/error.h"

namespace arbiter::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // (query, head) rows per block
constexpr int kTile = 32;                     // keys per shared-memory tile (one per lane)

size_t attn_smem_bytes(int Dh) {
  return sizeof(float) * (size_t(kRows) * Dh + 2 * size_t(kTile) * (Dh + 1));
}

/// Stages keys [k0, min(k0 + kTile, ke)) of one KV head into k_s / v_s as f32 (rows past ke
/// are zero). Each thread issues kBatch 16-byte loads of K and of V before it converts and
/// stores any of them, so a tile costs about one memory latency, not one per element.
template <class T>
__device__ __forceinline__ void load_tile(const T* kc, const T* vc, int k0, int ke, int kv_dim,
                                          int hk, int Dh, float* k_s, float* v_s) {
  constexpr int V = Vec16<T>::N, kBatch = 4, kThreads = kWarps * 32;
  const int ldk = Dh + 1;
  if (Dh % V == 0) {
    const int cpr = Dh / V, n = kTile * cpr;  // 16-byte chunks per row, per tile
    for (int base = 0; base < n; base += kThreads * kBatch) {
      uint4 kb[kBatch], vb[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = base + b * kThreads + int(threadIdx.x);
        const int j = c / cpr, d = (c % cpr) * V, key = k0 + j;
        if (c < n && key < ke) {
          const int64_t off = int64_t(key) * kv_dim + int64_t(hk) * Dh + d;
          kb[b] = __ldg(reinterpret_cast<const uint4*>(kc + off));
          vb[b] = __ldg(reinterpret_cast<const uint4*>(vc + off));
        } else {
          kb[b] = vb[b] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = base + b * kThreads + int(threadIdx.x);
        if (c >= n) continue;
        const int j = c / cpr, d = (c % cpr) * V;
        const T* ke_ = reinterpret_cast<const T*>(&kb[b]);
        const T* ve_ = reinterpret_cast<const T*>(&vb[b]);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          k_s[j * ldk + d + e] = to_f(ke_[e]);
          v_s[j * ldk + d + e] = to_f(ve_[e]);
        }
      }
    }
  } else {  // head size not a multiple of 16 bytes: element loads
    for (int idx = threadIdx.x; idx < kTile * Dh; idx += kThreads) {
      const int j = idx / Dh, d = idx % Dh, key = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (key < ke) {
        const int64_t off = int64_t(key) * kv_dim + int64_t(hk) * Dh + d;
        kv = to_f(kc[off]);
        vv = to_f(vc[off]);
      }
      k_s[j * ldk + d] = kv;
      v_s[j * ldk + d] = vv;
    }
  }
}

/// Stages the block's kRows query rows (zeros past the last row) into q_s [kRows][Dh] as f32,
/// with batched 16-byte loads like load_tile.
template <class T>
__device__ __forceinline__ void load_queries(const T* q, int row0, int rows_head, int group,
                                             int hk, int H, int Dh, float* q_s) {
  constexpr int V = Vec16<T>::N, kBatch = 4, kThreads = kWarps * 32;
  if (Dh % V == 0) {
    const int cpr = Dh / V, n = kRows * cpr;
    for (int base = 0; base < n; base += kThreads * kBatch) {
      uint4 qb[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = base + b * kThreads + int(threadIdx.x);
        const int r = c / cpr, d = (c % cpr) * V, row = row0 + r;
        if (c < n && row < rows_head) {
          const int t = row / group, h = hk * group + row % group;
          qb[b] = __ldg(reinterpret_cast<const uint4*>(q + (int64_t(t) * H + h) * Dh + d));
        } else {
          qb[b] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = base + b * kThreads + int(threadIdx.x);
        if (c >= n) continue;
        const int r = c / cpr, d = (c % cpr) * V;
        const T* e_ = reinterpret_cast<const T*>(&qb[b]);
#pragma unroll
        for (int e = 0; e < V; ++e) q_s[r * Dh + d + e] = to_f(e_[e]);
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * Dh; idx += kThreads) {
      const int r = idx / Dh, d = idx % Dh, row = row0 + r;
      float val = 0.f;
      if (row < rows_head) {
        const int t = row / group, h = hk * group + row % group;
        val = to_f(q[(int64_t(t) * H + h) * Dh + d]);
      }
      q_s[idx] = val;
    }
  }
}

template <class T, int DCH>
__global__ void __launch_bounds__(kWarps * 32) attn_kernel(AttnArgs a) {
  extern __shared__ float smem[];
  griddep_wait();
  griddep_launch();
  const int Dh = a.Dh, H = a.H, group = a.H / a.Hkv, kv_dim = a.Hkv * a.Dh, ldk = a.Dh + 1;
  const int hk = blockIdx.y, split = blockIdx.z;
  const int rows_head = a.T * group;  // rows of this KV head: row -> (t = row / group, g)
  const int row0 = blockIdx.x * kRows;
  const int pos0 = pos_of(a.pos);
  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  float* q_s = smem;                 // [kRows][Dh]
  float* k_s = q_s + kRows * Dh;     // [kTile][Dh + 1] (padded: lane-per-key reads)
  float* v_s = k_s + kTile * ldk;    // [kTile][Dh + 1]

  // Keys any row of this block can see: [lo, hi]; this split's slice: [ks, ke).
  const int last = min(row0 + kRows, rows_head) - 1;
  const int t_first = row0 / group, t_last = last / group;
  const int hi = pos0 + t_last;
  const int lo = a.window > 0 ? max(0, pos0 + t_first - a.window + 1) : 0;
  int chunk = (hi - lo + 1 + a.n_splits - 1) / a.n_splits;
  chunk = (chunk + kTile - 1) / kTile * kTile;
  const int ks = lo + split * chunk;
  const int ke = min(hi + 1, ks + chunk);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int qi[kRowsPerWarp], qlo[kRowsPerWarp], orow[kRowsPerWarp];
  bool live[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][DCH];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = row0 + warp * kRowsPerWarp + i;
    live[i] = row < rows_head;
    const int t = row / group, h = hk * group + row % group;
    qi[i] = pos0 + t;
    qlo[i] = a.window > 0 ? max(0, qi[i] - a.window + 1) : 0;
    orow[i] = t * H + h;
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DCH; ++c) o[i][c] = 0.f;
  }

  if (ks < ke) {  // block-uniform: empty slices only write (m = -inf, l = 0)
    load_queries<T>(q, row0, rows_head, group, hk, H, Dh, q_s);
    for (int k0 = ks; k0 < ke; k0 += kTile) {
      __syncthreads();  // the previous tile is consumed (and q_s is written, first time)
      load_tile<T>(kc, vc, k0, ke, kv_dim, hk, Dh, k_s, v_s);
      __syncthreads();

      // Scores: lane j owns key k0 + j, all rows of this warp at once.
      float s[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) s[i] = 0.f;
      const float* kr = k_s + lane * ldk;
      const float* qw = q_s + warp * kRowsPerWarp * Dh;
#pragma unroll 4
      for (int d = 0; d < Dh; ++d) {
        const float kv = kr[d];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) s[i] = fmaf(qw[i * Dh + d], kv, s[i]);
      }
      const int key = k0 + lane;
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const bool ok = live[i] && key < ke && key >= qlo[i] && key <= qi[i];
        const float sc = ok ? s[i] * a.scale : -INFINITY;
        const float mt = warp_max(sc);
        if (mt == -INFINITY) continue;  // warp-uniform: nothing visible in this tile
        const float mn = fmaxf(m[i], mt);
        const float corr = expf(m[i] - mn);  // 0 on the first visible tile (m = -inf)
        const float p = ok ? expf(sc - mn) : 0.f;
        l[i] = l[i] * corr + warp_sum(p);
#pragma unroll
        for (int c = 0; c < DCH; ++c) o[i][c] *= corr;
        for (int j = 0; j < kTile; ++j) {
          const float pj = __shfl_sync(0xffffffffu, p, j);
          if (pj == 0.f) continue;  // uniform across the warp
          const float* vr = v_s + j * ldk;
#pragma unroll
          for (int c = 0; c < DCH; ++c) {
            const int d = lane + 32 * c;
            if (d < Dh) o[i][c] = fmaf(pj, vr[d], o[i][c]);
          }
        }
        m[i] = mn;
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    if (a.n_splits == 1) {
      T* out = static_cast<T*>(a.out) + int64_t(orow[i]) * Dh;
#pragma unroll
      for (int c = 0; c < DCH; ++c) {
        const int d = lane + 32 * c;
        if (d < Dh) out[d] = from_f<T>(o[i][c] / l[i]);
      }
    } else {
      float* pr = a.part + (int64_t(orow[i]) * a.n_splits + split) * (Dh + 2);
#pragma unroll
      for (int c = 0; c < DCH; ++c) {
        const int d = lane + 32 * c;
        if (d < Dh) pr[d] = o[i][c];
      }
      if (lane == 0) {
        pr[Dh] = m[i];
        pr[Dh + 1] = l[i];
      }
    }
  }
}

/// out[row, :] = sum_s o_s * e^(m_s - M) / sum_s l_s * e^(m_s - M), splits in order.
template <class T>
__global__ void attn_combine_kernel(const float* part, int rows, int n_splits, int Dh, T* out) {
  griddep_wait();
  griddep_launch();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int stride = Dh + 2;
  const float* pr = part + int64_t(row) * n_splits * stride;
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, pr[s * stride + Dh]);
  float L = 0.f;
  for (int s = 0; s < n_splits; ++s) {
    const float ms = pr[s * stride + Dh];
    if (ms != -INFINITY) L += pr[s * stride + Dh + 1] * expf(ms - M);
  }
  for (int d = lane; d < Dh; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < n_splits; ++s) {
      const float ms = pr[s * stride + Dh];
      if (ms != -INFINITY) acc += pr[s * stride + d] * expf(ms - M);
    }
    out[int64_t(row) * Dh + d] = from_f<T>(acc / L);
  }
}

template <class T, int DCH>
void attn_launch(const AttnArgs& a, cudaStream_t s) {
  const int group = a.H / a.Hkv;
  dim3 grid(unsigned((a.T * group + kRows - 1) / kRows), unsigned(a.Hkv), unsigned(a.n_splits));
  launch_k(attn_kernel<T, DCH>, grid, dim3(kWarps * 32), attn_smem_bytes(a.Dh), s, a);
  ARB_LAUNCHED("attn_kernel", s);
  if (a.n_splits > 1) {
    const int rows = a.T * a.H, per_block = 8;
    launch_k(attn_combine_kernel<T>, dim3((rows + per_block - 1) / per_block), dim3(per_block * 32),
             0, s, static_cast<const float*>(a.part), rows, a.n_splits, a.Dh, static_cast<T*>(a.out));
    ARB_LAUNCHED("attn_combine_kernel", s);
  }
}

template <class T>
void attn_dispatch(const AttnArgs& a, cudaStream_t s) {
  if (a.Dh <= 32) attn_launch<T, 1>(a, s);
  else if (a.Dh <= 64) attn_launch<T, 2>(a, s);
  else if (a.Dh <= 128) attn_launch<T, 4>(a, s);
  else attn_launch<T, 8>(a, s);
}

template <class T>
void attn_init_type() {
  ARB_CUDA(cudaFuncSetAttribute(attn_kernel<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_smem_bytes(32))));
  ARB_CUDA(cudaFuncSetAttribute(attn_kernel<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_smem_bytes(64))));
  ARB_CUDA(cudaFuncSetAttribute(attn_kernel<T, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_smem_bytes(128))));
  ARB_CUDA(cudaFuncSetAttribute(attn_kernel<T, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_smem_bytes(256))));
}


// --- decode (T == 1) ------------------------------------------------------------------------
// One block per (heads_per_block query heads of one KV head, key split), kDecWarps warps: a
// column of blocks per query head by default (the host's attn_heads_per_block), so that the
// heads of a group run on separate SMs. Each such block reads its KV head's keys and values
// itself (from L2); every head's arithmetic is the same whichever block takes it, as long as
// KPW is. H200, bf16 decode, synth models, one call each (docs/evidence/h200/decode-variants-
// s13.txt): qwen3-0.6b (group 2) 1,902-1,903 tok/s against 1,824-1,826 with a block per KV
// head; llama-3.2-1b (group 4) 1,066 against 1,021; qwen2.5-0.5b (group 7) 1,564 against
// 1,177, and at --depth 1024 1,153 against 408.
// A warp takes KPW keys at a time, one per group of 32 / KPW lanes (each lane holds
// E = Dh KPW / 32 head elements), so a block covers kDecWarps x KPW keys per iteration, with
// the next two iterations' keys and values already in flight (one when a lane's slices exceed
// 32 bytes: more would spill); each lane group keeps an online softmax per query head of the
// block. KPW is 4, 2 or 1 for blocks of <= 2, <= 4, <= 8 query heads (q and the output stay
// at heads x E <= Dh / 4 values per lane). The lane groups of a warp merge by a
// butterfly of shuffles (every lane gets the same sums: each step adds two values, in either
// order the same), the warps in warp order through shared memory.
//
// Splits: the host sizes the grid from the cache (one graph serves every position); the
// blocks use the first S = min(gridDim.y, ceil(keys / a.split_keys)) splits of the current
// key range and the others exit at once, so short contexts pay no split merge. With S > 1
// each block writes its (o, m, l) partial, and the last block of a column to finish (an
// atomic ticket, reset by that block) merges the splits in split order: one kernel,
// deterministic.
//
// Before griddep_wait a block reads what no kernel of the step writes, so that it overlaps the
// q/k/v GEMV: the position, the first two iterations' keys and values of earlier positions
// (kQk; their rows were written by earlier steps), the q/k norm weights and the RoPE row.
// The next kernel is let in (launch_dependents) after the wait, or with kQk once the q and k
// heads are normalised and rotated.
//
// kQk (the fused qk_rope_attention): the kernel also does qk_rope_store's work for its KV
// head, so that op needs no launch of its own. Every block normalises and rotates its raw q
// heads and k head hk (norm_rope_head, the arithmetic of qk_rope_store_kernel) into shared
// memory and uses those values for q. The new position's key and value come from there and
// from v (the exact values the cache row gets), so the first column's block whose key range
// holds the position writes that row without reading it back. The roped q and k go back in
// place, as qk_rope_store leaves them: each column's last block writes its q heads (every
// block of the column has read them by then), and the first column's last block writes k
// once every block of the KV head has counted itself as past its raw k read (a counter per
// KV head; with one column per KV head the ticket says as much).
constexpr int kDecWarps = 8;
constexpr int kDecMaxGroup = 8;
static_assert(kMaxHeadDim <= kDecWarps * 32, "kQk: an element of a head per thread");

/// E consecutive elements of T (the largest vector loads their alignment allows; L2 only:
/// cache rows are written by other kernels of the step).
template <class T, int E>
struct alignas(16) Slice {
  T v[E];
};
template <class T, int E>
__device__ __forceinline__ void load_slice(const T* p, Slice<T, E>& s) {
  constexpr int B = E * int(sizeof(T));
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int i = 0; i < B / 16; ++i)
      reinterpret_cast<uint4*>(s.v)[i] = __ldcg(reinterpret_cast<const uint4*>(p) + i);
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int i = 0; i < B / 8; ++i)
      reinterpret_cast<uint2*>(s.v)[i] = __ldcg(reinterpret_cast<const uint2*>(p) + i);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) s.v[e] = p[e];
  }
}
template <class T, int E>
__device__ __forceinline__ void zero_slice(Slice<T, E>& s) {
#pragma unroll
  for (int e = 0; e < E; ++e) s.v[e] = from_f<T>(0.f);
}

template <class T, int E, int KPW, bool kQk, bool kTap = false>
__global__ void __launch_bounds__(kDecWarps * 32)
    attn_decode_kernel(AttnArgs a, unsigned* counters, QkRopeArgs qk) {
  static_assert(kQk || !kTap, "stage taps inside the fused q/k norm + RoPE only");
  constexpr int LPK = 32 / KPW;            // lanes per key
  constexpr int KPB = kDecWarps * KPW;     // keys per block iteration
  constexpr int MAXG = kDecMaxGroup / KPW;  // query heads per block the lanes hold
  // [kDecWarps][hb][Dh], then kQk: [hb + 1][Dh] roped q and k, [2][Dh] the q and k norm
  // weights, [Dh / 2] (cos, sin) of the position
  extern __shared__ float dec_o[];
  __shared__ float dec_m[kDecWarps][kDecMaxGroup], dec_l[kDecWarps][kDecMaxGroup];
  __shared__ int dec_last;
  const int hb = a.heads_per_block, columns = a.H / a.Hkv / hb;  // columns per KV head
  const int hk = blockIdx.x / columns, column = blockIdx.x % columns, split = blockIdx.y;
  const int hq0 = blockIdx.x * hb;  // the block's first query head
  const int Dh = E * LPK, kv_dim = a.Hkv * Dh;
  unsigned* k_readers = counters + kMaxDecodeHeads + hk;  // blocks past their raw k read
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / LPK, dl = lane % LPK;  // key of the warp's KPW, slice of the head
  // Before griddep_wait, what no kernel of this step writes: the position (uploaded before
  // the step), the cache rows of earlier positions (written by earlier steps: complete before
  // the kernel this one follows started), the q/k norm weights and the RoPE row.
  const int pos = pos_of(a.pos);
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int S = min(int(gridDim.y), (pos - lo + a.split_keys) / a.split_keys);
  if (split >= S) return;
  const int chunk = (pos - lo + 1 + S - 1) / S;
  const int ks = lo + split * chunk, ke = min(pos + 1, ks + chunk);
  // The first iterations' keys and values, two deep when a lane's slices are at most 32 bytes
  // each (else one: Dh 256, f32 at Dh 128 with 4 keys per warp, would spill). kQk: before the
  // wait (the new row, at pos, is taken from qks); otherwise the kernel before this one
  // stored the new row: after the wait.
  constexpr bool kDeep = E * sizeof(T) <= 32;
  const T* kc = static_cast<const T*>(a.k_cache) + int64_t(hk) * Dh + dl * E;
  const T* vc = static_cast<const T*>(a.v_cache) + int64_t(hk) * Dh + dl * E;
  const int koff = warp * KPW + sub;
  const int kend = kQk ? min(ke, pos) : ke;  // rows read from the cache
  auto load_kv = [&](int key, Slice<T, E>& k, Slice<T, E>& v) {  // zeros past the range
    zero_slice(k);
    zero_slice(v);
    if (key < kend) {
      load_slice(kc + int64_t(key) * kv_dim, k);
      load_slice(vc + int64_t(key) * kv_dim, v);
    }
  };
  Slice<T, E> kr, vr, kn, vn;
  auto load_first = [&] {
    load_kv(ks + koff, kr, vr);
    if (kDeep) load_kv(ks + koff + KPB, kn, vn);
  };
  if (kQk) load_first();
  const T* qp = static_cast<const T*>(a.q);
  float* qks = dec_o + kDecWarps * hb * Dh;  // kQk: the block's roped q heads, then k
  float* nws = qks + (hb + 1) * Dh;          // kQk: q norm weights, k norm weights
  float2* css = reinterpret_cast<float2*>(nws + 2 * Dh);  // kQk: the position's RoPE row
  float* vns = reinterpret_cast<float*>(css + Dh / 2);     // kQk: the new row's value
  if (kQk) {
    const float2* cs = qk.cs + int64_t(pos) * (Dh / 2);
    for (int i = threadIdx.x; i < Dh / 2; i += blockDim.x) css[i] = cs[i];
    for (int i = threadIdx.x; i < Dh; i += blockDim.x) {
      if (qk.qn) nws[i] = qk.qn[i];
      if (qk.kn) nws[Dh + i] = qk.kn[i];
    }
  }
  griddep_wait();
  if (!kQk) {
    griddep_launch();
    load_first();
  } else {
    constexpr int NCH = (E * LPK + 32 * Vec16<T>::N - 1) / (32 * Vec16<T>::N);
    // The new row's value (an element per thread: Dh <= blockDim), loaded at once with the
    // raw q and k below rather than in the key loop, where the lanes of the new key waited for
    // it (gemv.cu gives the measurement, with the add form's early residual read).
    const bool has_v = int(threadIdx.x) < Dh;
    const T vnew = has_v ? static_cast<const T*>(qk.v)[int64_t(hk) * Dh + threadIdx.x]
                         : from_f<T>(0.f);
    __syncthreads();  // nws, css
    for (int h = warp; h <= hb; h += kDecWarps) {
      const bool is_k = h == hb;
      const T* x = is_k ? static_cast<const T*>(qk.k) + int64_t(hk) * Dh
                        : qp + int64_t(hq0 + h) * Dh;
      const float* nw = is_k ? (qk.kn ? nws + Dh : nullptr) : (qk.qn ? nws : nullptr);
      HeadTaps ht;  // every block of a column computes its q heads, every column the k head
      if constexpr (kTap) {
        ht.norm = is_k ? &qk.k_norm : &qk.q_norm;
        ht.rope = is_k ? &qk.k_rope : &qk.q_rope;
        ht.base = int64_t(is_k ? hk : hq0 + h) * Dh;
        ht.writer = split == 0 && (!is_k || column == 0);
      }
      norm_rope_head<T, NCH, kTap>(x, nw, qk.eps, Dh, css, qk.adjacent, qks + h * Dh, lane, ht);
    }
    if (has_v) vns[threadIdx.x] = to_f(vnew);
    __syncthreads();
    if (columns > 1 && threadIdx.x == 0) atomicAdd(k_readers, 1u);  // raw q and k read
    // The o GEMV (and through its early launch the gate/up GEMV) starts loading its weights
    // only now, after the raw q and k reads above (with which, started at the wait, its loads
    // probably compete). H200, synth qwen3-0.6b bf16 decode, one call (with the q/k/v GEMV at
    // 88 registers, gemv.cu): 1,750-1,755 against 1,742 tok/s; after the key loop 1,717-1,722
    // (docs/evidence/h200/decode-variants-s11.txt).
    griddep_launch();
    if (column == 0 && ks <= pos && pos < ke && has_v) {  // the new row is in range: store it
      const int64_t row = int64_t(pos) * kv_dim + int64_t(hk) * Dh + threadIdx.x;
      static_cast<T*>(qk.k_cache)[row] = from_f<T>(qks[hb * Dh + threadIdx.x]);
      static_cast<T*>(qk.v_cache)[row] = vnew;
    }
  }
  float q[MAXG][E], o[MAXG][E], m[MAXG], l[MAXG];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      o[g][e] = 0.f;
      q[g][e] = 0.f;
    }
    if (g < hb) {
      if (kQk) {
#pragma unroll
        for (int e = 0; e < E; ++e) q[g][e] = qks[g * Dh + dl * E + e];
      } else {
        Slice<T, E> qs;
        load_slice(qp + int64_t(hq0 + g) * Dh + dl * E, qs);
#pragma unroll
        for (int e = 0; e < E; ++e) q[g][e] = to_f(qs.v[e]);
      }
    }
  }
  for (int base = ks; base < ke; base += KPB) {  // uniform over the block
    const int key = base + koff;
    Slice<T, E> kn2, vn2;  // the iteration after the next (kDeep), else the next
    load_kv(key + (kDeep ? 2 : 1) * KPB, kDeep ? kn2 : kn, kDeep ? vn2 : vn);
    float kf[E], vf[E];
    if (kQk && key == pos) {  // the new row, as stored above
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kf[e] = qks[hb * Dh + dl * E + e];
        vf[e] = vns[dl * E + e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kf[e] = to_f(kr.v[e]);
        vf[e] = to_f(vr.v[e]);
      }
    }
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      if (g >= hb) break;
      float sc = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) sc = fmaf(q[g][e], kf[e], sc);
#pragma unroll
      for (int off = LPK / 2; off > 0; off >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, off);
      if (key < ke) {
        sc *= a.scale;
        const float mn = fmaxf(m[g], sc);
        const float corr = expf(m[g] - mn);  // 0 for the first key (m = -inf)
        const float p = expf(sc - mn);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < E; ++e) o[g][e] = fmaf(p, vf[e], o[g][e] * corr);
        m[g] = mn;
      }
    }
    kr = kn;
    vr = vn;
    if (kDeep) {
      kn = kn2;
      vn = vn2;
    }
  }
  // kQk, the first of several columns: the count of blocks past their raw k read, loaded now
  // so that its latency passes during the merges (the other columns' blocks counted
  // themselves when this one did, before the keys): the k write-back below rarely waits.
  unsigned k_seen = 0;
  if (kQk && column == 0 && columns > 1 && threadIdx.x == 0)
    k_seen = *reinterpret_cast<volatile unsigned*>(k_readers);
  // Merge the warp's lane groups (butterfly), then the warps (in warp order).
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g >= hb) break;
    float M = m[g];
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    const float c = m[g] == -INFINITY ? 0.f : expf(m[g] - M);
    float L = l[g] * c;
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      float O = o[g][e] * c;
#pragma unroll
      for (int off = LPK; off < 32; off <<= 1) O += __shfl_xor_sync(0xffffffffu, O, off);
      if (sub == 0) dec_o[(warp * hb + g) * Dh + dl * E + e] = O;
    }
    if (lane == 0) {
      dec_m[warp][g] = M;
      dec_l[warp][g] = L;
    }
  }
  __syncthreads();
  // Then the warps, one thread per (head, element): each weighs the warps' partials in warp
  // order (the same sums as before). One warp per head looping over the elements, here and in
  // the split merge below, left most of the block idle at the end of the chain (H200, synth
  // qwen3-0.6b bf16 decode, one call: 1,670-1,671 against 1,652 tok/s; -p 2048: 1,662-1,687
  // against 1,643-1,649).
  const int stride = Dh + 2;
  for (int t = threadIdx.x; t < hb * Dh; t += blockDim.x) {
    const int g = t / Dh, d = t % Dh, h = hq0 + g;
    float M = -INFINITY;
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, dec_m[w][g]);
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      if (dec_m[w][g] == -INFINITY) continue;
      const float cw = expf(dec_m[w][g] - M);  // warp w's weight e^(m_w - M)
      L += dec_l[w][g] * cw;
      O = fmaf(dec_o[(w * hb + g) * Dh + d], cw, O);
    }
    if (S == 1) {
      static_cast<T*>(a.out)[int64_t(h) * Dh + d] = from_f<T>(O / L);
    } else {
      float* pr = a.part + (int64_t(h) * S + split) * stride;
      pr[d] = O;
      if (d == 0) {
        pr[Dh] = M;
        pr[Dh + 1] = L;
      }
    }
  }
  // Writes the roped q and k back in place (kQk; by the column's last block, k by the first
  // column's once every block of the KV head has read the raw k: S blocks per column).
  auto write_back_qk = [&] {
    if (!kQk) return;
    T* qo = static_cast<T*>(qk.q) + int64_t(hq0) * Dh;
    T* ko = static_cast<T*>(qk.k) + int64_t(hk) * Dh;
    const int n = column == 0 ? hb + 1 : hb;
    if (column == 0 && columns > 1) {
      if (threadIdx.x == 0) {
        while (k_seen < unsigned(columns * S))
          k_seen = *reinterpret_cast<volatile unsigned*>(k_readers);
        *k_readers = 0u;  // ready for the next launch
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < n * Dh; i += blockDim.x) {
      const T y = from_f<T>(qks[i]);
      if (i < hb * Dh) qo[i] = y;
      else ko[i - hb * Dh] = y;
    }
  };
  if (S == 1) {
    write_back_qk();  // every warp read its q from qks before the barrier above
    return;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) dec_last = atomicAdd(&counters[blockIdx.x], 1u) == unsigned(S - 1);
  __syncthreads();
  if (!dec_last) return;
  __threadfence();
  write_back_qk();
  // Last block of this column: merge the splits in split order. Warp g reads head g's (m, l)
  // (lane s split s's; n_splits <= 32) and leaves the splits' weights e^(m_s - M) and the
  // sum L in shared memory; then one thread per (head, element) adds the splits' partial
  // outputs, all loaded independently of each other.
  __shared__ float dec_ws[kDecMaxGroup][32], dec_sum[kDecMaxGroup];
  for (int g = warp; g < hb; g += kDecWarps) {
    const float* pr = a.part + int64_t(hq0 + g) * S * stride;
    const float ms = lane < S ? __ldcg(pr + lane * stride + Dh) : -INFINITY;
    const float ls = lane < S ? __ldcg(pr + lane * stride + Dh + 1) : 0.f;
    const float M = warp_max(ms);
    const float ws = ms == -INFINITY ? 0.f : expf(ms - M);
    float L = 0.f;
    for (int s2 = 0; s2 < S; ++s2)
      L = fmaf(__shfl_sync(0xffffffffu, ls, s2), __shfl_sync(0xffffffffu, ws, s2), L);
    dec_ws[g][lane] = ws;
    if (lane == 0) dec_sum[g] = L;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < hb * Dh; t += blockDim.x) {
    const int g = t / Dh, d = t % Dh, h = hq0 + g;
    const float* pr = a.part + int64_t(h) * S * stride;
    float acc = 0.f;
#pragma unroll 8
    for (int s2 = 0; s2 < S; ++s2) acc = fmaf(__ldcg(pr + s2 * stride + d), dec_ws[g][s2], acc);
    static_cast<T*>(a.out)[int64_t(h) * Dh + d] = from_f<T>(acc / dec_sum[g]);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (graph replays too)
}

/// Dynamic shared memory of the decode kernel: [kDecWarps][group][Dh] partial outputs; kQk:
/// roped q and k, the q/k norm weights, the RoPE row, the new row's value.
size_t attn_decode_smem_bytes(int group, int Dh, bool qk) {
  return sizeof(float) * (kDecWarps * size_t(group) + (qk ? group + 1 + 2 + 1 + 1 : 0)) * Dh;
}

template <class T, int KPW, bool kQk, bool kTap>
void attn_decode_launch(const AttnArgs& a, unsigned* counters, const QkRopeArgs& qk, dim3 grid,
                        size_t smem, cudaStream_t s) {
  const dim3 block(kDecWarps * 32);
  switch (a.Dh / 32) {
    case 1: launch_decode_k(attn_decode_kernel<T, KPW, KPW, kQk, kTap>, grid, block, smem, s, a, counters, qk); break;
    case 2: launch_decode_k(attn_decode_kernel<T, 2 * KPW, KPW, kQk, kTap>, grid, block, smem, s, a, counters, qk); break;
    case 4: launch_decode_k(attn_decode_kernel<T, 4 * KPW, KPW, kQk, kTap>, grid, block, smem, s, a, counters, qk); break;
    default: launch_decode_k(attn_decode_kernel<T, 8 * KPW, KPW, kQk, kTap>, grid, block, smem, s, a, counters, qk); break;
  }
}

/// The shared-memory limit of the decode kernels of one KPW where their largest group (8 / KPW
/// query heads per KV head) needs more than the default 48 KB (groups of 5+ at Dh 256).
template <class T, int KPW, bool kQk, bool kTap = false>
void attn_decode_init() {
  auto allow = [](auto kernel, int Dh) {
    const size_t smem = attn_decode_smem_bytes(kDecMaxGroup / KPW, Dh, kQk);
    if (smem > 48 * 1024)
      ARB_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem)));
  };
  allow(attn_decode_kernel<T, KPW, KPW, kQk, kTap>, 32);
  allow(attn_decode_kernel<T, 2 * KPW, KPW, kQk, kTap>, 64);
  allow(attn_decode_kernel<T, 4 * KPW, KPW, kQk, kTap>, 128);
  allow(attn_decode_kernel<T, 8 * KPW, KPW, kQk, kTap>, 256);
}

template <class T, bool kQk, bool kTap>
void attn_decode_group(const AttnArgs& a, unsigned* counters, const QkRopeArgs& qk,
                       cudaStream_t s) {
  const int group = a.H / a.Hkv, hb = a.heads_per_block;
  ARB_CHECK(hb >= 1 && group % hb == 0,
            "[cuda] attention_decode: %d heads per block of a group of %d", hb, group);
  // A block of the first column may wait for the other columns' blocks (kQk's k write-back):
  // at most one per KV head waits, far fewer than the device has block slots.
  ARB_CHECK(hb == group || a.Hkv <= kMaxSplitColumnsKvHeads,
            "[cuda] attention_decode: %d KV heads in columns of %d heads", a.Hkv, hb);
  const dim3 grid(unsigned(a.H / hb), unsigned(a.n_splits));
  const size_t smem = attn_decode_smem_bytes(hb, a.Dh, kQk);
  if (hb <= 2) attn_decode_launch<T, 4, kQk, kTap>(a, counters, qk, grid, smem, s);
  else if (hb <= 4) attn_decode_launch<T, 2, kQk, kTap>(a, counters, qk, grid, smem, s);
  else attn_decode_launch<T, 1, kQk, kTap>(a, counters, qk, grid, smem, s);
  ARB_LAUNCHED("attn_decode_kernel", s);
}

template <class T>
void attn_decode_init_type() {
  attn_decode_init<T, 4, false>();
  attn_decode_init<T, 4, true>();
  attn_decode_init<T, 4, true, true>();
  attn_decode_init<T, 2, false>();
  attn_decode_init<T, 2, true>();
  attn_decode_init<T, 2, true, true>();
  attn_decode_init<T, 1, false>();
  attn_decode_init<T, 1, true>();
  attn_decode_init<T, 1, true, true>();
}

template <class T>
void attn_decode_dispatch(const AttnArgs& a, unsigned* counters, const QkRopeArgs* qk,
                          cudaStream_t s) {
  if (qk && qk->tapped) attn_decode_group<T, true, true>(a, counters, *qk, s);
  else if (qk) attn_decode_group<T, true, false>(a, counters, *qk, s);
  else attn_decode_group<T, false, false>(a, counters, QkRopeArgs{}, s);
}

// --- prefill on tensor cores (T > 1, bf16/f16, Dh 64 or 128) ---------------------------------
// FlashAttention-2's schedule with mma.sync m16n8k16 (f32 accumulation): a block takes 64
// (query, head) rows of one KV head (4 warps x 16 rows, the GQA mapping of attn_kernel),
// walks the keys in tiles of 64 staged in shared memory by cp.async (two buffers: the next
// tile loads while this one is used), S = Q K^T and O += P V on tensor cores, online softmax
// in f32 per row (the quad of lanes owning a row reduces with a fixed shuffle order). P is
// rounded to the compute type for the P V product and the row sum l is taken over those
// rounded values, so the weights that multiply V are exactly the ones that normalise. Keys
// outside [lo, ke) are zero-filled (never read), so no NaN of an unwritten cache row can reach
// a product. Fixed order everywhere: deterministic.
constexpr int kTcWarps = 4;
constexpr int kTcRows = kTcWarps * 16;  // (query, head) rows per block
constexpr int kTcKeys = 64;             // keys per tile

size_t attn_tc_smem_bytes(int Dh) { return size_t(2) * 2 * kTcKeys * (Dh + 8) * 2; }

template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

/// Two values rounded to T, packed low element first (the mma operand layout).
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  const uint16_t l = *reinterpret_cast<const uint16_t*>(&lo), h = *reinterpret_cast<const uint16_t*>(&hi);
  return uint32_t(l) | (uint32_t(h) << 16);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
/// 16-byte global -> shared copy; zero-fills when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <class T, int DH>
__global__ void __launch_bounds__(kTcWarps * 32) attn_tc_kernel(AttnArgs a) {
  extern __shared__ __align__(16) unsigned char tc_smem[];
  constexpr int LD = DH + 8;       // padded row: ldmatrix rows fall in distinct banks
  constexpr int NT = DH / 8;       // output n-tiles of 8 head elements
  constexpr int KS = DH / 16;      // k-steps of S = Q K^T
  constexpr int SN = kTcKeys / 8;  // score n-tiles per key tile
  constexpr int CPR = DH / 8;      // 16-byte chunks per K/V row
  T* sm = reinterpret_cast<T*>(tc_smem);  // [buffer][K, V][kTcKeys][LD]
  griddep_wait();
  griddep_launch();
  const int H = a.H, group = a.H / a.Hkv, kv_dim = a.Hkv * DH;
  const int hk = blockIdx.y;
  const int rows_head = a.T * group;
  const int row0 = blockIdx.x * kTcRows;
  const int pos0 = pos_of(a.pos);
  const int last = min(row0 + kTcRows, rows_head) - 1;
  const int t_first = row0 / group, t_last = last / group;
  const int ke = pos0 + t_last + 1;
  const int lo = a.window > 0 ? max(0, pos0 + t_first - a.window + 1) : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);

  // This thread's two rows: r = 0 -> lane / 4, r = 1 -> lane / 4 + 8 of the warp's 16.
  int qi[2], qlo[2], orow[2];
  bool live[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + warp * 16 + lane / 4 + 8 * r;
    live[r] = row < rows_head;
    const int t = row / group, h = hk * group + row % group;
    qi[r] = pos0 + t;
    qlo[r] = a.window > 0 ? max(0, qi[r] - a.window + 1) : 0;
    orow[r] = t * H + h;
  }
  // Warp-uniform key range of the warp's rows (tiles outside it are skipped).
  const int wr0 = row0 + warp * 16;
  const bool warp_live = wr0 < rows_head;
  const int w_hi = pos0 + min(wr0 + 15, rows_head - 1) / group;
  const int w_lo = a.window > 0 ? max(0, pos0 + wr0 / group - a.window + 1) : 0;

  // Q as A fragments (row-major 16 x 16 per k-step), straight from global memory.
  uint32_t qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i & 1, d = kk * 16 + (i >> 1) * 8 + (lane % 4) * 2;
      qf[kk][i] = live[r] ? __ldg(reinterpret_cast<const unsigned*>(q + int64_t(orow[r]) * DH + d)) : 0u;
    }

  auto load_tile = [&](int buf, int k0) {
    T* ks_ = sm + buf * 2 * kTcKeys * LD;
    T* vs_ = ks_ + kTcKeys * LD;
    for (int c = threadIdx.x; c < kTcKeys * CPR; c += kTcWarps * 32) {
      const int j = c / CPR, d = (c % CPR) * 8, key = k0 + j;
      const bool ok = key < ke;
      const int64_t off = ok ? int64_t(key) * kv_dim + int64_t(hk) * DH + d : 0;
      cp_async16(ks_ + j * LD + d, kc + off, ok);
      cp_async16(vs_ + j * LD + d, vc + off, ok);
    }
    cp_async_commit();
  };

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int n_tiles = (ke - lo + kTcKeys - 1) / kTcKeys;
  load_tile(0, lo);
  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = lo + it * kTcKeys;
    if (it + 1 < n_tiles) {
      load_tile((it + 1) & 1, k0 + kTcKeys);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* ks_ = sm + (it & 1) * 2 * kTcKeys * LD;
    const T* vs_ = ks_ + kTcKeys * LD;
    if (warp_live && k0 <= w_hi && k0 + kTcKeys - 1 >= w_lo) {
      // S = Q K^T: 16 rows x 64 keys per warp.
      float s[SN][4];
#pragma unroll
      for (int n = 0; n < SN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const int mi = lane / 8;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#pragma unroll
        for (int np = 0; np < SN / 2; ++np) {
          uint32_t b[4];
          ldsm_x4(b, ks_ + (np * 16 + (mi >> 1) * 8 + lane % 8) * LD + kk * 16 + (mi & 1) * 8);
          Mma<T>::run(s[2 * np], qf[kk], b[0], b[1]);
          Mma<T>::run(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      // Online softmax: element e of n-tile n is row e >> 1, key k0 + 8n + 2(lane % 4) + (e & 1).
      float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < SN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, key = k0 + n * 8 + (lane % 4) * 2 + (e & 1);
          const bool ok = live[r] && key < ke && key >= qlo[r] && key <= qi[r];
          s[n][e] = ok ? s[n][e] * a.scale : -INFINITY;
          mt[r] = fmaxf(mt[r], s[n][e]);
        }
      float mb[2], corr[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
        mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
        const float mn = fmaxf(m[r], mt[r]);
        mb[r] = mn == -INFINITY ? 0.f : mn;  // a row with nothing visible yet: p = 0, corr = 0
        corr[r] = expf(m[r] - mb[r]);
        m[r] = mn;
      }
      // P rounded to T as A fragments of the P V product (k-step j = n-tiles 2j, 2j + 1).
      uint32_t pf[SN / 2][4];
      float ls[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        T p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = from_f<T>(expf(s[n][e] - mb[e >> 1]));
          ls[e >> 1] += to_f(p[e]);
        }
        pf[n / 2][(n & 1) * 2] = pack2<T>(p[0], p[1]);
        pf[n / 2][(n & 1) * 2 + 1] = pack2<T>(p[2], p[3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 1);
        ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 2);
        l[r] = l[r] * corr[r] + ls[r];
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
      // O += P V (V rows are keys: transposed ldmatrix gives the column-major B fragments).
#pragma unroll
      for (int j = 0; j < SN / 2; ++j)
#pragma unroll
        for (int dp = 0; dp < NT / 2; ++dp) {
          uint32_t b[4];
          ldsm_x4_t(b, vs_ + (j * 16 + (mi & 1) * 8 + lane % 8) * LD + dp * 16 + (mi >> 1) * 8);
          Mma<T>::run(o[2 * dp], pf[j], b[0], b[1]);
          Mma<T>::run(o[2 * dp + 1], pf[j], b[2], b[3]);
        }
    }
    __syncthreads();  // this buffer is refilled two tiles on
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!live[r]) continue;
    T* out = static_cast<T*>(a.out) + int64_t(orow[r]) * DH + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<uint32_t*>(out + n * 8) =
          pack2<T>(from_f<T>(o[n][2 * r] / l[r]), from_f<T>(o[n][2 * r + 1] / l[r]));
  }
}

template <class T, int DH>
void attn_tc_launch(const AttnArgs& a, cudaStream_t s) {
  const int group = a.H / a.Hkv;
  const dim3 grid(unsigned((a.T * group + kTcRows - 1) / kTcRows), unsigned(a.Hkv));
  launch_k(attn_tc_kernel<T, DH>, grid, dim3(kTcWarps * 32), attn_tc_smem_bytes(DH), s, a);
  ARB_LAUNCHED("attn_tc_kernel", s);
}

template <class T>
void attn_tc_init_type() {
  ARB_CUDA(cudaFuncSetAttribute(attn_tc_kernel<T, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_tc_smem_bytes(64))));
  ARB_CUDA(cudaFuncSetAttribute(attn_tc_kernel<T, 128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(attn_tc_smem_bytes(128))));
}

}  // namespace

void attention_init() {
  attn_init_type<float>();
  attn_init_type<__half>();
  attn_init_type<__nv_bfloat16>();
  attn_decode_init_type<float>();
  attn_decode_init_type<__half>();
  attn_decode_init_type<__nv_bfloat16>();
  attn_tc_init_type<__half>();
  attn_tc_init_type<__nv_bfloat16>();
}

bool attention_mma_fits(DType ct, int T, int Dh) {
  return T > 1 && ct != DType::F32 && (Dh == 64 || Dh == 128);
}

void launch_attention_mma(DType ct, const AttnArgs& a, cudaStream_t s) {
  ARB_CHECK(attention_mma_fits(ct, a.T, a.Dh) && a.n_splits == 1,
            "[cuda] attention_mma: T %d, Dh %d, %d splits", a.T, a.Dh, a.n_splits);
  if (ct == DType::BF16) {
    if (a.Dh == 64) attn_tc_launch<__nv_bfloat16, 64>(a, s);
    else attn_tc_launch<__nv_bfloat16, 128>(a, s);
  } else {
    if (a.Dh == 64) attn_tc_launch<__half, 64>(a, s);
    else attn_tc_launch<__half, 128>(a, s);
  }
}

int attention_blocks(int T, int H, int Hkv) {
  return (T * (H / Hkv) + kRows - 1) / kRows * Hkv;
}

bool attention_decode_fits(int H, int Hkv, int Dh) {
  const int e = Dh / 32;
  return Hkv > 0 && H % Hkv == 0 && H / Hkv <= kDecMaxGroup && Dh % 32 == 0 &&
         (e == 1 || e == 2 || e == 4 || e == 8) && H <= kMaxDecodeHeads;
}

void launch_attention_decode(DType ct, const AttnArgs& a, unsigned* counters,
                             const QkRopeArgs* qk, cudaStream_t s) {
  ARB_CHECK(!qk || (qk->H == a.H && qk->Hkv == a.Hkv && qk->Dh == a.Dh && qk->Dh <= 64 * int(16 / ctype_size(ct))),
            "[cuda] attention_decode: q/k rope arguments of another shape");
  ARB_DISPATCH_CTYPE(ct, T, attn_decode_dispatch<T>(a, counters, qk, s));
}

void launch_attention(DType ct, const AttnArgs& a, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T, attn_dispatch<T>(a, s));
}

}  // namespace arbiter::cuda
