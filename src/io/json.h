// JSON inputs (config.json, tokenizer.json, safetensors headers and index, ...) parsed with
// a nesting limit. nlohmann::json parses deep nesting fine but copies, compares and dumps
// values recursively: a 100 kB file of '[' would overflow the stack in the first copy or
// error message. No format arbiter reads nests deeper than a handful of levels.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace arbiter {

constexpr int kMaxJsonDepth = 64;

/// Parses text; throws arbiter::Error "[component] PATH: not valid JSON (...)" or
/// "[component] PATH: JSON nested deeper than 64 levels".
nlohmann::json parse_json_bounded(std::string_view text, const std::string& path, const std::string& component);

/// A short printable rendering of a JSON value for messages (at most 80 characters; never
/// throws on bad UTF-8).
std::string json_brief(const nlohmann::json& v);

}  // namespace arbiter
