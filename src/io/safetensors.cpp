// safetensors reader. File layout (huggingface/safetensors README, "Format"):
//   u64 little-endian N, then N bytes of UTF-8 JSON, then the byte buffer.
//   JSON: {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]}, ...,
//          "__metadata__": {"k": "v", ...}}; offsets are relative to the byte buffer.
// Everything the header says is checked against the file before a Tensor is made: the
// header length against the file size (and the 100 MB cap the reference implementation
// uses), the dtype, END - BEGIN == numel * element size, END within the buffer, and no two
// tensors sharing bytes. safetensors does not promise aligned data, but we need it (no
// copies at load), so a tensor not aligned to its element size is refused.
#include "io/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace arbiter {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeader = 100'000'000;  // safetensors' own MAX_HEADER_SIZE

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("[safetensors] " + path + ": " + what);
}

// Element type and size for the dtypes we run; false for the rest.
bool parse_dtype(const std::string& s, DType& t) {
  if (s == "F64") t = DType::F64;
  else if (s == "F32") t = DType::F32;
  else if (s == "F16") t = DType::F16;
  else if (s == "BF16") t = DType::BF16;
  else return false;
  return true;
}

bool parse_int_dtype(const std::string& s, StInt& t) {
  if (s == "U32") t = StInt::U32;
  else if (s == "U8") t = StInt::U8;
  else return false;
  return true;
}

// A JSON value as a non-negative integer that fits int64 (safetensors writes plain integers).
bool as_u63(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    out = uint64_t(i);
  } else {
    return false;
  }
  return out <= uint64_t(std::numeric_limits<int64_t>::max());
}

std::string brief(const json& v) { return json_brief(v); }

}  // namespace

void SafetensorsSet::add_file(std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  const uint8_t* base = file->data();
  const uint64_t size = file->size();
  if (size < 8) fail(path, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > kMaxHeader)
    fail(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > size - 8)
    fail(path, "header length " + std::to_string(n) + " runs past end of file (size " + std::to_string(size) + ")");
  const uint64_t data_begin = 8 + n;
  const uint64_t data_size = size - data_begin;

  const json header = parse_json_bounded(
      std::string_view(reinterpret_cast<const char*>(base + 8), size_t(n)), path + " (header)", "[safetensors]");
  if (!header.is_object()) fail(path, "header is not a JSON object");

  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  std::map<std::string, Tensor> added;
  std::map<std::string, IntTensor> added_int;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(path, "__metadata__ value of '" + m.key() + "' is not a string (got " + brief(m.value()) + ")");
        metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object()) fail(path, where + " is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) fail(path, where + " has no string 'dtype'");
    if (sh == v.end() || !sh->is_array()) fail(path, where + " has no array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail(path, where + " has no 'data_offsets' pair");
    Tensor t;
    t.name = name;
    const std::string dtype = dt->get<std::string>();
    StInt itype = StInt::U32;
    const bool is_int = parse_int_dtype(dtype, itype);
    if (!is_int && !parse_dtype(dtype, t.dtype))
      fail(path, where + " has dtype " + dtype + " (supported: F64, F32, F16, BF16, U8, U32)");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      uint64_t x;
      if (!as_u63(d, x)) fail(path, where + " has a bad dimension " + brief(d));
      if (x != 0 && numel > uint64_t(std::numeric_limits<int64_t>::max()) / x)
        fail(path, where + ": element count overflows");
      numel *= x;
      t.shape.push_back(int64_t(x));
    }
    const uint64_t elem = is_int ? (itype == StInt::U32 ? 4 : 1)
                                 : t.dtype == DType::F64 ? 8 : t.dtype == DType::F32 ? 4 : 2;
    if (numel > std::numeric_limits<uint64_t>::max() / elem) fail(path, where + ": byte size overflows");
    const uint64_t nbytes = numel * elem;
    uint64_t b, e;
    if (!as_u63((*off)[0], b) || !as_u63((*off)[1], e))
      fail(path, where + " has bad data_offsets " + brief(*off));
    if (b > e) fail(path, where + strformat(": data_offsets [%llu, %llu] are reversed", (unsigned long long)b,
                                            (unsigned long long)e));
    if (e > data_size)
      fail(path, where + strformat(" ends at byte %llu of the data buffer (file offset %llu), past end of file (size %llu)",
                                   (unsigned long long)e, (unsigned long long)(data_begin + e), (unsigned long long)size));
    if (e - b != nbytes)
      fail(path, where + strformat(" spans %llu bytes but %s %s needs %llu", (unsigned long long)(e - b), dtype.c_str(),
                                   brief(*sh).c_str(), (unsigned long long)nbytes));
    // Element-aligned data or nothing: the tiers read rows through typed pointers (and the
    // compiler may vectorise assuming natural alignment). Current writers align every tensor;
    // the mapping is page-aligned, so the file offset decides.
    if (nbytes != 0 && (data_begin + b) % elem != 0)
      fail(path, where + strformat(" data at file offset %llu is not aligned to its %llu-byte elements "
                                   "(re-save the file with a current safetensors)",
                                   (unsigned long long)(data_begin + b), (unsigned long long)elem));
    if (tensors_.count(name) || int_tensors_.count(name))
      fail(path, where + " also appears in an earlier file of the set");
    t.data = base + data_begin + b;
    if (is_int) {
      auto ins = added_int.emplace(name, IntTensor{name, itype, t.shape, t.data});
      spans.push_back({b, e, &ins.first->first});
      continue;
    }
    auto ins = added.emplace(name, std::move(t));
    spans.push_back({b, e, &ins.first->first});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k - 1].end > spans[k].begin)
      fail(path, "tensors '" + *spans[k - 1].name + "' and '" + *spans[k].name + "' overlap");
  for (auto& [name, t] : added) tensors_.emplace(name, std::move(t));
  for (auto& [name, t] : added_int) int_tensors_.emplace(name, std::move(t));
  files_.push_back(std::move(file));
}

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
  SafetensorsSet set;
  set.add_file(std::make_shared<MappedFile>(path, "[safetensors]"));
  return set;
}

SafetensorsSet SafetensorsSet::from_bytes(const std::string& name, std::string bytes) {
  SafetensorsSet set;
  set.add_file(MappedFile::from_bytes(name, std::move(bytes)));
  return set;
}

std::vector<std::pair<std::string, std::string>> parse_safetensors_index(const std::string& text,
                                                                         const std::string& index) {
  const json j = parse_json_bounded(text, index, "[safetensors]");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(index, "no 'weight_map' object");
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(index, "weight_map entry '" + it.key() + "' is not a file name");
    std::string f = it.value().get<std::string>();
    // Shards are plain names next to the index; anything else could read outside DIR.
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail(index, "weight_map entry '" + it.key() + "' names '" + f + "' (expected a file name in the same folder)");
    out.emplace_back(it.key(), std::move(f));
  }
  if (out.empty()) fail(index, "weight_map is empty");
  return out;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  // Same preference as transformers: the single file first, then the sharded index. exists()
  // is true for a FIFO or a directory too: those are then refused by the open, not skipped.
  if (fs::exists(single)) return open_file(single);
  if (!fs::exists(index))
    throw Error("[safetensors] " + dir + ": neither model.safetensors nor model.safetensors.index.json found");

  const auto map = parse_safetensors_index(
      read_input_file(index, "[safetensors]", kMaxInputBytes, "a safetensors index"), index);
  std::set<std::string> shards;
  for (const auto& [name, f] : map) shards.insert(f);
  SafetensorsSet set;
  for (const std::string& f : shards)  // std::set: sorted
    set.add_file(std::make_shared<MappedFile>(dir + "/" + f, "[safetensors]"));
  for (const auto& [name, f] : map) {
    const Tensor* t = set.tensor(name);
    const IntTensor* it = set.int_tensor(name);
    const MappedFile* owner = nullptr;
    for (const auto& m : set.files_)
      if (m->path() == dir + "/" + f) owner = m.get();
    auto p = static_cast<const uint8_t*>(t ? t->data : it ? it->data : nullptr);
    if (p == nullptr || owner == nullptr || p < owner->data() || p > owner->data() + owner->size())
      fail(index, "tensor '" + name + "' is not in its listed shard '" + f + "'");
  }
  return set;
}

const IntTensor* SafetensorsSet::int_tensor(const std::string& name) const {
  auto it = int_tensors_.find(name);
  return it == int_tensors_.end() ? nullptr : &it->second;
}

const char* st_int_name(StInt t) { return t == StInt::U32 ? "U32" : "U8"; }

const Tensor* SafetensorsSet::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace arbiter
