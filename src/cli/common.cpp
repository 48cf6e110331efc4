#include "cli/common.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace arbiter::cli {

std::vector<std::string> model_value_opts() {
  return {"-m|--model", "--device", "--dtype", "-t|--threads", "--inject", "--mix"};
}
std::vector<std::string> model_flag_opts() { return {"--stats"}; }

ModelRun open_model_run(const Args& a) {
  ModelRun r;
  DeviceSpec spec;
  spec.device = a.str("device", "cpu");
  spec.dtype = a.str("dtype", "");
  spec.threads = int(a.integer("threads", 0));
  spec.mix = a.str("mix", "");
  if (spec.threads < 0) throw Error("[cli] --threads must be >= 0");
  r.inject = InjectSpec::parse(a.str("inject", "none"));
  const char* env = std::getenv("ARBITER_OP_STATS");
  r.stats = a.flag("stats") || (env && std::strcmp(env, "0") != 0 && *env);
  r.model = load_model(a.str("model"));
  r.backend = make_backend(spec);
  return r;
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
