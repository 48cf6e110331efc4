// tokenizer_from_hf_dir: an HF `tokenizers` tokenizer.json (model type BPE) plus
// tokenizer_config.json. Two flavours are recognised from the pipeline:
//   - byte-level: a ByteLevel pre-tokenizer (alone, or last in a Sequence after Split /
//     Digits / Punctuation steps, which are read generically);
//   - SentencePiece-style: normalizer Prepend("▁") + Replace(" ", "▁") (Llama 2 legacy,
//     TinyStories) or a Metaspace pre-tokenizer, with byte_fallback.
// Anything else (WordPiece/Unigram models, NFKC, ...) is refused with an error naming it,
// rather than tokenized differently from the reference.
//
// Added tokens: split out of the raw text first (leftmost, longest); those with
// "special": true only when the caller asks for parse_special. Only ids listed in
// added_tokens are added tokens (TinyStories has ordinary merged tokens whose text contains
// "<|start_story|>"). The "normalized" flag is ignored: tokens are matched in the raw text
// and the "▁" prefix is put in front of each text fragment after an added token, as
// llama.cpp does.
//
// sha256(): SHA-256 of the tokenizer.json bytes.
#include <filesystem>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "io/sha256.h"
#include "tokenizer/vocab.h"

namespace arbiter {
namespace {

using json = nlohmann::json;
using namespace tok;

std::string read_all(const std::string& path) {
  return read_input_file(path, "[tokenizer]", kMaxInputBytes, "a tokenizer file");
}

// A token id: a JSON integer in [0, limit), limit at most 2^31 - 1 (ids are int32 everywhere
// downstream; a wider one must not wrap). `what` names the key in the refusal.
int32_t token_id(const json& v, const std::string& path, const std::string& what, int64_t limit,
                 const char* limit_why) {
  if (!v.is_number_integer())
    throw Error(strformat("[tokenizer] %s: %s is %s (expected an integer token id)", path.c_str(), what.c_str(),
                          json_brief(v).c_str()));
  const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  const uint64_t u = neg ? 0 : v.get<uint64_t>();
  if (neg || u > uint64_t(std::numeric_limits<int32_t>::max()))
    throw Error(strformat("[tokenizer] %s: %s is %s (expected 0 to %d)", path.c_str(), what.c_str(),
                          json_brief(v).c_str(), std::numeric_limits<int32_t>::max()));
  if (int64_t(u) >= limit)
    throw Error(strformat("[tokenizer] %s: %s is %llu, outside %s (expected below %lld)", path.c_str(), what.c_str(),
                          (unsigned long long)u, limit_why, (long long)limit));
  return int32_t(u);
}

std::string type_of(const json& j) {
  return (j.is_object() && j.contains("type") && j["type"].is_string()) ? j["type"].get<std::string>() : "";
}

// Flattens a Sequence (key "normalizers"/"pretokenizers"/"decoders"/"processors").
std::vector<json> flatten(const json& j, const char* list_key) {
  std::vector<json> out;
  if (j.is_null()) return out;
  if (type_of(j) == "Sequence" && j.contains(list_key)) {
    for (const auto& e : j[list_key]) {
      auto sub = flatten(e, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else {
    out.push_back(j);
  }
  return out;
}

std::string regex_quote(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) && c != 0) out += '\\';
    out += c;
  }
  return out;
}

SplitBehavior behavior_of(const std::string& path, const json& j) {
  std::string b = j.value("behavior", std::string("Isolated"));
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  throw Error(strformat("[tokenizer] %s: split behavior '%s' is not supported", path.c_str(), b.c_str()));
}

// Token id of a tokenizer_config.json entry ("<s>" or {"content": "<s>", ...}), or -1 when
// absent or null. A named token that is not in the vocabulary is refused (HF would add it as
// a new token that the model has no embedding row for).
int32_t config_token_id(const json& cfg, const char* key, const std::map<std::string, int32_t>& ids,
                        const std::string& cfg_path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return -1;
  const json& v = cfg[key];
  std::string s;
  if (v.is_string())
    s = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string())
    s = v["content"].get<std::string>();
  else
    throw Error(strformat("[tokenizer] %s: %s is %s (expected a token string or {\"content\": ...})",
                          cfg_path.c_str(), key, json_brief(v).c_str()));
  auto it = ids.find(s);
  ARB_CHECK(it != ids.end(), "[tokenizer] %s: %s '%s' is not in the vocabulary", cfg_path.c_str(), key, s.c_str());
  return it->second;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_hf_dir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  ARB_CHECK(std::filesystem::exists(path), "[tokenizer] %s: no tokenizer.json in this directory",
            dir.c_str());
  const std::string cfg_path = dir + "/tokenizer_config.json";
  // exists() is true for a FIFO or a directory too: those are then refused, not skipped.
  std::optional<std::string> cfg_text;
  if (std::filesystem::exists(cfg_path)) cfg_text = read_all(cfg_path);
  return tokenizer_from_hf_json(read_all(path), path, cfg_text, cfg_path);
}

std::unique_ptr<Tokenizer> tokenizer_from_hf_json(const std::string& bytes, const std::string& path,
                                                  const std::optional<std::string>& cfg_text,
                                                  const std::string& cfg_path) {
  const json j = parse_json_bounded(bytes, path, "[tokenizer]");
  const json cfg = cfg_text ? parse_json_bounded(*cfg_text, cfg_path, "[tokenizer]") : json::object();
  ARB_CHECK(j.is_object(), "[tokenizer] %s: not a JSON object", path.c_str());
  ARB_CHECK(cfg.is_object(), "[tokenizer] %s: not a JSON object", cfg_path.c_str());

  try {
    const json& model = j.at("model");
    std::string mtype = type_of(model);
    if (mtype.empty() && model.contains("merges")) mtype = "BPE";  // pre-0.10 files omit the type
    ARB_CHECK(mtype == "BPE", "[tokenizer] %s: tokenizer model '%s' is not supported (supported: BPE)",
              path.c_str(), mtype.c_str());
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      ARB_CHECK(!model.contains(k) || model[k].is_null() || model[k] == "",
                "[tokenizer] %s: BPE option '%s' is not supported", path.c_str(), k);
    ARB_CHECK(
        !model.contains("dropout") || model["dropout"].is_null() || model["dropout"].get<double>() == 0.0,
        "[tokenizer] %s: BPE dropout makes encoding random; not supported", path.c_str());

    VocabSpec spec;
    spec.source = path;
    spec.sha256 = sha256_hex(bytes.data(), bytes.size());
    // Ids index tables sized max_id + 1, so each is bounded before anything is sized from it:
    // a file of B bytes cannot describe more than B tokens, whatever ids it claims.
    const int64_t id_limit = std::min<int64_t>(int64_t(bytes.size()), std::numeric_limits<int32_t>::max());
    const char* id_limit_why = "what a file of this size can describe";
    const json& vocab = model.at("vocab");
    ARB_CHECK(vocab.is_object(), "[tokenizer] %s: model.vocab is not an object of token -> id", path.c_str());
    ARB_CHECK(!vocab.empty(), "[tokenizer] %s: model.vocab is empty", path.c_str());
    std::map<std::string, int32_t> ids;
    int32_t max_id = -1;
    for (const auto& [text, id] : vocab.items()) {
      int32_t v = token_id(id, path, "model.vocab['" + text + "']", id_limit, id_limit_why);
      ids[text] = v;
      max_id = std::max(max_id, v);
    }
    const json added = j.value("added_tokens", json::array());
    ARB_CHECK(added.is_array(), "[tokenizer] %s: added_tokens is not a list", path.c_str());
    for (size_t k = 0; k < added.size(); ++k) {
      const json& a = added[k];
      ARB_CHECK(a.is_object() && a.contains("content") && a["content"].is_string(),
                "[tokenizer] %s: added_tokens[%zu] has no string 'content'", path.c_str(), k);
      int32_t v = token_id(a.contains("id") ? a["id"] : json(), path, strformat("added_tokens[%zu].id", k), id_limit,
                           id_limit_why);
      ids[a["content"].get<std::string>()] = v;
      max_id = std::max(max_id, v);
    }
    // Every id names one text: two texts on one id would make encode and decode disagree
    // (an added token may repeat its own model.vocab entry).
    spec.tokens.assign(size_t(max_id) + 1, "");
    std::vector<bool> taken(spec.tokens.size(), false);
    for (const auto& [text, v] : ids) {
      ARB_CHECK(!taken[size_t(v)], "[tokenizer] %s: id %d is given to both '%s' and '%s'", path.c_str(), v,
                spec.tokens[size_t(v)].c_str(), text.c_str());
      taken[size_t(v)] = true;
      spec.tokens[size_t(v)] = text;
    }
    for (size_t i = 0; i < spec.tokens.size(); ++i)
      if (!taken[i]) spec.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // holes in the id space
    const size_t n = spec.tokens.size();
    spec.types.assign(n, TokenType::Normal);
    spec.special.assign(n, false);

    for (const auto& a : added) {
      AddedToken t;
      t.text = a["content"].get<std::string>();
      t.id = ids.at(t.text);
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      ARB_CHECK(!a.value("single_word", false),
                "[tokenizer] %s: added token '%s' with single_word is not supported", path.c_str(),
                t.text.c_str());
      spec.special[t.id] = t.special;
      spec.types[t.id] = t.special ? TokenType::Control : TokenType::UserDefined;
      spec.added.push_back(t);
    }

    for (const auto& m : model.at("merges")) {
      if (m.is_array() && m.size() == 2) {
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        std::string s = m.get<std::string>();
        size_t sp = s.find(' ', 1);
        ARB_CHECK(sp != std::string::npos, "[tokenizer] %s: merge '%s' has no space", path.c_str(),
                  s.c_str());
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      }
    }
    spec.ignore_merges = model.value("ignore_merges", false);
    spec.byte_fallback = model.value("byte_fallback", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = ids.find(model["unk_token"].get<std::string>());
      ARB_CHECK(it != ids.end(), "[tokenizer] %s: model.unk_token '%s' is not in the vocabulary", path.c_str(),
                model["unk_token"].get<std::string>().c_str());
      spec.unk = it->second;
    }

    // Which flavour: look for ByteLevel / Metaspace / Prepend+Replace in the pipeline.
    auto norms = flatten(j.value("normalizer", json()), "normalizers");
    auto pres = flatten(j.value("pre_tokenizer", json()), "pretokenizers");
    auto decs = flatten(j.value("decoder", json()), "decoders");
    bool byte_level = false;
    for (const auto& p : pres) byte_level |= type_of(p) == "ByteLevel";
    for (const auto& d : decs) byte_level |= type_of(d) == "ByteLevel";

    if (byte_level) {
      for (const auto& nm : norms) {
        std::string t = type_of(nm);
        if (t == "NFC")
          spec.nfc = true;
        else
          throw Error(strformat("[tokenizer] %s: normalizer '%s' is not supported for byte-level BPE",
                                path.c_str(), t.c_str()));
      }
      std::vector<SplitStep> steps;
      bool after_byte_level = false;
      auto add_step = [&](const std::string& pattern, SplitBehavior b, bool invert) {
        steps.push_back({std::make_shared<const Regex>(pattern), b, invert});
      };
      for (const auto& p : pres) {
        std::string t = type_of(p);
        // Steps after ByteLevel would see GPT-2's mapped characters, not the text.
        ARB_CHECK(!after_byte_level, "[tokenizer] %s: pre-tokenizer '%s' after ByteLevel is not supported",
                  path.c_str(), t.c_str());
        if (t == "ByteLevel") {
          after_byte_level = true;
          spec.add_prefix_space = p.value("add_prefix_space", false);
          if (p.value("use_regex", true)) add_step(kGpt2Pattern, SplitBehavior::Isolated, false);
        } else if (t == "Split") {
          const json& pat = p.at("pattern");
          std::string re = pat.contains("Regex") ? pat["Regex"].get<std::string>()
                                                 : regex_quote(pat.at("String").get<std::string>());
          add_step(re, behavior_of(path, p), p.value("invert", false));
        } else if (t == "Digits") {
          add_step(p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", SplitBehavior::Isolated,
                   false);
        } else if (t == "Punctuation") {
          // HF is_punctuation: ASCII punctuation or a Unicode P* category, one char per match.
          add_step("[\\p{P}!-/:-@\\[-`{-~]", behavior_of(path, p), false);
        } else {
          throw Error(
              strformat("[tokenizer] %s: pre-tokenizer '%s' is not supported", path.c_str(), t.c_str()));
        }
      }
      spec.pre = PreTokenizer("hf", std::move(steps));
      spec.strip_leading_space = false;
    } else {
      // SentencePiece-style.
      ARB_CHECK(spec.byte_fallback || spec.unk >= 0,
                "[tokenizer] %s: BPE without ByteLevel, byte_fallback or unk_token is not supported",
                path.c_str());
      bool replace_space = false, prepend = false, metaspace = false;
      for (const auto& nm : norms) {
        std::string t = type_of(nm);
        if (t == "Prepend" && nm.value("prepend", std::string()) == "\xE2\x96\x81")
          prepend = true;
        else if (t == "Replace" && nm.at("pattern").value("String", std::string()) == " " &&
                 nm.value("content", std::string()) == "\xE2\x96\x81")
          replace_space = true;
        else
          throw Error(strformat("[tokenizer] %s: normalizer '%s' is not supported", path.c_str(),
                                nm.dump().substr(0, 120).c_str()));
      }
      for (const auto& p : pres) {
        std::string t = type_of(p);
        ARB_CHECK(t == "Metaspace" && p.value("replacement", std::string("\xE2\x96\x81")) == "\xE2\x96\x81",
                  "[tokenizer] %s: pre-tokenizer '%s' is not supported", path.c_str(),
                  p.dump().substr(0, 120).c_str());
        metaspace = true;
        std::string scheme =
            p.value("prepend_scheme", std::string(p.value("add_prefix_space", true) ? "always" : "never"));
        spec.prepend = scheme == "first"   ? Prepend::First
                       : scheme == "never" ? Prepend::Never
                                           : Prepend::Always;
        spec.prepend_only_without_space = true;
        spec.split_on_metaspace = p.value("split", true);
      }
      ARB_CHECK(metaspace || replace_space,
                "[tokenizer] %s: cannot tell the BPE flavour (no ByteLevel, Metaspace or Replace(' ', '▁'))",
                path.c_str());
      if (!metaspace) spec.prepend = prepend ? Prepend::Always : Prepend::Never;
      // Decoders: Replace/ByteFallback/Fuse are what token_bytes does; Strip / Metaspace drop
      // the dummy-prefix space.
      spec.strip_leading_space = false;
      for (const auto& d : decs) {
        std::string t = type_of(d);
        if (t == "Strip" && d.value("start", 0) >= 1 && d.value("content", std::string(" ")) == " ")
          spec.strip_leading_space = true;
        if (t == "Metaspace")
          spec.strip_leading_space = d.value("prepend_scheme", std::string("always")) != "never" &&
                                     d.value("add_prefix_space", true);
      }
      if (spec.byte_fallback)
        for (size_t i = 0; i < n; ++i) {
          const std::string& t = spec.tokens[i];
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
            spec.types[i] = TokenType::Byte;
        }
    }

    // BOS/EOS: the post-processor's template is what HF's fast tokenizer adds; without one,
    // tokenizer_config.json's add_bos_token / add_eos_token (slow-tokenizer flags).
    spec.bos = config_token_id(cfg, "bos_token", ids, cfg_path);
    spec.eos = config_token_id(cfg, "eos_token", ids, cfg_path);
    bool have_template = false;
    for (const auto& pp : flatten(j.value("post_processor", json()), "processors")) {
      std::string t = type_of(pp);
      if (t == "ByteLevel") continue;
      ARB_CHECK(t == "TemplateProcessing", "[tokenizer] %s: post-processor '%s' is not supported",
                path.c_str(), t.c_str());
      have_template = true;
      const json& single = pp.at("single");
      auto special_id = [&](const json& e) -> int32_t {
        std::string name = e.at("SpecialToken").at("id").get<std::string>();
        const json& st = pp.at("special_tokens").at(name);
        ARB_CHECK(st.at("ids").is_array() && st["ids"].size() == 1,
                  "[tokenizer] %s: template token '%s' with %zu ids is not supported", path.c_str(),
                  name.c_str(), st.at("ids").size());
        return token_id(st["ids"][0], path, "post_processor.special_tokens['" + name + "'].ids[0]",
                        int64_t(n), "the vocabulary");
      };
      for (size_t k = 0; k < single.size(); ++k) {
        const json& e = single[k];
        if (!e.contains("SpecialToken")) continue;
        bool front = k == 0, back = k + 1 == single.size();
        ARB_CHECK(front || back,
                  "[tokenizer] %s: template with a special token in the middle is not supported",
                  path.c_str());
        if (front)
          spec.add_bos = true, spec.bos = special_id(e);
        else
          spec.add_eos = true, spec.eos = special_id(e);
      }
    }
    if (!have_template) {
      spec.add_bos = cfg.value("add_bos_token", false);
      spec.add_eos = cfg.value("add_eos_token", false);
    }
    return byte_level ? make_byte_bpe_tokenizer(std::move(spec)) : make_spm_tokenizer(std::move(spec));
  } catch (const json::exception& e) {
    throw Error(strformat("[tokenizer] %s: unexpected structure: %s", path.c_str(), e.what()));
  }
}

}  // namespace arbiter
