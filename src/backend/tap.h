// Stage taps: what a tier does to one stage output right after computing it. A stage is a
// named output inside the forward (model/stage.h); the forward hands each op the taps of the
// stages it computes, and the op applies them where the value is, inside a fused kernel
// too. So --inject, drift and opcheck reach the path that trace and generate run
// (docs/architecture.md).
#pragma once
#include <vector>

namespace arbiter {

/// Applied to an output [rows, cols], in this order:
///  1. fault:     out = out * scale + bias + noise[i]  (--inject; noise empty or [rows*cols])
///  2. record:    *record = out as f64 [rows*cols]     (capture for drift and opcheck)
///  3. overwrite: out = *overwrite rounded to the tier's type (replay: the next op reads the
///                other side's value, so each stage's error is measured alone)
/// A tier computes the fault in its own arithmetic (f64 on the host path, f32 inside a fused
/// kernel), then rounds once to the stage's storage type.
struct StageTap {
  bool fault = false;
  double scale = 1.0, bias = 0.0;
  std::vector<double> noise;
  std::vector<double>* record = nullptr;
  const std::vector<double>* overwrite = nullptr;
};

}  // namespace arbiter
