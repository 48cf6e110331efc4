// GGUF reader. Layout (docs/gguf.md in ggml-org/ggml), all little-endian:
//   u32 magic "GGUF", u32 version (2 or 3), u64 tensor_count, u64 kv_count,
//   kv_count x (string key, u32 value_type, value),
//   tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset),
//   padding to general.alignment (default 32), tensor data (offsets are relative to it).
// A string is u64 length + bytes (no terminator). Every count and length is checked
// against the bytes left in the file before anything is allocated or read, so a corrupt
// file gives an arbiter::Error and never a crash or a huge allocation.
#include "io/gguf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/quant.h"

namespace arbiter {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

namespace {

// gguf_type codes (docs/gguf.md, enum gguf_metadata_value_type).
enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12, kTypeCount = 13
};

const char* gguf_type_name(uint32_t t) {
  static const char* names[] = {"UINT8", "INT8",  "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                "BOOL",  "STRING", "ARRAY", "UINT64", "INT64",  "FLOAT64"};
  return t < kTypeCount ? names[t] : "unknown";
}

// Byte size of a fixed-size scalar type; 0 for string/array.
size_t scalar_size(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}


class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& path)
      : p_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("[gguf] " + path_ + ": " + what);
  }
  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(strformat("%s at offset %zu needs %llu bytes but only %zu remain (file size %zu)", what,
                     pos_, (unsigned long long)n, left(), size_));
  }
  template <typename T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    size_t at = pos_;
    uint64_t len = scalar<uint64_t>(what);
    if (len > left())
      fail(strformat("%s at offset %zu has length %llu but only %zu bytes remain (file size %zu)",
                     what, at, (unsigned long long)len, left(), size_));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// A float32 scalar widened to the shortest decimal that rounds back to it: converters store
// float32(config value), so 1e-5 arrives as 9.99999975e-06; the decimal is what the model
// was configured with, and float(result) is still exactly the stored value.
double f32_decimal(float x) {
  if (!std::isfinite(x)) return double(x);
  char buf[32];
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, double(x));
    double d = std::strtod(buf, nullptr);
    if (float(d) == x) return d;
  }
  return double(x);
}

// Reads one scalar of type t into v (widened); t must be a scalar type.
void read_scalar(Reader& r, uint32_t t, GgufValue& v, const std::string& key) {
  switch (t) {
    case kU8: v.kind = GgufValue::Kind::U64; v.u = r.scalar<uint8_t>("value"); return;
    case kU16: v.kind = GgufValue::Kind::U64; v.u = r.scalar<uint16_t>("value"); return;
    case kU32: v.kind = GgufValue::Kind::U64; v.u = r.scalar<uint32_t>("value"); return;
    case kU64: v.kind = GgufValue::Kind::U64; v.u = r.scalar<uint64_t>("value"); return;
    case kI8: v.kind = GgufValue::Kind::I64; v.i = r.scalar<int8_t>("value"); return;
    case kI16: v.kind = GgufValue::Kind::I64; v.i = r.scalar<int16_t>("value"); return;
    case kI32: v.kind = GgufValue::Kind::I64; v.i = r.scalar<int32_t>("value"); return;
    case kI64: v.kind = GgufValue::Kind::I64; v.i = r.scalar<int64_t>("value"); return;
    case kF32: v.kind = GgufValue::Kind::F64; v.f = f32_decimal(r.scalar<float>("value")); return;
    case kF64: v.kind = GgufValue::Kind::F64; v.f = r.scalar<double>("value"); return;
    case kBool: {
      size_t at = r.pos();
      uint8_t b = r.scalar<uint8_t>("value");
      if (b > 1) r.fail(strformat("key '%s': bool at offset %zu is %u (expected 0 or 1)", key.c_str(), at, b));
      v.kind = GgufValue::Kind::Bool;
      v.b = b != 0;
      return;
    }
    case kString: v.kind = GgufValue::Kind::String; v.s = r.str("string value"); return;
    default: break;
  }
  r.fail(strformat("key '%s': unknown value type %u", key.c_str(), t));
}

void read_array(Reader& r, GgufValue& v, const std::string& key) {
  size_t at = r.pos();
  uint32_t et = r.scalar<uint32_t>("array element type");
  uint64_t n = r.scalar<uint64_t>("array length");
  v.elem_type = et;
  if (et == kArray)
    r.fail(strformat("key '%s': arrays of arrays are not supported (array at offset %zu)", key.c_str(), at));
  if (et >= kTypeCount)
    r.fail(strformat("key '%s': array at offset %zu has unknown element type %u", key.c_str(), at, et));
  // Every element takes at least min_bytes, so n is bounded by the bytes left.
  size_t min_bytes = et == kString ? 8 : scalar_size(et);
  if (n > r.left() / min_bytes)
    r.fail(strformat("key '%s': array at offset %zu has %llu elements of %s, more than the %zu bytes left can hold",
                     key.c_str(), at, (unsigned long long)n, gguf_type_name(et), r.left()));
  GgufValue e;
  switch (et) {
    case kString:
      v.kind = GgufValue::Kind::ArrString;
      v.as.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.as.push_back(r.str("string array element"));
      return;
    case kBool:
      v.kind = GgufValue::Kind::ArrBool;
      v.au.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        read_scalar(r, et, e, key);
        v.au.push_back(e.b ? 1 : 0);
      }
      return;
    case kF32: case kF64:
      v.kind = GgufValue::Kind::ArrF64;
      v.af.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        read_scalar(r, et, e, key);
        v.af.push_back(e.f);
      }
      return;
    case kU8: case kU16: case kU32: case kU64:
      v.kind = GgufValue::Kind::ArrU64;
      v.au.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        read_scalar(r, et, e, key);
        v.au.push_back(e.u);
      }
      return;
    default:
      v.kind = GgufValue::Kind::ArrI64;
      v.ai.reserve(n);
      for (uint64_t k = 0; k < n; ++k) {
        read_scalar(r, et, e, key);
        v.ai.push_back(e.i);
      }
      return;
  }
}

const char* kind_name(GgufValue::Kind k) {
  switch (k) {
    case GgufValue::Kind::U64: return "unsigned integer";
    case GgufValue::Kind::I64: return "signed integer";
    case GgufValue::Kind::F64: return "float";
    case GgufValue::Kind::Bool: return "bool";
    case GgufValue::Kind::String: return "string";
    case GgufValue::Kind::ArrU64: return "array of unsigned integers";
    case GgufValue::Kind::ArrI64: return "array of signed integers";
    case GgufValue::Kind::ArrF64: return "array of floats";
    case GgufValue::Kind::ArrBool: return "array of bools";
    case GgufValue::Kind::ArrString: return "array of strings";
  }
  return "?";
}

}  // namespace

namespace {

// ggml.h enum ggml_type codes of the types arbiter reads, and the list refusals print.
struct GgmlType {
  uint32_t code;
  DType dtype;
};
constexpr GgmlType kGgmlTypes[] = {
    {0, DType::F32},     {1, DType::F16},     {30, DType::BF16},   {8, DType::Q8_0},   {2, DType::Q4_0},
    {3, DType::Q4_1},    {6, DType::Q5_0},    {7, DType::Q5_1},    {10, DType::Q2_K},  {11, DType::Q3_K},
    {12, DType::Q4_K},   {13, DType::Q5_K},   {14, DType::Q6_K},   {20, DType::IQ4_NL}, {23, DType::IQ4_XS},
    {39, DType::MXFP4}};
constexpr const char* kSupportedGgmlTypes =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4";

}  // namespace

bool dtype_of_ggml_type(uint32_t code, DType& t) {
  for (const GgmlType& g : kGgmlTypes)
    if (g.code == code) {
      t = g.dtype;
      return true;
    }
  return false;
}

uint32_t ggml_type_of(DType t) {
  for (const GgmlType& g : kGgmlTypes)
    if (g.dtype == t) return g.code;
  return UINT32_MAX;
}

std::string ggml_type_name(uint32_t type) {
  // ggml.h enum ggml_type; gaps are types removed from ggml.
  static const char* names[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "type 4", "type 5",
                                "Q5_0",    "Q5_1",   "Q8_0",    "Q8_1",  "Q2_K",   "Q3_K",
                                "Q4_K",    "Q5_K",   "Q6_K",    "Q8_K",  "IQ2_XXS", "IQ2_XS",
                                "IQ3_XXS", "IQ1_S",  "IQ4_NL",  "IQ3_S", "IQ2_S",  "IQ4_XS",
                                "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M",
                                "BF16",    "type 31", "type 32", "type 33", "TQ1_0", "TQ2_0",
                                "type 36", "type 37", "type 38", "MXFP4"};
  if (type < sizeof(names) / sizeof(names[0])) return names[type];
  return "type " + std::to_string(type);
}

GgufFile::GgufFile(const std::string& path) : GgufFile(std::make_shared<MappedFile>(path, "[gguf]")) {}

GgufFile::GgufFile(std::shared_ptr<MappedFile> file) : file_(std::move(file)) {
  const uint8_t* base = file_->data();
  const size_t size = file_->size();
  const std::string& path = file_->path();
  Reader r(base, size, path);

  // Header.
  r.need(4, "magic");
  if (std::memcmp(base, "GGUF", 4) != 0) r.fail("not a GGUF file (magic is not 'GGUF')");
  r.scalar<uint32_t>("magic");
  version_ = r.scalar<uint32_t>("version");
  if (version_ == 1) r.fail("GGUF version 1 is not supported (expected 2 or 3)");
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0 && version_ != 0)
      r.fail(strformat("version field reads %u: a big-endian GGUF? (only little-endian v2/v3 supported)", version_));
    r.fail(strformat("unsupported GGUF version %u (expected 2 or 3)", version_));
  }
  uint64_t n_tensors = r.scalar<uint64_t>("tensor count");
  uint64_t n_kv = r.scalar<uint64_t>("kv count");
  // Smallest kv: empty key (8) + type (4) + a 1-byte value. Smallest tensor info:
  // empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  if (n_kv > r.left() / 13)
    r.fail(strformat("kv count %llu cannot fit in the %zu bytes after the header", (unsigned long long)n_kv, r.left()));
  if (n_tensors > r.left() / 32)
    r.fail(strformat("tensor count %llu cannot fit in the %zu bytes after the header",
                     (unsigned long long)n_tensors, r.left()));

  // Metadata.
  for (uint64_t k = 0; k < n_kv; ++k) {
    size_t at = r.pos();
    std::string key = r.str("metadata key");
    if (kv_.count(key)) r.fail(strformat("duplicate metadata key '%s' at offset %zu", key.c_str(), at));
    GgufValue v;
    v.type = r.scalar<uint32_t>("value type");
    if (v.type == kArray) {
      read_array(r, v, key);
    } else {
      read_scalar(r, v.type, v, key);
    }
    if (key == "general.alignment") {
      // The spec types general.alignment as uint32 and requires a power of two.
      if (v.type != kU32)
        r.fail(strformat("general.alignment has type %s (expected UINT32)", gguf_type_name(v.type)));
      if (v.u == 0 || (v.u & (v.u - 1)) != 0)
        r.fail(strformat("general.alignment is %llu (expected a power of two)", (unsigned long long)v.u));
      alignment_ = v.u;
    }
    kv_.emplace(std::move(key), std::move(v));
  }

  // Tensor infos.
  struct Info {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
    uint64_t offset, nbytes;
  };
  std::vector<Info> infos;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    Info info;
    size_t at = r.pos();
    info.name = r.str("tensor name");
    if (tensor_index_.count(info.name)) r.fail(strformat("duplicate tensor '%s' at offset %zu", info.name.c_str(), at));
    const char* nm = info.name.c_str();
    uint32_t n_dims = r.scalar<uint32_t>("tensor n_dims");
    if (n_dims < 1 || n_dims > 4)
      r.fail(strformat("tensor '%s' at offset %zu has %u dimensions (expected 1 to 4)", nm, at, n_dims));
    std::vector<uint64_t> ne(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = r.scalar<uint64_t>("tensor dimension");
      if (ne[d] == 0 || ne[d] > uint64_t(std::numeric_limits<int64_t>::max()))
        r.fail(strformat("tensor '%s': dimension %u is %llu (expected 1 to 2^63-1)", nm, d, (unsigned long long)ne[d]));
      if (numel > uint64_t(std::numeric_limits<int64_t>::max()) / ne[d])
        r.fail(strformat("tensor '%s': element count overflows", nm));
      numel *= ne[d];
    }
    uint32_t type = r.scalar<uint32_t>("tensor type");
    if (!dtype_of_ggml_type(type, info.dtype))
      r.fail(strformat("tensor '%s' has ggml type %s (%u); supported: %s", nm, ggml_type_name(type).c_str(), type,
                       kSupportedGgmlTypes));
    const int be = block_elems(info.dtype);
    if (ne[0] % be != 0)
      r.fail(strformat("tensor '%s': %s row length %llu is not a multiple of its block of %d", nm,
                       ggml_type_name(type).c_str(), (unsigned long long)ne[0], be));
    if (numel / be > std::numeric_limits<uint64_t>::max() / block_bytes(info.dtype))
      r.fail(strformat("tensor '%s': byte size overflows", nm));
    info.nbytes = numel / be * block_bytes(info.dtype);
    info.offset = r.scalar<uint64_t>("tensor offset");
    if (info.offset % alignment_ != 0)
      r.fail(strformat("tensor '%s': data offset %llu is not a multiple of the alignment %llu", nm,
                       (unsigned long long)info.offset, (unsigned long long)alignment_));
    // Our shape is ggml's ne reversed: ne0 (contiguous) is the last, i.e. [rows, cols].
    for (uint32_t d = n_dims; d-- > 0;) info.shape.push_back(int64_t(ne[d]));
    tensor_index_[info.name] = infos.size();
    infos.push_back(std::move(info));
  }

  // Data section starts at the next multiple of the alignment.
  uint64_t end_infos = r.pos();
  uint64_t pad = (alignment_ - end_infos % alignment_) % alignment_;
  data_offset_ = end_infos + pad;
  if (!infos.empty() && data_offset_ > size)
    r.fail(strformat("tensor data would start at offset %llu, past the end of the file (size %zu)",
                     (unsigned long long)data_offset_, size));
  const uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;
  for (const Info& info : infos) {
    if (info.offset > data_size || info.nbytes > data_size - info.offset)
      r.fail(strformat("tensor '%s' (%llu bytes at data offset %llu, file offset %llu) runs past end of file (size %zu)",
                       info.name.c_str(), (unsigned long long)info.nbytes, (unsigned long long)info.offset,
                       (unsigned long long)(data_offset_ + info.offset), size));
  }
  // general.alignment may legally be 1 or 2; views must still be element-aligned because
  // the tiers read them through typed pointers (Q8_0 blocks hold a 2-byte scale).
  for (const Info& info : infos) {
    uint64_t need = info.dtype == DType::F32 ? 4 : info.dtype == DType::MXFP4 ? 1 : 2;
    if ((data_offset_ + info.offset) % need != 0)
      r.fail(strformat("tensor '%s' at file offset %llu is not aligned to %llu bytes", info.name.c_str(),
                       (unsigned long long)(data_offset_ + info.offset), (unsigned long long)need));
  }
  // Overlapping tensors mean a corrupt offset table (a writer never shares bytes).
  std::vector<const Info*> by_offset;
  for (const Info& info : infos) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Info* a, const Info* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const Info* a = by_offset[k - 1];
    const Info* b = by_offset[k];
    if (a->offset + a->nbytes > b->offset)
      r.fail(strformat("tensors '%s' and '%s' overlap (data offsets %llu+%llu and %llu)", a->name.c_str(),
                       b->name.c_str(), (unsigned long long)a->offset, (unsigned long long)a->nbytes,
                       (unsigned long long)b->offset));
  }
  for (Info& info : infos) {
    Tensor t;
    t.name = std::move(info.name);
    t.dtype = info.dtype;
    t.shape = std::move(info.shape);
    t.data = base + data_offset_ + info.offset;
    tensors_.push_back(std::move(t));
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const Tensor* GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void wrong_kind(const std::string& path, const std::string& key, GgufValue::Kind got,
                             const char* expected) {
  throw Error("[gguf] " + path + ": key '" + key + "' is " + kind_name(got) + " (expected " + expected + ")");
}
const GgufValue& need_key(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) throw Error("[gguf] " + f.path() + ": missing metadata key '" + key + "'");
  return *v;
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  if (v.kind != GgufValue::Kind::String) wrong_kind(path(), key, v.kind, "string");
  return v.s;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  if (v.kind == GgufValue::Kind::I64) return v.i;
  if (v.kind == GgufValue::Kind::U64) {
    if (v.u > uint64_t(std::numeric_limits<int64_t>::max()))
      throw Error(strformat("[gguf] %s: key '%s' = %llu does not fit a signed 64-bit integer", path().c_str(),
                            key.c_str(), (unsigned long long)v.u));
    return int64_t(v.u);
  }
  wrong_kind(path(), key, v.kind, "integer");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  switch (v.kind) {
    case GgufValue::Kind::F64: return v.f;
    case GgufValue::Kind::I64: return double(v.i);
    case GgufValue::Kind::U64: return double(v.u);
    default: wrong_kind(path(), key, v.kind, "number");
  }
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  if (v.kind != GgufValue::Kind::Bool) wrong_kind(path(), key, v.kind, "bool");
  return v.b;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  if (v.kind != GgufValue::Kind::ArrString) wrong_kind(path(), key, v.kind, "array of strings");
  return v.as;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  switch (v.kind) {
    case GgufValue::Kind::ArrF64: return v.af;
    case GgufValue::Kind::ArrI64: return std::vector<double>(v.ai.begin(), v.ai.end());
    case GgufValue::Kind::ArrU64: return std::vector<double>(v.au.begin(), v.au.end());
    default: wrong_kind(path(), key, v.kind, "array of numbers");
  }
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = need_key(*this, key);
  if (v.kind == GgufValue::Kind::ArrI64) return v.ai;
  if (v.kind == GgufValue::Kind::ArrU64) {
    std::vector<int64_t> out;
    out.reserve(v.au.size());
    for (uint64_t x : v.au) {
      if (x > uint64_t(std::numeric_limits<int64_t>::max()))
        throw Error("[gguf] " + path() + ": key '" + key + "' holds a value that does not fit a signed 64-bit integer");
      out.push_back(int64_t(x));
    }
    return out;
  }
  wrong_kind(path(), key, v.kind, "array of integers");
}

int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const { return has(key) ? get_int(key) : dflt; }
double GgufFile::get_float(const std::string& key, double dflt) const { return has(key) ? get_float(key) : dflt; }
bool GgufFile::get_bool(const std::string& key, bool dflt) const { return has(key) ? get_bool(key) : dflt; }
std::string GgufFile::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}

}  // namespace arbiter
