#include <cstdlib>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_factory.h"
#include "backend/mix.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter {

std::unique_ptr<Backend> make_backend(const DeviceSpec& spec) {
  const std::string& d = spec.device;
  // --mix is validated first so a typo is named even where it would be refused anyway.
  const MixSpec mix = parse_mix(spec.mix);
  const bool is_cuda = d == "cuda" || d.rfind("cuda:", 0) == 0;
  ARB_CHECK(mix.empty() || is_cuda,
            "[backend] --mix %s: per-family precision exists only on the cuda tier (device '%s')",
            mix.text().c_str(), d.c_str());
  if (d == "ref") {
    ARB_CHECK(spec.dtype.empty() || spec.dtype == "f64",
              "[backend] device ref computes in f64 (asked for --dtype %s)", spec.dtype.c_str());
    return make_ref_backend();
  }
  if (d == "cpu") {
    ARB_CHECK(spec.dtype.empty() || spec.dtype == "f32",
              "[backend] device cpu computes in f32 (asked for --dtype %s)", spec.dtype.c_str());
    return make_cpu_backend(spec.threads);
  }
  if (d == "cuda" || d.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (d.size() > 5) {
      char* end = nullptr;
      long v = std::strtol(d.c_str() + 5, &end, 10);
      ARB_CHECK(*end == '\0' && v >= 0 && v < 1024, "[backend] bad device '%s' (cuda:N)",
                d.c_str());
      index = int(v);
    }
    if (mix.empty()) return make_cuda_backend(index, spec.dtype);
    // --mix: one cuda tier per distinct dtype, each family routed to its own (backend/mix.h).
    const std::string base = spec.dtype.empty() ? "bf16" : spec.dtype;
    std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers;
    auto add = [&](const std::string& dt) {
      for (const auto& t : tiers)
        if (t.first == dt) return;
      tiers.emplace_back(dt, make_cuda_backend(index, dt));
    };
    add(base);
    for (const auto& e : mix.entries) add(e.second);
    return make_mix_backend(std::move(tiers), base, mix);
  }
  throw Error("[backend] unknown device '" + d + "' (expected ref, cpu, cuda or cuda:N)");
}

}  // namespace arbiter
