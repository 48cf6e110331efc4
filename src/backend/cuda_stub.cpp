// Linked when the CUDA tier is compiled out: asking for it says so instead of failing later.
#include "backend/cuda_factory.h"
#include "core/error.h"

namespace arbiter {

bool cuda_tier_built() { return false; }

std::string cuda_build_version() { return "none"; }

std::unique_ptr<Backend> make_cuda_backend(int device, const std::string& dtype) {
  throw Error("[cuda] cuda tier not built (configure with nvcc available and ARBITER_CUDA=ON)");
}

}  // namespace arbiter
