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
/// _ATTN_MMA, each on unless "0").
struct CudaTuning {
  bool gemv = true;    // T == 1 matmuls by the hand-written GEMV (else cuBLASLt)
  bool graphs = true;  // capture and replay single-token forwards
  bool fused = true;   // T == 1 fused ops (ARBITER_CUDA_FUSED): norm+GEMV, q/k norm+RoPE+KV
                       // store, GEMV+residual add; off: the ops one by one
  bool pdl = true;     // programmatic dependent launch (ARBITER_CUDA_PDL); process-wide
  bool attn_direct = true;  // T == 1 attention by the direct decode kernel (one launch, keys
                            // from global memory; ARBITER_CUDA_ATTN_DIRECT); off: flash + combine
  bool attn_mma = true;  // T > 1 attention on tensor cores (bf16/f16, Dh 64/128;
                         // ARBITER_CUDA_ATTN_MMA); off: the CUDA-core flash kernel
  int attn_split_keys = 512;  // direct decode attention: one key split per this many keys (a
                              // grid of up to 32 splits sized by the cache rows; the kernel
                              // uses those the position needs; ARBITER_CUDA_ATTN_SPLIT_KEYS).
                              // With the weights first out of L2 the cache rows stay there,
                              // and fewer, longer splits won over 128 (H200, synth qwen3-0.6b
                              // bf16 decode, -p 2048: 1,836-1,848 against 1,815-1,816 tok/s;
                              // -p 512: 1,838-1,839 against 1,823-1,832; decode-variants-s12)
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
