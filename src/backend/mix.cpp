#include "backend/mix.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace arbiter {

const std::vector<std::string>& mix_families() {
  static const std::vector<std::string> f = {"embed", "norm", "attn", "mlp", "residual", "logits"};
  return f;
}

std::string MixSpec::text() const {
  if (entries.empty()) return "none";
  std::string out;
  for (const auto& [fam, dt] : entries) out += (out.empty() ? "" : ",") + fam + "=" + dt;
  return out;
}

std::string MixSpec::dtype_of(const std::string& family) const {
  for (const auto& [fam, dt] : entries)
    if (fam == family) return dt;
  return "";
}

MixSpec parse_mix(const std::string& spec) {
  MixSpec m;
  if (spec.empty() || spec == "none") return m;
  ARB_CHECK(spec.back() != ',', "[mix] '%s': trailing ','", spec.c_str());
  std::stringstream ss(spec);
  std::string field;
  const auto& fams = mix_families();
  while (std::getline(ss, field, ',')) {
    size_t eq = field.find('=');
    ARB_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < field.size(),
              "[mix] '%s': entry '%s' is not family=dtype", spec.c_str(), field.c_str());
    std::string fam = field.substr(0, eq), dt = field.substr(eq + 1);
    if (std::find(fams.begin(), fams.end(), fam) == fams.end()) {
      std::string valid;
      for (const auto& f : fams) valid += (valid.empty() ? "" : ", ") + f;
      throw Error("[mix] '" + spec + "': unknown op family '" + fam + "' (expected " + valid + ")");
    }
    ARB_CHECK(dt == "f32" || dt == "bf16" || dt == "f16",
              "[mix] '%s': family %s: dtype '%s' (expected f32, bf16 or f16)", spec.c_str(),
              fam.c_str(), dt.c_str());
    ARB_CHECK(m.dtype_of(fam).empty(), "[mix] '%s': family %s given twice", spec.c_str(),
              fam.c_str());
    m.entries.emplace_back(fam, dt);
  }
  ARB_CHECK(!m.entries.empty(), "[mix] '%s': no family=dtype entry", spec.c_str());
  return m;
}

}  // namespace arbiter
