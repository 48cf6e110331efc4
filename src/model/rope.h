// RoPE frequencies, shared by every tier so that "which angle" is defined once.
#pragma once
#include <vector>

#include "model/config.h"

namespace arbiter {

/// Inverse frequencies [Dh/2] in f64: theta^(-2i/Dh), then the config's scaling
/// (linear: / factor; llama3: HF _compute_llama3_parameters, smooth between the
/// low- and high-frequency wavelengths).
std::vector<double> rope_inv_freq(const ModelConfig& cfg);

/// Index of the two elements rotated by frequency i inside a head of Dh:
/// Half (HF rotate_half): (i, i + Dh/2); Adjacent (GGUF llama, llama2.c): (2i, 2i + 1).
inline void rope_pair(RopeLayout layout, int Dh, int i, int& a, int& b) {
  if (layout == RopeLayout::Half) {
    a = i;
    b = i + Dh / 2;
  } else {
    a = 2 * i;
    b = 2 * i + 1;
  }
}

}  // namespace arbiter
