#include "tokenizer/vocab.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace arbiter::tok {

VocabTokenizer::VocabTokenizer(VocabSpec spec) : spec_(std::move(spec)) {
  const size_t n = spec_.tokens.size();
  ARB_CHECK(n > 0, "[tokenizer] %s: empty vocabulary", spec_.source.c_str());
  spec_.types.resize(n, TokenType::Normal);
  spec_.special.resize(n, false);
  token_to_id_.reserve(n * 2);
  // First id wins for duplicate texts (HF vocabularies are maps, so duplicates only occur in
  // GGUFs, where llama.cpp keeps the last; no shipped vocabulary has any).
  for (size_t i = 0; i < n; ++i) token_to_id_.emplace(spec_.tokens[i], static_cast<int32_t>(i));
  // The readers turn "none" into -1 and refuse other ids outside the vocabulary; one that
  // got through would be dropped from every encode without a word.
  for (auto [id, name] : {std::pair{spec_.bos, "BOS"}, {spec_.eos, "EOS"}, {spec_.unk, "unknown-token"}})
    ARB_CHECK(id >= -1 && id < static_cast<int32_t>(n), "[tokenizer] %s: %s id %d outside the vocabulary (size %zu)",
              spec_.source.c_str(), name, id, n);

  for (size_t k = 0; k < spec_.added.size(); ++k) {
    const AddedToken& t = spec_.added[k];
    ARB_CHECK(t.id >= 0 && t.id < static_cast<int32_t>(n),
              "[tokenizer] %s: added token '%s' has id %d outside the vocabulary (size %zu)",
              spec_.source.c_str(), t.text.c_str(), t.id, n);
    if (t.text.empty()) continue;
    added_by_byte_[static_cast<uint8_t>(t.text[0])].push_back(static_cast<int32_t>(k));
  }
  for (auto& bucket : added_by_byte_)
    std::stable_sort(bucket.begin(), bucket.end(), [&](int32_t a, int32_t b) {
      return spec_.added[a].text.size() > spec_.added[b].text.size();
    });
}

int32_t VocabTokenizer::find_token(std::string_view text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

void VocabTokenizer::check_id(int32_t id) const {
  ARB_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] %s: token id %d outside the vocabulary (size %d)",
            spec_.source.c_str(), id, vocab_size());
}

bool VocabTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && spec_.special[id];
}

static bool is_space_byte(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> out;
  size_t text_start = 0;  // start of the pending plain-text fragment
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (int32_t k : added_by_byte_[static_cast<uint8_t>(text[i])]) {
      const AddedToken& t = spec_.added[k];
      if (t.special && !parse_special) continue;
      if (text.compare(i, t.text.size(), t.text) == 0) {
        hit = &t;  // buckets are sorted longest first
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->text.size();
    if (hit->lstrip)
      while (b > text_start && is_space_byte(text[b - 1])) --b;
    if (hit->rstrip)
      while (e < text.size() && is_space_byte(text[e])) ++e;
    if (b > text_start) out.push_back({-1, text_start, b});
    out.push_back({hit->id, b, e});
    text_start = i = e;
  }
  if (text_start < text.size()) out.push_back({-1, text_start, text.size()});
  return out;
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special && add_bos()) ids.push_back(spec_.bos);
  bool after_added = true;
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      after_added = true;
      continue;
    }
    encode_fragment(text.substr(f.begin, f.end - f.begin), f.begin == 0, after_added, ids);
    after_added = false;
  }
  if (add_special && spec_.add_eos && spec_.eos >= 0) ids.push_back(spec_.eos);
  return ids;
}

std::string VocabTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    check_id(id);
    if (spec_.special[id]) {
      if (!skip_special) out += spec_.tokens[id];
      continue;
    }
    std::string piece = token_bytes(id);
    // SentencePiece's dummy prefix (HF decoder Strip(" ", 1, 0)): only the text's first space.
    if (first && strips_leading_space() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    first = false;
    out += piece;
  }
  return utf8_sanitize(out);
}

MergeTable build_merge_table(const VocabSpec& spec,
                             const std::unordered_map<std::string_view, int32_t>& vocab) {
  MergeTable table;
  table.reserve(spec.merges.size() * 2);
  auto find = [&](const std::string& s) {
    auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  };
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    int32_t ia = find(a), ib = find(b), im = find(a + b);
    if (ia < 0 || ib < 0 || im < 0) continue;
    // The first (lowest) rank of a repeated pair wins, as in HF and llama.cpp.
    table.emplace(merge_key(ia, ib), std::make_pair(static_cast<int32_t>(r), im));
  }
  return table;
}

}  // namespace arbiter::tok
