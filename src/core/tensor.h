// A read-only view of a weight tensor in its storage dtype (usually inside an mmap).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace arbiter {

/// Row-major weight view. Matrices are [rows = out, cols = in] for HF and GGUF alike
/// (GGUF's ne0 is the contiguous input dim, so ggml [ne0, ne1] becomes [ne1, ne0] here).
/// A missing optional weight has data == nullptr.
struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t rows() const { return shape.size() >= 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  size_t nbytes() const { return dtype_bytes(dtype, numel()); }
  /// Start of row r (rows are contiguous, cols() elements each).
  const void* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + dtype_bytes(dtype, r * cols());
  }
};

}  // namespace arbiter
