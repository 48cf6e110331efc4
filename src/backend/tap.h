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
/// and, with record, input_rounding: *input_rounding = the squared error that the op's own
/// rounding of its inputs, beyond the activations' storage type, can add to this output,
/// summed over its elements (the cpu tier's decode matmuls on 8-bit activation codes:
/// Backend::measure_input_rounding); 0 when the op rounded nothing more.
/// A tier computes the fault in its own arithmetic (f64 on the host path, f32 inside a fused
/// kernel), then rounds once to the stage's storage type.
struct StageTap {
  bool fault = false;
  double scale = 1.0, bias = 0.0;
  std::vector<double> noise;
  std::vector<double>* record = nullptr;
  const std::vector<double>* overwrite = nullptr;
  double* input_rounding = nullptr;
};

}  // namespace arbiter
