// --mix: run one op family at a different precision on the CUDA tier (an ablation that
// shows which family carries the error). Parsed here, below the tiers, so the CUDA tier can
// honour it and make_backend can refuse it elsewhere; recorded in trace headers as `# mix`.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace arbiter {

/// "attn=f32,mlp=bf16,norm=f32": family=dtype pairs, each family at most once.
/// Families (DeviceSpec::mix is the canonical text):
///   embed    embedding gather
///   norm     every RMSNorm (block norms, qwen3 q/k norms, final norm)
///   attn     q/k/v projections, RoPE, KV cache, attention, output projection
///   mlp      gate and up projections, SwiGLU (relu2), down projection, MoE routers and experts
///   ssm      the Mamba2 mixer: in_proj, ssm_conv, ssm_scan, rmsnorm_gated, out_proj
///   residual the residual adds
///   logits   the final projection (lm_head)
/// dtypes: f32, bf16, f16.
struct MixSpec {
  std::vector<std::pair<std::string, std::string>> entries;  // (family, dtype) in given order
  bool empty() const { return entries.empty(); }
  /// Canonical text: entries in the order given, "family=dtype" joined by ','; "none" if empty.
  std::string text() const;
  /// dtype asked for a family, or "" when the family keeps the tier's --dtype.
  std::string dtype_of(const std::string& family) const;
};

/// The family names, in the order above.
const std::vector<std::string>& mix_families();
/// Parses a mix spec ("" and "none" give an empty spec). Throws arbiter::Error
/// "[mix] 'SPEC': ..." naming the bad entry, family or dtype.
MixSpec parse_mix(const std::string& spec);

/// A tier that runs each op family on the inner tier of that family's dtype (`tiers`: dtype
/// name -> backend, one per distinct dtype; `base` names the dtype of every family the spec
/// does not name). Activations live where their last op ran and move between tiers only at a
/// family boundary: read back as f64 from the tier that holds them, written to the next one
/// (rounded to its dtype): a family at f32 computes and stores its outputs in f32, and its
/// inputs are the neighbouring families' rounded values. matmul's family comes from its
/// weight (q/k/v/o: attn; gate/up/down: mlp; in_proj/out_proj: ssm; lm_head: logits), also
/// for a slice of a weight's rows. A scale or soft cap (Granite's multipliers, gemma's
/// embedding scale and caps) runs where its input is. Fused ops run as their
/// default composition, so each part goes to its own family. With every family on one tier
/// the results are exactly that tier's. make_backend builds this for `--mix` on cuda; the
/// tiers can be any Backend (tests use cpu and ref).
std::unique_ptr<Backend> make_mix_backend(std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers,
                                          const std::string& base, const MixSpec& mix);

}  // namespace arbiter
