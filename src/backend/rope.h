// Rotary position embeddings: what a RoPE op rotates and by which angles, defined once for
// every tier (the angles in f64 on the host, so "which angle" never depends on the tier).
#pragma once
#include <cstdint>
#include <vector>

namespace arbiter {

/// How RoPE pairs dimensions inside a head. HF checkpoints rotate (i, i + Dh/2)
/// ("rotate_half"); GGUF llama-family checkpoints have Q/K rows permuted so that RoPE
/// rotates adjacent pairs (2i, 2i+1) (llama.cpp "normal" rope, llama2.c). We keep the file's
/// layout and tell the op, instead of permuting rows at load.
enum class RopeLayout { Half, Adjacent };

struct RopeScaling {
  enum class Kind { None, Linear, Llama3 };
  Kind kind = Kind::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;     // llama3
  double high_freq_factor = 4.0;    // llama3
  int64_t original_max_pos = 8192;  // llama3
  bool operator==(const RopeScaling&) const = default;
};

/// One RoPE: the rotated head size, base, scaling and pair layout.
struct RopeSpec {
  int dims = 0;  // Dh: the head size it rotates
  double theta = 10000.0;
  RopeScaling scaling;
  RopeLayout layout = RopeLayout::Half;
  bool operator==(const RopeSpec&) const = default;
};

/// Inverse frequencies [dims/2] in f64: theta^(-2i/dims), then the scaling (linear: / factor;
/// llama3: HF _compute_llama3_parameters, smooth between the low- and high-frequency
/// wavelengths).
std::vector<double> rope_inv_freq(const RopeSpec& rope);

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
