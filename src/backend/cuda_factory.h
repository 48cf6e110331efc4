// Entry point of the CUDA tier (src/backend/cuda/), or of its stub when compiled out.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace arbiter {

bool cuda_tier_built();
/// dtype: "bf16", "f16" or "f32" (default bf16 when empty). Throws arbiter::Error when the
/// tier is not built or no such device exists.
std::unique_ptr<Backend> make_cuda_backend(int device, const std::string& dtype);
/// "cuda-13.0" style version of the CUDA runtime compiled in, or "none".
std::string cuda_build_version();

}  // namespace arbiter
