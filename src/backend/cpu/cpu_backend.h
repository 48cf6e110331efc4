// The fast CPU tier: f32 activations, SIMD and threads; weights stay in their storage dtype
// (bf16/f16/q8_0 rows are widened inside the kernels), so a model is never copied at load.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace arbiter {

/// threads <= 0: all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace arbiter
