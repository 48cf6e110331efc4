// Synthetic GGUF models for the loader tests (tests/model): tiny seeded weights of any
// supported architecture, tokenizer metadata copied from stories260K.gguf (V = 512), and
// in-place patches of one metadata value (a count or a float no writer would produce).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/io_test_util.h"

namespace arbiter::test {

struct Dims {
  int D = 32, L = 1, H = 2, Hkv = 1, Dh = 32, F = 64, V = 512;
  float theta = 1000000.0f;
};

// f32 values for a tensor with ggml dims ne (seeded, small).
inline std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 0.1f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Q8_0 blocks for rows of ne0 (multiple of 32) values: f16 scale 2^-7 (0x2000), random int8.
inline std::string q8_bytes(size_t numel, std::mt19937& rng) {
  std::string s;
  for (size_t b = 0; b < numel / 32; ++b) {
    put<uint16_t>(s, 0x2000);
    for (int j = 0; j < 32; ++j) put<int8_t>(s, int8_t(rng()));
  }
  return s;
}

// A tiny model GGUF: tokenizer metadata copied from stories260K (V = 512).
inline GgufBuilder make_gguf(const std::string& arch, const Dims& d, bool q8_matrices, bool biases, bool qk_norm,
                     bool with_output) {
  GgufFile src(stories260k_gguf());
  GgufBuilder w;
  w.kv_string("general.architecture", arch);
  const std::string p = arch + ".";
  w.kv_u32(p + "embedding_length", d.D);
  w.kv_u32(p + "block_count", d.L);
  w.kv_u32(p + "attention.head_count", d.H);
  w.kv_u32(p + "attention.head_count_kv", d.Hkv);
  w.kv_u32(p + "attention.key_length", d.Dh);
  w.kv_u32(p + "attention.value_length", d.Dh);
  w.kv_u32(p + "feed_forward_length", d.F);
  w.kv_u32(p + "context_length", 4096);
  w.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_f32(p + "rope.freq_base", d.theta);
  for (const auto& [k, v] : src.metadata())
    if (k.rfind("tokenizer.", 0) == 0) w.kv_copy(k, v);
  std::mt19937 rng(42);
  auto mat = [&](const std::string& n, uint64_t in, uint64_t out) {
    if (q8_matrices) w.add_tensor(n, {in, out}, 8, q8_bytes(in * out, rng));
    else w.add_f32(n, {in, out}, randn(in * out, rng));
  };
  auto vec = [&](const std::string& n, uint64_t len) { w.add_f32(n, {len}, randn(len, rng)); };
  const uint64_t D = d.D, Q = uint64_t(d.H) * d.Dh, K = uint64_t(d.Hkv) * d.Dh, F = d.F, V = d.V;
  w.add_f32("token_embd.weight", {D, V}, randn(D * V, rng));
  vec("output_norm.weight", D);
  if (with_output) w.add_f32("output.weight", {D, V}, randn(D * V, rng));
  for (int l = 0; l < d.L; ++l) {
    std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", D);
    mat(b + "attn_q.weight", D, Q);
    mat(b + "attn_k.weight", D, K);
    mat(b + "attn_v.weight", D, K);
    mat(b + "attn_output.weight", Q, D);
    if (biases) {
      vec(b + "attn_q.bias", Q);
      vec(b + "attn_k.bias", K);
      vec(b + "attn_v.bias", K);
    }
    if (qk_norm) {
      vec(b + "attn_q_norm.weight", d.Dh);
      vec(b + "attn_k_norm.weight", d.Dh);
    }
    vec(b + "ffn_norm.weight", D);
    mat(b + "ffn_gate.weight", D, F);
    mat(b + "ffn_up.weight", D, F);
    mat(b + "ffn_down.weight", F, D);
  }
  return w;
}

inline std::string write_gguf(const GgufBuilder& w) {
  std::string p = temp_dir("synth") + "/m.gguf";
  write_file(p, w.build());
  return p;
}


/// Overwrites the scalar value of metadata key in GGUF bytes (the value right after the key
/// and its u32 type code) with v, which must have the value's stored size.
template <typename V>
inline void patch_value(std::string& gguf, const std::string& key, V v) {
  std::string needle;
  put_str(needle, key);
  const size_t at = gguf.find(needle);
  if (at == std::string::npos) throw std::runtime_error("patch_value: no key " + key);
  std::memcpy(&gguf[at + needle.size() + 4], &v, sizeof v);
}

}  // namespace arbiter::test
