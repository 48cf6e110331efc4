// Reading a JSON configuration file (Hugging Face config.json, generation_config.json) with
// errors that name the file and the key: "[hf] DIR/config.json: 'hidden_size' is 0 (expected
// a positive int)". The model layer decides which keys mean what (model/archs/).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace arbiter {

/// One JSON object and the path it came from. Accessors refuse a present key of the wrong
/// type; a null value counts as absent (transformers writes null for "use the default").
class JsonConfig {
 public:
  /// Parses text; throws "[hf] PATH: not valid JSON (...)" or "not a JSON object".
  JsonConfig(const std::string& text, std::string path);
  /// A nested object (e.g. rope_scaling), reported as "PATH: rope_scaling.KEY".
  JsonConfig(const nlohmann::json& object, std::string path, std::string prefix);

  const std::string& path() const { return path_; }
  bool has(const char* key) const;
  /// Whether the key is present at all, null included (has() treats null as absent; a few
  /// keys mean "off" when null and a default when absent).
  bool contains(const char* key) const { return j_.contains(key); }
  const nlohmann::json& raw(const char* key) const { return j_[key]; }
  /// A nested object at key (the key must hold an object).
  JsonConfig object(const char* key) const;

  /// An exact integer (12 or 12.0), required.
  int64_t integer(const char* key) const;
  /// An integer in [1, INT_MAX], required or with a default when absent.
  int positive_int(const char* key) const;
  int positive_int(const char* key, int dflt) const;
  /// A finite number, with a default when absent.
  double number(const char* key, double dflt) const;
  /// A finite number, required.
  double number(const char* key) const;
  bool flag(const char* key, bool dflt) const;
  std::string str(const char* key) const;
  /// The first present key of keys holding a string, or dflt.
  std::string str_of(std::initializer_list<const char*> keys, const std::string& dflt) const;

  /// Throws "[hf] PATH: what".
  [[noreturn]] void fail(const std::string& what) const;
  /// "prefix.key" as the messages name it.
  std::string name(const char* key) const { return prefix_ + key; }

 private:
  nlohmann::json j_;
  std::string path_, prefix_;
};

/// Reads a whole text file; throws "[hf] PATH: cannot open".
std::string read_config_text(const std::string& path);

/// eos_token_id (an int, a list of ints, or null) from one config text; [] when absent.
std::vector<int32_t> parse_eos_ids(const std::string& json_text, const std::string& path);

/// EOS ids that end generation: generation_config.json's (what transformers' generate()
/// uses) followed by any extra ones from config.json, without duplicates.
std::vector<int32_t> load_hf_eos_ids(const std::string& dir);

}  // namespace arbiter
