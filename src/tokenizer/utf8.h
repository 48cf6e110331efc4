// UTF-8 helpers shared by the tokenizers: character lengths, validation, code point
// encoding, and the "complete prefix" test the streaming decoder needs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace arbiter::tok {

/// Length in bytes of the UTF-8 sequence that starts with lead byte b, as announced by the
/// lead byte (1 for ASCII and for bytes that cannot start a sequence).
inline size_t utf8_lead_len(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

/// Length of the well-formed UTF-8 character at s[i] (RFC 3629: no overlongs, no
/// surrogates, <= U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_valid_len(std::string_view s, size_t i);

/// Appends code point cp (<= U+10FFFF) encoded as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

/// Decodes the well-formed character at s[i] whose length is n (from utf8_valid_len).
uint32_t utf8_decode(std::string_view s, size_t i, size_t n);

/// Number of leading bytes of s that can be emitted now: everything except a trailing,
/// still incomplete but so far well-formed sequence (at most 3 bytes).
size_t utf8_emittable_prefix(std::string_view s);

/// s with every ill-formed byte sequence replaced by U+FFFD (one per maximal subpart).
std::string utf8_sanitize(std::string_view s);

/// Offset of the first character of s whose NFC stability this code cannot vouch for, or
/// npos when NFC(s) == s is certain. Certain means: every code point lies in a table of
/// ranges whose characters have NFC_Quick_Check = Yes and canonical combining class 0
/// (Unicode 15 UCD: Latin-1/Latin Extended, basic Greek and Cyrillic, general punctuation
/// without U+2000/2001, currency, arrows, math operators, box drawing and dingbats, CJK
/// punctuation without the tone marks U+302A..302F, kana without U+3099/309A, CJK unified
/// ideographs, Hangul syllables, fullwidth forms, variation selectors, emoji); for such text
/// the quick-check answer YES implies NFC(s) == s (UAX #15 section 9). Ill-formed bytes
/// count as stable (they are not characters).
size_t nfc_unsure_offset(std::string_view s);

}  // namespace arbiter::tok
