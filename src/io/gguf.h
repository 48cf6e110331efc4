// GGUF v3 reader (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): metadata
// key/values and tensor views into the mapped file. Built to be fuzzed: every length,
// count, offset and type is checked against the file size before use.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "io/mmap.h"

namespace arbiter {

/// A GGUF metadata value. Scalars are widened: unsigned ints to u, signed ints to i, floats
/// to f (a FLOAT32 scalar becomes the shortest decimal that rounds back to it, e.g. 1e-5, not
/// 9.99999975e-06; arrays of FLOAT32 are widened exactly). Arrays hold one of the vectors (ArrBool keeps 0/1 in au). `type` and `elem_type`
/// keep the file's own gguf_type codes (0 UINT8 .. 12 FLOAT64; elem_type for arrays only),
/// so a reader that must reproduce the file's exact encoding can.
struct GgufValue {
  enum class Kind { U64, I64, F64, Bool, String, ArrU64, ArrI64, ArrF64, ArrBool, ArrString };
  Kind kind = Kind::U64;
  uint32_t type = 0;
  uint32_t elem_type = 0;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<uint64_t> au;
  std::vector<int64_t> ai;
  std::vector<double> af;
  std::vector<std::string> as;
};

class GgufFile {
 public:
  /// Opens and validates the file; throws arbiter::Error ("[gguf] PATH: ...") on any defect,
  /// including unsupported tensor types (supported: F32, F16, BF16 and ggml's block formats
  /// in core/quant.h).
  explicit GgufFile(const std::string& path);
  /// The same over bytes already mapped or in memory (MappedFile::from_bytes: fuzzing).
  explicit GgufFile(std::shared_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  /// general.alignment (default 32) and the absolute file offset of the tensor data.
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;

  // Typed getters: throw arbiter::Error naming the key when missing or of the wrong kind.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer kind
  double get_float(const std::string& key) const;  // float or integer kinds
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  // Getters with a default for optional keys (still throw on a wrong kind).
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;

  /// Tensors in file order; shapes are reversed ggml dims ([ne1, ne0] for matrices).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const Tensor* tensor(const std::string& name) const;
  std::shared_ptr<MappedFile> file() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

/// ggml type code <-> DType for the types arbiter reads (false / UINT32_MAX otherwise).
bool dtype_of_ggml_type(uint32_t code, DType& t);
uint32_t ggml_type_of(DType t);

/// ggml type code -> name ("F32", "Q4_K", ...; "type N" when unknown), for messages.
std::string ggml_type_name(uint32_t type);

}  // namespace arbiter
