// Decode attention (T == 1): the direct kernel, keys read straight from global memory, with
// the step's q/k norm + RoPE + KV store folded in (kQk) and, for drift and --inject, their
// stage taps (kTap). kernels.h has the launchers' contracts.
#include "backend/cuda/device_common.cuh"
#include "core/error.h"

namespace arbiter::cuda {

namespace {

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
/// Keys a warp takes at a time for blocks of hb query heads (KPW, above).
__host__ __device__ constexpr int dec_kpw(int hb) { return hb <= 2 ? 4 : hb <= 4 ? 2 : 1; }
/// Floats of one head's row in shared memory (a warp's partial output; kQk, a roped q or k
/// head): each lane group's slice of E = Dh KPW / 32 elements padded by 4, so that the 8
/// lanes of a quarter warp storing or loading their slices hit distinct banks. Unpadded, a
/// slice of 32 floats (Dh 256) put all 8 on one bank: Nsight Compute counted 85% of gemma3-1b's
/// shared stores and loads as bank conflicts (docs/evidence/h200/call-c-s40.txt).
__host__ __device__ constexpr int dec_partial_row(int Dh, int kpw) { return Dh + 4 * (32 / kpw); }
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
  // [kDecWarps][hb][ROW] (padded rows), then kQk: [hb + 1][ROW] roped q and k, [2][Dh] the
  // q and k norm weights, [Dh / 2] (cos, sin) of the position
  extern __shared__ float dec_o[];
  __shared__ float dec_m[kDecWarps][kDecMaxGroup], dec_l[kDecWarps][kDecMaxGroup];
  __shared__ int dec_last;
  const int hb = a.heads_per_block, columns = a.H / a.Hkv / hb;  // columns per KV head
  const int hk = blockIdx.x / columns, column = blockIdx.x % columns, split = blockIdx.y;
  const int hq0 = blockIdx.x * hb;  // the block's first query head
  const int Dh = E * LPK, kv_dim = a.Hkv * Dh;
  constexpr int EP = E + 4, ROW = EP * LPK;  // a padded slice, a padded row (dec_partial_row)
  static_assert(ROW == dec_partial_row(E * LPK, KPW));
  auto at = [](int d) { return d / E * EP + d % E; };  // element d of a padded row
  unsigned* k_readers = counters + kMaxDecodeHeads + hk;  // blocks past their raw k read
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / LPK, dl = lane % LPK;  // key of the warp's KPW, slice of the head
  // Before griddep_wait, what no kernel of this step writes: the position (uploaded before
  // the step), the cache rows of earlier positions (written by earlier steps: complete before
  // the kernel this one follows started), the q/k norm weights and the RoPE row.
  // A batch's sequence (AttnArgs::seqs, blockIdx.z; one query row each): its q and output
  // rows, position and block table; the descriptors were uploaded before the forward.
  int pos, qrow = 0;
  const int* pages = nullptr;
  if (a.seqs) {
    const int* sd = a.seqs + kSeqWords * blockIdx.z;
    qrow = sd[0];
    pos = sd[2];
    pages = a.blocks + sd[3];
  } else {
    pos = pos_of(a.pos);
  }
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int S = min(int(gridDim.y), (pos - lo + a.split_keys) / a.split_keys);
  if (split >= S) return;
  const int chunk = (pos - lo + 1 + S - 1) / S;
  const int ks = lo + split * chunk, ke = min(pos + 1, ks + chunk);
  const int base = ring_base(lo, a.rows);
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
      const int64_t row = key_row(key, base, a.rows, pages, a.block_rows) * kv_dim;
      load_slice(kc + row, k);
      load_slice(vc + row, v);
    }
  };
  Slice<T, E> kr, vr, kn, vn;
  auto load_first = [&] {
    load_kv(ks + koff, kr, vr);
    if (kDeep) load_kv(ks + koff + KPB, kn, vn);
  };
  if (kQk) load_first();
  const T* qp = static_cast<const T*>(a.q) + int64_t(qrow) * a.H * Dh;
  T* const outp = static_cast<T*>(a.out) + int64_t(qrow) * a.H * Dh;
  float* qks = dec_o + kDecWarps * hb * ROW;  // kQk: the block's roped q heads, then k (padded)
  float* nws = qks + (hb + 1) * ROW;         // kQk: q norm weights, k norm weights
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
      norm_rope_head<T, NCH, kTap, E>(x, nw, qk.eps, Dh, css, qk.adjacent, qks + h * ROW, lane,
                                      ht);
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
      static_cast<T*>(qk.k_cache)[row] = from_f<T>(qks[hb * ROW + at(int(threadIdx.x))]);
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
        for (int e = 0; e < E; ++e) q[g][e] = qks[g * ROW + dl * EP + e];
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
        kf[e] = qks[hb * ROW + dl * EP + e];
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
      if (sub == 0) dec_o[(warp * hb + g) * ROW + dl * EP + e] = O;
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
      O = fmaf(dec_o[(w * hb + g) * ROW + at(d)], cw, O);
    }
    if (S == 1) {
      outp[int64_t(h) * Dh + d] = from_f<T>(O / L);
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
      const T y = from_f<T>(qks[i / Dh * ROW + at(i % Dh)]);
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
    outp[int64_t(h) * Dh + d] = from_f<T>(acc / dec_sum[g]);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (graph replays too)
}

/// Dynamic shared memory of the decode kernel: [kDecWarps][group] partial outputs; kQk: roped
/// q and k (padded rows, dec_partial_row), the q/k norm weights, the RoPE row, the new row's
/// value.
size_t attn_decode_smem_bytes(int group, int Dh, bool qk) {
  const size_t row = dec_partial_row(Dh, dec_kpw(group));
  return sizeof(float) *
         (kDecWarps * size_t(group) * row + (qk ? (group + 1) * row + 4 * size_t(Dh) : 0));
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
  ARB_CHECK(!a.seqs || (a.n_splits == 1 && !kQk),
            "[cuda] attention_decode: a batch of sequences with %d key splits%s", a.n_splits,
            kQk ? " and the fused q/k RoPE" : "");
  const dim3 grid(unsigned(a.H / hb), unsigned(a.n_splits), unsigned(a.seqs ? a.n_seqs : 1));
  const size_t smem = attn_decode_smem_bytes(hb, a.Dh, kQk);
  switch (dec_kpw(hb)) {
    case 4: attn_decode_launch<T, 4, kQk, kTap>(a, counters, qk, grid, smem, s); break;
    case 2: attn_decode_launch<T, 2, kQk, kTap>(a, counters, qk, grid, smem, s); break;
    default: attn_decode_launch<T, 1, kQk, kTap>(a, counters, qk, grid, smem, s); break;
  }
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

}  // namespace

void attention_decode_init() {
  attn_decode_init_type<float>();
  attn_decode_init_type<__half>();
  attn_decode_init_type<__nv_bfloat16>();
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
  ARB_CHECK(a.softcap == 0.f, "[cuda] attention_decode: no score cap (the flash kernel caps)");
  ARB_DISPATCH_CTYPE(ct, T, attn_decode_dispatch<T>(a, counters, qk, s));
}

}  // namespace arbiter::cuda
