#include "io/json.h"

#include "core/error.h"

namespace arbiter {

void throw_json_too_deep(const std::string& path, const std::string& component) {
  throw Error(strformat("%s %s: JSON nested deeper than %d levels", component.c_str(), path.c_str(), kMaxJsonDepth));
}

void throw_json_invalid(const std::string& path, const std::string& component, const char* what) {
  throw Error(component + " " + path + ": not valid JSON (" + what + ")");
}

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace arbiter
