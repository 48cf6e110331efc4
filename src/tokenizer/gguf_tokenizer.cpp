// tokenizer_from_gguf: the vocabulary from GGUF metadata (tokenizer.ggml.*), following
// llama.cpp's llama_vocab::load for the two vocabulary types supported here:
//   "llama": SentencePiece BPE with scores and byte tokens (LLAMA_VOCAB_TYPE_SPM);
//   "gpt2":  byte-level BPE with ranked merges and a named pre-tokenizer (LLAMA_VOCAB_TYPE_BPE).
// Works on vocab-only GGUFs (no tensors needed).
//
// sha256(): SHA-256 over a canonical serialisation of every "tokenizer.ggml.*" key, in
// byte-wise key order (GgufFile's std::map order). Per key: u64 key length, key bytes, one
// byte with the GgufValue::Kind number, then the value with integers as 8-byte
// little-endian (unsigned kinds as u64, signed as i64), floats as the little-endian bits of
// the f64 they widen to exactly, bools as one byte 0/1, strings as u64 length + bytes, and
// arrays as u64 count + elements in the same encodings. The hash thus depends on the
// tokenizer values only, not on the integer/float widths the file used, nor on other keys
// (tokenizer.chat_template, weights).
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/gguf.h"
#include "io/sha256.h"
#include "tokenizer/vocab.h"

namespace arbiter {
namespace {

void put_u64(Sha256& h, uint64_t v) {
  uint8_t b[8];
  for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(v >> (8 * k));
  h.update(b, 8);
}
void put_f64(Sha256& h, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  put_u64(h, bits);
}
void put_str(Sha256& h, const std::string& s) {
  put_u64(h, s.size());
  h.update(s.data(), s.size());
}

std::string gguf_tokenizer_sha256(const GgufFile& g) {
  Sha256 h;
  for (const auto& [key, v] : g.metadata()) {
    if (key.rfind("tokenizer.ggml.", 0) != 0) continue;
    put_str(h, key);
    uint8_t kind = static_cast<uint8_t>(v.kind);
    h.update(&kind, 1);
    using K = GgufValue::Kind;
    switch (v.kind) {
      case K::U64:
        put_u64(h, v.u);
        break;
      case K::I64:
        put_u64(h, static_cast<uint64_t>(v.i));
        break;
      case K::F64:
        put_f64(h, v.f);
        break;
      case K::Bool: {
        uint8_t b = v.b ? 1 : 0;
        h.update(&b, 1);
        break;
      }
      case K::String:
        put_str(h, v.s);
        break;
      case K::ArrU64:
      case K::ArrBool:
        put_u64(h, v.au.size());
        for (uint64_t x : v.au) put_u64(h, x);
        break;
      case K::ArrI64:
        put_u64(h, v.ai.size());
        for (int64_t x : v.ai) put_u64(h, static_cast<uint64_t>(x));
        break;
      case K::ArrF64:
        put_u64(h, v.af.size());
        for (double x : v.af) put_f64(h, x);
        break;
      case K::ArrString:
        put_u64(h, v.as.size());
        for (const auto& s : v.as) put_str(h, s);
        break;
    }
  }
  return h.hex_digest();
}

// A special-token id key: absent gives dflt; -1 (or 0xFFFFFFFF, -1 written as a UINT32)
// means "none" and gives -1. Any other id outside the vocabulary is refused: dropping it
// would silently run the model without its BOS, or never stop at its EOS.
int32_t id_key(const GgufFile& g, const std::string& key, int32_t dflt, size_t n_tokens) {
  if (!g.has(key)) return dflt;
  const GgufValue& v = *g.find(key);
  if ((v.kind == GgufValue::Kind::I64 && v.i == -1) || (v.kind == GgufValue::Kind::U64 && v.u == 0xFFFFFFFFu))
    return -1;
  int64_t id = g.get_int(key);
  ARB_CHECK(id >= 0 && id < static_cast<int64_t>(n_tokens),
            "[tokenizer] %s: %s is %lld, outside the vocabulary of %zu tokens (expected 0 to %zu, or -1 for none)",
            g.path().c_str(), key.c_str(), (long long)id, n_tokens, n_tokens - 1);
  return static_cast<int32_t>(id);
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& g) {
  using namespace tok;
  const std::string& path = g.path();
  ARB_CHECK(g.has("tokenizer.ggml.model"),
            "[tokenizer] %s: no tokenizer.ggml.model key (the file carries no vocabulary)", path.c_str());
  const std::string model = g.get_string("tokenizer.ggml.model");
  ARB_CHECK(model == "llama" || model == "gpt2",
            "[tokenizer] %s: tokenizer model '%s' is not supported (supported: llama, gpt2)", path.c_str(),
            model.c_str());
  const bool spm = model == "llama";

  VocabSpec spec;
  spec.source = path;
  spec.tokens = g.get_string_array("tokenizer.ggml.tokens");
  const size_t n = spec.tokens.size();
  ARB_CHECK(n > 0, "[tokenizer] %s: tokenizer.ggml.tokens is empty", path.c_str());

  spec.types.assign(n, TokenType::Normal);
  if (g.has("tokenizer.ggml.token_type")) {
    std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
    ARB_CHECK(types.size() == n, "[tokenizer] %s: tokenizer.ggml.token_type has %zu entries (expected %zu)",
              path.c_str(), types.size(), n);
    for (size_t i = 0; i < n; ++i) {
      ARB_CHECK(types[i] >= 0 && types[i] <= 6,
                "[tokenizer] %s: tokenizer.ggml.token_type[%zu] is %lld (expected 0 to 6)", path.c_str(), i,
                (long long)types[i]);
      spec.types[i] = static_cast<TokenType>(types[i]);
    }
  }
  spec.special.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    TokenType t = spec.types[i];
    // llama.cpp's tokenizer_st_partition: control and unknown tokens are parsed from text
    // only on request; user-defined tokens always are.
    if (t != TokenType::Control && t != TokenType::Unknown && t != TokenType::UserDefined) continue;
    bool special = t != TokenType::UserDefined;
    spec.special[i] = special;
    spec.added.push_back({static_cast<int32_t>(i), spec.tokens[i], special, false, false});
  }

  // llama.cpp's defaults: SentencePiece vocabularies use <unk>=0, <s>=1, </s>=2.
  auto spm_default = [&](int32_t id) { return spm && size_t(id) < n ? id : -1; };
  spec.bos = id_key(g, "tokenizer.ggml.bos_token_id", spm_default(1), n);
  spec.eos = id_key(g, "tokenizer.ggml.eos_token_id", spm_default(2), n);
  spec.unk = id_key(g, "tokenizer.ggml.unknown_token_id", spm_default(0), n);
  // Not a tokenizer field, but the loader stops generation on it: checked with the others.
  id_key(g, "tokenizer.ggml.eot_token_id", -1, n);
  spec.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", spm);
  spec.add_eos = g.get_bool("tokenizer.ggml.add_eos_token", false);
  spec.sha256 = gguf_tokenizer_sha256(g);

  if (spm) {
    ARB_CHECK(g.has("tokenizer.ggml.scores"),
              "[tokenizer] %s: 'llama' vocabulary without tokenizer.ggml.scores", path.c_str());
    std::vector<double> scores = g.get_float_array("tokenizer.ggml.scores");
    ARB_CHECK(scores.size() == n, "[tokenizer] %s: tokenizer.ggml.scores has %zu entries (expected %zu)",
              path.c_str(), scores.size(), n);
    for (size_t i = 0; i < n; ++i)
      ARB_CHECK(std::isfinite(scores[i]), "[tokenizer] %s: tokenizer.ggml.scores[%zu] is %g (expected a finite number)",
                path.c_str(), i, scores[i]);
    spec.scores.assign(scores.begin(), scores.end());
    spec.merge_by_score = true;
    spec.prepend = g.get_bool("tokenizer.ggml.add_space_prefix", true) ? Prepend::Always : Prepend::Never;
    spec.strip_leading_space = spec.prepend != Prepend::Never;
    ARB_CHECK(!g.get_bool("tokenizer.ggml.remove_extra_whitespaces", false),
              "[tokenizer] %s: tokenizer.ggml.remove_extra_whitespaces is not supported", path.c_str());
    return make_spm_tokenizer(std::move(spec));
  }

  const std::string pre = g.get_string("tokenizer.ggml.pre", "default");
  ARB_CHECK(pretokenizer_for_gguf_pre(pre, spec.pre),
            "[tokenizer] %s: pre-tokenizer '%s' is not supported (supported: %s)", path.c_str(), pre.c_str(),
            supported_gguf_pre_names().c_str());
  spec.ignore_merges = gguf_pre_ignores_merges(pre);
  for (const std::string& m : g.get_string_array("tokenizer.ggml.merges")) {
    // "left right", split at the first space after the first byte (llama.cpp: find(' ', 1)),
    // so a left part may itself be a space.
    size_t sp = m.find(' ', 1);
    ARB_CHECK(sp != std::string::npos, "[tokenizer] %s: merge '%s' has no space", path.c_str(), m.c_str());
    spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  spec.strip_leading_space = false;
  return make_byte_bpe_tokenizer(std::move(spec));
}

}  // namespace arbiter
