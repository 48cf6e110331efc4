#include "tokenizer/utf8.h"

namespace arbiter::tok {

size_t utf8_valid_len(std::string_view s, size_t i) {
  auto at = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t b0 = at(i);
  if (b0 < 0x80) return 1;
  size_t n = utf8_lead_len(b0);
  if (n == 1 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  uint8_t b1 = at(i + 1);
  // Reject overlong forms, surrogates and code points above U+10FFFF (RFC 3629 table 3-7).
  if (n == 2 && b0 < 0xC2) return 0;
  if (n == 3 && ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F))) return 0;
  if (n == 4 && ((b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F) || b0 > 0xF4)) return 0;
  return n;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t n) {
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (n) {
    case 1:
      return at(0);
    case 2:
      return ((at(0) & 0x1F) << 6) | (at(1) & 0x3F);
    case 3:
      return ((at(0) & 0x0F) << 12) | ((at(1) & 0x3F) << 6) | (at(2) & 0x3F);
    default:
      return ((at(0) & 0x07) << 18) | ((at(1) & 0x3F) << 12) | ((at(2) & 0x3F) << 6) | (at(3) & 0x3F);
  }
}

// Whether p (shorter than its lead byte announces) is a prefix of some well-formed
// character: the lead must be C2..F4 and each byte must lie in the range RFC 3629 allows.
static bool utf8_valid_prefix(std::string_view p) {
  uint8_t b0 = static_cast<uint8_t>(p[0]);
  if (b0 < 0xC2 || b0 > 0xF4) return false;
  for (size_t k = 1; k < p.size(); ++k) {
    uint8_t b = static_cast<uint8_t>(p[k]);
    uint8_t lo = 0x80, hi = 0xBF;
    if (k == 1) {
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    if (b < lo || b > hi) return false;
  }
  return true;
}

size_t utf8_emittable_prefix(std::string_view s) {
  // Hold back a trailing sequence that is too short for its lead byte but still valid.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t i = n - back;
    uint8_t b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = utf8_lead_len(b);
    if (need <= back) return n;
    return utf8_valid_prefix(s.substr(i)) ? i : n;
  }
  return n;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8_valid_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // One U+FFFD per maximal subpart (Unicode ch. 3, "U+FFFD substitution of maximal
    // subparts"): the longest prefix of a valid sequence starting here, at least one byte.
    size_t need = utf8_lead_len(static_cast<uint8_t>(s[i]));
    size_t j = i + 1;
    while (j < s.size() && j - i < need && utf8_valid_prefix(s.substr(i, j - i + 1))) ++j;
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

size_t nfc_unsure_offset(std::string_view s) {
  static const uint32_t kStable[][2] = {
      {0x0000, 0x02FF},   {0x0391, 0x03A1},   {0x03A3, 0x03A9}, {0x03B1, 0x03C9}, {0x0400, 0x0482},
      {0x048A, 0x052F},   {0x2002, 0x206F},   {0x20A0, 0x20C0}, {0x2190, 0x2328}, {0x232B, 0x23FF},
      {0x2500, 0x27BF},   {0x3000, 0x3029},   {0x3030, 0x303F}, {0x3041, 0x3096}, {0x309B, 0x30FF},
      {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3}, {0xFE00, 0xFE0F}, {0xFF01, 0xFFEF},
      {0x1F000, 0x1FAFF}, {0x20000, 0x2A6DF},
  };
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_valid_len(s, i);
    if (n == 0) {
      ++i;
      continue;
    }
    uint32_t cp = utf8_decode(s, i, n);
    bool ok = false;
    for (const auto& r : kStable)
      if (cp >= r[0] && cp <= r[1]) {
        ok = true;
        break;
      }
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace arbiter::tok
