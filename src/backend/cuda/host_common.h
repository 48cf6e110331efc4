// Host-side pieces shared by the CUDA tier's files (cuda_backend.cpp, fused.cpp, weights.cpp,
// step_graph.cpp); not part of the Backend interface.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace arbiter::cuda {

/// Bytes of one element of a compute type.
inline size_t elem_size(DType t) { return t == DType::F32 ? 4 : 2; }

/// n values as the device stores them in t (f32, or bf16/f16 rounded to nearest even).
std::vector<uint8_t> encode(DType t, const double* src, int64_t n);

/// A device allocation that grows; growing frees the old block (its users must be done).
struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
};
/// Grows b to at least `bytes` (at least doubling), after waiting for stream s.
void grow(DevBuf& b, size_t bytes, cudaStream_t s);

/// A floating-point launch argument as a word of a launch signature (its bits).
inline int64_t sig_bits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

/// Arguments of a queued launch that vary per step (the rest are in its closure).
struct StepCtx {
  const int* pos_dev;      // device position, or nullptr: use the op's host position
  const int32_t* ids_dev;  // device token ids for the embedding gather
};

}  // namespace arbiter::cuda
