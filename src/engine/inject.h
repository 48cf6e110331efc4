// Fault injection: --inject op=NAME[,layer=L][,scale=X|noise=S|bias=B]. Perturbs one stage's
// output (model/stage.h) on any tier, fused kernels included, so that every check can be
// shown to fail. Recorded in trace headers.
#pragma once
#include <cstdint>
#include <string>

#include "model/stage.h"

namespace arbiter {

struct InjectSpec {
  bool active = false;
  std::string stage;       // a stage name: any family's (model/arch.h all_stage_names)
  int layer = -1;          // -1: every layer (or the stage outside blocks)
  double scale = 1.0;      // out *= scale
  double noise = 0.0;      // out += noise * N(0,1), seeded by (stage, layer, position)
  double bias = 0.0;       // out += bias
  std::string text = "none";  // canonical spec for headers

  /// Parses the spec; throws arbiter::Error naming the bad field (an unknown stage lists the
  /// valid names).
  static InjectSpec parse(const std::string& spec);
  bool matches(const StagePoint& p) const {
    return active && stage == p.name && (layer < 0 || layer == p.layer);
  }
  /// Sets tap's fault for a matching stage of a forward at pos0: scale, bias and, with noise,
  /// one value per output, seeded by (stage, layer, absolute position) so that it does not
  /// depend on how the tokens were split into forwards.
  void fault(const StagePoint& p, int pos0, StageTap& tap) const;
};

}  // namespace arbiter
