#include "io/json.h"

#include "core/error.h"

namespace arbiter {

nlohmann::json parse_json_bounded(std::string_view text, const std::string& path, const std::string& component) {
  using json = nlohmann::json;
  json::parser_callback_t depth_guard = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw Error(strformat("%s %s: JSON nested deeper than %d levels", component.c_str(), path.c_str(),
                            kMaxJsonDepth));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_guard);
  } catch (const json::exception& e) {
    throw Error(component + " " + path + ": not valid JSON (" + e.what() + ")");
  }
}

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace arbiter
