#include "engine/inject.h"

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "core/error.h"

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
      s.stage = stage_from_name(val);
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

void InjectSpec::check_applies(const ModelConfig& c) const {
  if (!active) return;
  const bool outside = stage == Stage::Embed || stage == Stage::FinalNorm || stage == Stage::Logits;
  ARB_CHECK(!(outside && layer >= 0), "[inject] '%s': op %s runs outside the layers (drop layer=)", text.c_str(),
            stage_name(stage));
  ARB_CHECK(layer < c.n_layer, "[inject] '%s': layer %d does not exist (the model has %d layers)", text.c_str(),
            layer, c.n_layer);
  ARB_CHECK(c.qk_norm || (stage != Stage::QNorm && stage != Stage::KNorm),
            "[inject] '%s': op %s does not exist in this model (no q/k norm)", text.c_str(), stage_name(stage));
}

void InjectSpec::apply(Backend& be, Stage st, int l, Buffer& buf, int rows, int cols,
                       int pos0) const {
  if (!active || st != stage || (layer >= 0 && l != layer)) return;
  int64_t n = int64_t(rows) * cols;
  std::vector<double> host(n);
  be.read(buf, 0, n, host.data());
  for (int r = 0; r < rows; ++r) {
    // Noise is seeded by (stage, layer, absolute position) so it does not depend on how
    // the tokens were split into forwards.
    std::mt19937_64 rng(uint64_t(int(st)) * 1000003u + uint64_t(l + 1) * 7919u +
                        uint64_t(pos0 + r) * 104729u);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int c = 0; c < cols; ++c) {
      double& v = host[int64_t(r) * cols + c];
      v = v * scale + bias;
      if (noise != 0) v += noise * normal(rng);
    }
  }
  be.write(buf, 0, n, host.data());
}

}  // namespace arbiter
