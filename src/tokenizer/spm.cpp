// SentencePiece-style BPE with byte fallback (Llama 1/2, Phi-3, TinyStories, stories260K).
// Text: "▁" in front of a fragment (the dummy prefix), spaces -> "▁", split into UTF-8
// characters, then greedy pair merging:
//   - GGUF "llama" vocabularies carry scores: the pair whose concatenation is a token with
//     the highest score merges first (SentencePiece bpe_model.cc, llama.cpp llm_tokenizer_spm);
//   - tokenizer.json BPE carries ranked merges: lowest rank first (HF tokenizers' BPE model).
// Characters that end up as no token become their UTF-8 bytes as <0xXX> tokens, else unk.
#include <array>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace arbiter::tok {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
    byte_ids_.fill(-1);
    token_byte_.assign(spec_.tokens.size(), -1);
    for (size_t i = 0; i < spec_.tokens.size(); ++i) {
      const std::string& t = spec_.tokens[i];
      unsigned v = 0;
      if (spec_.types[i] == TokenType::Byte && t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &v) == 1 &&
          v < 256) {
        byte_ids_[v] = static_cast<int32_t>(i);
        token_byte_[i] = static_cast<int16_t>(v);
      }
    }
    if (spec_.merge_by_score) {
      ARB_CHECK(spec_.scores.size() == spec_.tokens.size(), "[tokenizer] %s: %zu scores for %zu tokens",
                spec_.source.c_str(), spec_.scores.size(), spec_.tokens.size());
      // SentencePiece merges only into normal and user-defined pieces: control, unknown and
      // byte pieces never come out of a merge (typing "<s>" gives '<' 's' '>' pieces).
      for (size_t i = 0; i < spec_.tokens.size(); ++i) {
        TokenType t = spec_.types[i];
        if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Byte) continue;
        pieces_.emplace(spec_.tokens[i], static_cast<int32_t>(i));
      }
    } else {
      std::unordered_map<std::string_view, int32_t> vocab;
      for (size_t i = 0; i < spec_.tokens.size(); ++i)
        vocab.emplace(spec_.tokens[i], static_cast<int32_t>(i));
      merges_ = build_merge_table(spec_, vocab);
    }
  }

  std::string token_bytes(int32_t id) const override {
    check_id(id);
    if (token_byte_[id] >= 0) return std::string(1, static_cast<char>(token_byte_[id]));
    const std::string& t = spec_.tokens[id];
    if (spec_.special[id]) return t;
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, kMetaspace.size(), kMetaspace) == 0) {
        out += ' ';
        i += kMetaspace.size();
      } else {
        out += t[i++];
      }
    }
    return out;
  }

  std::string kind() const override { return "spm-bpe"; }
  bool strips_leading_space() const override { return spec_.strip_leading_space; }

 protected:
  void encode_fragment(std::string_view frag, bool at_text_start, bool after_added,
                       std::vector<int32_t>& out) const override {
    if (frag.empty()) return;
    bool prefix = spec_.prepend == Prepend::Always  ? after_added
                  : spec_.prepend == Prepend::First ? at_text_start
                                                    : false;
    if (spec_.prepend_only_without_space && frag[0] == ' ') prefix = false;
    std::string norm;
    norm.reserve(frag.size() + 8);
    if (prefix) norm += kMetaspace;
    for (char c : frag) {
      if (c == ' ')
        norm += kMetaspace;
      else
        norm += c;
    }
    if (!spec_.split_on_metaspace) {
      encode_word(norm, out);
      return;
    }
    // HF Metaspace split=true: words start at each "▁" (MergedWithNext).
    size_t start = 0;
    for (size_t i = 1; i < norm.size(); ++i)
      if (norm.compare(i, kMetaspace.size(), kMetaspace) == 0) {
        encode_word(std::string_view(norm).substr(start, i - start), out);
        start = i;
      }
    encode_word(std::string_view(norm).substr(start), out);
  }

 private:
  void push_bytes(std::string_view s, std::vector<int32_t>& out) const {
    for (char c : s) {
      int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id < 0) id = spec_.unk;
      ARB_CHECK(id >= 0, "[tokenizer] %s: byte 0x%02X has no token and there is no unk token",
                spec_.source.c_str(), static_cast<uint8_t>(c));
      out.push_back(id);
    }
  }

  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    std::vector<Symbol> syms;
    syms.reserve(word.size());
    auto add = [&](int32_t id, size_t b, size_t n) {
      int32_t k = static_cast<int32_t>(syms.size());
      syms.push_back({id, static_cast<uint32_t>(b), static_cast<uint32_t>(n), k - 1, -1});
      if (k > 0) syms[k - 1].next = k;
    };
    for (size_t i = 0; i < word.size();) {
      size_t n = std::min(utf8_lead_len(static_cast<uint8_t>(word[i])), word.size() - i);
      std::string_view ch = word.substr(i, n);
      if (spec_.merge_by_score) {
        auto it = pieces_.find(ch);
        add(it == pieces_.end() ? -1 : it->second, i, n);  // unknown chars fall back at the end
      } else {
        // HF BPE: an unknown character becomes its byte tokens right away (they may merge),
        // else unk, with consecutive unks fused.
        int32_t id = find_token(ch);
        if (id >= 0) {
          add(id, i, n);
        } else if (spec_.byte_fallback && all_bytes_known(ch)) {
          for (size_t k = 0; k < n; ++k) add(byte_ids_[static_cast<uint8_t>(ch[k])], i + k, 1);
        } else {
          ARB_CHECK(spec_.unk >= 0, "[tokenizer] %s: no token for '%.*s' and no unk token",
                    spec_.source.c_str(), static_cast<int>(n), ch.data());
          if (!syms.empty() && syms.back().id == spec_.unk && syms.back().begin + syms.back().len == i)
            syms.back().len += static_cast<uint32_t>(n);
          else
            add(spec_.unk, i, n);
        }
      }
      i += n;
    }
    if (spec_.merge_by_score) {
      merge_symbols(syms, word, [&](const Symbol&, const Symbol&, std::string_view merged) {
        auto it = pieces_.find(merged);
        if (it == pieces_.end()) return std::make_pair(-std::numeric_limits<double>::infinity(), int32_t{-1});
        return std::make_pair(static_cast<double>(spec_.scores[it->second]), it->second);
      });
    } else {
      merge_symbols(syms, word, [&](const Symbol& a, const Symbol& b, std::string_view) {
        auto it = (a.id < 0 || b.id < 0) ? merges_.end() : merges_.find(merge_key(a.id, b.id));
        if (it == merges_.end()) return std::make_pair(-std::numeric_limits<double>::infinity(), int32_t{-1});
        return std::make_pair(-static_cast<double>(it->second.first), it->second.second);
      });
    }
    for (int32_t k = syms.empty() ? -1 : 0; k >= 0; k = syms[k].next) {
      const Symbol& s = syms[k];
      if (s.id >= 0)
        out.push_back(s.id);
      else
        push_bytes(word.substr(s.begin, s.len), out);
    }
  }

  bool all_bytes_known(std::string_view s) const {
    for (char c : s)
      if (byte_ids_[static_cast<uint8_t>(c)] < 0) return false;
    return true;
  }

  std::unordered_map<std::string_view, int32_t> pieces_;  // score mode: mergeable pieces
  MergeTable merges_;                                     // rank mode
  std::array<int32_t, 256> byte_ids_;                     // byte -> <0xXX> token
  std::vector<int16_t> token_byte_;                       // token -> its byte, -1 for other tokens
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabSpec spec) {
  return std::make_unique<SpmTokenizer>(std::move(spec));
}

}  // namespace arbiter::tok
