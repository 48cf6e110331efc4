#include "cli/common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "core/error.h"

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

ModelRun open_model_run(const Args& a) {
  ModelRun r;
  DeviceSpec spec;
  spec.device = a.str("device", "cpu");
  spec.dtype = a.str("dtype", "");
  spec.threads = thread_count(a);
  spec.mix = a.str("mix", "");
  r.inject = InjectSpec::parse(a.str("inject", "none"));
  const char* env = std::getenv("ARBITER_OP_STATS");
  r.stats = a.flag("stats") || (env && std::strcmp(env, "0") != 0 && *env);
  {
    ActivityScope scope("loading model " + a.str("model"));
    r.model = load_model(a.str("model"));
  }
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
