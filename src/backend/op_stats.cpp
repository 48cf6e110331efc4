#include <sstream>

#include "backend/backend.h"

namespace arbiter {

std::string OpStats::summary() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [op, providers] : calls_)
    for (const auto& [provider, n] : providers) {
      if (!first) os << ',';
      os << op << '=' << provider << ':' << n;
      first = false;
    }
  return first ? "none" : os.str();
}

std::string OpStats::act_quant() const {
  std::string s;
  for (const auto& k : act_quant_) s += (s.empty() ? "" : ",") + k;
  return s;
}

std::string OpStats::table() const {
  std::ostringstream os;
  os << "op stats (calls per provider), fallbacks " << fallbacks_ << "\n";
  for (const auto& [op, providers] : calls_)
    for (const auto& [provider, n] : providers) {
      char line[160];
      std::snprintf(line, sizeof line, "  %-12s %-28s %12lld\n", op.c_str(), provider.c_str(),
                    (long long)n);
      os << line;
    }
  return os.str();
}

}  // namespace arbiter
