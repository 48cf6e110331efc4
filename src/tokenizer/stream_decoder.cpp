// StreamDecoder: the text of a token sequence, emitted as soon as it is complete UTF-8.
// Contract: feeding ids one by one from the start of a sequence and joining every push()
// result and the final flush() gives exactly tok.decode(ids, /*skip_special=*/true).
// (To print only a continuation, push the prompt ids first and discard what they return.)
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace arbiter {

std::string StreamDecoder::push(int32_t id) {
  if (tok_.is_special(id)) return "";
  std::string piece = tok_.token_bytes(id);
  if (first_ && tok_.strips_leading_space() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  first_ = false;
  pending_ += piece;
  size_t n = tok::utf8_emittable_prefix(pending_);
  std::string out = tok::utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tok::utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace arbiter
