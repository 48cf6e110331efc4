// The cpu tier's Mamba2 ops (backend.h: ssm_conv, ssm_scan, rmsnorm_gated) on f32 rows, the
// weights already widened to f32. Plain loops the compiler vectorises over the inner index
// (the matmuls around them dominate a hybrid's forward), but for the chunked scan, whose dot
// products over N (a reduction the compiler keeps in order) are written in simd.h's vectors.
#pragma once
#include <cstdint>

#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace arbiter::cpu {

/// out[T, C] = silu(causal conv of [state; x] + b); state [K-1, C] becomes the last K-1 rows.
/// w [C, K]; b [C] or null.
void ssm_conv_f32(const float* x, const float* w, const float* b, int T, int C, int K,
                  float* state, float* out);
/// The selective scan of backend.h over T tokens, heads split across the pool.
struct ScanArgs {
  const float* xbc = nullptr;     // [T, nh*hd + 2*G*N]
  const float* dt_raw = nullptr;  // [T, nh]
  const float* a_log = nullptr;   // [nh] each
  const float* d = nullptr;
  const float* dt_bias = nullptr;
  double dt_min = 0, dt_max = 0;
  int T = 0, nh = 0, hd = 0, G = 0, N = 0;
  int chunk = 0;           // tokens per chunk of the chunked form (HF chunk_size)
  float* state = nullptr;  // [nh, hd, N]
  float* y = nullptr;      // [T, nh*hd]
};
/// The recurrence token by token (the decode step, T == 1).
void ssm_scan_f32(const ScanArgs& a, ThreadPool& pool);
/// The same scan in Mamba2's chunked (SSD) form, as HF's torch_forward computes a prefill:
/// per chunk of a.chunk tokens, the intra-chunk (diagonal block) outputs, the entering state's
/// contribution to them, then the state carried to the next chunk. Vectorised with isa.
void ssm_scan_chunked_f32(Isa isa, const ScanArgs& a, ThreadPool& pool);
/// out[R, W] = w * v / rms(v) per group of `group` columns, v = y * silu(z).
void rmsnorm_gated_f32(const float* y, const float* z, const float* w, int R, int W, int group,
                       float eps, float* out);

}  // namespace arbiter::cpu
