// The mixture-of-experts feed-forward block, usable by any family whose layers are pre-norm
// decoders (the llama family's qwen2_moe, qwen3_moe and mixtral today):
//   x += sum over the k routed experts e of w_e * down_e(silu(gate_e(xn)) * up_e(xn))
//        [+ sigmoid(xn @ shared_gate^T) * shared(xn)]            (Qwen2-MoE's shared expert)
// with xn = rmsnorm(x), the router's logits = xn @ W_router^T (one rmsnorm_matmul that keeps
// xn) and the routing of backend/moe_routing.h. The routing, the experts, their weighted sum
// and the residual update are Backend::moe_add (backend.h), the op the hybrids' MoE layers
// call too: ref and cpu route on the host in f64 from the router's logits as the tier stored
// them and run each expert on the rows routed to it only; cuda keeps it all on the device.
// The shared expert's gate is Backend::sigmoid_gate.
// Stages: "router" (logits [T, E]), "moe" (the routed experts' weighted sum [T, D]) and
// "shared_expert" (the gated shared expert [T, D]).
#pragma once
#include <vector>

#include "model/arch.h"

namespace arbiter {

class JsonConfig;

/// HF names of a family's MoE tensors inside "model.layers.N.": the block's module and the
/// expert projections (Qwen: mlp / gate_proj, up_proj, down_proj; Mixtral: block_sparse_moe
/// / w1, w3, w2).
struct MoeNames {
  const char* block;
  const char* gate;
  const char* up;
  const char* down;
};

/// Per-layer tensor slots of a MoE layer, from the family's first free slot: router, shared
/// expert gate vector, shared gate/up/down, then gate/up/down of each expert.
int moe_layer_slots(const ModelConfig& c);
/// Appends layer l's MoE tensors (slots from first_slot) to t: the experts' matrices as
/// views into 3-D stacks in GGUF files and in HF files that fuse them (TensorSpec::hf_stack).
void moe_tensors(const ModelConfig& c, const MoeNames& names, int l, int first_slot,
                 std::vector<TensorSpec>& t);

/// Scratch of the block for forwards of up to T tokens (allocated only for MoE configs).
struct MoeScratch {
  MoeScratch(Backend& be, const ModelConfig& c, int T);
  ~MoeScratch();
  Backend& be;
  Buffer router;         // [T, E]
  Buffer y;              // [T, D]: the shared expert's output
  Buffer gate, up, act;  // [T, F_shared] (1 column without a shared expert)
  Buffer shared_gate;    // [T, 1]
  std::vector<Backend::MoeExperts> experts;  // [L]: each MoE layer's, built at its first use
};

/// x[T, D] += the block applied to xn = rmsnorm(x; norm_w) at layer l (weights at slots from
/// first_slot; taps norm_tap on xn, res_tap on x), through Backend::moe_add; xn and out
/// [T, D] are scratch.
void moe_ffn(const Model& m, Backend& be, int l, int first_slot, const Tensor& norm_w,
             const StageTap* norm_tap, int T, const Stages& tap, MoeScratch& s, Buffer& x,
             Buffer& xn, Buffer& out, const StageTap* res_tap);

/// The stage names moe_ffn may emit.
std::vector<std::string> moe_stages();

}  // namespace arbiter
