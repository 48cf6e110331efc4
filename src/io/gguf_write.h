// GGUF v3 writer (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), the twin of
// io/gguf.h's reader: metadata key/values and F32/F16/BF16 or block-format tensors, the tensors' bytes
// produced in pieces by a fill callback (as for safetensors) so multi-GB checkpoints never
// sit in memory. Used by `arbiter synth --format gguf`. Written atomically (io/atomic_file.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"

namespace arbiter {

struct GgufTensorEntry {
  std::string name;
  DType dtype = DType::F32;    // F32, F16, BF16 or a block format (core/quant.h)
  std::vector<int64_t> shape;  // outermost first, as GgufFile::tensors() reports it ([rows, cols])
  /// Writes elements [begin, begin + n) (row-major, in dtype; whole blocks) to dst; increasing begin.
  std::function<void(int64_t begin, int64_t n, void* dst)> fill;
};

class GgufWriter {
 public:
  // Metadata, written in the order added. Keys must be unique.
  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  /// A value read by GgufFile, written back with its own type codes (arbiter quantize copies
  /// a file's metadata).
  void add_value(const std::string& key, const GgufValue& v);
  void add_tensor(GgufTensorEntry t);

  /// Writes the file: header, metadata, tensor infos, padding to general.alignment (32),
  /// tensor data each at a multiple of 32. Throws "[gguf] PATH: ..." on a duplicate key or
  /// tensor, an unsupported dtype, or an I/O error; PATH then holds nothing new.
  void write(const std::string& path) const;

 private:
  void add_kv(const std::string& key, uint32_t type, std::string bytes);
  struct Kv {
    std::string key;
    uint32_t type;
    std::string bytes;  // the encoded value
  };
  std::vector<Kv> kv_;
  std::vector<GgufTensorEntry> tensors_;
};

}  // namespace arbiter
