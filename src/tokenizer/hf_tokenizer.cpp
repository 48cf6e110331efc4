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
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/sha256.h"
#include "tokenizer/vocab.h"

namespace arbiter {
namespace {

using json = nlohmann::json;
using namespace tok;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ARB_CHECK(f.good(), "[tokenizer] %s: cannot open file", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
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

// Token id of a tokenizer_config.json entry ("<s>" or {"content": "<s>", ...}), or -1.
int32_t config_token_id(const json& cfg, const char* key, const std::map<std::string, int32_t>& ids) {
  if (!cfg.contains(key)) return -1;
  const json& v = cfg[key];
  std::string s;
  if (v.is_string())
    s = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string())
    s = v["content"].get<std::string>();
  else
    return -1;
  auto it = ids.find(s);
  return it == ids.end() ? -1 : it->second;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_hf_dir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  ARB_CHECK(std::filesystem::exists(path), "[tokenizer] %s: no tokenizer.json in this directory",
            dir.c_str());
  const std::string bytes = read_all(path);
  json j;
  try {
    j = json::parse(bytes);
  } catch (const json::exception& e) {
    throw Error(strformat("[tokenizer] %s: not valid JSON: %s", path.c_str(), e.what()));
  }
  json cfg = json::object();
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    try {
      cfg = json::parse(read_all(cfg_path));
    } catch (const json::exception& e) {
      throw Error(strformat("[tokenizer] %s: not valid JSON: %s", cfg_path.c_str(), e.what()));
    }
  }

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
    std::map<std::string, int32_t> ids;
    int32_t max_id = -1;
    for (const auto& [text, id] : model.at("vocab").items()) {
      int32_t v = id.get<int32_t>();
      ARB_CHECK(v >= 0, "[tokenizer] %s: negative id for token '%s'", path.c_str(), text.c_str());
      ids[text] = v;
      max_id = std::max(max_id, v);
    }
    const json added = j.value("added_tokens", json::array());
    for (const auto& a : added) {
      int32_t v = a.at("id").get<int32_t>();
      ids[a.at("content").get<std::string>()] = v;
      max_id = std::max(max_id, v);
    }
    spec.tokens.assign(max_id + 1, "");
    for (const auto& [text, v] : ids) spec.tokens[v] = text;
    for (size_t i = 0; i < spec.tokens.size(); ++i)
      if (spec.tokens[i].empty())
        spec.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // holes in the id space
    const size_t n = spec.tokens.size();
    spec.types.assign(n, TokenType::Normal);
    spec.special.assign(n, false);

    for (const auto& a : added) {
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.text = a.at("content").get<std::string>();
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
      if (it != ids.end()) spec.unk = it->second;
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
    spec.bos = config_token_id(cfg, "bos_token", ids);
    spec.eos = config_token_id(cfg, "eos_token", ids);
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
        ARB_CHECK(st.at("ids").size() == 1,
                  "[tokenizer] %s: template token '%s' with %zu ids is not supported", path.c_str(),
                  name.c_str(), st.at("ids").size());
        return st["ids"][0].get<int32_t>();
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
