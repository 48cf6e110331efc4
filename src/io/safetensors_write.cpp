#include "io/safetensors_write.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"

namespace arbiter {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("[safetensors] " + path + ": " + what);
}

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return nullptr;
  }
}

// Bytes of n elements of an entry.
size_t entry_bytes(const SafetensorsEntry& e, int64_t n) {
  if (e.int_type) return size_t(n) * (*e.int_type == StInt::U32 ? 4 : 1);
  return dtype_bytes(e.dtype, n);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps __metadata__ first and the tensors in file order, which makes the
  // header readable and the bytes a pure function of the entries.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const char* dt = e.int_type ? st_int_name(*e.int_type) : st_dtype_name(e.dtype);
    if (dt == nullptr) fail(path, "tensor '" + e.name + "' has dtype " + dtype_name(e.dtype) + " (supported: F64, F32, F16, BF16)");
    if (e.name.empty() || e.name == "__metadata__") fail(path, "bad tensor name '" + e.name + "'");
    if (!names.insert(e.name).second) fail(path, "tensor '" + e.name + "' given twice");
    if (!e.fill && e.data == nullptr) fail(path, "tensor '" + e.name + "' has neither data nor a fill function");
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) fail(path, "tensor '" + e.name + "' has a negative dimension");
      numel *= d;
    }
    const uint64_t nbytes = entry_bytes(e, numel);
    header[e.name] = {{"dtype", dt}, {"shape", e.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  // Pad with spaces (allowed by the format) so the byte buffer starts 64-byte aligned.
  while ((8 + text.size()) % 64 != 0) text.push_back(' ');

  AtomicFile f;
  f.open(path, "[safetensors]");
  auto put = [&](const void* p, size_t n) { f.write(p, n); };
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  put(len, 8);
  put(text.data(), text.size());

  // Pieces of 8 Mi elements keep memory bounded for multi-GB tensors.
  constexpr int64_t kPiece = int64_t(8) << 20;
  std::vector<uint8_t> buf;
  for (const SafetensorsEntry& e : entries) {
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    if (e.data != nullptr) {
      put(e.data, entry_bytes(e, numel));
      continue;
    }
    for (int64_t b = 0; b < numel; b += kPiece) {
      const int64_t m = std::min(kPiece, numel - b);
      buf.resize(entry_bytes(e, m));
      e.fill(b, m, buf.data());
      put(buf.data(), buf.size());
    }
  }
  f.commit();
}

}  // namespace arbiter
