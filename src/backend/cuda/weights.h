// Weights on the device: each host tensor uploaded once, on first use: matrices in ggml's
// block formats as their packed blocks (rows padded to a 16-byte stride; gemv_quant.cu reads
// them), other matrices in the compute type (rows padded to a 16-byte stride; MLX's blocks and
// f64 widened on the host first), 1-D weights (norm scales and biases) in f32; keyed by the
// host tensor (address, shape, dtype and a sample of its bytes, so a different model mapped at
// the same address is not mistaken for the old one).
#pragma once
#include <cuda_runtime.h>

#include <unordered_map>
#include <vector>

#include "backend/cuda/host_common.h"
#include "backend/cuda/kernels.h"
#include "core/tensor.h"

namespace arbiter::cuda {

/// Weight matrix on the device: in the compute type (st == the compute type; ld elements from
/// one row to the next), or packed blocks of format st (packed(); ld bytes from one row to
/// the next), rows padded to a 16-byte stride either way.
struct DevMat {
  void* ptr = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  DType st = DType::F32;
  bool packed() const { return packed_on_device(st); }
};
/// 1-D weight (norm scale, bias, Mamba2's A_log / D / dt_bias, a conv1d kernel) on the device
/// in f32.
struct DevVec {
  float* ptr = nullptr;
  int64_t n = 0;
};

class WeightCache {
 public:
  WeightCache(DType ct, cudaStream_t s) : ct_(ct), stream_(s) {}
  ~WeightCache();
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  /// dense: in the compute type even when t's format could stay packed (the MoE kernels read
  /// their experts so; kept beside a packed copy if both are asked for).
  const DevMat& matrix(const Tensor& t, bool dense = false);
  /// plus_one: the vector 1 + t (gemma's RMSNorm weights), kept beside t's own.
  const DevVec& vector(const Tensor& t, bool plus_one = false);
  /// A new model's weights: frees every other upload, uploads these (2-D as matrices; 1-D and
  /// conv1d weights [C, 1, K] as f32 vectors, the latter read as [C, K]) and gives back the
  /// staging block. No queued launch may still read an old one.
  void prepare(const std::vector<const Tensor*>& weights);

 private:
  struct Key {
    const void* data;
    int64_t numel, cols;  // the shape too: two views of the same bytes are different matrices
    DType dt;
    uint64_t sample;
    bool plus_one = false;  // vectors: 1 + the weight
    bool dense = false;     // matrices: widened though the format could stay packed
    bool operator==(const Key& o) const {
      return data == o.data && numel == o.numel && cols == o.cols && dt == o.dt &&
             sample == o.sample && plus_one == o.plus_one && dense == o.dense;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  static Key key_of(const Tensor& t);
  /// The packed blocks of t, each row at a 16-byte stride.
  DevMat upload_packed(const Tensor& t);
  /// Copies a weight's bytes to the staging block (f64 is widened to f32 on the host first;
  /// every other storage type is converted on the device); st: the type staged.
  const void* upload_raw(const Tensor& t, DType& st);

  DType ct_;
  cudaStream_t stream_;
  std::unordered_map<Key, DevMat, KeyHash> mats_;
  std::unordered_map<Key, DevVec, KeyHash> vecs_;
  DevBuf staging_;
};

}  // namespace arbiter::cuda
