// --mix: run one op family at a different precision on the CUDA tier (an ablation that
// shows which family carries the error). Parsed here, below the tiers, so the CUDA tier can
// honour it and make_backend can refuse it elsewhere; recorded in trace headers as `# mix`.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace arbiter {

/// "attn=f32,mlp=bf16,norm=f32": family=dtype pairs, each family at most once.
/// Families (DeviceSpec::mix is the canonical text):
///   embed    embedding gather
///   norm     every RMSNorm (block norms, qwen3 q/k norms, final norm)
///   attn     q/k/v projections, RoPE, KV cache, attention, output projection
///   mlp      gate and up projections, SwiGLU, down projection
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

}  // namespace arbiter
