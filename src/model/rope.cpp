#include "model/rope.h"

#include <cmath>

namespace arbiter {

std::vector<double> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = std::pow(cfg.rope_theta, -2.0 * i / cfg.head_dim);
  const RopeScaling& s = cfg.rope_scaling;
  if (s.kind == RopeScaling::Kind::Linear) {
    for (double& f : inv) f /= s.factor;
  } else if (s.kind == RopeScaling::Kind::Llama3) {
    // transformers modeling_rope_utils._compute_llama3_parameters
    const double old_ctx = double(s.original_max_pos);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (double& f : inv) {
      double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_ctx / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace arbiter
