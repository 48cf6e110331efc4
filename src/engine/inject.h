// Fault injection: --inject op=NAME[,layer=L][,scale=X|noise=S|bias=B]. Perturbs one stage's
// output on any tier so that every check can be shown to fail. Recorded in trace headers.
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "model/forward.h"

namespace arbiter {

struct InjectSpec {
  bool active = false;
  Stage stage = Stage::Logits;
  int layer = -1;          // -1: every layer (or the stage outside blocks)
  double scale = 1.0;      // out *= scale
  double noise = 0.0;      // out += noise * N(0,1), seeded by (stage, layer, position)
  double bias = 0.0;       // out += bias
  std::string text = "none";  // canonical spec for headers

  /// Parses the spec; throws arbiter::Error naming the bad field.
  static InjectSpec parse(const std::string& spec);
  /// Refuses a fault that can never apply to model c (a layer it does not have, a layer on a
  /// stage outside the layers, q/k norm on a model without): the run would be fault-free
  /// while its trace header records the injection.
  void check_applies(const ModelConfig& c) const;
  /// Applies the fault to buf [rows, cols] if (s, layer) matches. Deterministic.
  void apply(Backend& be, Stage s, int layer, Buffer& buf, int rows, int cols, int pos0) const;
};

}  // namespace arbiter
