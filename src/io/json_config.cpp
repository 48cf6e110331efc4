#include "io/json_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace arbiter {

using json = nlohmann::json;

JsonConfig::JsonConfig(const std::string& text, std::string path) : path_(std::move(path)) {
  j_ = parse_json_bounded(text, path_, "[hf]");
  if (!j_.is_object()) fail("not a JSON object");
}

JsonConfig::JsonConfig(const json& object, std::string path, std::string prefix)
    : j_(object), path_(std::move(path)), prefix_(std::move(prefix)) {}

void JsonConfig::fail(const std::string& what) const { throw Error("[hf] " + path_ + ": " + what); }

bool JsonConfig::has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

JsonConfig JsonConfig::object(const char* key) const {
  if (!has(key) || !j_[key].is_object()) fail("'" + name(key) + "' is not an object");
  return JsonConfig(j_[key], path_, name(key) + ".");
}

int64_t JsonConfig::integer(const char* key) const {
  if (!has(key)) fail("missing required key '" + name(key) + "'");
  const json& v = j_[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers emit 128.0 for an integer field; accept exact integers only.
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  fail("'" + name(key) + "' is not an integer (got " + v.dump() + ")");
}

int JsonConfig::positive_int(const char* key) const {
  int64_t v = integer(key);
  if (v <= 0 || v > std::numeric_limits<int>::max())
    fail("'" + name(key) + "' is " + std::to_string(v) + " (expected a positive int)");
  return int(v);
}

int JsonConfig::positive_int(const char* key, int dflt) const {
  return has(key) ? positive_int(key) : dflt;
}

double JsonConfig::number(const char* key) const {
  if (!has(key)) fail("missing required key '" + name(key) + "'");
  const json& v = j_[key];
  if (!v.is_number()) fail("'" + name(key) + "' is not a number (got " + v.dump() + ")");
  double d = v.get<double>();
  if (!std::isfinite(d)) fail("'" + name(key) + "' is not finite");
  return d;
}

double JsonConfig::number(const char* key, double dflt) const {
  return has(key) ? number(key) : dflt;
}

bool JsonConfig::flag(const char* key, bool dflt) const {
  if (!has(key)) return dflt;
  if (!j_[key].is_boolean()) fail("'" + name(key) + "' is not a bool (got " + j_[key].dump() + ")");
  return j_[key].get<bool>();
}

std::string JsonConfig::str(const char* key) const {
  if (!has(key)) fail("missing required key '" + name(key) + "'");
  if (!j_[key].is_string()) fail("'" + name(key) + "' is not a string (got " + j_[key].dump() + ")");
  return j_[key].get<std::string>();
}

std::string JsonConfig::str_of(std::initializer_list<const char*> keys,
                               const std::string& dflt) const {
  for (const char* k : keys)
    if (has(k)) return str(k);
  return dflt;
}

std::string read_config_text(const std::string& path) {
  return read_input_file(path, "[hf]", kMaxInputBytes, "a JSON config");
}

std::vector<int32_t> parse_eos_ids(const std::string& json_text, const std::string& path) {
  std::vector<int32_t> out;
  const json j = parse_json_bounded(json_text, path, "[hf]");
  // Not an object: no key could be read from it, and the defaults would be taken silently.
  if (!j.is_object()) throw Error("[hf] " + path + ": not a JSON object");
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return out;
  const json& v = j["eos_token_id"];
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        x.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw Error("[hf] " + path + ": eos_token_id entry " + x.dump() + " is not a token id");
    out.push_back(int32_t(x.get<int64_t>()));
  };
  if (v.is_array()) {
    for (const json& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

std::vector<int32_t> load_hf_eos_ids(const std::string& dir) {
  std::vector<int32_t> ids;
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::string p = dir + "/" + name;
    std::error_code ec;
    // exists() is true for a FIFO or a directory too: the read refuses those.
    if (!std::filesystem::exists(p, ec)) continue;
    for (int32_t id : parse_eos_ids(read_config_text(p), p))
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace arbiter
