// Byte-level BPE (GPT-2, GPT-NeoX/MPT, Falcon, StarCoder, DeepSeek, Llama 3, Qwen2):
// regex pre-tokenization, each piece's bytes mapped to printable characters with GPT-2's
// bytes_to_unicode table (OpenAI encoder.py), then ranked merges within the piece.
#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace arbiter::tok {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
// themselves; the other 68 bytes map, in byte order, to U+0100, U+0101, ...
struct ByteMap {
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 0x200> from_cp;  // code point -> byte, -1 when not a mapped char
  ByteMap() {
    from_cp.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      uint32_t cp = printable ? b : next++;
      to_utf8[b].clear();
      utf8_append(to_utf8[b], cp);
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

class ByteBpeTokenizer final : public VocabTokenizer {
 public:
  explicit ByteBpeTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
    std::unordered_map<std::string_view, int32_t> vocab;
    for (size_t i = 0; i < spec_.tokens.size(); ++i) vocab.emplace(spec_.tokens[i], static_cast<int32_t>(i));
    merges_ = build_merge_table(spec_, vocab);
    const ByteMap& bm = byte_map();
    for (int b = 0; b < 256; ++b) byte_token_[b] = find_token(bm.to_utf8[b]);
  }

  std::string token_bytes(int32_t id) const override {
    check_id(id);
    const std::string& t = spec_.tokens[id];
    // Added/user-defined tokens (e.g. MPT's runs of spaces) are stored as plain text; a
    // token with any character outside the byte map is returned as is (HF ByteLevel decoder).
    if (spec_.special[id] || spec_.types[id] == TokenType::UserDefined) return t;
    const ByteMap& bm = byte_map();
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      size_t n = utf8_valid_len(t, i);
      if (n == 0) return t;
      uint32_t cp = utf8_decode(t, i, n);
      if (cp >= bm.from_cp.size() || bm.from_cp[cp] < 0) return t;
      out += static_cast<char>(bm.from_cp[cp]);
      i += n;
    }
    return out;
  }

  std::string kind() const override { return "byte-bpe:" + spec_.pre.name(); }

 protected:
  void encode_fragment(std::string_view frag, bool, bool, std::vector<int32_t>& out) const override {
    if (spec_.nfc) {
      // HF's NFC normalizer (Qwen2): no Unicode composition tables here, so only text that
      // is provably NFC already is accepted; anything else is refused, never mis-tokenized.
      size_t at = nfc_unsure_offset(frag);
      if (at != std::string_view::npos) {
        size_t n = std::max<size_t>(1, utf8_valid_len(frag, at));
        throw Error(
            strformat("[tokenizer] %s: the NFC normalizer is only supported for text that is "
                      "already NFC by a table test; character U+%04X at byte %zu is outside it",
                      spec_.source.c_str(), utf8_decode(frag, at, n), at));
      }
    }
    std::string with_prefix;
    if (spec_.add_prefix_space && !frag.empty() && frag[0] != ' ') {
      with_prefix = " ";
      with_prefix += frag;
      frag = with_prefix;
    }
    const ByteMap& bm = byte_map();
    std::string mapped;
    for (const Span& sp : spec_.pre.split(frag)) {
      mapped.clear();
      for (size_t i = sp.begin; i < sp.end; ++i) mapped += bm.to_utf8[static_cast<uint8_t>(frag[i])];
      encode_piece(mapped, frag.substr(sp.begin, sp.end - sp.begin), out);
    }
  }

 private:
  // piece: the mapped characters; raw: the original bytes (one mapped char per byte).
  void encode_piece(std::string_view piece, std::string_view raw, std::vector<int32_t>& out) const {
    if (spec_.ignore_merges) {
      int32_t id = find_token(piece);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    std::vector<Symbol> syms;
    syms.reserve(raw.size());
    const ByteMap& bm = byte_map();
    uint32_t off = 0;
    for (size_t i = 0; i < raw.size(); ++i) {
      uint8_t b = static_cast<uint8_t>(raw[i]);
      uint32_t n = static_cast<uint32_t>(bm.to_utf8[b].size());
      int32_t k = static_cast<int32_t>(syms.size());
      syms.push_back({byte_token_[b], off, n, k - 1, -1});
      if (k > 0) syms[k - 1].next = k;
      off += n;
    }
    merge_symbols(syms, piece, [&](const Symbol& a, const Symbol& b, std::string_view) {
      auto it = (a.id < 0 || b.id < 0) ? merges_.end() : merges_.find(merge_key(a.id, b.id));
      if (it == merges_.end()) return std::make_pair(-std::numeric_limits<double>::infinity(), int32_t{-1});
      return std::make_pair(-static_cast<double>(it->second.first), it->second.second);
    });
    for (int32_t k = syms.empty() ? -1 : 0; k >= 0; k = syms[k].next) {
      int32_t id = syms[k].id;
      if (id < 0) id = spec_.unk;
      ARB_CHECK(id >= 0, "[tokenizer] %s: the vocabulary has no token for byte piece '%.*s' and no unk token",
                spec_.source.c_str(), static_cast<int>(syms[k].len), piece.data() + syms[k].begin);
      out.push_back(id);
    }
  }

  MergeTable merges_;
  std::array<int32_t, 256> byte_token_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_bpe_tokenizer(VocabSpec spec) {
  return std::make_unique<ByteBpeTokenizer>(std::move(spec));
}

}  // namespace arbiter::tok
