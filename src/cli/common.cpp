#include "cli/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "core/error.h"
#include "verify/judge/route_flips.h"

extern char** environ;

namespace arbiter::cli {

std::vector<std::string> model_value_opts() {
  return {"-m|--model", "--device", "--dtype", "-t|--threads", "--inject", "--mix"};
}
std::vector<std::string> model_flag_opts() { return {"--stats"}; }

int thread_count(const Args& a) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int t = a.int_in("threads", 0, 0, std::numeric_limits<int32_t>::max());
  if (t <= hw) return t;
  std::fprintf(stderr, "[cli] --threads %d capped at the %d hardware threads\n", t, hw);
  return hw;
}

double route_decided_option(const Args& a, const std::string& command) {
  const double v = a.number("route-decided", verify::kRouteDecided);
  ARB_CHECK(v >= 0 && std::isfinite(v), "[cli] %s: --route-decided must be a number >= 0 (got %g)",
            command.c_str(), v);
  return v;
}

std::string route_decided_help() {
  return strformat(
      "  --route-decided  MoE: a routing flip (a token sent to other experts at a layer) is\n"
      "              decided when the reference router's k-th minus (k+1)-th score is at least\n"
      "              this, else a near-tie (default %g; reported, not a gate: docs/traces.md)\n",
      verify::kRouteDecided);
}

ModelRun open_model_run(const Args& a, std::unique_ptr<Model> model) {
  ModelRun r;
  DeviceSpec spec;
  spec.device = a.str("device", "cpu");
  spec.dtype = a.str("dtype", "");
  spec.threads = thread_count(a);
  spec.mix = a.str("mix", "");
  r.inject = InjectSpec::parse(a.str("inject", "none"));
  const char* env = std::getenv("ARBITER_OP_STATS");
  r.stats = a.flag("stats") || (env && std::strcmp(env, "0") != 0 && *env);
  if (model) {
    r.model = std::move(model);
  } else {
    ActivityScope scope("loading model " + a.str("model"));
    r.model = load_model(a.str("model"));
  }
  r.backend = make_backend(spec);
  return r;
}

int context_option(const Args& a, const std::string& command, int64_t dflt, int64_t lo, const Model& m) {
  if (!a.has("ctx")) return int(dflt);
  const int64_t v = a.integer("ctx");
  ARB_CHECK(v >= lo, "[cli] %s: --ctx %lld is below %lld", command.c_str(), (long long)v, (long long)lo);
  ARB_CHECK(m.config.max_pos <= 0 || v <= m.config.max_pos,
            "[cli] %s: --ctx %lld passes the model's maximum of %d positions (max_position_embeddings / "
            "context_length of %s)",
            command.c_str(), (long long)v, m.config.max_pos, m.path.c_str());
  ARB_CHECK(v <= std::numeric_limits<int32_t>::max(), "[cli] %s: --ctx %lld is over %d", command.c_str(),
            (long long)v, std::numeric_limits<int32_t>::max());
  return int(v);
}

void print_stats_if_asked(const ModelRun& r) {
  if (r.stats) std::fprintf(stderr, "%s", r.backend->stats().table().c_str());
}

std::string arbiter_env() {
  std::string out;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "ARBITER_", 8) == 0) out += (out.empty() ? "" : " ") + std::string(*e);
  return out.empty() ? "none" : out;
}

}  // namespace arbiter::cli
