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

[[noreturn]] void throw_json_too_deep(const std::string& path, const std::string& component);
[[noreturn]] void throw_json_invalid(const std::string& path, const std::string& component, const char* what);

/// Parses text into Json (nlohmann::json, or ordered_json where key order matters: chat
/// messages, requests); throws arbiter::Error "[component] PATH: not valid JSON (...)" or
/// "[component] PATH: JSON nested deeper than 64 levels". A request body, a reply from
/// another server and every file go through here.
template <class Json = nlohmann::json>
Json parse_json_bounded(std::string_view text, const std::string& path, const std::string& component) {
  typename Json::parser_callback_t depth_guard = [&](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw_json_too_deep(path, component);
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), depth_guard);
  } catch (const typename Json::exception& e) {
    throw_json_invalid(path, component, e.what());
  }
}

/// A short printable rendering of a JSON value for messages (at most 80 characters; never
/// throws on bad UTF-8).
std::string json_brief(const nlohmann::json& v);

}  // namespace arbiter
