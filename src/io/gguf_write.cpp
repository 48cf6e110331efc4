#include "io/gguf_write.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/quant.h"
#include "io/gguf.h"
#include "io/atomic_file.h"

namespace arbiter {

namespace {

// gguf_metadata_value_type and ggml_type codes (docs/gguf.md).
constexpr uint32_t kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9;
constexpr uint64_t kAlignment = 32;

template <typename T>
void put_le(std::string& out, T v) {  // the hosts we build for are little-endian
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_str(std::string& out, const std::string& s) {
  put_le<uint64_t>(out, s.size());
  out += s;
}

}  // namespace

void GgufWriter::add_kv(const std::string& key, uint32_t type, std::string bytes) {
  for (const Kv& k : kv_)
    if (k.key == key) throw Error("[gguf] metadata key '" + key + "' given twice");
  kv_.push_back({key, type, std::move(bytes)});
}

void GgufWriter::add_value(const std::string& key, const GgufValue& v) {
  std::string b;
  // One scalar of gguf type t from the widened fields GgufFile filled.
  auto scalar = [&](uint32_t t, uint64_t u, int64_t i, double f, const std::string& s) {
    switch (t) {
      case 0: case 7: put_le<uint8_t>(b, uint8_t(u)); break;
      case 1: put_le<int8_t>(b, int8_t(i)); break;
      case 2: put_le<uint16_t>(b, uint16_t(u)); break;
      case 3: put_le<int16_t>(b, int16_t(i)); break;
      case 4: put_le<uint32_t>(b, uint32_t(u)); break;
      case 5: put_le<int32_t>(b, int32_t(i)); break;
      case 6: put_le<float>(b, float(f)); break;  // GgufFile kept the float's shortest decimal
      case 8: put_str(b, s); break;
      case 10: put_le<uint64_t>(b, u); break;
      case 11: put_le<int64_t>(b, i); break;
      case 12: put_le<double>(b, f); break;
      default: throw Error("[gguf] metadata key '" + key + "' has value type " + std::to_string(t));
    }
  };
  if (v.type != kArray) {
    scalar(v.type, v.kind == GgufValue::Kind::Bool ? uint64_t(v.b) : v.u, v.i, v.f, v.s);
  } else {
    put_le<uint32_t>(b, v.elem_type);
    const size_t n = v.as.size() + v.au.size() + v.ai.size() + v.af.size();  // one of them is filled
    put_le<uint64_t>(b, n);
    for (size_t k = 0; k < n; ++k)
      scalar(v.elem_type, k < v.au.size() ? v.au[k] : 0, k < v.ai.size() ? v.ai[k] : 0, k < v.af.size() ? v.af[k] : 0,
             k < v.as.size() ? v.as[k] : std::string());
  }
  add_kv(key, v.type, std::move(b));
}

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  std::string b;
  put_str(b, v);
  add_kv(key, kString, std::move(b));
}

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  std::string b;
  put_le(b, v);
  add_kv(key, kU32, std::move(b));
}

void GgufWriter::add_f32(const std::string& key, float v) {
  std::string b;
  put_le(b, v);
  add_kv(key, kF32, std::move(b));
}

void GgufWriter::add_bool(const std::string& key, bool v) {
  add_kv(key, kBool, std::string(1, v ? '\1' : '\0'));
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::string b;
  put_le(b, kString);
  put_le<uint64_t>(b, v.size());
  for (const std::string& s : v) put_str(b, s);
  add_kv(key, kArray, std::move(b));
}

void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::string b;
  put_le(b, kI32);
  put_le<uint64_t>(b, v.size());
  for (int32_t x : v) put_le(b, x);
  add_kv(key, kArray, std::move(b));
}

void GgufWriter::add_tensor(GgufTensorEntry t) { tensors_.push_back(std::move(t)); }

void GgufWriter::write(const std::string& path) const {
  auto fail = [&](const std::string& what) { throw Error("[gguf] " + path + ": " + what); };
  // Header, metadata and tensor infos in memory first, so bad entries throw before any file.
  std::string head;
  put_le<uint32_t>(head, 0x46554747u);  // "GGUF"
  put_le<uint32_t>(head, 3);
  put_le<uint64_t>(head, tensors_.size());
  put_le<uint64_t>(head, kv_.size());
  for (const Kv& k : kv_) {
    put_str(head, k.key);
    put_le(head, k.type);
    head += k.bytes;
  }
  std::set<std::string> names;
  std::vector<uint64_t> nbytes;
  uint64_t offset = 0;
  for (const GgufTensorEntry& t : tensors_) {
    const uint32_t type = ggml_type_of(t.dtype);
    if (type == UINT32_MAX || t.dtype == DType::F64)
      fail("tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) + " (GGUF holds f32, f16, bf16 and ggml's block formats)");
    if (!names.insert(t.name).second) fail("tensor '" + t.name + "' given twice");
    if (!t.fill) fail("tensor '" + t.name + "' has no fill function");
    if (t.shape.empty() || t.shape.size() > 4) fail("tensor '" + t.name + "' must have 1 to 4 dimensions");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d <= 0) fail("tensor '" + t.name + "' has a dimension <= 0");
      numel *= d;
    }
    if (t.shape.back() % block_elems(t.dtype) != 0)
      fail(strformat("tensor '%s': rows of %lld values do not divide into %s blocks of %d", t.name.c_str(),
                     (long long)t.shape.back(), dtype_name(t.dtype), block_elems(t.dtype)));
    put_str(head, t.name);
    put_le<uint32_t>(head, uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put_le<uint64_t>(head, uint64_t(*it));  // ne0 first
    put_le(head, type);
    put_le(head, offset);
    nbytes.push_back(dtype_bytes(t.dtype, numel));
    offset += (nbytes.back() + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.append((kAlignment - head.size() % kAlignment) % kAlignment, '\0');

  AtomicFile f;
  f.open(path, "[gguf]");
  f.write(head);
  constexpr int64_t kPiece = int64_t(8) << 20;  // elements per fill call: bounded memory, whole blocks
  std::vector<uint8_t> buf;
  const char zeros[kAlignment] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensorEntry& t = tensors_[i];
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    for (int64_t b = 0; b < numel; b += kPiece) {
      const int64_t m = std::min(kPiece, numel - b);
      buf.resize(dtype_bytes(t.dtype, m));
      t.fill(b, m, buf.data());
      f.write(buf.data(), buf.size());
    }
    f.write(zeros, (kAlignment - nbytes[i] % kAlignment) % kAlignment);
  }
  f.commit();
}

}  // namespace arbiter
