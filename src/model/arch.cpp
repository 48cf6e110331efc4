#include "model/arch.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/model.h"

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

double Arch::weight_bytes_per_step(const Model& m, int rows) const {
  // A tied output matrix is read whole by the lm_head, besides its embedding rows.
  double w = 0;
  for (const TensorSpec& s : m.weights.specs) {
    const Tensor& t = m.weights.at(s);
    if (t.empty()) continue;
    const double n = double(std::max<int64_t>(t.rows(), 1));
    w += std::string(s.family) == "embed" ? double(t.nbytes()) * std::min(double(rows), n) / n : double(t.nbytes());
  }
  return w;
}

double Arch::routed_weight_bytes(const Model& m, int rows, int top_k, int n_experts) const {
  const double all = Arch::weight_bytes_per_step(m, rows);
  if (n_experts == 0) return all;
  double experts = 0;
  for (const TensorSpec& s : m.weights.specs)
    if (s.role.rfind("expert", 0) == 0) experts += double(m.weights.at(s).nbytes());
  const double read = 1.0 - std::pow(1.0 - double(top_k) / n_experts, rows);
  return all - experts * (1.0 - read);
}

std::vector<std::string> all_stage_names() {
  std::vector<std::string> out;
  for (const Arch* a : arch_registry())
    for (const std::string& s : a->stages())
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

}  // namespace arbiter
