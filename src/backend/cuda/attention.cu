// Causal GQA attention with an online softmax (flash-attention style) for prefill (T > 1),
// and for decode steps (T == 1) where the direct decode kernel (attention_decode.cu) does not
// take the shape or is switched off.
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

/// An attention score after AttnArgs::softcap (none when softcap is 0: the same bits).
__device__ __forceinline__ float cap_score(float s, float softcap) {
  return softcap > 0.f ? tanhf(s / softcap) * softcap : s;
}

/// Stages keys [k0, min(k0 + kTile, ke)) of one KV head into k_s / v_s as f32 (rows past ke
/// are zero; key p at cache row key_row(p, ring0, rows, pages, block_rows)). Each thread issues kBatch 16-byte
/// loads of K and of V before it converts and stores any of them, so a tile costs about one
/// memory latency, not one per element.
template <class T>
__device__ __forceinline__ void load_tile(const T* kc, const T* vc, int k0, int ke, int kv_dim,
                                          int ring0, int rows, const int* pages, int block_rows,
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
          const int64_t off =
              key_row(key, ring0, rows, pages, block_rows) * kv_dim + int64_t(hk) * Dh + d;
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
        const int64_t off =
            key_row(key, ring0, rows, pages, block_rows) * kv_dim + int64_t(hk) * Dh + d;
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
  const int hk = blockIdx.y;
  // One sequence's rows (a batch's: blockIdx.z names the sequence, AttnArgs::seqs).
  int split = blockIdx.z, T_ = a.T, pos0 = 0, qrow0 = 0;
  const int* pages = nullptr;
  if (a.seqs) {
    const int* sd = a.seqs + kSeqWords * blockIdx.z;
    qrow0 = sd[0];
    T_ = sd[1];
    pos0 = sd[2];
    pages = a.blocks + sd[3];
    split = 0;
  } else {
    pos0 = pos_of(a.pos);
  }
  const int rows_head = T_ * group;  // rows of this KV head: row -> (t = row / group, g)
  const int row0 = blockIdx.x * kRows;
  if (row0 >= rows_head) return;  // block-uniform: past a shorter sequence of the batch
  const T* q = static_cast<const T*>(a.q) + int64_t(qrow0) * H * Dh;
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
  const int base = pages ? 0 : ring_base(lo, a.rows);

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
    orow[i] = (qrow0 + t) * H + h;
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DCH; ++c) o[i][c] = 0.f;
  }

  if (ks < ke) {  // block-uniform: empty slices only write (m = -inf, l = 0)
    load_queries<T>(q, row0, rows_head, group, hk, H, Dh, q_s);
    for (int k0 = ks; k0 < ke; k0 += kTile) {
      __syncthreads();  // the previous tile is consumed (and q_s is written, first time)
      load_tile<T>(kc, vc, k0, ke, kv_dim, base, a.rows, pages, a.block_rows, hk, Dh, k_s, v_s);
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
        const float sc = ok ? cap_score(s[i] * a.scale, a.softcap) : -INFINITY;
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
  ARB_ASSERT(!a.seqs || a.n_splits == 1);
  dim3 grid(unsigned((a.T * group + kRows - 1) / kRows), unsigned(a.Hkv),
            unsigned(a.seqs ? a.n_seqs : a.n_splits));
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
  const int base = ring_base(lo, a.rows);
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
      const int64_t off = ok ? ring_row(key, base, a.rows) * kv_dim + int64_t(hk) * DH + d : 0;
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
          mma_16816<T>(s[2 * np], qf[kk], b[0], b[1]);
          mma_16816<T>(s[2 * np + 1], qf[kk], b[2], b[3]);
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
          mma_16816<T>(o[2 * dp], pf[j], b[0], b[1]);
          mma_16816<T>(o[2 * dp + 1], pf[j], b[2], b[3]);
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
  attention_decode_init();
  attn_tc_init_type<__half>();
  attn_tc_init_type<__nv_bfloat16>();
}

bool attention_mma_fits(DType ct, int T, int Dh) {
  return T > 1 && ct != DType::F32 && (Dh == 64 || Dh == 128);
}

void launch_attention_mma(DType ct, const AttnArgs& a, cudaStream_t s) {
  ARB_CHECK(attention_mma_fits(ct, a.T, a.Dh) && a.n_splits == 1 && a.softcap == 0.f,
            "[cuda] attention_mma: T %d, Dh %d, %d splits, softcap %g", a.T, a.Dh, a.n_splits,
            double(a.softcap));
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

void launch_attention(DType ct, const AttnArgs& a, cudaStream_t s) {
  ARB_DISPATCH_CTYPE(ct, T, attn_dispatch<T>(a, s));
}

}  // namespace arbiter::cuda
