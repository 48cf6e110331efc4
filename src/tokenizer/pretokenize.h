// Pre-tokenization for byte-level BPE: a sequence of regex splits, each applied to every
// piece the previous step produced (the semantics of HF tokenizers' Sequence of Split
// pre-tokenizers and of llama.cpp's regex_exprs lists). Regexes run through PCRE2
// (pcre2-8, PCRE2_UTF | PCRE2_UCP), compiled once per tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace arbiter::tok {

/// What happens to the matched parts of a piece (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

/// A compiled PCRE2 pattern (UTF + UCP). Immutable after construction, so one instance is
/// shared by all threads; match data is allocated per call.
class Regex {
 public:
  /// Throws arbiter::Error("[tokenizer] ...") naming the pattern and PCRE2's message.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Non-empty matches of the pattern in subject (valid UTF-8), left to right, as
  /// [begin, end) byte offsets appended to out (pairs).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

/// One step of a pre-tokenizer.
struct SplitStep {
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;  // HF Split.invert: the pattern describes the pieces, not the delimiters
};

/// A piece of the input: [begin, end) byte offsets into the text being split.
struct Span {
  size_t begin, end;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  PreTokenizer(std::string name, std::vector<SplitStep> steps)
      : name_(std::move(name)), steps_(std::move(steps)) {}

  /// Splits text into pieces (offsets into text). Bytes that are not well-formed UTF-8
  /// cannot go through the regexes; each such byte becomes a piece of its own.
  std::vector<Span> split(std::string_view text) const;
  const std::string& name() const { return name_; }
  bool empty() const { return steps_.empty(); }

 private:
  std::string name_;
  std::vector<SplitStep> steps_;
};

/// GPT-2's pattern (HF ByteLevel use_regex, OpenAI encoder.py).
extern const char* const kGpt2Pattern;

/// The pre-tokenizer for a GGUF `tokenizer.ggml.pre` value (llama.cpp's names). Returns
/// false when the name is not one this tokenizer reproduces.
bool pretokenizer_for_gguf_pre(const std::string& pre, PreTokenizer& out);
/// Whether that pre type looks a whole piece up in the vocabulary before merging.
bool gguf_pre_ignores_merges(const std::string& pre);
/// The GGUF pre names pretokenizer_for_gguf_pre accepts, comma-separated, for messages.
std::string supported_gguf_pre_names();

}  // namespace arbiter::tok
