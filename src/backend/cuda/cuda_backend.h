// Extra controls of the CUDA tier for tests and benchmarks (the Backend interface covers
// everything else). Declared always; defined only when the CUDA tier is built
// (ARBITER_HAVE_CUDA), so callers guard their use with that macro.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace arbiter {

/// How single-token forwards were executed, counted per segment (a step runs in segments of
/// CudaTuning::graph_segment_ops launches): replays of a captured CUDA graph, captures (each
/// also runs the segment once) and segments run op by op (first sight of an op sequence, or a
/// step cut short by a host read such as a capture hook or fault injection).
struct CudaGraphStats {
  int64_t replays = 0;
  int64_t captures = 0;
  int64_t eager_steps = 0;
};

/// Kernel choices (defaults from ARBITER_CUDA_GEMV / _GRAPH / _FUSED / _PDL / _ATTN_DIRECT /
/// _SSM_FUSED / _ATTN_MMA / _QGEMV_MMA / _MOE_MMA, each on unless "0").
struct CudaTuning {
  bool gemv = true;    // T == 1 matmuls by the hand-written GEMV (else cuBLASLt)
  bool graphs = true;  // capture and replay single-token forwards, and batched forwards
                       // under row invariance (continuous batching)
  bool fused = true;   // T == 1 fused ops (ARBITER_CUDA_FUSED): norm+GEMV, q/k norm+RoPE+KV
                       // store, GEMV+residual add; off: the ops one by one
  bool pdl = true;     // programmatic dependent launch (ARBITER_CUDA_PDL); process-wide
  bool attn_direct = true;  // T == 1 attention by the direct decode kernel (one launch, keys
                            // from global memory; ARBITER_CUDA_ATTN_DIRECT); off: flash + combine
  bool qgemv_mma = true;  // T == 1 matmuls of Q4_K/Q5_K/Q6_K rows on tensor cores (bf16/f16;
                          // ARBITER_CUDA_QGEMV_MMA); off: the CUDA-core packed GEMV
  bool ssm_fused = true;  // T == 1 Mamba2 conv inside the in_proj GEMV (rmsnorm_matmul_conv;
                          // ARBITER_CUDA_SSM_FUSED, under `fused`); off: GEMV, then ssm_conv
  bool attn_mma = true;  // T > 1 attention on tensor cores (bf16/f16, Dh 64/128;
                         // ARBITER_CUDA_ATTN_MMA); off: the CUDA-core flash kernel
  bool moe_mma = true;  // T > 1 MoE experts' grouped GEMMs on tensor cores (bf16/f16;
                        // ARBITER_CUDA_MOE_MMA); off: the CUDA-core f32 tiles
  int attn_split_keys = 256;  // direct decode attention: the fewest keys per key split (the
                              // grid's splits are sized by the cache rows; the kernel uses
                              // those the position needs; ARBITER_CUDA_ATTN_SPLIT_KEYS)
  int attn_max_splits = 8;    // and the most splits (ARBITER_CUDA_ATTN_MAX_SPLITS, <= 32).
                              // H200, synth qwen3-0.6b bf16 decode, tg128 (session 13,
                              // decode-variants-s13): keys per split 128 / 256 / 512 / 1024 at
                              // --depth 1024 1,238 / 1,313 / 1,119 / 908 tok/s, at --depth 4096
                              // 764 / 963 / 1,106 / 858 (at most 32 splits): about 4-8 splits
                              // of 256+ keys each. Short contexts run one split.
  int attn_heads_per_block = 1;  // direct decode attention: query heads per block (the largest
                                 // divisor of the group up to this, a whole group past 64 KV
                                 // heads; ARBITER_CUDA_ATTN_HEADS_PER_BLOCK). One head per
                                 // block spreads a group over SMs (attention.cu)
  int graph_segment_ops = 32;  // a single-token step runs (as a graph) in segments of this many
                               // launches while the host queues the rest; 0: the whole step at
                               // once (ARBITER_CUDA_GRAPH_SEGMENT). Steps that embed a pick
                               // (queued ahead of the GPU) always run whole.
};

/// Throws arbiter::Error when be is not the CUDA tier.
CudaGraphStats cuda_graph_stats(const Backend& be);
CudaTuning cuda_tuning(const Backend& be);
void cuda_set_tuning(Backend& be, const CudaTuning& t);

}  // namespace arbiter
