// Tokenizer interface: byte-level BPE (GPT-2 / Llama-3 / Qwen2 styles) and
// SentencePiece-style BPE with byte fallback (Llama 2, TinyStories), built from a GGUF
// vocabulary or an HF tokenizer.json. Encoding is byte-exact with the reference tokenizers.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace arbiter {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Text -> ids. add_bos follows the model's policy when the caller asks for specials;
  /// parse_special turns special-token text (e.g. "<|endoftext|>") into its id.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;
  /// The raw bytes of one token as it appears in decoded text (byte-fallback tokens give
  /// single bytes, possibly an incomplete UTF-8 sequence; "▁" becomes a space).
  virtual std::string token_bytes(int32_t id) const = 0;
  /// Full decode of a sequence (applies the decoder's rules, e.g. SentencePiece's
  /// leading-space strip); skip_special drops control tokens.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;  // -1 when none
  virtual bool add_bos() const = 0;    // whether encode(..., add_special=true) prepends BOS
  virtual bool is_special(int32_t id) const = 0;
  /// "spm-bpe" or "byte-bpe" (plus pre-tokenizer name), for info and trace headers.
  virtual std::string kind() const = 0;
  /// Whether decoding drops one leading space from the text (SentencePiece's dummy-prefix
  /// space; HF decoder Strip(" ", 1, 0)). StreamDecoder applies the same rule.
  virtual bool strips_leading_space() const { return false; }
  /// sha256 of the source the vocabulary came from (tokenizer.json bytes, or the GGUF
  /// tokenizer.* metadata serialised canonically).
  virtual std::string sha256() const = 0;
};

/// Streaming-safe decode: feed ids one at a time, get only complete UTF-8 text back.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  /// Returns the text that became complete with this token (may be empty).
  std::string push(int32_t id);
  /// Whatever is still pending (invalid trailing bytes are replaced with U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool first_ = true;
};

/// From GGUF metadata (tokenizer.ggml.model "llama" or "gpt2"); other models are refused
/// with an Error naming the file and the model type.
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf);
/// From an HF model directory (tokenizer.json, tokenizer_config.json).
std::unique_ptr<Tokenizer> tokenizer_from_hf_dir(const std::string& dir);
/// The same from the two files' text (no config_json when there is none); the paths only
/// name the files in errors. Every id is checked before a table is sized from it: ids are
/// integers in [0, 2^31), unique, and fewer than tokenizer_json's byte count.
std::unique_ptr<Tokenizer> tokenizer_from_hf_json(const std::string& tokenizer_json, const std::string& json_path,
                                                  const std::optional<std::string>& config_json,
                                                  const std::string& config_path);

}  // namespace arbiter
