// safetensors writer (https://huggingface.co/docs/safetensors, "Format"): u64 little-endian
// header length N, N bytes of JSON, then the tensors' bytes back to back. Used by
// `arbiter synth` to write checkpoints too large to hold in memory: each tensor's bytes
// are produced in pieces by a fill callback and streamed to the file.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <optional>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace arbiter {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;  // F64, F32, F16 or BF16
  std::vector<int64_t> shape;
  /// Writes elements [begin, begin + n) of the tensor (row-major, in dtype) to dst.
  /// Called with increasing begin; n is at most the writer's piece size.
  std::function<void(int64_t begin, int64_t n, void* dst)> fill;
  /// Alternative to fill: the whole tensor already in memory (numel elements of dtype).
  const void* data = nullptr;
  std::optional<StInt> int_type;  // set: a U8/U32 tensor instead (dtype unused; MLX's words)
};

/// Writes entries, in the order given, to path. The header is padded with spaces so the
/// data starts at a multiple of 64 bytes; tensors follow each other with no gaps (the
/// reference implementation refuses gaps), so a tensor is 64-byte aligned when the ones
/// before it have sizes that are multiples of 64 bytes. metadata goes to "__metadata__".
/// Throws "[safetensors] PATH: ..." on bad entries (duplicate names, unsupported dtype)
/// and on I/O errors. Atomic (io/atomic_file.h): PATH holds the whole file or nothing.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace arbiter
