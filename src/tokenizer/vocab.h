// What every BPE flavour shares: the vocabulary as read from a GGUF or a tokenizer.json
// (VocabSpec), and VocabTokenizer, which splits text on added/special tokens, adds BOS/EOS
// and decodes; the flavours (spm.cpp, byte_bpe.cpp) only encode plain text fragments and
// map one token to bytes.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace arbiter::tok {

/// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6
};

/// A token matched in the raw text before the model sees it (GGUF control/unknown/
/// user-defined tokens, HF added_tokens).
struct AddedToken {
  int32_t id = -1;
  std::string text;
  bool special = false;  // split out only when the caller asks for parse_special
  bool lstrip = false;   // absorbs the whitespace on its left (HF AddedToken.lstrip)
  bool rstrip = false;   // absorbs the whitespace on its right
};

/// When SentencePiece-style encoding puts "▁" in front of a text fragment.
enum class Prepend {
  Never,
  First,   // only the fragment at the very start of the text (HF Metaspace "first")
  Always,  // the first fragment and every fragment after an added token (llama.cpp, HF Prepend)
};

/// Everything a tokenizer is built from; filled by the GGUF and tokenizer.json readers.
struct VocabSpec {
  std::string source;               // file path, for messages
  std::string sha256;               // see Tokenizer::sha256()
  std::vector<std::string> tokens;  // id -> text as stored ("▁" for spaces / GPT-2 byte chars)
  std::vector<TokenType> types;     // id -> type (Normal where the source has no types)
  std::vector<bool> special;        // id -> dropped by decode(skip_special=true)
  std::vector<AddedToken> added;
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;

  // Merge rule: SentencePiece scores (GGUF "llama": best score first) or ranked merges
  // (tokenizer.json and GGUF "gpt2": lowest rank first). Ties go to the leftmost pair.
  bool merge_by_score = false;
  std::vector<float> scores;
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;  // a piece that is itself a token is taken whole (Llama 3)

  // SentencePiece-style only.
  Prepend prepend = Prepend::Always;
  bool prepend_only_without_space = false;  // HF Metaspace: no "▁" if the text starts with one
  bool split_on_metaspace = false;          // HF Metaspace split=true: one BPE word per "▁word"
  bool byte_fallback = true;
  bool strip_leading_space = true;  // decode drops one leading space (SentencePiece, HF Strip)

  // Byte-level only.
  PreTokenizer pre;
  bool add_prefix_space = false;  // HF ByteLevel add_prefix_space
  bool nfc = false;               // HF NFC normalizer (see byte_bpe.cpp for its limits)
};

/// A text fragment between added tokens, or one added token.
struct Fragment {
  int32_t id = -1;  // >= 0: an added token
  size_t begin = 0, end = 0;
};

class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(VocabSpec spec);

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const override { return spec_.bos; }
  int32_t eos_id() const override { return spec_.eos; }
  bool add_bos() const override { return spec_.add_bos && spec_.bos >= 0; }
  bool is_special(int32_t id) const override;
  std::string sha256() const override { return spec_.sha256; }

  /// Splits text on added tokens (leftmost, then longest match); special ones only when
  /// parse_special. Public for tests.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 protected:
  /// Encodes one plain-text fragment. at_text_start: the fragment begins the text;
  /// after_added: it follows an added token (or begins the text).
  virtual void encode_fragment(std::string_view fragment, bool at_text_start, bool after_added,
                               std::vector<int32_t>& out) const = 0;
  /// Id of an exact token text, or -1.
  int32_t find_token(std::string_view text) const;
  void check_id(int32_t id) const;

  VocabSpec spec_;

 private:
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // views into spec_.tokens
  // Added tokens bucketed by first byte, longest first.
  std::array<std::vector<int32_t>, 256> added_by_byte_;
};

/// Ranked merges as (left id, right id) -> (rank, merged id); merges whose parts or result
/// are not tokens are dropped (they can never apply to a tokenized word).
using MergeTable = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;
MergeTable build_merge_table(const VocabSpec& spec,
                             const std::unordered_map<std::string_view, int32_t>& vocab);
inline uint64_t merge_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

/// One symbol of a word being merged: bytes [begin, begin+len) of the word, its token id
/// (-1 when the text is no token), and its neighbours in the linked list (-1 at the ends).
struct Symbol {
  int32_t id;
  uint32_t begin, len;
  int32_t prev, next;
};

/// Greedy pair merging shared by both flavours: repeatedly merges the adjacent pair with the
/// highest priority (ties: leftmost), where lookup(left, right, merged_text) returns
/// {priority, merged id} or priority = -inf when the pair does not merge. Symbols that
/// were merged away get len 0.
template <class Lookup>
void merge_symbols(std::vector<Symbol>& syms, std::string_view word, Lookup lookup);

std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabSpec spec);
std::unique_ptr<Tokenizer> make_byte_bpe_tokenizer(VocabSpec spec);

}  // namespace arbiter::tok

#include "tokenizer/merge_impl.h"
