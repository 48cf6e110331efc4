#include "model/validate.h"

#include <cmath>

#include "core/error.h"
#include "core/quant.h"
#include "model/model.h"

namespace arbiter {

namespace {

// The fields checked, and their key in each format (GGUF keys get the "<arch>." prefix).
enum class Key { Layers, Dim, Heads, KvHeads, HeadDim, Ffn, Vocab, MaxPos, Eps, Theta, Scaling, Window };

std::string key_name(Key k, const ModelConfig& c, bool gguf) {
  struct Names {
    const char *gguf, *hf;
  };
  static const Names names[] = {
      {"block_count", "num_hidden_layers"},
      {"embedding_length", "hidden_size"},
      {"attention.head_count", "num_attention_heads"},
      {"attention.head_count_kv", "num_key_value_heads"},
      {"attention.key_length", "head_dim"},
      {"feed_forward_length", "intermediate_size"},
      {"", "vocab_size"},
      {"context_length", "max_position_embeddings"},
      {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
      {"rope.freq_base", "rope_theta"},
      {"rope.scaling.factor", "rope_scaling.factor"},
      {"attention.sliding_window", "sliding_window"},
  };
  const Names& n = names[int(k)];
  if (!gguf) return n.hf;
  // A GGUF's vocabulary size is the length of its token list (or the embedding's rows).
  if (k == Key::Vocab) return "tokenizer.ggml.tokens (vocabulary size)";
  return arch_of(c.arch).gguf_arch(c) + "." + n.gguf;  // llama.cpp's prefix ("qwen3moe.")
}

[[noreturn]] void refuse(const ConfigSource& src, const ModelConfig& c, Key k, const std::string& what) {
  throw Error("[loader] " + src.path + ": " + key_name(k, c, src.gguf) + " " + what);
}

std::string num(double v) { return strformat("%.17g", v); }

// Non-finite elements of a stored tensor: count, and the index of the first (-1: none).
// Only exponent bits are looked at, so the scan runs at memory speed.
template <class U>
void scan_bits(const void* data, int64_t n, U exp_mask, int64_t& count, int64_t& first) {
  const U* p = static_cast<const U*>(data);
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & exp_mask) == exp_mask) {
      if (count++ == 0) first = i;
    }
}

void count_nonfinite(const Tensor& t, int64_t& count, int64_t& first) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::F64: scan_bits<uint64_t>(t.data, n, 0x7FF0000000000000ull, count, first); return;
    case DType::F32: scan_bits<uint32_t>(t.data, n, 0x7F800000u, count, first); return;
    case DType::BF16: scan_bits<uint16_t>(t.data, n, uint16_t(0x7F80), count, first); return;
    case DType::F16: scan_bits<uint16_t>(t.data, n, uint16_t(0x7C00), count, first); return;
    default: {
      // The quants are always finite; each block's f16 scales may not be.
      const auto* b = static_cast<const uint8_t*>(t.data);
      const int be = block_elems(t.dtype);
      for (int64_t i = 0; i < n / be; ++i)
        if (!block_scales_finite(t.dtype, b + i * block_bytes(t.dtype))) {
          if (count == 0) first = i * be;
          count += be;
        }
      return;
    }
  }
}

}  // namespace

void validate_config(const ModelConfig& c, const ConfigSource& src) {
  auto positive = [&](Key k, int64_t v) {
    if (v < 1) refuse(src, c, k, "is " + std::to_string(v) + " (expected >= 1)");
  };
  positive(Key::Layers, c.n_layer);
  positive(Key::Dim, c.d_model);
  positive(Key::Heads, c.n_head);
  positive(Key::KvHeads, c.n_head_kv);
  positive(Key::HeadDim, c.head_dim);
  positive(Key::Ffn, c.d_ff);
  positive(Key::Vocab, c.vocab);
  positive(Key::MaxPos, c.max_pos);
  if (c.n_head % c.n_head_kv != 0)
    refuse(src, c, Key::KvHeads,
           strformat("%d does not divide the %d attention heads", c.n_head_kv, c.n_head));
  if (c.head_dim % 2 != 0)
    refuse(src, c, Key::HeadDim, strformat("is %d (expected an even size: RoPE rotates pairs)", c.head_dim));
  if (c.sliding_window < 0) refuse(src, c, Key::Window, "is " + std::to_string(c.sliding_window) + " (expected >= 0)");

  // Every layer holds at least one tensor in any family: the bound that keeps the tensor list
  // the architecture builds for c (and everything sized from it) within what the file holds.
  // The binder then checks each tensor's shape against the file.
  if (uint64_t(c.n_layer) > src.n_tensors)
    refuse(src, c, Key::Layers,
           strformat("is %d but the weights hold %llu tensors", c.n_layer, (unsigned long long)src.n_tensors));

  if (!std::isfinite(c.norm_eps) || !(c.norm_eps > 0 && c.norm_eps < 1))
    refuse(src, c, Key::Eps, "is " + num(c.norm_eps) + " (expected a finite number in (0, 1))");
  if (!std::isfinite(c.rope.theta) || !(c.rope.theta > 1))
    refuse(src, c, Key::Theta, "is " + num(c.rope.theta) + " (expected a finite number > 1)");
  const RopeScaling& s = c.rope.scaling;
  if (s.kind != RopeScaling::Kind::None) {
    if (!std::isfinite(s.factor) || !(s.factor > 0))
      refuse(src, c, Key::Scaling, "is " + num(s.factor) + " (expected a finite number > 0)");
    if (s.kind == RopeScaling::Kind::Llama3 &&
        (!std::isfinite(s.low_freq_factor) || !std::isfinite(s.high_freq_factor) || !(s.low_freq_factor > 0) ||
         !(s.high_freq_factor > s.low_freq_factor) || s.original_max_pos < 1))
      refuse(src, c, Key::Scaling,
             strformat("%g with llama3 low_freq_factor %g, high_freq_factor %g, original context %lld (expected finite "
                       "0 < low < high and a context >= 1)",
                       s.factor, s.low_freq_factor, s.high_freq_factor, (long long)s.original_max_pos));
  }
}

void validate_loaded(const Model& m) {
  const ModelConfig& c = m.config;
  const Tokenizer& tok = *m.tokenizer;
  if (tok.vocab_size() > c.vocab)
    throw Error(strformat("[loader] %s: the tokenizer has %d tokens but the embedding has %d rows (vocab_size)",
                          m.path.c_str(), tok.vocab_size(), c.vocab));
  for (int32_t id : m.eos_ids)
    if (id < 0 || id >= c.vocab)
      throw Error(strformat("[loader] %s: eos_token_id %d is outside the vocabulary of %d rows", m.path.c_str(), id,
                            c.vocab));
  m.weights.for_each_distinct([&](const TensorSpec&, const Tensor& t) {
    int64_t count = 0, first = -1;
    count_nonfinite(t, count, first);
    if (count > 0)
      throw Error(strformat("[loader] %s: tensor '%s' holds %lld NaN/Inf values (first at element %lld)",
                            m.path.c_str(), t.name.c_str(), (long long)count, (long long)first));
  });
}

std::unique_ptr<Model> validated(std::unique_ptr<Model> m) {
  validate_loaded(*m);
  return m;
}

}  // namespace arbiter
