#include "backend/rope.h"

#include <cmath>

namespace arbiter {

std::vector<double> rope_inv_freq(const RopeSpec& rope) {
  const int half = rope.dims / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = std::pow(rope.theta, -2.0 * i / rope.dims);
  const RopeScaling& s = rope.scaling;
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
