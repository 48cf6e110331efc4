// safetensors reader (https://huggingface.co/docs/safetensors): one file or a sharded set
// listed by model.safetensors.index.json. Tensors are views into the mapped files.
// Built to be fuzzed: header length, JSON, dtypes and data_offsets are checked.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mmap.h"

namespace arbiter {

/// Integer tensors: MLX's packed weights (U32) and its E8M0/E4M3 scales (U8). They are no
/// DType: nothing computes with them; model/mlx.cpp repacks them into quantized blocks.
enum class StInt : uint8_t { U8, U32 };
struct IntTensor {
  std::string name;
  StInt type = StInt::U32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // little-endian words, aligned to their size
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};
const char* st_int_name(StInt t);  // "U8", "U32"

class SafetensorsSet {
 public:
  /// Loads DIR/model.safetensors, or the shards named by DIR/model.safetensors.index.json.
  /// Supported dtypes: F64, F32, F16, BF16 (tensors()), U8 and U32 (int_tensors()). Throws "[safetensors] PATH: ..." on any defect.
  static SafetensorsSet open_dir(const std::string& dir);
  /// Loads one file.
  static SafetensorsSet open_file(const std::string& path);
  /// One file's bytes already in memory, under a name used in messages (fuzzing).
  static SafetensorsSet from_bytes(const std::string& name, std::string bytes);

  /// nullptr when absent.
  const Tensor* tensor(const std::string& name) const;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const IntTensor* int_tensor(const std::string& name) const;
  const std::map<std::string, IntTensor>& int_tensors() const { return int_tensors_; }
  /// `__metadata__` string pairs of every file (merged).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The weight files in sorted path order (their bytes define the model's weight sha256).
  const std::vector<std::shared_ptr<MappedFile>>& files() const { return files_; }

 private:
  void add_file(std::shared_ptr<MappedFile> file);
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, IntTensor> int_tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::shared_ptr<MappedFile>> files_;
};

/// model.safetensors.index.json text -> its weight_map as (tensor, shard file name) pairs,
/// in the file's order. Refuses ("[safetensors] PATH: ...") a missing or empty weight_map, a
/// value that is not a string, and a shard that is not a plain file name in the same folder.
std::vector<std::pair<std::string, std::string>> parse_safetensors_index(const std::string& text,
                                                                         const std::string& path);

}  // namespace arbiter
