// Helpers for the io and loader tests: where the shipped models are, a tiny GGUF writer
// and a safetensors builder so tests can make files whose every byte they know.
// The writers follow the format docs directly (docs/gguf.md; safetensors README), not the
// readers under test. Header-only so tests/model can include it too.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "test_util.h"

namespace arbiter::test {

/// The project's copy (models/...) when present, else the shared copy; "" when neither.
inline std::string model_path(const std::string& rel) {
  std::string p = source_path("models/" + rel);
  if (std::filesystem::exists(p)) return p;
  return shared_path("models/" + rel);
}
inline std::string stories260k_gguf() { return model_path("stories260K/stories260K.gguf"); }
inline std::string tinystories656k_dir() { return model_path("TinyStories-656K"); }
/// The sha256 that models/SHA256SUMS (model_path's copy) lists for models/rel, or "" when it
/// lists none: a check against it then fails instead of being skipped.
inline std::string published_sha(const std::string& rel) {
  std::ifstream f(model_path("SHA256SUMS"));
  std::string line;
  while (std::getline(f, line))
    if (line.size() > 66 && line.substr(66) == "./" + rel) return line.substr(0, 64);
  return "";
}

// ---- little-endian byte appenders ---------------------------------------------------
template <typename T>
inline void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
inline void put_str(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

/// Builds a GGUF file in memory. Type codes are docs/gguf.md's gguf_type and ggml_type.
struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::string kvs;
  uint64_t n_kv = 0;
  struct T {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order: ne[0] is the contiguous dimension
    uint32_t type;
    std::string data;
  };
  std::vector<T> tensors;

  // A raw kv: key, type code, already-encoded value bytes.
  void kv_raw(const std::string& key, uint32_t type, const std::string& value) {
    put_str(kvs, key);
    put<uint32_t>(kvs, type);
    kvs += value;
    ++n_kv;
  }
  template <typename V>
  void kv(const std::string& key, uint32_t type, V v) {
    std::string b;
    put<V>(b, v);
    kv_raw(key, type, b);
  }
  void kv_u32(const std::string& k, uint32_t v) { kv(k, 4, v); }
  void kv_f32(const std::string& k, float v) { kv(k, 6, v); }
  void kv_string(const std::string& k, const std::string& v) {
    std::string b;
    put_str(b, v);
    kv_raw(k, 8, b);
  }
  void kv_string_array(const std::string& k, const std::vector<std::string>& v) {
    std::string b;
    put<uint32_t>(b, 8);
    put<uint64_t>(b, v.size());
    for (const auto& s : v) put_str(b, s);
    kv_raw(k, 9, b);
  }
  /// Re-encodes a value read from another GGUF with its original type codes.
  void kv_copy(const std::string& k, const GgufValue& v) {
    std::string b;
    auto scalar = [&](uint32_t t, uint64_t u, int64_t i, double f, const std::string& s) {
      switch (t) {
        case 0: put<uint8_t>(b, uint8_t(u)); break;
        case 1: put<int8_t>(b, int8_t(i)); break;
        case 2: put<uint16_t>(b, uint16_t(u)); break;
        case 3: put<int16_t>(b, int16_t(i)); break;
        case 4: put<uint32_t>(b, uint32_t(u)); break;
        case 5: put<int32_t>(b, int32_t(i)); break;
        case 6: put<float>(b, float(f)); break;
        case 7: put<uint8_t>(b, uint8_t(u)); break;
        case 8: put_str(b, s); break;
        case 10: put<uint64_t>(b, u); break;
        case 11: put<int64_t>(b, i); break;
        case 12: put<double>(b, f); break;
      }
    };
    if (v.type != 9) {
      scalar(v.type, v.kind == GgufValue::Kind::Bool ? uint64_t(v.b) : v.u, v.i, v.f, v.s);
    } else {
      put<uint32_t>(b, v.elem_type);
      size_t n = v.as.size() + v.au.size() + v.ai.size() + v.af.size();
      put<uint64_t>(b, n);
      for (size_t k = 0; k < n; ++k)
        scalar(v.elem_type, k < v.au.size() ? v.au[k] : 0, k < v.ai.size() ? v.ai[k] : 0,
               k < v.af.size() ? v.af[k] : 0, k < v.as.size() ? v.as[k] : std::string());
    }
    kv_raw(k, v.type, b);
  }
  void add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::string data) {
    tensors.push_back({name, std::move(ne), type, std::move(data)});
  }
  void add_f32(const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    add_tensor(name, std::move(ne), 0, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  }

  std::string build() const {
    std::string s = "GGUF";
    put<uint32_t>(s, version);
    put<uint64_t>(s, tensors.size());
    put<uint64_t>(s, n_kv);
    s += kvs;
    std::string data;
    for (const T& t : tensors) {
      put_str(s, t.name);
      put<uint32_t>(s, uint32_t(t.ne.size()));
      for (uint64_t d : t.ne) put<uint64_t>(s, d);
      put<uint32_t>(s, t.type);
      while (data.size() % alignment) data += '\0';
      put<uint64_t>(s, data.size());
      data += t.data;
    }
    while (s.size() % alignment) s += '\0';
    return s + data;
  }
};

/// A safetensors file: 8-byte little-endian header length, header JSON, data. With pad8 the
/// header is padded with spaces so the data starts 8-byte aligned (as current writers do).
inline std::string safetensors_bytes(std::string header, const std::string& data, bool pad8 = true) {
  if (pad8)
    while (header.size() % 8) header += ' ';
  std::string s;
  put<uint64_t>(s, header.size());
  return s + header + data;
}

}  // namespace arbiter::test
