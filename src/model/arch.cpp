#include "model/arch.h"

#include <algorithm>

#include "core/error.h"

namespace arbiter {

const Arch& arch_of(const std::string& config_name) {
  for (const Arch* a : arch_registry())
    for (const auto& [cls, name] : a->hf_classes())
      if (name == config_name) return *a;
  throw Error("[model] unsupported architecture '" + config_name + "' (supported: " +
              supported_archs() + ")");
}

std::string supported_archs() {
  std::vector<std::string> names;
  for (const Arch* a : arch_registry())
    for (const auto& [cls, name] : a->hf_classes())
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> all_stage_names() {
  std::vector<std::string> out;
  for (const Arch* a : arch_registry())
    for (const std::string& s : a->stages())
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

}  // namespace arbiter
