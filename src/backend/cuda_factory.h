// Entry point of the CUDA tier (src/backend/cuda/), or of its stub when compiled out.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/error.h"

namespace arbiter {

bool cuda_tier_built();
/// dtype: "bf16", "f16" or "f32" (default bf16 when empty). Throws arbiter::Error when the
/// tier is not built or no such device exists.
std::unique_ptr<Backend> make_cuda_backend(int device, const std::string& dtype);
/// "cuda-13.0" style version of the CUDA runtime compiled in, or "none".
std::string cuda_build_version();

/// The error of a CUDA build that sees no device, from cudaGetDeviceCount (count and, when it
/// failed, its error string), cudaDriverGetVersion and cudaRuntimeGetVersion (1000 * major +
/// 10 * minor; 0 when there is no driver). Without a GPU the runtime's own words are "CUDA
/// driver version is insufficient for CUDA runtime version", which sends users after a driver
/// update; this names what is missing first. Inline so that builds without CUDA test it.
inline std::string cuda_no_device_message(int count, int driver_version, int runtime_version,
                                          const std::string& error) {
  auto version = [](int v) { return v > 0 ? strformat("%d.%d", v / 1000, (v % 1000) / 10) : std::string("none"); };
  std::string why;
  if (driver_version == 0) why = "no NVIDIA driver loaded: is this a machine with a GPU?";
  else if (driver_version < runtime_version) why = "the driver is older than the runtime: update the driver";
  else if (!error.empty()) why = "cudaGetDeviceCount: " + error + "; check CUDA_VISIBLE_DEVICES";
  else why = "check CUDA_VISIBLE_DEVICES";
  return strformat("[cuda] no CUDA device visible (%d GPUs; driver %s; runtime %s): %s", count,
                   version(driver_version).c_str(), version(runtime_version).c_str(), why.c_str());
}

}  // namespace arbiter
