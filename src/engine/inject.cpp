#include "engine/inject.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "core/error.h"
#include "model/arch.h"

namespace arbiter {

InjectSpec InjectSpec::parse(const std::string& spec) {
  InjectSpec s;
  if (spec.empty() || spec == "none") return s;
  s.active = true;
  bool have_op = false, have_effect = false;
  std::stringstream ss(spec);
  std::string field;
  while (std::getline(ss, field, ',')) {
    size_t eq = field.find('=');
    ARB_CHECK(eq != std::string::npos, "[inject] '%s': field '%s' is not key=value",
              spec.c_str(), field.c_str());
    std::string key = field.substr(0, eq), val = field.substr(eq + 1);
    auto number = [&](const std::string& what) {
      char* end = nullptr;
      double v = std::strtod(val.c_str(), &end);
      ARB_CHECK(!val.empty() && *end == '\0' && std::isfinite(v),
                "[inject] '%s': %s=%s is not a finite number", spec.c_str(), what.c_str(),
                val.c_str());
      return v;
    };
    if (key == "op") {
      const std::vector<std::string> names = all_stage_names();
      if (std::find(names.begin(), names.end(), val) == names.end()) {
        std::string valid;
        for (const std::string& n : names) valid += (valid.empty() ? "" : ", ") + n;
        throw Error("[inject] '" + spec + "': unknown stage '" + val + "' (valid: " + valid + ")");
      }
      s.stage = val;
      have_op = true;
    } else if (key == "layer") {
      double v = number("layer");
      // Bounded before the conversion to int (out of range it is undefined and wrapped).
      ARB_CHECK(v >= 0 && v == std::floor(v) && v <= 1e9, "[inject] '%s': layer must be a whole number in [0, 1e9]",
                spec.c_str());
      s.layer = int(v);
    } else if (key == "scale") {
      s.scale = number("scale");
      have_effect = true;
    } else if (key == "noise") {
      s.noise = number("noise");
      have_effect = true;
    } else if (key == "bias") {
      s.bias = number("bias");
      have_effect = true;
    } else {
      throw Error("[inject] '" + spec + "': unknown key '" + key +
                  "' (expected op, layer, scale, noise, bias)");
    }
  }
  ARB_CHECK(have_op, "[inject] '%s': op=NAME is required", spec.c_str());
  ARB_CHECK(have_effect, "[inject] '%s': one of scale=, noise=, bias= is required", spec.c_str());
  s.text = spec;
  return s;
}

void InjectSpec::fault(const StagePoint& p, int pos0, StageTap& tap) const {
  tap.fault = true;
  tap.scale = scale;
  tap.bias = bias;
  tap.noise.clear();
  if (noise == 0) return;
  // The stage's index among every family's stage names keeps the seeds of the llama family's
  // stages what they were when those were an enum.
  const std::vector<std::string> names = all_stage_names();
  const uint64_t id = uint64_t(std::find(names.begin(), names.end(), stage) - names.begin());
  tap.noise.resize(size_t(p.rows) * size_t(p.cols));
  for (int r = 0; r < p.rows; ++r) {
    std::mt19937_64 rng(id * 1000003u + uint64_t(p.layer + 1) * 7919u +
                        uint64_t(pos0 + r) * 104729u);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int c = 0; c < p.cols; ++c) tap.noise[size_t(r) * p.cols + c] = noise * normal(rng);
  }
}

}  // namespace arbiter
