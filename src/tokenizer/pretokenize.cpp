#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace arbiter::tok {

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(strformat("[tokenizer] regex /%s/: %s at offset %zu", pattern.c_str(),
                          reinterpret_cast<const char*>(msg), static_cast<size_t>(err_off)));
  }
  // JIT is only a speed-up; the interpreter gives the same matches when it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) throw Error("[tokenizer] out of memory allocating PCRE2 match data");
  auto subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos < subject.size()) {
    // The caller guarantees valid UTF-8 (PreTokenizer::split cuts invalid bytes out).
    int rc = pcre2_match(code, subj, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(strformat("[tokenizer] regex /%s/: match failed: %s", pattern_.c_str(),
                            reinterpret_cast<const char*>(msg)));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: it splits nothing; step over one character and search again.
      pos = b + std::max<size_t>(1, utf8_lead_len(static_cast<uint8_t>(subject[b])));
    }
  }
  pcre2_match_data_free(md);
}

// Applies one split step to the piece [b, e) of text; appends the resulting pieces.
// Segment bookkeeping follows HF tokenizers' NormalizedString::split.
static void split_piece(std::string_view text, Span piece, const SplitStep& step,
                        std::vector<std::pair<size_t, size_t>>& scratch, std::vector<Span>& out) {
  scratch.clear();
  step.regex->find_all(text.substr(piece.begin, piece.end - piece.begin), scratch);
  // Segments in order: (begin, end, is_match).
  struct Seg {
    size_t b, e;
    bool m;
  };
  std::vector<Seg> segs;
  size_t cur = piece.begin;
  for (auto [mb, me] : scratch) {
    mb += piece.begin;
    me += piece.begin;
    if (mb > cur) segs.push_back({cur, mb, false});
    segs.push_back({mb, me, true});
    cur = me;
  }
  if (cur < piece.end) segs.push_back({cur, piece.end, false});
  if (step.invert)
    for (auto& s : segs) s.m = !s.m;

  std::vector<Seg> res;
  switch (step.behavior) {
    case SplitBehavior::Removed:
      for (auto& s : segs)
        if (!s.m) res.push_back(s);
      break;
    case SplitBehavior::Isolated:
      res = segs;
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& s : segs) {
        if (s.m && !prev_match && !res.empty())
          res.back().e = s.e;
        else
          res.push_back(s);
        prev_match = s.m;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool next_match = false;  // walking right to left: whether the segment to the right matched
      for (size_t k = segs.size(); k-- > 0;) {
        const Seg& s = segs[k];
        if (s.m && !next_match && !res.empty())
          res.back().b = s.b;
        else
          res.push_back(s);
        next_match = s.m;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (auto& s : segs) {
        if (s.m && prev_match && !res.empty())
          res.back().e = s.e;
        else
          res.push_back(s);
        prev_match = s.m;
      }
      break;
    }
  }
  for (auto& s : res)
    if (s.e > s.b) out.push_back({s.b, s.e});
}

std::vector<Span> PreTokenizer::split(std::string_view text) const {
  // Cut the text into runs of well-formed UTF-8; an ill-formed byte is a piece of its own
  // (the regexes cannot see it; byte-level BPE still encodes it).
  std::vector<Span> pieces;
  std::vector<bool> opaque;
  size_t run = 0, i = 0;
  while (i < text.size()) {
    size_t n = utf8_valid_len(text, i);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > run) pieces.push_back({run, i}), opaque.push_back(false);
    pieces.push_back({i, i + 1});
    opaque.push_back(true);
    run = ++i;
  }
  if (i > run) pieces.push_back({run, i}), opaque.push_back(false);

  std::vector<std::pair<size_t, size_t>> scratch;
  for (const SplitStep& step : steps_) {
    std::vector<Span> next;
    std::vector<bool> next_opaque;
    next.reserve(pieces.size() * 2);
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (opaque[k]) {
        next.push_back(pieces[k]);
        next_opaque.push_back(true);
        continue;
      }
      split_piece(text, pieces[k], step, scratch, next);
      next_opaque.resize(next.size(), false);
    }
    pieces = std::move(next);
    opaque = std::move(next_opaque);
  }
  return pieces;
}

namespace {

// llama.cpp's pre-tokenizer regex lists (src/llama-vocab.cpp, llm_tokenizer_bpe), keyed by
// the `tokenizer.ggml.pre` names convert_hf_to_gguf.py writes. Where llama.cpp rewrote an
// HF pattern for std::regex (llama3, qwen2), the original HF pattern is used: PCRE2 runs it
// as written.
const char* const kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Cased letters (Unicode category L&) as llama.cpp lists them, written as code points so
// that no editor or normalisation can change them (several are NFC-unstable: U+1F7D, U+1FBE,
// U+1FD3, U+1FDB, U+2126, U+212A).
const char* const kDeepseekLlmLetters =
    "\\s?["
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}"
    "\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
    "]+";
const char* const kGpt2NoTail =  // llama.cpp drops "|\s+": the gaps it leaves are the same pieces
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

struct PreDef {
  std::vector<std::string> names;
  std::vector<const char*> regexes;
};

const std::vector<PreDef>& pre_defs() {
  static const std::vector<PreDef> defs = {
      {{"default", "gpt-2", "phi-2", "mpt", "olmo", "roberta-bpe"}, {kGpt2Pattern}},
      {{"starcoder", "refact", "smollm", "codeshell", "command-r"}, {"\\p{N}", kGpt2NoTail}},
      {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2NoTail, "[0-9][0-9][0-9]"}},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLlmLetters,
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$",
        "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}+"}},
      {{"deepseek-coder"},
       {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
        "\\p{N}"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2}},
  };
  return defs;
}

}  // namespace

bool pretokenizer_for_gguf_pre(const std::string& pre, PreTokenizer& out) {
  // Regexes are compiled once per process and shared (Regex is immutable).
  static std::map<std::string, std::shared_ptr<const Regex>> cache;
  static std::mutex mu;
  for (const PreDef& d : pre_defs()) {
    if (std::find(d.names.begin(), d.names.end(), pre) == d.names.end()) continue;
    std::vector<SplitStep> steps;
    std::lock_guard<std::mutex> lock(mu);
    for (const char* r : d.regexes) {
      auto& re = cache[r];
      if (!re) re = std::make_shared<const Regex>(r);
      steps.push_back({re, SplitBehavior::Isolated, false});
    }
    out = PreTokenizer(pre, std::move(steps));
    return true;
  }
  return false;
}

bool gguf_pre_ignores_merges(const std::string& pre) {
  // llama.cpp sets ignore_merges for the Llama-3 family only (HF tokenizer.json of
  // Llama 3 has "ignore_merges": true).
  return pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3";
}

std::string supported_gguf_pre_names() {
  std::string s;
  for (const PreDef& d : pre_defs())
    for (const auto& n : d.names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace arbiter::tok
